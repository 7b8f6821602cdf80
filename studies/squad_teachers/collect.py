"""The teacher study's runs read back as data: each arm over its seeds, each dev question's
figures, the paired differences (by seed and by question) of each treatment with the control, the
students fused with BM25, the teacher's set-up, what each arm cost, and score's rate. A study cut
part way gives the part it has."""

from __future__ import annotations

import json
import statistics
from pathlib import Path
from typing import Any

from studies.squad_batch_size.runs import collect, machine_hours, mean_sd, train_seconds
from studies.squad_hard_negatives.collect import (
    METRICS,
    linear_per_question,
    paired,
    per_question,
)
from studies.squad_teachers.teacher import TREATMENTS

ARMS = {  # folder -> the arm's name on the page
    "round1": "round 1: BM25 negatives, H = 1 (the teacher's dense half)",
    "control": "control: contrastive, mined candidates",
    "distill": "distill: distill_kl + contrastive, mined candidates",
    "cleaned": "cleaned: contrastive, teacher-cleaned candidates",
}
MINED = ("mined", "cleaned-all")  # train.<kind>.jsonl, mined by round 1 over its index


def read_json(path: Path) -> dict[str, Any] | None:
    """A JSON file's content; None where a step has not written it yet."""
    return json.loads(path.read_text()) if path.is_file() else None


def median_train_seconds(run: dict[str, Any]) -> float:
    """A run's training time, estimated as its updates at its median step time: a step that spans a
    pause (the study's processes stopped while CI runs beside it), slow steps (other work beside
    it) and the time outside steps (loading, checkpoints, segments cut) do not count. A run
    without a train log: its wall time."""
    if run.get("steps") and run.get("median_step_seconds"):
        return run["steps"] * run["median_step_seconds"]
    return train_seconds(run)


def arm_rows(out: Path, suffix: str, arms: dict[str, str] = ARMS) -> tuple[list[dict], dict, dict]:
    """Each arm's row (mean and sd over its seeds), its runs, and each run's dev figures;
    ``arms``: folder -> the arm's name on the page."""
    rows, runs_of, per_q = [], {}, {}
    for folder, label in arms.items():
        runs = sorted(
            (r for r in collect(out / f"{folder}{suffix}") if r["mode"] == "gradcache"),
            key=lambda r: r["seed"],
        )
        if not runs:
            continue
        runs_of[folder] = runs
        row = {
            "folder": folder,
            "arm": label,
            "seeds": [r["seed"] for r in runs],
            "steps": runs[0].get("steps"),
            "hard_negatives": runs[0].get("hard_negatives", 1),
            "train_h": statistics.mean(median_train_seconds(r) for r in runs) / 3600,
            "hours": machine_hours(runs, median_train_seconds),
            "peak_gb": max(r.get("peak_memory_bytes", 0) for r in runs) / 2**30,
        }
        for m in METRICS:
            row[m], row[m + "_sd"] = mean_sd([r[m] for r in runs])
        rows.append(row)
        for r in runs:
            run_dir = out / f"{folder}{suffix}" / r["dir"]
            per_q[folder, r["seed"]] = per_question(run_dir / "eval" / "retrieval.json")
    return rows, runs_of, per_q


def _differences(per_q: dict, best: str | None) -> list[dict[str, Any]]:
    """Each treatment minus the control at each seed both ran, and over those seeds; for the
    best arm, also over the seeds after the one that picked it."""
    diffs = []
    for arm in TREATMENTS:
        seeds = sorted(s for a, s in per_q if a == arm and ("control", s) in per_q)
        for s in seeds:
            diffs.append(
                paired(f"{arm} - control, seed {s}", [per_q[arm, s]], [per_q["control", s]], [s])
            )
        groups = [("all seeds", seeds)]
        if arm == best and len(seeds) > 2:
            groups.append(("seeds after the pick", seeds[1:]))
        for name, group in groups:
            if len(group) > 1:
                diffs.append(
                    paired(
                        f"{arm} - control, {name}",
                        [per_q[arm, s] for s in group],
                        [per_q["control", s] for s in group],
                        group,
                    )
                )
    return diffs


def fused_runs(out: Path, suffix: str, runs_of: dict) -> tuple[list, dict]:
    """Each run of ``runs_of`` (folder -> its runs) fused with BM25 (linear, rrf) where all
    three fusions are done: a row per (run, method) with its figures and the linear halves'
    weights, and each run's linear per-question figures by (folder, seed), in the same order."""
    split = read_json(out / "dev-split" / "split.json")
    rows, linear = [], {}
    if split is None:
        return rows, linear
    for folder, runs in runs_of.items():
        for r in runs:
            run_dir = out / f"{folder}{suffix}" / r["dir"]
            done = [run_dir / f"eval-{e}" / "metrics.json" for e in ("rrf", "linear-a", "linear-b")]
            if not all(p.is_file() for p in done):
                continue
            fused, weights = linear_per_question(
                {h: run_dir / f"eval-linear-{h}" for h in "ab"}, split
            )
            linear[folder, r["seed"]] = fused
            rrf = per_question(run_dir / "eval-rrf" / "retrieval.json")
            for method, figures in (("linear", fused), ("rrf", rrf)):
                rows.append(
                    {
                        "model": f"{folder} s{r['seed']}",
                        "folder": folder,
                        "method": method,
                        "weights": weights if method == "linear" else None,
                        **{m: float(figures[m].mean()) for m in METRICS},
                    }
                )
    return rows, linear


def _hybrids(out: Path, suffix: str, runs_of: dict, bm25: dict) -> tuple[list, list]:
    """Each student fused with BM25 (linear, rrf): figures, weights, differences to BM25, and
    each treatment's fused figures minus the control's, paired by seed."""
    rows, linear = fused_runs(out, suffix, runs_of)
    diffs = [
        paired(f"BM25 + {folder} s{seed} (linear) - BM25", [fused], [bm25], [])
        for (folder, seed), fused in linear.items()
    ]
    for arm in TREATMENTS:
        seeds = sorted(s for a, s in linear if a == arm and ("control", s) in linear)
        if seeds:
            diffs.append(
                paired(
                    f"BM25 + {arm} - BM25 + control (linear), seeds {','.join(map(str, seeds))}",
                    [linear[arm, s] for s in seeds],
                    [linear["control", s] for s in seeds],
                    seeds,
                )
            )
    return rows, diffs


def _setup(out: Path) -> dict[str, Any]:
    """The teacher (weight, temperature, spreads), the mined and cleaned files, score's rate."""
    setup: dict[str, Any] = {"teacher": read_json(out / "teacher" / "teacher.json")}
    for kind in MINED:
        setup[kind] = read_json(out / f"train.{kind}.summary.json")
    for kind in ("scored", "bm25-scored"):
        setup[kind] = read_json(out / f"train.{kind}.summary.json")
    for kind in ("candidates", "cleaned"):
        setup[f"{kind}_keep"] = read_json(out / f"train.{kind}.keep.json")
    setup["weight_eval"] = read_json(out / "teacher" / "weight" / "fusion.json")
    setup["best"] = read_json(out / "best.json")
    setup["score_rate"] = read_json(out / "score-rate" / "rate.json")
    return setup


def _setup_hours(out: Path, setup: dict[str, Any]) -> float:
    """Mining, scoring and the teacher's weight, by their own timings."""
    seconds = sum(s["seconds"] for k in (*MINED, "scored", "bm25-scored") if (s := setup.get(k)))
    for timings in (out / "teacher").glob("*/timings.json"):
        seconds += sum(json.loads(timings.read_text())["seconds"].values())
    return seconds / 3600


def hybrid_hours(out: Path, suffix: str) -> float:
    seconds = 0.0
    for timings in out.glob(f"*{suffix}/*/eval-*/timings.json"):
        seconds += sum(json.loads(timings.read_text())["seconds"].values())
    return seconds / 3600


def gather(out: Path, suffix: str = "") -> dict[str, Any]:
    """Everything the page shows, computed from the run folders under ``out``."""
    rows, runs_of, per_q = arm_rows(out, suffix)
    bm25_dir = out / f"references{suffix}" / "bm25" / "eval" / "retrieval.json"
    bm25 = per_question(bm25_dir)
    setup = _setup(out)
    best = (setup.get("best") or {}).get("arm")
    hybrids, hybrid_diffs = _hybrids(out, suffix, runs_of, bm25)
    costs = {row["folder"]: row["hours"] for row in rows}
    costs["teacher and mining"] = _setup_hours(out, setup)
    costs["fused evaluations"] = hybrid_hours(out, suffix)
    return {
        "references": [{"arm": "BM25 (bm25s)", **{m: float(bm25[m].mean()) for m in METRICS}}],
        "arms": rows,
        "diffs": _differences(per_q, best),
        "hybrids": hybrids,
        "hybrid_diffs": hybrid_diffs,
        "setup": setup,
        "best": best,
        "costs": costs,
        "hours": sum(costs.values()),
        "questions": len(bm25["top1"]),
    }
