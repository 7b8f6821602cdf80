"""The batch-size study's runs read back: records, recipe check, arms averaged over seeds, and
the paired difference of each GradCache run with the accumulation run of its seed and lr."""

from __future__ import annotations

import json
import statistics
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np

from dpr_cache.retrieval.metrics import first_relevant_rank, hit_metrics
from dpr_cache.retrieval.results import answer_flags
from dpr_cache.runtime.atomic import read_lines

KS = (1, 5, 20, 100)
METRICS = (*(f"top{k}" for k in KS), "mrr@10")
RECIPE_KEYS = (
    "epochs",
    "warmup_pct",
    "chunk_size",
    "max_passage_length",
    "temperature",
    "dry_run",
    "n_questions",
)
TRAINED = ("full", "accumulate", "gradcache")


def _read_log(path: Path) -> dict[str, Any]:
    """Peak memory, summed, median and fastest step seconds, step count, per-step batch digests
    and each step's (loss, gradient norm before clipping) by step, of a train_log.jsonl (empty
    if none)."""
    lines = [json.loads(line) for line in read_lines(path)]
    if not lines:
        return {}
    return {
        "peak_memory_bytes": max(r["peak_memory_bytes"] for r in lines),
        "train_seconds": sum(r["seconds"] for r in lines),
        "median_step_seconds": statistics.median(r["seconds"] for r in lines),
        "fastest_step_seconds": min(r["seconds"] for r in lines),
        "steps": lines[-1]["step"],
        "negatives_per_question": lines[-1]["negatives_per_question"],
        "digests": [r.get("batch_digest") for r in lines],
        "updates": {
            r["step"]: (r["loss"], r["grad_norm"])
            for r in lines
            if "loss" in r and "grad_norm" in r
        },
    }


def collect(runs: Path) -> list[dict[str, Any]]:
    """One record per finished run (run.json and eval/metrics.json present)."""
    records = []
    for run_json in sorted(runs.glob("*/run.json")):
        metrics = run_json.parent / "eval" / "metrics.json"
        if not metrics.is_file():
            continue
        record = json.loads(run_json.read_text())
        record.update(json.loads(metrics.read_text()))
        record.update(_read_log(run_json.parent / "train_log.jsonl"))
        record["dir"] = run_json.parent.name
        records.append(record)
    return records


def arm_key(record: dict[str, Any]) -> tuple[str, int, float]:
    """What a run trained with, seeds aside: (mode, batch size, lr)."""
    return record["mode"], int(record["batch_size"]), float(record["lr"])


ARM_ORDER = {"full": 1, "accumulate": 2, "gradcache": 3}
REFERENCES = {"bm25": "BM25 (bm25s, as mined)", "none": "all-MiniLM-L6-v2 off the shelf"}


def arm_order(row: dict[str, Any]) -> tuple[float, int, int]:
    """Where an arm sits in the tables: by lr, then sequential, accumulation, GradCache."""
    return float(row["lr"]), ARM_ORDER.get(row["mode"], 9), int(row["batch_size"])


def diff_order(d: dict[str, Any]) -> tuple:
    """Where a paired difference sits: by lr and batch, each seed, then the rows over seeds."""
    seeds = tuple(d["seeds"]) if d["seed"] == "all" else (int(d["seed"]),)
    return float(d["lr"]), int(d["batch_size"]), d["seed"] == "all", seeds


def train_seconds(record: dict[str, Any]) -> float:
    """A run's training time: the wall seconds its script recorded, or the sum of its logged
    steps' seconds when that is larger (a session that ended mid-run recorded no wall time)."""
    return max(record.get("train_wall_seconds") or 0.0, record.get("train_seconds") or 0.0)


def machine_hours(
    records: list[dict[str, Any]], train: Callable[[dict[str, Any]], float] = train_seconds
) -> float:
    """Hours of every train, index and eval command behind the records, a run's training counted
    by ``train``."""
    keys = ("index_seconds", "eval_seconds")
    return sum(train(r) + sum(r.get(k) or 0.0 for k in keys) for r in records) / 3600


def references(records: list[dict[str, Any]]) -> list[tuple[str, dict[str, Any]]]:
    """The untrained rows among the records (BM25 as mined, the encoder off the shelf): their
    names and metrics."""
    return [
        (REFERENCES[r["mode"]], {m: r[m] for m in METRICS if r.get(m) is not None})
        for r in records
        if r["mode"] in REFERENCES
    ]


def arm_label(mode: str, batch: int, lr: float, chunk: int, base_lr: float) -> str:
    """The paper's name for an arm: sequential B=8, accumulation 16 x 8, GradCache B=128."""
    name = {
        "full": f"sequential B={batch}",
        "accumulate": f"accumulation {batch // chunk} x {chunk}",
        "gradcache": f"GradCache B={batch}",
    }.get(mode, mode)
    return name if lr == base_lr else f"{name}, lr {format_lr(lr)}"


def format_lr(lr: float) -> str:
    """2e-5, 1e-4: the way papers write learning rates."""
    mantissa, exponent = f"{lr:.0e}".split("e")
    return f"{mantissa}e{int(exponent)}"


def mean_sd(values: list[float]) -> tuple[float | None, float | None]:
    """Mean and sample standard deviation; the sd is None below two values (not measured)."""
    mean = statistics.mean(values) if values else None
    return mean, statistics.stdev(values) if len(values) > 1 else None


def check_same_recipe(records: list[dict[str, Any]]) -> None:
    """SystemExit naming the key and two runs (and where each came from, for kept records) if
    trained runs differ in anything but the arm."""
    trained = [r for r in records if r["mode"] in TRAINED]
    for key in RECIPE_KEYS:
        values = {str(r.get(key)): r for r in trained}
        if len(values) > 1:
            (a, run_a), (b, run_b) = list(values.items())[:2]
            where = [
                r["dir"] + (f" from {r['source']}" if r.get("source") else "")
                for r in (run_a, run_b)
            ]
            raise SystemExit(
                f"error: runs differ in {key} ({where[0]}: {a}, {where[1]}: {b}); give each "
                "recipe its own OUT= (studies/squad_batch_size/run.sh), or build without --kept"
            )


def group(records: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Per arm: the metrics' mean and sample sd over seeds, and each seed's values."""
    groups: dict[tuple[str, int, float], list[dict[str, Any]]] = {}
    for r in records:
        groups.setdefault(arm_key(r), []).append(r)
    rows = []
    for key, members in groups.items():
        runs = sorted(members, key=lambda r: r["seed"])
        row: dict[str, Any] = {"mode": key[0], "batch_size": key[1], "lr": key[2]}
        row["seeds"] = [r["seed"] for r in runs]
        row["per_seed"] = {m: [r[m] for r in runs] for m in METRICS}
        for name in (*METRICS, "peak_memory_bytes", "train_seconds", "train_wall_seconds"):
            row[name], row[name + "_sd"] = mean_sd(
                [r[name] for r in runs if r.get(name) is not None]
            )
        row["steps"] = runs[0].get("steps")
        row["negatives_per_question"] = runs[0].get("negatives_per_question")
        rows.append(row)
    return sorted(rows, key=arm_order)


def per_question(retrieval_json: Path) -> dict[str, np.ndarray]:
    """Each metric per dev question, in points (top-k as 0 or 100, MRR@10), from a run's DPR
    results file."""
    ranks = [first_relevant_rank(flags) for flags in answer_flags(retrieval_json)]
    return hit_metrics(ranks, KS)


def check_paired(a: dict[str, Any], b: dict[str, Any]) -> None:
    """SystemExit unless the two runs logged the same batch at every step."""
    da, db = a.get("digests"), b.get("digests")
    if not da or None in da or da != db:
        raise SystemExit(
            f"error: {a['dir']} and {b['dir']} did not train on the same batches step by step "
            "(train_log.jsonl batch_digest); they cannot be compared as a pair"
        )


def _bootstrap_ci(diffs: list[np.ndarray], idx: np.ndarray) -> tuple[float, float]:
    """2.5 and 97.5 percentiles over resamples ``idx`` [n_boot, questions] of the mean over
    seeds of each seed's mean per-question difference (the same questions for every seed)."""
    boot = np.mean([d[idx].mean(axis=1) for d in diffs], axis=0)  # [n_boot]
    return float(np.percentile(boot, 2.5)), float(np.percentile(boot, 97.5))


def paired_differences(
    records: list[dict[str, Any]], runs: Path, n_boot: int = 10000
) -> list[dict[str, Any]]:
    """GradCache minus accumulation at the same batch, lr and seed, per metric in points, with
    a 95% bootstrap interval over the dev questions (questions resampled, seed 0). Then, per
    (batch, lr) with two or more seeds, a row over all seeds: the mean difference, its interval
    over questions (each resample applied to every seed) and the sample sd over seeds."""
    accum = {(r["batch_size"], r["lr"], r["seed"]): r for r in records if r["mode"] == "accumulate"}
    rows, per_arm = [], {}
    for r in sorted(records, key=lambda r: (r["lr"], r["batch_size"], r["seed"])):
        base = accum.get((r["batch_size"], r["lr"], r["seed"]))
        if r["mode"] != "gradcache" or base is None:
            continue
        check_paired(r, base)
        ours = per_question(runs / r["dir"] / "eval" / "retrieval.json")
        theirs = per_question(runs / base["dir"] / "eval" / "retrieval.json")
        diff = {m: ours[m] - theirs[m] for m in METRICS}
        n = len(diff["top1"])
        idx = np.random.default_rng(0).integers(0, n, size=(n_boot, n))
        row = {"batch_size": r["batch_size"], "lr": r["lr"], "seed": r["seed"], "questions": n}
        for m in METRICS:
            row[m], row[m + "_ci"] = float(diff[m].mean()), _bootstrap_ci([diff[m]], idx)
        rows.append(row)
        per_arm.setdefault((r["batch_size"], r["lr"]), []).append((row, diff, idx))
    for (batch, lr), items in per_arm.items():
        if len(items) < 2:
            continue
        row = {"batch_size": batch, "lr": lr, "seed": "all", "seeds": [i[0]["seed"] for i in items]}
        idx = items[0][2]
        for m in METRICS:
            seed_diffs = [i[1][m] for i in items]  # each [questions]
            row[m] = float(np.mean(seed_diffs))
            row[m + "_ci"] = _bootstrap_ci(seed_diffs, idx)
            row[m + "_sd"] = statistics.stdev(i[0][m] for i in items)
        rows.append(row)
    return sorted(rows, key=diff_order)
