"""docs/teachers.md's cross-fitting recipe runs as printed (its bash block, one script, on the
toy data, with the installed commands on ``PATH``), and what it writes holds the recipe's
promises: every training question is scored by the round 1 that never trained on it, on
candidates that hold no answer, and the cleaned file is the scored one less the candidates the
teacher's rule names."""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

from dpr_cache.data.answers import has_answer
from dpr_cache.runtime.processes import child_env
from tests.support.cli import fork_bin
from tests.support.fixtures import REPO

VENV_BIN = Path(sys.prefix) / "bin"


def _records(path: Path) -> list[dict]:
    return [json.loads(line) for line in path.read_text(encoding="utf-8").splitlines() if line]


def _recipe() -> str:
    blocks = re.findall(r"```bash\n(.*?)```", (REPO / "docs/teachers.md").read_text(), re.S)
    assert len(blocks) == 1, "docs/teachers.md: one bash block, the recipe"
    return blocks[0]


def test_the_recipe_runs_as_printed_and_keeps_its_promises(tmp_path: Path) -> None:
    for part in ("configs/toy.yaml", "data/toy"):
        copy = shutil.copytree if (REPO / part).is_dir() else shutil.copyfile
        (tmp_path / part).parent.mkdir(parents=True, exist_ok=True)
        copy(REPO / part, tmp_path / part)
    env = child_env()
    env["PATH"] = os.pathsep.join([fork_bin(), str(VENV_BIN), env["PATH"]])
    proc = subprocess.run(
        ["bash", "-euo", "pipefail", "-c", _recipe()],
        cwd=tmp_path,
        env=env,
        capture_output=True,
        text=True,
        timeout=900,
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    runs = tmp_path / "runs/xfit"
    assert (runs / "student/model").is_dir()

    source = {r["id"]: r for r in _records(tmp_path / "data/toy/train.jsonl")}
    scored = {r["id"]: r for r in _records(runs / "train.scored.jsonl")}
    assert sorted(scored) == sorted(source)  # every question, once
    for k in (1, 2):
        fold = runs / f"folds/fold-{k}"
        held = {r["id"] for r in _records(fold / "held.jsonl")}
        trained_on = {r["id"] for r in _records(fold / "train.jsonl")}
        assert held and not held & trained_on  # round 1 of fold k never saw its questions
        assert held | trained_on == set(source)
        rules = json.loads((fold / "mined.summary.json").read_text())["settings"]["rules"]
        assert rules["relative_margin"] is None and rules["margin"] is None  # the answer rule only
        assert rules["match"] == "string"
        config = (runs / f"round1-fold{k}/config.yaml").read_text()
        assert f"train: runs/xfit/folds/fold-{k}/train.jsonl" in config  # not the held file
        summary = json.loads((fold / "scored.summary.json").read_text())
        assert summary["teacher"]["model"].endswith(f"runs/xfit/round1-fold{k}/model")
        assert summary["questions"] == len(held)
        weight = json.loads((runs / f"round1-fold{k}/fused/fusion.json").read_text())["weight"]
        assert summary["teacher"]["fusion_weight"] == weight
        assert json.loads((runs / f"round1-fold{k}/fused/fusion.json").read_text())[
            "tuned_on"
        ].endswith(f"fold-{k}/held.qa.tsv")
    for qid, record in scored.items():
        negatives = record["hard_negative_ctxs"]
        assert len(negatives) >= 3 and all("teacher_score" in c for c in negatives)
        assert "teacher_score" in record["positive_ctxs"][0]
        # the answer rule, and only it: no candidate holds an answer
        assert not any(has_answer(source[qid]["answers"], c["text"], "string") for c in negatives)

    cleaned = {r["id"]: r for r in _records(runs / "train.cleaned.jsonl")}
    dropped = 0
    for qid, record in scored.items():
        positive = record["positive_ctxs"][0]["teacher_score"]
        keep = [
            c
            for c in record["hard_negative_ctxs"]
            if c["teacher_score"] < positive - 0.05 * abs(positive)
        ]
        assert cleaned[qid]["hard_negative_ctxs"] == keep
        dropped += len(record["hard_negative_ctxs"]) - len(keep)
    assert dropped > 0  # the rule did something here: the comparison above is not vacuous
