"""studies/squad_crossfit's page writer: the two-level bootstrap (questions and seeds) against a
computation by hand, wider than the questions-only interval when seeds differ, zero for identical
arms; and the page, its data and its README block built from a study's folders cut part way."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import numpy as np
import pytest
import torch

from dpr_cache.data.batches import TrainBatches
from dpr_cache.data.sources import Source, load_sources
from dpr_cache.retrieval.metrics import hit_metrics
from dpr_cache.train.recipe import BatchRecipe
from studies.squad_batch_size.runs import collect
from studies.squad_crossfit import table
from studies.squad_crossfit.collect import (
    gather,
    positive_shares,
    scored_groups,
    teacher_margins,
    teacher_targets,
    two_level,
    updates,
)
from studies.squad_hard_negatives.collect import KS, METRICS, N_BOOT, RANKS_NAME, paired
from tests.support.fixtures import TOY


def _figures(rng: np.random.Generator, n: int, shift: float = 0.0) -> dict[str, np.ndarray]:
    """A run's per-question figures: each metric drawn at random, ``shift`` points added."""
    return {m: rng.uniform(0, 100, size=n) + shift for m in METRICS}


def _by_hand(ours: list[dict], theirs: list[dict], m: str) -> tuple[float, list[float]]:
    """The two-level bootstrap written out resample by resample (the module's draws: questions,
    then seeds, from default_rng(0))."""
    n, k = len(ours[0][m]), len(ours)
    rng = np.random.default_rng(0)
    questions = rng.integers(0, n, size=(N_BOOT, n))
    seeds = rng.integers(0, k, size=(N_BOOT, k))
    diffs = [a[m] - b[m] for a, b in zip(ours, theirs, strict=True)]
    boot = [np.mean([diffs[s][questions[b]].mean() for s in seeds[b]]) for b in range(N_BOOT)]
    mean = float(np.mean([d.mean() for d in diffs]))
    return mean, [float(np.percentile(boot, 2.5)), float(np.percentile(boot, 97.5))]


def test_two_level_bootstrap_against_a_hand_computation() -> None:
    rng = np.random.default_rng(7)
    ours = [_figures(rng, 30) for _ in range(3)]
    theirs = [_figures(rng, 30) for _ in range(3)]
    row = two_level("a - b", ours, theirs, [1, 2, 3])
    assert set(row) >= set(paired("a - b", ours, theirs, [1, 2, 3]))  # diffs_table reads both
    assert row["interval"] == "questions and seeds" and row["seeds"] == [1, 2, 3]
    for m in ("top1", "mrr@10"):
        mean, ci = _by_hand(ours, theirs, m)
        assert row[m] == pytest.approx(mean)
        assert row[m + "_ci"] == pytest.approx(ci, rel=1e-12)
        sd = np.std([(a[m] - b[m]).mean() for a, b in zip(ours, theirs, strict=True)], ddof=1)
        assert row[m + "_sd"] == pytest.approx(sd)
    # one seed: the seed draw is trivial, the interval the questions-only one, to the bit
    one = two_level("a - b", ours[:1], theirs[:1], [1])
    alone = paired("a - b", ours[:1], theirs[:1], [1])
    assert one["interval"] == "questions" and one["top1_sd"] is None
    assert all(one[m + "_ci"] == alone[m + "_ci"] and one[m] == alone[m] for m in METRICS)


def test_seed_to_seed_variance_widens_the_interval() -> None:
    """Negative control: the same per-question noise, the seeds' differences spread by +-6
    points; the questions-only interval over the seeds does not see the spread, the two-level
    one does."""
    rng = np.random.default_rng(3)
    n = 400
    theirs = [_figures(rng, n) for _ in range(3)]
    noise = [rng.normal(0, 5, size=n) for _ in range(3)]
    ours = [
        {m: t[m] + e + shift for m in METRICS}
        for t, e, shift in zip(theirs, noise, (-6.0, 0.0, 6.0), strict=True)
    ]
    both, questions = two_level("x", ours, theirs, [1, 2, 3]), paired("x", ours, theirs, [1, 2, 3])
    for m in METRICS:
        assert both[m] == pytest.approx(questions[m])  # the same difference, a wider interval
        lo, hi = both[m + "_ci"]
        qlo, qhi = questions[m + "_ci"]
        assert hi - lo > 3 * (qhi - qlo)
    # without the spread the two intervals are alike
    flat = [{m: t[m] + e for m in METRICS} for t, e in zip(theirs, noise, strict=True)]
    both, questions = two_level("x", flat, theirs, [1, 2, 3]), paired("x", flat, theirs, [1, 2, 3])
    width = both["top1_ci"][1] - both["top1_ci"][0]
    assert width < 1.5 * (questions["top1_ci"][1] - questions["top1_ci"][0])


def test_identical_arms_differ_by_zero() -> None:
    rng = np.random.default_rng(5)
    runs = [_figures(rng, 25) for _ in range(2)]
    row = two_level("same", runs, [dict(r) for r in runs], [1, 2])
    for m in METRICS:
        assert row[m] == 0.0 and row[m + "_ci"] == [0.0, 0.0] and row[m + "_sd"] == 0.0


# -- a study's folders, faked: each run's per-question ranks as a saved study keeps them ----------

N = 8  # dev questions
KEYS = {"peak_memory_bytes": 1, "negatives_per_question": 7}  # a train log line's other figures
SPLIT = {"a": list(range(0, N, 2)), "b": list(range(1, N, 2))}


def _json(path: Path, data) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(data))


def _ranks(folder: Path, ranks: list[int | None]) -> None:
    """An eval folder's saved ranks (0-based, None: no answer) and its metrics."""
    _json(folder / RANKS_NAME, ranks)
    figures = hit_metrics([np.inf if r is None else r for r in ranks], KS)
    _json(folder / "metrics.json", {m: float(figures[m].mean()) for m in METRICS})
    _json(folder / "timings.json", {"seconds": {"search": 1.5, "encode": 0.5}})


def _run(arm: Path, seed: int, ranks: list[int | None], hard: int = 3, fused: bool = True) -> None:
    run = arm / f"gradcache-b32-s{seed}"
    _json(
        run / "run.json",
        {
            "mode": "gradcache",
            "seed": seed,
            "hard_negatives": hard,
            "train_wall_seconds": 500.0,
            "index_seconds": 10.0,
            "eval_seconds": 5.0,
        },
    )
    seconds = (3.0, 900.0, 3.0)  # the second step spans a pause: 3 updates at 3 s
    log = "".join(
        json.dumps(
            {"step": i + 1, "seconds": t, "loss": seed + i, "grad_norm": 10 * seed + i, **KEYS}
        )
        + "\n"
        for i, t in enumerate(seconds)
    )
    (run / "train_log.jsonl").write_text(log)
    train = {"seed": seed, "batch_size": 2, "epochs": 2, "hard_negatives": 1}
    (run / "config.yaml").write_text(json.dumps({"train": {**train, "max_grad_norm": 2.0}}))
    _ranks(run / "eval", ranks)
    if fused:
        better = [0 if r is not None else 5 for r in ranks]
        _ranks(run / "eval-rrf", better)
        for half, rows in SPLIT.items():
            _ranks(run / f"eval-linear-{half}", [better[i] for i in rows])
            _json(run / f"eval-linear-{half}" / "fusion.json", {"weight": 2.0})


def _scored(path: Path, groups: list[tuple[float, list[float]]]) -> None:
    """A students' training file: each question's positive's and candidates' teacher scores."""
    lines = []
    for positive, candidates in groups:
        ctx = lambda t: {"passage_id": "1", "title": "", "text": "", "teacher_score": t}  # noqa: E731
        record = {"question": "q", "answers": ["a"], "positive_ctxs": [ctx(positive)]}
        record["hard_negative_ctxs"] = [ctx(t) for t in candidates]
        lines.append(json.dumps(record) + "\n")
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text("".join(lines))


def _set_up(out: Path, folds: tuple[int, ...] = (1, 2), teacher: bool = True) -> None:
    """BM25 on dev (its DPR results file), the dev halves, the folds, each fold's round 1 and
    teacher and, with ``teacher``, the pooled temperature and the students' files' counts."""
    flags = [[j == i % 3 for j in range(5)] for i in range(N)]
    entries = [
        {
            "question": "q",
            "answers": ["a"],
            "ctxs": [{"id": str(j), "has_answer": f} for j, f in enumerate(row)],
        }
        for row in flags
    ]
    _json(out / "references-dry" / "bm25" / "eval" / "retrieval.json", entries)
    _json(out / "references-dry" / "bm25" / "eval" / "metrics.json", {"top1": 1.0})
    _json(out / "references-dry" / "bm25" / "run.json", {"mode": "bm25", "eval_seconds": 3.0})
    _json(out / "dev-split" / "split.json", SPLIT)
    _json(out / "folds" / "folds.json", {"questions": [40, 60], "articles": [["x"], ["y", "z"]]})
    mined = {
        "questions": 40,
        "negatives": 1200,
        "candidates": 1300,
        "short": 2,
        "kept_bm25": 1000,
        "dropped": {"positive_id": 30, "positive_text": 0, "answer": 70, "margin": 0},
        "seconds": 60.0,
    }
    scored = {"questions": 40, "positives": 40, "hard_negatives": 2200, "cleaned": 0}
    for k in folds:
        _run(out / f"round1-fold{k}-dry", 1, [0, 1, None, 3, 0, 2, 1, 0], hard=1, fused=False)
        t = out / f"teacher-{k}"
        _json(t / "weight" / "fusion.json", {"weight": 0.5 * k, "grid": {f"{0.5 * k:g}": 61.25}})
        _json(t / "weight" / "metrics.json", {"top1": 80.0 + k, "mrr@10": 86.0, "top5": 93.0})
        _json(t / "weight" / "timings.json", {"seconds": {"search": 30.0}})
        _json(t / "mined.summary.json", mined)
        _json(t / "scored.summary.json", {**scored, "seconds": 100.0})
        _json(t / "bm25-scored.summary.json", {**scored, "seconds": 10.0})
        cleaned = {**scored, "hard_negatives": 2000, "cleaned": 200, "seconds": 100.0}
        _json(t / "cleaned.summary.json", cleaned)
    if teacher:
        _json(
            out / "teacher" / "teacher.json",
            {
                "teacher_temperature": 0.4,
                "weight": [0.5, 1.0],
                "train_temperature": 0.05,
                "groups": 100,
                "candidates_a_group": 55.0,
                "spread": {"teacher": 2.0, "round1": 5.0},
                "positive_first": {"teacher": 90.0, "round1": 60.0, "bm25": 70.0},
            },
        )
        parts = {"questions": 2, "pairs": 4, "bm25": -1.5, "round1": 2.0, "round1_cosine": 3.0}
        _json(
            out / "teacher" / "margins.json",
            {**parts, "bm25_variance": 60.0, "round1_variance": 9.6},
        )
        _json(
            out / "train.scored.keep.json", {"hard": 3, "kept": 100, "dropped": 0, "kept_short": 0}
        )
        _scored(out / "train.scored.jsonl", [(10.0, [7.0, 12.0]), (5.0, [1.0])])
        _json(
            out / "train.cleaned.keep.json", {"hard": 3, "kept": 100, "dropped": 0, "kept_short": 4}
        )


def _page(out: Path, monkeypatch, reading: Path | None = None) -> tuple[str, str]:
    """The table's command line, as run.sh calls it (with a README holding the markers), closed
    by ``reading`` if given, never by the study's own reading.md."""
    readme = out / "README.md"
    readme.write_text(f"# x\n\n{table.README_BEGIN}\nSTALE\n{table.README_END}\nafter\n")
    argv = ["table", "--runs", str(out), "--suffix=-dry", "--readme", str(readme)]
    argv += ["--md", str(out / "results.md"), "--png", str(out / "plot.png")]
    argv += ["--reading", str(reading or out / "no-reading.md")]
    monkeypatch.setattr(sys, "argv", argv)
    table.main()
    return (out / "results.md").read_text(), readme.read_text()


def test_the_page_of_a_study_cut_part_way(tmp_path: Path, monkeypatch) -> None:
    out = tmp_path / "crossfit-dry"
    _set_up(out)
    control = [0, 1, 2, None, 0, 4, 0, 1]
    _run(out / "control-dry", 1, control)
    _run(out / "control-dry", 2, [0, 1, 0, None, 3, 4, 0, 1])
    _run(out / "kl05-dry", 1, [0, 0, 2, 1, 0, 4, 0, 0])
    _run(out / "kl05-dry", 2, [0, 0, 2, 1, 0, 0, 0, 0])
    _run(out / "kl0-dry", 1, control, fused=False)  # trained, not fused with BM25 yet
    reading = out / "reading.md"
    reading.write_text("## Reading\n\nWritten by hand.\n")
    page, readme = _page(out, monkeypatch, reading)
    assert page.endswith("\n\n## Reading\n\nWritten by hand.\n")  # the reading closes the page
    for row in (
        "| BM25 (bm25s) | – | – | – |",
        "| round 1, fold 1: BM25 negatives, H = 1, trained without fold 1 | 1 | 1 | 3 |",
        "| control: contrastive | 1,2 | 3 | 3 |",
        "| kl0: distill_kl alone | 1 | 3 | 3 |",
        "| kl0 - control, seed 1 | +0.0 [+0.0, +0.0] |",
        "| kl05 - control, seed 2 |",
        "| kl05 - control, seeds 1,2 (questions and seeds) |",
        "| control s2 | linear | 2 / 2 |",
        "| BM25 + kl05 - BM25 + control (linear), seeds 1,2 (questions and seeds) |",
        "| 1 | 40 | 1 | 0.5 | 61.2 | 81.0 | 86.0 |",
        "| 2 | 40 | 1,200 | 1,000 | 55.0 | 2 | 1,300 | 70 | 30 | 2,200 | 200 (9.1%) |",
        "| teacher, fold 2: weight, mining, scoring, cleaning | 0.08 |",
        "| kl05 ahead of the control at top-1 and MRR@10, each interval (questions and seeds) "
        "above 0 |",
        "| pending (2 of 3 seeds) |",  # two seeds: a goal waits for the third
        "| at most 15 machine hours on this 2-core CPU |",
        "| a dense model alone at BM25's top-1 (79.5) | best arm: kl05,",
        "covers both the questions and the seeds",
        # margins 3, -2 and 4: mean 5/3, mean square 29/3, one of three at or above the positive
        "3 (positive, candidate) pairs",
        "mean 1.7 (sd 3.2), 10th, 50th and 90th percentiles -1.0, 3.0 and 3.8, mean square 9.7; "
        "33.3% of the candidates",
        "a cosine gap of 0.08",
        "Over the folds' 2 scored questions' 4 pairs (before the students' file left out those "
        "with too few candidates), BM25's part averages -1.5 and "
        "round 1's 2.0: round 1's own cosine gap averages 3.00, where `margin_mse` asks the "
        "student for 0.08. The variance of BM25's part is 60% of the margins', round 1's 10%",
        # kl0 at seed 1: 2 epochs of one update of the file's 2 questions, one candidate each
        "softmax(teacher / 0.4) over a question's group",
        "In the groups kl0 trained on (seed 1: 4 groups, every question of every update)",
        # question 2: 1 / (1 + e^-10) both epochs; question 1 drew 7 both epochs (seed 1's
        # draw): 1 / (1 + e^-7.5); 12 would give 1 / (1 + e^5), a mean below 75%
        "it puts a mean 100.0% of its probability on the positive (median 99.97%): more than "
        "99% in 100.0% of the groups, less than half in 0.0%",
        "(`train.max_grad_norm`: 2)",
        # control's logs: seed 1 losses 1, 2, 3 and norms 10, 11, 12; seed 2's 2, 3, 4 and 20-22
        "| control | 1,2 | 6 | 2.50 [1.00, 4.00] | 16.00 [10.00, 22.00] |",
        "| kl0 | 1 | 3 | 2.00 [1.00, 3.00] | 11.00 [10.00, 12.00] |",
    ):
        assert row in page, row
    assert "kl0 s1 |" not in page  # no fusions yet: no hybrid row
    assert "| mse05" not in page and "| cleaned:" not in page  # arms not started
    data = json.loads((out / "results.json").read_text())
    pooled = next(d for d in data["diffs"] if d["pair"].startswith("kl05 - control, seeds"))
    assert pooled["interval"] == "questions and seeds" and pooled["seeds"] == [1, 2]
    # the README block: the retrievers, the pooled differences (or the one seed), the goals
    block = readme.split(table.README_BEGIN)[1].split(table.README_END)[0]
    assert readme.endswith(f"{table.README_END}\nafter\n") and "STALE" not in block
    assert "| kl05 - control, seeds 1,2 (questions and seeds) |" in block
    assert "| kl0 - control, seed 1 |" in block and "| kl05 - control, seed 1 |" not in block
    kl0 = next(line for line in block.splitlines() if line.startswith("| kl0 ahead"))
    assert kl0.endswith("| pending (1 of 3 seeds) |")  # one seed: never judged met
    assert (out / "plot.png").stat().st_size > 0
    # --kept writes the same page from results.json
    monkeypatch.setattr(sys, "argv", [*sys.argv, "--kept"])
    table.main()
    assert (out / "results.md").read_text() == page


def test_the_page_before_any_student(tmp_path: Path, monkeypatch) -> None:
    out = tmp_path / "crossfit-dry"
    _set_up(out, folds=(1,), teacher=False)  # fold 2's round 1 not trained yet
    page, readme = _page(out, monkeypatch)
    assert "| round 1, fold 1:" in page and "| round 1, fold 2:" not in page
    assert "| 1 | 40 | 1 | 0.5 |" in page and "softmax temperature" not in page
    assert "| control" not in page and "| goal | measured | met |" in readme
    # nothing but the dev halves: a page all the same
    bare = tmp_path / "bare-dry"
    _json(bare / "dev-split" / "split.json", SPLIT)
    page, _ = _page(bare, monkeypatch)
    assert "(the teachers are not set up yet)" in page and "0 questions" in page
    assert "(no students' file yet, and no student trained)" in page
    assert gather(bare, "-dry")["hours"] == 0.0


def test_a_resumed_runs_repeated_steps_count_once(tmp_path: Path) -> None:
    arm = tmp_path / "kl0"
    _run(arm, 1, [0] * N)
    log = arm / "gradcache-b32-s1" / "train_log.jsonl"
    lines = log.read_text().splitlines()
    cut = json.loads(lines[1])
    # the run was cut after step 2 and resumed: step 2 logged again, with the resumed figures
    log.write_text("\n".join([*lines[:2], json.dumps({**cut, "loss": 9.0}), lines[2]]) + "\n")
    (row,) = updates(tmp_path, "", {"kl0": collect(arm)})
    assert row["updates"] == 3 and row["loss"] == [3.0, 1.0, 9.0]
    assert row["grad_norm"] == [11.0, 10.0, 12.0] and row["clip"] == 2.0
    # a log without the figures (an older run's): no row
    log.write_text(json.dumps({"step": 1, "seconds": 3.0, **KEYS}) + "\n")
    assert updates(tmp_path, "", {"kl0": collect(arm)}) == []


def test_the_teachers_margins_by_hand(tmp_path: Path) -> None:
    train = tmp_path / "train.scored.jsonl"
    _scored(train, [(10.0, [7.0, 12.0, 10.0]), (5.0, [1.0]), (2.0, [])])
    groups = scored_groups(train)
    assert groups is not None
    got = teacher_margins(groups)
    assert got["questions"] == 3 and got["pairs"] == 4  # margins 3, -2, 0, 4
    assert got["mean"] == pytest.approx(5 / 4) and got["mean_square"] == pytest.approx(29 / 4)
    assert got["sd"] == pytest.approx(
        ((3 - 1.25) ** 2 + 3.25**2 + 1.25**2 + 2.75**2) ** 0.5 / 3**0.5
    )
    assert got["percentiles"]["50"] == pytest.approx(1.5)  # halfway between 0 and 3
    assert got["not_below"] == pytest.approx(50.0)  # -2 and 0: a tie counts
    assert scored_groups(tmp_path / "absent.jsonl") is None


def _shares(train: Path, runs: list[dict], tokenizer, cache: Path) -> list[float]:
    """The positive's share of softmax(teacher / 0.5) in each group of the very batches the
    trainer builds: the training file loaded as training loads it, each step's batch by
    BatchRecipe, the teacher's scores its rows carry."""
    dataset = load_sources([Source(train, train.stem)], cache, scored_negatives=2).dataset
    shares = []
    for run in runs:
        recipe = BatchRecipe(2, 8, 8, run["seed"], teacher_scores=True)
        batches = TrainBatches(len(dataset), run["batch_size"], run["seed"])
        for step in range(run.get("max_steps") or run["epochs"] * batches.steps_per_epoch):
            scores = recipe.batch(dataset, batches, tokenizer, step).teacher_scores
            assert scores is not None
            shares += torch.softmax(scores.view(-1, 3) / 0.5, dim=1)[:, 0].tolist()
    return shares


def test_the_teachers_targets_are_those_of_the_training_batches(tmp_path: Path) -> None:
    from transformers import AutoTokenizer

    rng = np.random.default_rng(3)

    def ctx(pid: str, mean: float = 0.0) -> dict:
        score = rng.normal(mean, 3)
        return {"passage_id": pid, "title": "t", "text": "x", "teacher_score": score}

    records = [
        {
            "question": f"q{i}",
            "answers": ["a"],
            "positive_ctxs": [ctx(f"p{i}", mean=4.0)],
            "hard_negative_ctxs": [ctx(f"h{i}.{j}") for j in range(2 + i % 3)],
        }
        for i in range(6)
    ]
    train = tmp_path / "train.scored.jsonl"
    train.write_text("".join(json.dumps(r) + "\n" for r in records))
    tokenizer = AutoTokenizer.from_pretrained(TOY / "tiny-bert")
    groups = scored_groups(train)
    assert groups is not None
    runs = [{"seed": s, "batch_size": 4, "epochs": 2, "hard_negatives": 2} for s in (1, 2)]
    want = _shares(train, runs, tokenizer, tmp_path / "cache")
    got = [p for run in runs for p in positive_shares(groups, 0.5, run)]
    assert got == pytest.approx(want, rel=1e-6) and len(got) == 16  # 2 runs x 2 updates x 4
    p = np.asarray(want)
    assert 0 < (p > 0.99).mean() and 0 < (p < 0.5).mean()  # both ends of the page's figures met
    summary = teacher_targets(groups, 0.5, runs)
    assert summary is not None and summary["groups"] == 16 and summary["seeds"] == [1, 2]
    assert summary["mean"] == pytest.approx(100 * p.mean())
    assert summary["median"] == pytest.approx(100 * np.median(p))
    assert summary["over_99"] == pytest.approx(100 * (p > 0.99).mean())
    assert summary["under_half"] == pytest.approx(100 * (p < 0.5).mean())
    # a run cut short by train.max_steps: its updates only
    short = {**runs[0], "max_steps": 1}
    assert list(positive_shares(groups, 0.5, short)) == pytest.approx(
        _shares(train, [short], tokenizer, tmp_path / "cache")
    )
    # negative controls: the file's first two candidates in place of the draw, and the first
    # epoch's draw in both epochs, each give other shares
    first = [{**g, "hard_negative_ctxs": g["hard_negative_ctxs"][:2]} for g in groups]
    assert [p for run in runs for p in positive_shares(first, 0.5, run)] != pytest.approx(want)
    one_epoch = {**runs[0], "epochs": 1}
    again = [*positive_shares(groups, 0.5, one_epoch), *positive_shares(groups, 0.5, one_epoch)]
    assert again != pytest.approx(want[:8])
    assert teacher_targets(groups, 0.5, []) is None
    # a question with fewer candidates than H: refused, as training refuses it
    with pytest.raises(ValueError, match="fewer than 3 scored candidates"):
        list(positive_shares(groups, 0.5, {**runs[0], "hard_negatives": 3}))


def test_a_goal_is_judged_over_three_seeds_met_or_not(tmp_path: Path, monkeypatch) -> None:
    out = tmp_path / "crossfit-dry"
    _set_up(out)
    for seed in (1, 2, 3):
        _run(out / "control-dry", seed, [3] * N)
        _run(out / "kl05-dry", seed, [0] * N)  # first at every question, every seed
        _run(out / "kl0-dry", seed, [3] * N)  # the control's figures: no gain
    page, _ = _page(out, monkeypatch)
    goals = {line.split(" ahead")[0]: line for line in page.splitlines() if " ahead of" in line}
    assert goals["| kl05"].endswith("| yes |")
    assert goals["| kl0"].endswith("| no |")  # negative control: equal figures are not ahead
    assert "seeds 1,2,3 (questions and seeds)" in goals["| kl05"]
