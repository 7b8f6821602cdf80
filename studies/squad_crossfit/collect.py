"""The cross-fitted teacher study's runs read back as data: BM25, the two folds' round 1s and each
student arm over its seeds, each dev question's figures, each treatment minus the control (by seed,
and over the seeds with an interval that covers both the questions and the seeds), the students
fused with BM25, each fold's teacher and candidates, and what each part cost. A study cut part way
gives the part it has."""

from __future__ import annotations

import json
import statistics
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numpy as np
import yaml

from dpr_cache.data.batches import TrainBatches
from dpr_cache.data.collate import choose_step_negatives, negatives_rng
from dpr_cache.data.training import iter_training_examples
from studies.squad_batch_size.runs import collect, machine_hours
from studies.squad_hard_negatives.collect import METRICS, N_BOOT, paired, per_question
from studies.squad_teachers.collect import arm_rows, fused_runs, hybrid_hours, read_json

FOLDS = (1, 2)
ROUND1 = {  # folder -> its name on the page: round 1 of fold k scores fold k's questions
    f"round1-fold{k}": f"round 1, fold {k}: BM25 negatives, H = 1, trained without fold {k}"
    for k in FOLDS
}
ARMS = {  # folder -> the arm's name on the page
    "control": "control: contrastive",
    "kl0": "kl0: distill_kl alone",
    "kl05": "kl05: distill_kl + contrastive (0.5)",
    "mse05": "mse05: margin_mse + contrastive (0.5)",
    "cleaned": "cleaned: contrastive, teacher-cleaned candidates",
}
TREATMENTS = ("kl0", "kl05", "mse05", "cleaned")
DISTILLED = ("kl0", "kl05", "mse05")
SUMMARIES = ("mined", "scored", "bm25-scored", "cleaned")  # teacher-k/<kind>.summary.json
QUANTILES = (10, 50, 90)  # the teacher's margins' percentiles on the page
BOTH = "questions and seeds"  # what a pooled row's interval covers


def two_level(name: str, ours: list[dict], theirs: list[dict], seeds: list) -> dict[str, Any]:
    """``ours - theirs`` per metric in points over the seeds both ran (the lists paired by seed,
    each a run's per-question figures), as :func:`paired` gives it, but with a 95% interval that
    covers the seeds as well as the questions: a two-level bootstrap. Each of ``N_BOOT``
    resamples draws the dev questions with replacement (the same draw for every seed) and the
    seeds with replacement, and averages the drawn seeds' mean per-question differences; the
    interval is the 2.5 and 97.5 percentiles. The draws: ``default_rng(0)``, the questions first
    (``integers(0, n, (N_BOOT, n))``, :func:`paired`'s own draw), then the seeds
    (``integers(0, k, (N_BOOT, k))``); with one seed the interval is :func:`paired`'s."""
    n, k = len(ours[0]["top1"]), len(ours)
    rng = np.random.default_rng(0)
    questions = rng.integers(0, n, size=(N_BOOT, n))
    drawn = rng.integers(0, k, size=(N_BOOT, k))
    covers = BOTH if k > 1 else "questions"
    row: dict[str, Any] = {"pair": name, "seeds": seeds, "questions": n, "interval": covers}
    for m in METRICS:
        diffs = [a[m] - b[m] for a, b in zip(ours, theirs, strict=True)]
        by_seed = np.stack([d[questions].mean(axis=1) for d in diffs], axis=1)  # [N_BOOT, k]
        boot = np.take_along_axis(by_seed, drawn, axis=1).mean(axis=1)
        row[m] = float(np.mean([d.mean() for d in diffs]))
        row[m + "_ci"] = [float(np.percentile(boot, 2.5)), float(np.percentile(boot, 97.5))]
        row[m + "_sd"] = statistics.stdev(d.mean() for d in diffs) if k > 1 else None
    return row


def _seeds(per_q: dict, arm: str, base: str = "control") -> list:
    """The seeds at which both ``arm`` and ``base`` have per-question figures."""
    return sorted(s for a, s in per_q if a == arm and (base, s) in per_q)


def _listed(seeds: list) -> str:
    """The seeds of a row over seeds and, with two or more, what its interval covers, as the
    row's name says them."""
    return ",".join(map(str, seeds)) + (f" ({BOTH})" if len(seeds) > 1 else "")


def _differences(per_q: dict) -> list[dict[str, Any]]:
    """Each treatment minus the control at each seed both ran (an interval over the questions)
    and, with two or more, over those seeds (an interval over the questions and the seeds)."""
    diffs = []
    for arm in TREATMENTS:
        seeds = _seeds(per_q, arm)
        for s in seeds:
            diffs.append(
                paired(f"{arm} - control, seed {s}", [per_q[arm, s]], [per_q["control", s]], [s])
            )
        if len(seeds) > 1:
            diffs.append(_against_control(f"{arm} - control", per_q, arm, seeds))
    return diffs


def _against_control(name: str, figures: dict, arm: str, seeds: list[int]) -> dict[str, Any]:
    """``arm`` minus the control in ``figures`` (by arm and seed) over ``seeds``, the interval
    over the questions and the seeds."""
    return two_level(
        f"{name}, seeds {_listed(seeds)}",
        [figures[arm, s] for s in seeds],
        [figures["control", s] for s in seeds],
        seeds,
    )


def _hybrid_diffs(linear: dict, bm25: dict | None) -> list[dict[str, Any]]:
    """Each arm fused with BM25 (linear) minus BM25 alone, and each treatment's fused figures
    minus the control's, over the seeds (the interval over the questions and the seeds)."""
    diffs = []
    for arm in ARMS:
        seeds = sorted(s for a, s in linear if a == arm)
        if seeds and bm25 is not None:
            diffs.append(
                two_level(
                    f"BM25 + {arm} (linear) - BM25, seeds {_listed(seeds)}",
                    [linear[arm, s] for s in seeds],
                    [bm25] * len(seeds),
                    seeds,
                )
            )
    for arm in TREATMENTS:
        seeds = _seeds(linear, arm)
        if seeds:
            name = f"BM25 + {arm} - BM25 + control (linear)"
            diffs.append(_against_control(name, linear, arm, seeds))
    return diffs


def _timings_seconds(path: Path) -> float:
    """The seconds an eval's timings.json records (0 when there is none)."""
    return sum(json.loads(path.read_text())["seconds"].values()) if path.is_file() else 0.0


def _teacher(out: Path) -> dict[str, Any]:
    """Each fold's teacher (its weight, tuned on the fold's questions, and its fused dev
    figures), its candidates (mine's and score's summaries) and seconds; the pooled temperature
    and spreads; the students' training files' counts."""
    folds = read_json(out / "folds" / "folds.json")
    by_fold = []
    for k in FOLDS:
        teacher = out / f"teacher-{k}"
        fusion = read_json(teacher / "weight" / "fusion.json")
        dev = read_json(teacher / "weight" / "metrics.json")
        fold: dict[str, Any] = {
            "fold": k,
            "questions": folds["questions"][k - 1] if folds else None,
            "articles": len(folds["articles"][k - 1]) if folds else None,
            "weight": fusion["weight"] if fusion else None,
            "tune_metric": fusion.get("tune_metric") if fusion else None,
            "grid": fusion.get("grid") if fusion else None,
            "dev": {m: dev[m] for m in METRICS if m in dev} if dev else None,
        }
        for kind in SUMMARIES:
            fold[kind] = read_json(teacher / f"{kind}.summary.json")
        fold["seconds"] = _timings_seconds(teacher / "weight" / "timings.json") + sum(
            fold[kind]["seconds"] for kind in SUMMARIES if fold[kind]
        )
        by_fold.append(fold)
    return {
        "folds": by_fold,
        "teacher": read_json(out / "teacher" / "teacher.json"),
        "margin_parts": read_json(out / "teacher" / "margins.json"),
        "scored_keep": read_json(out / "train.scored.keep.json"),
        "cleaned_keep": read_json(out / "train.cleaned.keep.json"),
    }


def scored_groups(train: Path) -> list[dict[str, Any]] | None:
    """Each question of the students' training file in its order, read by the training's own
    parser (which drops a question without a positive, as DPR does): its positive's and its
    candidates' passage ids and teacher scores (None when the file is absent)."""
    if not train.is_file():
        return None
    return [
        {key: [_id_and_score(c) for c in example[key]] for key in _GROUP_KEYS}
        for example in iter_training_examples(train)
    ]


_GROUP_KEYS = ("positive_ctxs", "hard_negative_ctxs")


def _id_and_score(ctx: dict[str, Any]) -> dict[str, Any]:
    return {"passage_id": ctx["passage_id"], "teacher_score": ctx.get("teacher_score")}


def teacher_margins(groups: list[dict[str, Any]]) -> dict[str, Any]:
    """The teacher's margins over ``groups`` (:func:`scored_groups`): for each question, its
    positive's ``teacher_score`` minus each candidate's, the pairs ``margin_mse`` draws its
    targets from. Their count, mean, sd, mean square and percentiles, and the share of
    candidates the teacher scores at or above the positive."""
    margins: list[float] = []
    for group in groups:
        positive = group["positive_ctxs"][0]["teacher_score"]
        margins += [positive - c["teacher_score"] for c in group["hard_negative_ctxs"]]
    m = np.asarray(margins)
    return {
        "questions": len(groups),
        "pairs": len(m),
        "mean": float(m.mean()),
        "sd": float(m.std(ddof=1)),
        "mean_square": float((m**2).mean()),
        "percentiles": {str(q): float(np.percentile(m, q)) for q in QUANTILES},
        "not_below": float(100 * (m <= 0).mean()),
    }


def positive_shares(
    groups: list[dict[str, Any]], temperature: float, train: dict[str, Any]
) -> Iterator[float]:
    """For every question of every update of a run (``train``: its ``train`` config), the
    positive's share of softmax(teacher / ``temperature``) over its group: the positive and the
    H candidates the run drew for it that epoch (the training's own batches and draw)."""
    hard = train["hard_negatives"]
    batches = TrainBatches(len(groups), train["batch_size"], train["seed"])
    steps = train.get("max_steps") or train["epochs"] * batches.steps_per_epoch
    for step in range(steps):
        epoch = batches.epoch_of(step)
        for i in batches.batch_indices(step):
            if len(groups[i]["hard_negative_ctxs"]) < hard:
                raise ValueError(f"question {i}: fewer than {hard} scored candidates")
            rng = negatives_rng(train["seed"], epoch, i)
            drawn = choose_step_negatives(groups[i], hard, rng, groups)
            rows = [groups[i]["positive_ctxs"][0], *drawn]
            scores = np.array([c["teacher_score"] for c in rows]) / temperature
            yield float(1 / np.exp(scores - scores[0]).sum())


def teacher_targets(
    groups: list[dict[str, Any]], temperature: float, runs: list[dict[str, Any]]
) -> dict[str, Any] | None:
    """What ``distill_kl`` asks of the student in the groups ``runs`` trained on
    (:func:`positive_shares` of each run): the positive's share's mean and median, and the
    shares (%) of groups above 99% and below a half; None without a run."""
    shares = [p for train in runs for p in positive_shares(groups, temperature, train)]
    if not shares:
        return None
    p = np.asarray(shares)
    return {
        "temperature": temperature,
        "seeds": [train["seed"] for train in runs],
        "groups": len(p),
        "mean": float(100 * p.mean()),
        "median": float(100 * np.median(p)),
        "over_99": float(100 * (p > 0.99).mean()),
        "under_half": float(100 * (p < 0.5).mean()),
    }


def updates(out: Path, suffix: str, runs_of: dict[str, list[dict]]) -> list[dict[str, Any]]:
    """Each arm's logged updates over its seeds (``runs_of``: :func:`collect`'s records): the
    loss and the gradient's norm before clipping, each as its median, least and greatest over
    every update of every seed, and the clip (the first run's ``train.max_grad_norm``)."""
    rows = []
    for folder, runs in runs_of.items():
        steps = [step for r in runs for step in r.get("updates", {}).values()]
        if not steps:
            continue
        row: dict[str, Any] = {"folder": folder, "seeds": [r["seed"] for r in runs]}
        row["updates"] = len(steps)
        config = out / f"{folder}{suffix}" / runs[0]["dir"] / "config.yaml"
        train = yaml.safe_load(config.read_text())["train"] if config.is_file() else {}
        row["clip"] = train.get("max_grad_norm")
        for key, values in zip(("loss", "grad_norm"), zip(*steps, strict=True), strict=True):
            row[key] = [statistics.median(values), min(values), max(values)]
        rows.append(row)
    return rows


def _kl0_targets(
    out: Path, suffix: str, groups: list | None, teacher: dict[str, Any], runs: list[dict]
) -> dict[str, Any] | None:
    """:func:`teacher_targets` over kl0's runs (``distill_kl`` alone), at the teacher's
    temperature; None before the file, the temperature or a kl0 run."""
    temperature = (teacher.get("teacher") or {}).get("teacher_temperature")
    if not groups or temperature is None:
        return None
    configs = [out / f"kl0{suffix}" / r["dir"] / "config.yaml" for r in runs]
    trains = [yaml.safe_load(c.read_text())["train"] for c in configs if c.is_file()]
    return teacher_targets(groups, temperature, trains)


def gather(out: Path, suffix: str = "") -> dict[str, Any]:
    """Everything the page shows, computed from the run folders under ``out``."""
    rows, runs_of, per_q = arm_rows(out, suffix, {**ROUND1, **ARMS})
    bm25_file = out / f"references{suffix}" / "bm25" / "eval" / "retrieval.json"
    bm25_done = bm25_file.is_file() or bm25_file.with_name("retrieval.ranks.json").is_file()
    bm25 = per_question(bm25_file) if bm25_done else None
    students = {folder: runs for folder, runs in runs_of.items() if folder in ARMS}
    hybrids, linear = fused_runs(out, suffix, students)
    teacher = _teacher(out)
    costs = {row["folder"]: row["hours"] for row in rows}
    costs["BM25 on dev"] = machine_hours(collect(out / f"references{suffix}"))
    for fold in teacher["folds"]:
        costs[f"teacher, fold {fold['fold']}: weight, mining, scoring, cleaning"] = (
            fold["seconds"] / 3600
        )
    costs["fused evaluations"] = hybrid_hours(out, suffix)
    # the same parts with each run's training at the wall time its calls recorded
    recorded = {folder: machine_hours(runs) for folder, runs in runs_of.items()}
    wall_hours = sum(recorded.values()) + sum(h for k, h in costs.items() if k not in recorded)
    groups = scored_groups(out / "train.scored.jsonl")
    questions = bm25 or next(iter(per_q.values()), None)
    return {
        "references": (
            [{"arm": "BM25 (bm25s)", **{m: float(bm25[m].mean()) for m in METRICS}}] if bm25 else []
        ),
        "arms": rows,
        "diffs": _differences(per_q),
        "hybrids": hybrids,
        "hybrid_diffs": _hybrid_diffs(linear, bm25),
        "setup": teacher,
        "margins": teacher_margins(groups) if groups else None,
        "targets": _kl0_targets(out, suffix, groups, teacher, runs_of.get("kl0", [])),
        "updates": updates(out, suffix, students),
        "costs": costs,
        "hours": sum(costs.values()),
        "wall_hours": wall_hours,
        "questions": len(questions["top1"]) if questions else 0,
    }
