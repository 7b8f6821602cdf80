"""studies/squad_teachers/run.sh end to end at toy scale (DRY_RUN=1: toy data, tiny BERT, 2 steps
a run, one seed): round 1, BM25, mining, the teacher's weight, scores and temperature, cleaning,
score's rate, the three arms, the pick of the best, every hybrid and the page; and the study's
set-up steps against figures worked out by hand."""

from __future__ import annotations

import json
import subprocess
from pathlib import Path

import numpy as np
import pytest

from dpr_cache.runtime.processes import child_env
from studies.squad_teachers.teacher import (
    best_arm,
    keep,
    margin_parts,
    spread,
    teacher_temperature,
    write_qa,
)
from tests.support.cli import fork_python
from tests.support.fixtures import REPO

SCRIPT = REPO / "studies" / "squad_teachers" / "run.sh"


def test_dry_run_writes_the_page(tmp_path: Path) -> None:
    out, saved = tmp_path / "teachers-dry", tmp_path / "saved"
    env = {**child_env(), "DRY_RUN": "1", "OUT": str(out), "PY": fork_python(), "SEEDS": "1"}
    run = {"capture_output": True, "text": True, "timeout": 1800, "cwd": REPO}
    done = subprocess.run(["bash", str(SCRIPT)], env={**env, "SAVED": str(saved)}, **run)
    assert done.returncode == 0, done.stderr[-3000:]
    page = (out / "results.md").read_text()
    for row in (
        "| BM25 (bm25s) |",
        "| control: contrastive, mined candidates | 1 | 3 | 2 |",
        "| distill: distill_kl + contrastive, mined candidates | 1 | 3 | 2 |",
        "| cleaned: contrastive, teacher-cleaned candidates | 1 | 3 | 2 |",
        "| distill - control, seed 1 |",
        "| cleaned - control, seed 1 |",
        "| distill s1 | linear |",
        "| BM25 + distill - BM25 + control (linear), seeds 1 |",
        "| train.cleaned-all.jsonl |",
        "pairs a second",
        "| `score` with a cross-encoder at NQ's size, projected |",
    ):
        assert row in page, row
    # the distilled run learnt from the teacher: its config names the loss and the temperature
    teacher = json.loads((out / "teacher" / "teacher.json").read_text())
    config = (out / "distill-dry" / "gradcache-b32-s1" / "config.yaml").read_text()
    assert "loss: distill_kl" in config
    assert f"teacher_temperature: {teacher['teacher_temperature']}" in config
    assert (
        "loss: contrastive"
        in (out / "control-dry" / "gradcache-b32-s1" / "config.yaml").read_text()
    )
    # every arm trains on the same questions in the same order
    ids = {}
    for name in ("scored", "cleaned"):
        ids[name] = [json.loads(line)["id"] for line in (out / f"train.{name}.jsonl").open()]
    assert ids["scored"] == ids["cleaned"] and ids["scored"]
    scored = [json.loads(line) for line in (out / "train.scored.jsonl").open()]
    assert all(len(r["hard_negative_ctxs"]) >= 3 for r in scored)
    assert all("teacher_score" in c for r in scored for c in r["hard_negative_ctxs"])
    # the cleaning dropped candidates by the teacher's rule, and only the cleaned file did
    summaries = {
        k: json.loads((out / f"train.{k}.summary.json").read_text())
        for k in ("mined", "cleaned-all")
    }
    assert summaries["mined"]["dropped"]["teacher"] == 0
    assert summaries["cleaned-all"]["dropped"]["teacher"] > 0
    best = json.loads((out / "best.json").read_text())
    assert best["arm"] in ("distill", "cleaned")
    rate = json.loads((out / "score-rate" / "rate.json").read_text())
    assert rate["pairs"] > 0 and rate["pairs_a_second"] > 0 and rate["nq"]["pairs"] == 58_880 * 31
    assert (out / "plot.png").stat().st_size > 0

    # a fresh machine with only the saved state: every step skipped, nothing trained, scored or
    # mined again, the same page
    again = tmp_path / "again-dry"
    done = subprocess.run(
        ["bash", str(SCRIPT)], env={**env, "OUT": str(again), "SAVED": str(saved)}, **run
    )
    assert done.returncode == 0, done.stderr[-3000:]
    assert not [p for p in again.rglob("*") if p.name in ("model", "checkpoints", "index")]
    assert not (again / "train.mined.jsonl").exists()
    assert (again / "results.md").read_text() == page.replace(str(out), str(again))
    assert sum(p.stat().st_size for p in saved.rglob("*")) < 2**20


def _record(qid: str, scores: list[float]) -> dict:
    ctx = [
        {"passage_id": str(i), "title": "t", "text": "x", "teacher_score": s}
        for i, s in enumerate(scores)
    ]
    return {
        "id": qid,
        "question": f"q {qid}?",
        "answers": ["a"],
        "positive_ctxs": ctx[:1],
        "hard_negative_ctxs": ctx[1:],
    }


def _write(path: Path, records: list[dict]) -> Path:
    path.write_text("".join(json.dumps(r) + "\n" for r in records))
    return path


def test_temperature_gives_the_teacher_round_ones_spread(tmp_path: Path) -> None:
    rng = np.random.default_rng(0)
    weight = 20.0
    bm25, hybrid = [], []
    dense_groups, teacher_groups, b_groups, cos_groups = [], [], [], []
    for q in range(40):
        b = rng.normal(20, 4, size=1 + q % 5 + 2)
        cos = rng.uniform(0.2, 0.9, size=b.size)
        b_groups.append(b)
        cos_groups.append(cos)
        bm25.append(_record(str(q), b.tolist()))
        hybrid.append(_record(str(q), (b + weight * cos).tolist()))
        dense_groups.append(cos / 0.05)
        teacher_groups.append(b + weight * cos)
    result = teacher_temperature(
        [(_write(tmp_path / "h.jsonl", hybrid), _write(tmp_path / "b.jsonl", bm25), weight)]
    )

    # by hand: pooled within-group sd of each side
    def pooled(groups):
        return np.sqrt(np.mean([np.mean((g - g.mean()) ** 2) for g in groups]))

    want = pooled(teacher_groups) / pooled(dense_groups)
    assert result["teacher_temperature"] == pytest.approx(want, abs=1e-4)
    assert spread([g / want for g in teacher_groups]) == pytest.approx(pooled(dense_groups))
    # negative control: the files out of step are refused
    with pytest.raises(SystemExit, match="differ at question"):
        teacher_temperature(
            [(_write(tmp_path / "h2.jsonl", hybrid[1:] + hybrid[:1]), tmp_path / "b.jsonl", weight)]
        )
    # a file shorter than the other is refused the same way
    with pytest.raises(SystemExit, match="differ at question"):
        teacher_temperature(
            [(_write(tmp_path / "h4.jsonl", hybrid[:-1]), tmp_path / "b.jsonl", weight)]
        )
    # two folds, each with its own weight, pool their groups: fold 2's hybrid is BM25 + 2 x
    # weight x cosine, so its dense score is read off with 2 x weight
    bm25_2 = [_record(f"b{q}", g.tolist()) for q, g in enumerate(b_groups)]
    hybrid_2 = [
        _record(f"b{q}", (g + 2 * weight * c).tolist())
        for q, (g, c) in enumerate(zip(b_groups, cos_groups, strict=True))
    ]
    pooled_result = teacher_temperature(
        [
            (tmp_path / "h.jsonl", tmp_path / "b.jsonl", weight),
            (
                _write(tmp_path / "h3.jsonl", hybrid_2),
                _write(tmp_path / "b3.jsonl", bm25_2),
                2 * weight,
            ),
        ]
    )
    teacher_2 = [g + 2 * weight * c for g, c in zip(b_groups, cos_groups, strict=True)]
    want_2 = pooled(teacher_groups + teacher_2) / pooled(dense_groups + dense_groups)
    assert pooled_result["teacher_temperature"] == pytest.approx(want_2, abs=1e-4)
    assert pooled_result["weight"] == [weight, 2 * weight]
    assert abs(want_2 - want) > 0.01  # the second fold moves it: the pooling is seen


def test_the_teachers_margins_split_into_bm25s_and_round_ones(tmp_path: Path) -> None:
    # fold 1 (weight 2): BM25's margins 1 and -4; round 1's part 6 - 4 = 2 twice (cosine gap 1)
    h1 = _write(tmp_path / "h1.jsonl", [_record("a", [10.0, 7.0, 12.0])])
    b1 = _write(tmp_path / "b1.jsonl", [_record("a", [4.0, 3.0, 8.0])])
    # fold 2 (weight 4): BM25's margin 0; round 1's part 8 - 0 = 8 (cosine gap 2)
    h2 = _write(tmp_path / "h2.jsonl", [_record("b", [9.0, 1.0])])
    b2 = _write(tmp_path / "b2.jsonl", [_record("b", [1.0, 1.0])])
    got = margin_parts([(h1, b1, 2.0), (h2, b2, 4.0)])
    bm25, round1 = np.array([1.0, -4.0, 0.0]), np.array([2.0, 2.0, 8.0])
    assert got["questions"] == 2 and got["pairs"] == 3
    assert got["bm25"] == pytest.approx(-1.0) and got["round1"] == pytest.approx(4.0)
    assert got["round1_cosine"] == pytest.approx(
        4 / 3
    )  # gaps 1, 1 and 2; the weights swapped: 5 / 3
    assert got["bm25_variance"] == pytest.approx(100 * bm25.var() / (bm25 + round1).var())
    assert got["round1_variance"] == pytest.approx(100 * round1.var() / (bm25 + round1).var())
    # negative control: a fold's files that differ in a question's candidates are refused
    b3 = _write(tmp_path / "b3.jsonl", [_record("b", [1.0, 1.0, 2.0])])
    with pytest.raises(SystemExit, match="differ at question"):
        margin_parts([(h1, b1, 2.0), (h2, b3, 4.0)])


def test_keep_drops_the_same_questions_from_every_file(tmp_path: Path) -> None:
    mined = _write(
        tmp_path / "mined.jsonl",
        [_record("a", [3, 1, 2, 0]), _record("b", [3, 1]), _record("c", [1, 0, 0, 0])],
    )
    cleaned = _write(
        tmp_path / "cleaned.jsonl",
        [_record("a", [3, 1]), _record("b", [3, 1, 1, 1]), _record("c", [1])],
    )
    record = keep(mined, 3, cleaned, tmp_path / "kept.jsonl")
    kept = [json.loads(line)["id"] for line in (tmp_path / "kept.jsonl").open()]
    assert kept == ["a", "c"]  # b has 1 mined candidate; a and c keep their cleaned lists
    assert record["kept"] == 2 and record["dropped"] == 1
    assert record["kept_short"] == 2  # a and c keep fewer than 3 cleaned candidates
    assert json.loads((tmp_path / "kept.keep.json").read_text())["dropped"] == 1


def test_qa_file_reads_back_as_the_training_questions(tmp_path: Path) -> None:
    from dpr_cache.data.qas import read_qas

    records = [_record("a", [1, 0]), {**_record("b", [1, 0]), "question": '"Quoted" a\tb?'}]
    write_qa(_write(tmp_path / "t.jsonl", records), tmp_path / "t.qa.tsv")
    assert read_qas(tmp_path / "t.qa.tsv") == [("q a?", ["a"]), ('"Quoted" a\tb?', ["a"])]


def test_best_arm_is_the_higher_mrr_at_the_seed(tmp_path: Path) -> None:
    for arm, mrr in (("distill", 50.0), ("cleaned", 51.0)):
        path = tmp_path / arm / "gradcache-b128-s1" / "eval" / "metrics.json"
        path.parent.mkdir(parents=True)
        path.write_text(json.dumps({"mrr@10": mrr}))
    assert best_arm(tmp_path, "", 1)["arm"] == "cleaned"
    with pytest.raises(SystemExit, match="no finished run at seed 2"):
        best_arm(tmp_path, "", 2)


def test_a_runs_training_time_leaves_out_a_paused_step(tmp_path: Path) -> None:
    from studies.squad_batch_size.runs import _read_log, machine_hours
    from studies.squad_teachers.collect import median_train_seconds

    log = tmp_path / "train_log.jsonl"
    seconds = [27.0, 26.0, 1212.0, 28.0, 27.5]  # the third step spans a 20-minute pause
    keys = {"peak_memory_bytes": 1, "negatives_per_question": 7}
    lines = [json.dumps({"step": i + 1, "seconds": s, **keys}) for i, s in enumerate(seconds)]
    log.write_text("\n".join(lines) + "\n")
    run = _read_log(log)
    assert run["train_seconds"] == sum(seconds)  # the wall sum counts the pause
    assert median_train_seconds(run) == 5 * 27.5  # 5 updates at the median step
    timed = [{**run, "index_seconds": 30.0, "eval_seconds": 15.0}]
    assert machine_hours(timed, median_train_seconds) == 182.5 / 3600
    assert median_train_seconds({"train_wall_seconds": 900.0}) == 900.0  # no train log: wall time


@pytest.mark.parametrize("dry_run", ["0", "1"])
def test_setup_sourced_under_set_e_goes_on(tmp_path: Path, dry_run: str) -> None:
    out = tmp_path / "study-dry"
    script = (
        "set -euo pipefail; STUDY=squad_teachers PY=python DRY_RUN=$1 OUT=$2\n"
        'source studies/setup.sh\necho "B=$B SEEDS=$SEEDS CFG=$CFG"'
    )
    done = subprocess.run(
        ["bash", "-c", script, "bash", dry_run, str(out)],
        capture_output=True,
        text=True,
        cwd=REPO,
        env=child_env(),
    )
    assert done.returncode == 0, done.stderr
    expected = {
        "0": "B=128 SEEDS=1 2 3 CFG=configs/squad_reproduce.yaml",
        "1": "B=32 SEEDS=1 2 CFG=configs/toy.yaml",
    }
    assert done.stdout.strip() == expected[dry_run]
