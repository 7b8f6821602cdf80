"""studies/squad_crossfit/run.sh end to end at toy scale (DRY_RUN=1: toy data, tiny BERT, 2 steps
a run, one seed, three of the five arms): the folds, round 1 of each fold, its weight, mining,
scores and cleaning, the joined files, the temperature, the students, every hybrid, the page,
and a fresh start from the saved state that redoes nothing."""

from __future__ import annotations

import json
import subprocess
from pathlib import Path

from dpr_cache.runtime.processes import child_env
from tests.support.cli import fork_python
from tests.support.fixtures import REPO

SCRIPT = REPO / "studies" / "squad_crossfit" / "run.sh"


def _ids(path: Path) -> list[str]:
    return [json.loads(line)["id"] for line in path.open(encoding="utf-8") if line.strip()]


def test_dry_run_writes_the_page_and_resumes_from_the_saved_state(tmp_path: Path) -> None:
    out, saved = tmp_path / "crossfit-dry", tmp_path / "saved"
    env = {
        **child_env(),
        "DRY_RUN": "1",
        "OUT": str(out),
        "PY": fork_python(),
        "SEEDS": "1",
        "ARMS": "control kl0 cleaned",
        "SAVED": str(saved),
    }
    run = {"capture_output": True, "text": True, "timeout": 1800, "cwd": REPO}
    done = subprocess.run(["bash", str(SCRIPT)], env=env, **run)
    assert done.returncode == 0, done.stderr[-3000:]

    # each fold's teacher is the round 1 that never trained on the fold's questions
    for k in (1, 2):
        held = set(_ids(out / f"folds/fold-{k}/held.jsonl"))
        assert held and not held & set(_ids(out / f"folds/fold-{k}/train.jsonl"))
        round1 = out / f"round1-fold{k}-dry/gradcache-b32-s1"
        trained_on = json.loads((round1 / "run.json").read_text())["train"]
        assert trained_on.endswith(f"folds/fold-{k}/train.jsonl")  # the other fold, not the held
        scored = json.loads((out / f"teacher-{k}/scored.summary.json").read_text())
        assert f"round1-fold{k}-dry/gradcache-b32-s1/model" in scored["teacher"]["model"]
        assert scored["questions"] == len(held)
        mined = json.loads((out / f"teacher-{k}/mined.summary.json").read_text())
        assert mined["settings"]["rules"]["relative_margin"] is None  # the answer rule only
        assert mined["kept_bm25"] > 0  # BM25's candidates after round 1's
        cleaned = json.loads((out / f"teacher-{k}/cleaned.summary.json").read_text())
        assert cleaned["cleaned"] > 0 and cleaned["settings"]["teacher_relative"] == 0.95
    # every arm trains on the same questions in the same order, fold 1's then fold 2's
    ids = _ids(out / "train.scored.jsonl")
    assert ids == _ids(out / "train.cleaned.jsonl")
    assert ids == _ids(out / "folds/fold-1/held.jsonl") + _ids(out / "folds/fold-2/held.jsonl")
    # the arms differ in the loss, and kl0 is distillation alone at the teacher's temperature
    teacher = json.loads((out / "teacher" / "teacher.json").read_text())
    assert len(teacher["weight"]) == 2
    runs = {arm: out / f"{arm}-dry" / "gradcache-b32-s1" for arm in ("control", "kl0", "cleaned")}
    kl0 = (runs["kl0"] / "config.yaml").read_text()
    assert "loss: distill_kl" in kl0 and "distill_weight: 0.0" in kl0
    assert f"teacher_temperature: {teacher['teacher_temperature']}" in kl0
    for arm in ("control", "cleaned"):
        assert "loss: contrastive" in (runs[arm] / "config.yaml").read_text()
    for run_dir in runs.values():
        recipe = json.loads((run_dir / "run.json").read_text())
        assert (recipe["precision"], recipe["chunk_size"], recipe["hard_negatives"]) == (
            "bf16",
            32,
            3,
        )
    page = (out / "results.md").read_text()
    for row in ("| BM25 (bm25s) |", "| kl0 - control, seed 1 |", "| cleaned - control, seed 1 |"):
        assert row in page, row

    # a fresh machine with only the saved state: nothing trained, mined or scored again
    again = tmp_path / "again-dry"
    done = subprocess.run(["bash", str(SCRIPT)], env={**env, "OUT": str(again)}, **run)
    assert done.returncode == 0, done.stderr[-3000:]
    assert not [p for p in again.rglob("*") if p.name in ("model", "checkpoints", "index")]
    assert not (again / "teacher-1" / "mined.jsonl").exists()
    assert (again / "results.md").read_text() == page.replace(str(out), str(again))
    assert sum(p.stat().st_size for p in saved.rglob("*")) < 2**20
