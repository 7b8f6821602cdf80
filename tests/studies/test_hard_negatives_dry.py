"""studies/squad_hard_negatives/run.sh end to end at toy scale (DRY_RUN=1: toy data, tiny BERT,
2 steps a run, one seed): round 1, the references, mining, round 2, every hybrid, the filter
check and the page, each step where a multi-hour study would reach it."""

from __future__ import annotations

import json
import subprocess
from pathlib import Path

from dpr_cache.runtime.processes import child_env
from tests.support.cli import fork_python
from tests.support.fixtures import REPO

SCRIPT = REPO / "studies" / "squad_hard_negatives" / "run.sh"


def test_dry_run_writes_the_page(tmp_path: Path) -> None:
    out = tmp_path / "hn-dry"
    env = {**child_env(), "DRY_RUN": "1", "OUT": str(out), "PY": fork_python(), "SEEDS": "1"}
    done = subprocess.run(
        ["bash", str(SCRIPT)], env=env, capture_output=True, text=True, timeout=1800, cwd=REPO
    )
    assert done.returncode == 0, done.stderr[-3000:]
    page = (out / "results.md").read_text()
    for row in (
        "| BM25 (bm25s) |",
        "| round 1: BM25 negatives | 1 |",
        "| round 2 (b): mined + BM25 negatives | 1 |",
        "| round 2 (a): mined negatives alone | 1 |",
        "| (b) - round 1, seed 1 |",
        "| round1 s1 | linear |",
        "| round2-both s1 | rrf |",
        "| train.both.jsonl |",
        "where an answer starts a word",
        "| BM25 + round2-both - BM25 + round1 (linear), seeds 1 |",
        "| `mine` at NQ's size",
    ):
        assert row in page, row
    data = json.loads((out / "results.json").read_text())
    assert data["filter"]["mined"]["questions"] == 300 and data["hours"] > 0
    both = [json.loads(line) for line in (out / "train.both.jsonl").open()]
    mined = [json.loads(line) for line in (out / "train.mined.jsonl").open()]
    assert all(
        len(b["hard_negative_ctxs"]) >= len(m["hard_negative_ctxs"])
        for b, m in zip(both, mined, strict=True)
    )
    for half in "ab":  # each half scored with the weight tuned on the other
        record = json.loads(
            (
                out / "round1-dry" / "gradcache-b32-s1" / f"eval-linear-{half}" / "fusion.json"
            ).read_text()
        )
        assert record["tuned_on"].endswith(f"dev-{'b' if half == 'a' else 'a'}.qa.tsv")
    assert (out / "plot.png").stat().st_size > 0


def test_train_seconds_counts_the_steps_when_a_cut_left_no_wall_time() -> None:
    from studies.squad_batch_size.runs import train_seconds

    # a session ended mid-run: only the last segment's wall time was written
    assert train_seconds({"train_wall_seconds": 469.9, "train_seconds": 2944.0}) == 2944.0
    # a whole run: the wall time, start-up included, is the larger
    assert train_seconds({"train_wall_seconds": 3039.2, "train_seconds": 3000.0}) == 3039.2
    assert train_seconds({"train_seconds": 12.5}) == 12.5
