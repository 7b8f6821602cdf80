"""The hard-negative study's runs read back as data: each arm's metrics over seeds, each dev
question's figures, the hybrids (linear fusion's two halves put back together), paired differences
with bootstrap intervals over the questions, the filter's counts and the machine hours."""

from __future__ import annotations

import json
import math
import statistics
from pathlib import Path
from typing import Any

import numpy as np

from dpr_cache.retrieval.metrics import first_relevant_rank, hit_metrics
from dpr_cache.retrieval.results import answer_flags
from studies.squad_batch_size.runs import collect, machine_hours, mean_sd, train_seconds

KS = (1, 5, 20, 100)
METRICS = (*(f"top{k}" for k in KS), "mrr@10")
ARMS = {  # folder -> the arm's name on the page
    "round1": "round 1: BM25 negatives",
    "round2-both": "round 2 (b): mined + BM25 negatives",
    "round2-mined": "round 2 (a): mined negatives alone",
}
N_BOOT = 10_000


RANKS_NAME = "retrieval.ranks.json"  # a saved study's stand-in for a run's retrieval.json


def first_ranks(retrieval_json: Path) -> list[float]:
    """Each dev question's 0-based rank of its first passage with the answer (inf: none in the
    file), from a DPR results file or, where that is gone, from the ranks saved beside it."""
    saved = retrieval_json.with_name(RANKS_NAME)
    if not retrieval_json.is_file() and saved.is_file():
        return [math.inf if r is None else float(r) for r in json.loads(saved.read_text())]
    return [first_relevant_rank(f) for f in answer_flags(retrieval_json)]


def per_question(retrieval_json: Path) -> dict[str, np.ndarray]:
    """Each metric per dev question, in points, from a DPR results file (or its saved ranks)."""
    return hit_metrics(first_ranks(retrieval_json), KS)


def linear_per_question(eval_dirs: dict[str, Path], split: dict[str, list[int]]):
    """The two halves' figures put back in dev order, and each half's tuned weight."""
    n = sum(len(rows) for rows in split.values())
    out = {m: np.zeros(n) for m in METRICS}
    weights = {}
    for half, rows in split.items():
        part = per_question(eval_dirs[half] / "retrieval.json")
        for m in METRICS:
            out[m][rows] = part[m]
        weights[half] = json.loads((eval_dirs[half] / "fusion.json").read_text())["weight"]
    return out, weights


def _ci(diffs: list[np.ndarray], idx: np.ndarray) -> list[float]:
    boot = np.mean([d[idx].mean(axis=1) for d in diffs], axis=0)  # [n_boot]
    return [float(np.percentile(boot, 2.5)), float(np.percentile(boot, 97.5))]


def paired(name: str, ours: list[dict], theirs: list[dict], seeds: list) -> dict[str, Any]:
    """``ours - theirs`` per metric in points: the mean over the seeds of each seed's mean
    per-question difference, a 95% bootstrap interval over the questions (each resample applied
    to every seed) and the sample sd over seeds."""
    n = len(ours[0]["top1"])
    idx = np.random.default_rng(0).integers(0, n, size=(N_BOOT, n))
    row: dict[str, Any] = {"pair": name, "seeds": seeds, "questions": n}
    for m in METRICS:
        diffs = [a[m] - b[m] for a, b in zip(ours, theirs, strict=True)]
        row[m] = float(np.mean([d.mean() for d in diffs]))
        row[m + "_ci"] = _ci(diffs, idx)
        row[m + "_sd"] = statistics.stdev(d.mean() for d in diffs) if len(diffs) > 1 else None
    return row


def gather(out: Path, suffix: str = "") -> dict[str, Any]:
    """Everything the page shows, computed from the run folders under ``out``."""
    split = json.loads((out / "dev-split" / "split.json").read_text())
    arms, per_q, rows, hours = {}, {}, [], 0.0
    for folder, label in ARMS.items():
        records = collect(out / f"{folder}{suffix}")
        hours += machine_hours(records)
        records = [r for r in records if r["mode"] == "gradcache"]
        if not records:
            continue
        runs = sorted(records, key=lambda r: r["seed"])
        arms[folder] = runs
        row = {"arm": label, "seeds": [r["seed"] for r in runs], "steps": runs[0].get("steps")}
        for m in METRICS:
            row[m], row[m + "_sd"] = mean_sd([r[m] for r in runs])
        row["train_h"] = statistics.mean(train_seconds(r) for r in runs) / 3600
        rows.append(row)
        for r in runs:
            run_dir = out / f"{folder}{suffix}" / r["dir"]
            per_q[(folder, r["seed"])] = per_question(run_dir / "eval" / "retrieval.json")
    refs = out / f"references{suffix}"
    per_q["bm25"] = per_question(refs / "bm25" / "eval" / "retrieval.json")
    per_q["off-the-shelf"] = per_question(refs / "off-the-shelf" / "eval" / "retrieval.json")
    hours += machine_hours(collect(refs))
    names = (("bm25", "BM25 (bm25s)"), ("off-the-shelf", "all-MiniLM-L6-v2 off the shelf"))
    references = [
        {"arm": name, **{m: float(per_q[key][m].mean()) for m in METRICS}} for key, name in names
    ]
    hybrids, hybrid_diffs = _hybrids(out, suffix, arms, split, per_q)
    seeds = [r["seed"] for r in arms.get("round1", [])]
    diffs = []
    both = [s for s in seeds if ("round2-both", s) in per_q]
    for s in both:
        diffs.append(
            paired(f"(b) - round 1, seed {s}", [per_q["round2-both", s]], [per_q["round1", s]], [s])
        )
    if len(both) > 1:
        diffs.append(
            paired(
                "(b) - round 1, all seeds",
                [per_q["round2-both", s] for s in both],
                [per_q["round1", s] for s in both],
                both,
            )
        )
    for s in [s for s in seeds if ("round2-mined", s) in per_q]:
        diffs.append(
            paired(
                f"(a) - round 1, seed {s}", [per_q["round2-mined", s]], [per_q["round1", s]], [s]
            )
        )
    hours += _extra_hours(out, suffix)
    return {
        "arms": rows,
        "references": references,
        "hybrids": hybrids,
        "diffs": diffs,
        "hybrid_diffs": hybrid_diffs,
        "filter": _filter(out),
        "hours": hours,
        "questions": len(per_q["bm25"]["top1"]),
    }


def _hybrids(out, suffix, arms, split, per_q):
    """Each model fused with BM25 (linear, rrf): figures, tuned weights, differences to BM25."""
    models = [("off-the-shelf", out / f"references{suffix}" / "off-the-shelf", None)]
    for folder, runs in arms.items():
        models += [
            (f"{folder} s{r['seed']}", out / f"{folder}{suffix}" / r["dir"], (folder, r["seed"]))
            for r in runs
        ]
    rows, diffs = [], []
    linear_by_run: dict[tuple[str, int], dict] = {}  # (folder, seed) -> per-question figures
    for name, run_dir, run in models:
        if not (run_dir / "eval-rrf" / "metrics.json").is_file():
            continue
        linear, weights = linear_per_question(
            {h: run_dir / f"eval-linear-{h}" for h in "ab"}, split
        )
        rrf = per_question(run_dir / "eval-rrf" / "retrieval.json")
        if run:
            linear_by_run[run] = linear
        for method, figures in (("linear", linear), ("rrf", rrf)):
            row = {
                "model": name,
                "method": method,
                **{m: float(figures[m].mean()) for m in METRICS},
            }
            row["weights"] = weights if method == "linear" else None
            rows.append(row)
            diffs.append(paired(f"BM25 + {name} ({method}) - BM25", [figures], [per_q["bm25"]], []))
    seeds = sorted(
        s for f, s in linear_by_run if f == "round1" and ("round2-both", s) in linear_by_run
    )
    if seeds:  # the fused rounds paired by seed, as the models alone are
        diffs.append(
            paired(
                f"BM25 + round2-both - BM25 + round1 (linear), seeds {','.join(map(str, seeds))}",
                [linear_by_run["round2-both", s] for s in seeds],
                [linear_by_run["round1", s] for s in seeds],
                seeds,
            )
        )
    return rows, diffs


def _filter(out: Path) -> dict[str, Any]:
    """What mining dropped and kept (both files) and the looser rules' check."""
    result = {}
    for kind in ("mined", "both"):
        path = out / f"train.{kind}.summary.json"
        if path.is_file():
            result[kind] = json.loads(path.read_text())
    check = out / "filter_check.json"
    if check.is_file():
        result["check"] = json.loads(check.read_text())
    return result


def _extra_hours(out: Path, suffix: str) -> float:
    """Mining, and the hybrid evaluations (their own timings)."""
    summaries = [out / f"train.{k}.summary.json" for k in ("mined", "both")]
    seconds = sum(json.loads(p.read_text())["seconds"] for p in summaries if p.is_file())
    for timings in out.glob(f"*{suffix}/*/eval-*/timings.json"):
        seconds += sum(json.loads(timings.read_text())["seconds"].values())
    return seconds / 3600
