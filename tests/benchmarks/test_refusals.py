"""``python -m benchmarks.refusals``: one round writes a row a refusal, each refused as it should
(exit 2 and its one line; a finished run resumed: exit 0), and the page with its verdict."""

from __future__ import annotations

import json


def test_one_round_times_every_refusal(tmp_path, run_benchmark) -> None:
    proc = run_benchmark("refusals", "--out", str(tmp_path), "--rounds", "1")
    assert proc.returncode == 0, proc.stderr[-3000:]
    result = json.loads((tmp_path / "refusals.json").read_text())
    rows = result["rows"]
    assert rows["--help"]["exit"] == 0 and result["help_s"] > 0
    assert rows["train --resume: a finished run"]["exit"] == 0
    refusals = {
        n: r for n, r in rows.items() if n not in ("--help", "train --resume: a finished run")
    }
    assert len(refusals) >= 10
    for name, row in refusals.items():
        assert row["exit"] == 2 and row["line"].startswith("error: "), (name, row)
    assert "in use by pid" in rows["train: a run in use"]["line"]
    assert "--resume`" in rows["train: another run's checkpoints"]["line"]
    page = (tmp_path / "refusals.md").read_text()
    assert "| eval: before index |" in page and "The slowest refusal:" in page
