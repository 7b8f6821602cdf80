"""The loss-options study's runs read back as data: each arm over its seeds, each treatment
minus the control (by seed, and over the seeds with an interval that covers the questions and
the seeds), the control and Matryoshka at every dim, BM25 on the same questions, and what each
part cost. A study cut part way gives the part it has."""

from __future__ import annotations

import json
import statistics
from pathlib import Path
from typing import Any

from studies.squad_batch_size.runs import mean_sd
from studies.squad_crossfit.collect import _timings_seconds, two_level
from studies.squad_hard_negatives.collect import METRICS, paired, per_question
from studies.squad_teachers.collect import arm_rows

ARMS = {  # folder -> the arm's name on the page
    "control": "control: contrastive, query -> passages",
    "symmetric": "symmetric: + passage -> questions",
    "hardness": "hardness: all negatives, strength 5",
    "guided": "guided: untrained MiniLM as GIST's guide, margin 0",
    "matryoshka": "matryoshka: 384/256/128/64/32",
}
TREATMENTS = ("symmetric", "hardness", "guided", "matryoshka")
AT_DIMS = ("control", "matryoshka")  # the arms evaluated at every smaller dim
BM25 = Path("squad_crossfit/references/bm25/eval/metrics.json")  # beside OUT, restored


def _listed(seeds: list) -> str:
    return ",".join(map(str, seeds)) + (" (questions and seeds)" if len(seeds) > 1 else "")


def against_control(per_q: dict, arm: str, label: str = "") -> list[dict[str, Any]]:
    """``arm`` minus the control at each seed both ran and, with two or more, over them."""
    seeds = sorted(s for a, s in per_q if a == arm and ("control", s) in per_q)
    name = f"{arm}{label} - control{label}"
    rows = [paired(f"{name}, seed {s}", [per_q[arm, s]], [per_q["control", s]], [s]) for s in seeds]
    if len(seeds) > 1:
        ours = [per_q[arm, s] for s in seeds]
        theirs = [per_q["control", s] for s in seeds]
        rows.append(two_level(f"{name}, seeds {_listed(seeds)}", ours, theirs, seeds))
    return rows


def _dims_of(run: Path) -> list[int]:
    """The widths a run was evaluated at, widest (its own) first, once every one is done
    (run.sh's ``eval-dims/metrics.json``); none before."""
    marker = run / "eval-dims" / "metrics.json"
    if not marker.is_file():
        return []
    record = json.loads(marker.read_text())
    return [record["width"], *sorted((int(d) for d in record["dims"]), reverse=True)]


def at_dims(out: Path, suffix: str, runs_of: dict[str, list[dict]]) -> dict[str, Any]:
    """The control and Matryoshka arms at every dim: each arm's figures (mean and sd over its
    seeds) and Matryoshka minus the control at each dim (paired, over the seeds)."""
    figures: dict[tuple[str, int], dict[str, list[float]]] = {}
    per_q: dict[int, dict[tuple[str, int], dict]] = {}
    eval_seconds = 0.0
    width = None
    for arm in AT_DIMS:
        for run in runs_of.get(arm, []):
            folder = out / f"{arm}{suffix}" / run["dir"]
            dims = _dims_of(folder)
            for i, d in enumerate(dims):
                width = width or d
                where = folder / ("eval" if i == 0 else f"eval-dim-{d}")
                metrics = json.loads((where / "metrics.json").read_text())
                for m in METRICS:
                    figures.setdefault((arm, d), {}).setdefault(m, []).append(metrics[m])
                per_q.setdefault(d, {})[arm, run["seed"]] = per_question(where / "retrieval.json")
                if i:
                    eval_seconds += _timings_seconds(where / "timings.json")
    rows = []
    for (arm, d), values in sorted(figures.items(), key=lambda kv: (kv[0][0], -kv[0][1])):
        row = {"arm": arm, "dim": d, "seeds": len(values["top1"])}
        for m in METRICS:
            row[m], row[m + "_sd"] = mean_sd(values[m])
        rows.append(row)
    diffs = []
    for d in sorted(per_q, reverse=True):
        pooled = against_control(per_q[d], "matryoshka", f" at {d}")
        diffs += [{**r, "dim": d} for r in pooled if len(r["seeds"]) > 1 or len(pooled) == 1]
    return {"width": width, "rows": rows, "diffs": diffs, "eval_hours": eval_seconds / 3600}


def gather(out: Path, suffix: str = "") -> dict[str, Any]:
    """Everything the page shows, computed from the run folders under ``out``."""
    rows, runs_of, per_q = arm_rows(out, suffix, ARMS)
    diffs = [d for arm in TREATMENTS for d in against_control(per_q, arm)]
    bm25_file = out.parent / BM25
    bm25 = json.loads(bm25_file.read_text()) if bm25_file.is_file() and not suffix else None
    dims = at_dims(out, suffix, runs_of)
    costs = {row["folder"]: row["hours"] for row in rows}
    steps = {
        folder: {
            "median_s": statistics.median(r["median_step_seconds"] for r in runs),
            "fastest_s": min(r["fastest_step_seconds"] for r in runs),
        }
        for folder, runs in runs_of.items()
        if all(r.get("fastest_step_seconds") for r in runs)
    }
    costs["the control and Matryoshka at the smaller dims"] = dims["eval_hours"]
    questions = next(iter(per_q.values()), None)
    return {
        "references": (
            [{"arm": "BM25 (bm25s)", **{m: bm25.get(m) for m in METRICS}}] if bm25 else []
        ),
        "arms": rows,
        "diffs": diffs,
        "dims": dims,
        "costs": costs,
        "steps": steps,
        "hours": sum(costs.values()),
        "questions": len(questions["top1"]) if questions else 0,
    }
