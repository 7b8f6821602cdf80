"""The scale benchmark rehearsed at toy size (every step, in its order, resumable): the figures
it records and the page it writes, so a multi-hour run never fails on its last step."""

from __future__ import annotations

import json


def test_tiny_rehearsal_runs_every_step_and_resumes(tmp_path, rehearse) -> None:
    done = rehearse("scale")
    assert done.returncode == 0, done.stderr[-3000:]
    results = json.loads((tmp_path / "out" / "scale.json").read_text())
    for step in ("vectors", "exact", "ivfpq", "hnsw", "tsv", "eval", "cleanup", "json", "tokenize"):
        assert step in results, step
    exact = results["exact"]["sizes"]
    assert [s["rows"] for s in exact.values()] == [5000, 20000, 20000]
    assert all(0 < s["peak_rss_gb"] < results["exact"]["memory_gb"] for s in exact.values())
    assert results["hnsw"]["4M"]["recall_at_100"] > 0.9  # approximate, yet near the exact run
    assert 0 < results["ivfpq"]["21M"]["recall_at_100"] < 1
    page = (tmp_path / "out" / "scale.md").read_text()
    assert "## Targets (exact search)" in page and "Machine:" in page
    assert not (tmp_path / "w" / "vectors").exists()  # cleaned up for the JSON steps
    assert set(results["machines"]) == set(results) - {"machine", "machines"}
    assert "ran on different machines" not in page
    # a step measured in another session, on another machine: the page says which ran where
    results["machines"]["exact"] = {**results["machine"], "cpu": "Other CPU"}
    (tmp_path / "out" / "scale.json").write_text(json.dumps(results))
    again = rehearse("scale", timeout=300)
    assert again.returncode == 0 and again.stdout.count("done, skipped") == 9
    page = (tmp_path / "out" / "scale.md").read_text()
    assert "ran on different machines" in page and "| exact | Other CPU" in page
