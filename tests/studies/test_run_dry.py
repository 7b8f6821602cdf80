"""studies/squad_batch_size/run.sh end to end at toy scale (DRY_RUN=1: toy data, tiny BERT, 2
steps a run): every run trains, indexes, evaluates and passes the numbers check, and the table
has a row for each. Takes a few minutes; the real study is the same script without DRY_RUN."""

from __future__ import annotations

import json
import subprocess
from pathlib import Path

from dpr_cache.runtime.processes import child_env
from tests.support.cli import fork_python
from tests.support.fixtures import REPO as ROOT

SCRIPT = ROOT / "studies" / "squad_batch_size" / "run.sh"


def _run(out: Path, **env: str) -> subprocess.CompletedProcess:
    full_env = {**child_env(), "DRY_RUN": "1", "OUT": str(out), "PY": fork_python(), **env}
    return subprocess.run(
        ["bash", str(SCRIPT)], env=full_env, capture_output=True, text=True, timeout=1800
    )


def test_dry_run_writes_every_row(tmp_path: Path) -> None:
    committed = [
        ROOT / "docs" / "studies.md",
        ROOT / "studies" / "squad_batch_size" / "results.json",
    ]
    before = [path.read_bytes() for path in committed]
    out = tmp_path / "study-dry"
    done = _run(out)
    assert done.returncode == 0, done.stderr[-3000:]
    assert "passed" in done.stdout  # the numbers check ran inside the script
    table = (out / "results.md").read_text()
    assert "**Dry run**" in table and "| BM25 (bm25s, as mined) |" in table
    for arm, seeds in (
        ("sequential B=8", "1"),
        ("accumulation 4 x 8", "1,2"),
        ("GradCache B=32", "1,2"),
        ("accumulation 4 x 8, lr 1e-4", "1"),
        ("GradCache B=32, lr 1e-4", "1"),
    ):
        assert f"| {arm} | {seeds} | 2 |" in table, arm
    assert "| GradCache B=32 − accumulation 4 x 8 | all: 1,2 |" in table
    run = json.loads((out / "gradcache-b32-s1" / "run.json").read_text())
    assert run["train_wall_seconds"] > 0 and run["batch_size"] == 32 and run["lr"] == 2e-5
    logs = [
        (out / name / "train_log.jsonl").read_text().splitlines()
        for name in ("accumulate-b32-s1", "gradcache-b32-s1", "gradcache-b32-s2")
    ]
    digests = [[json.loads(line)["batch_digest"] for line in log] for log in logs]
    assert digests[0] == digests[1] and digests[1] != digests[2]  # pairs by seed
    assert (out / "plot.png").stat().st_size > 10_000
    kept = json.loads((out / "results.json").read_text())  # the page as data, beside it
    assert len(kept["runs"]) == 9 and {r["source"] for r in kept["runs"]} == {f"`{out}`"}
    assert {d["seed"] for d in kept["diffs"]} == {1, 2, "all"}
    assert [path.read_bytes() for path in committed] == before  # a dry run leaves them alone


def test_dry_run_refuses_an_out_it_would_wipe(tmp_path: Path) -> None:
    out = tmp_path / "results"
    out.mkdir()
    (out / "keep.txt").write_text("a finished study")
    done = _run(out)
    assert done.returncode == 2 and "-dry" in done.stderr
    assert (out / "keep.txt").read_text() == "a finished study"
