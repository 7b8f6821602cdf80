"""The late-interaction study's runs read back as data: BM25, the loss study's control and multi
arms over their seeds (the students, in that study's folder beside this one), each fused with
BM25 (linear, its weight tuned on the other half of dev; and RRF), each system's hit rate at every
depth from 1 to 100, the differences that answer the study's questions (by seed, and over the
seeds with an interval that covers the questions and the seeds), the same on the questions BM25
gets right at top-1 and on those it misses, and what each part cost. A study cut part way gives
the part it has."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import numpy as np

from studies.squad_batch_size.runs import collect, machine_hours, mean_sd
from studies.squad_crossfit.collect import two_level
from studies.squad_hard_negatives.collect import METRICS, first_ranks, paired, per_question
from studies.squad_teachers.collect import arm_rows, fused_runs, hybrid_hours, read_json

LOSSES = "squad_losses"  # the loss study's folder, beside this study's: the students
ARMS = {  # folder (in the loss study) -> the arm's name on the page
    "control": "control: a vector a passage (mean pooling, cosine)",
    "multi": "multi: a vector a token (MaxSim)",
}
BM25, FUSED = "BM25", "BM25 + {}"
SYSTEMS = (BM25, "control", "multi", FUSED.format("control"), FUSED.format("multi"))
DEPTHS = tuple(range(1, 101))  # the top-k curves' k
BOTH = "questions and seeds"
PAIRS = (  # (ours, theirs): the differences the page shows
    ("multi", "control"),
    ("multi", BM25),
    ("control", BM25),
    (FUSED.format("multi"), FUSED.format("control")),
    (FUSED.format("multi"), BM25),
    (FUSED.format("control"), BM25),
)
MULTI_VS_CONTROL = (PAIRS[0], PAIRS[3])  # alone and fused
STRATA = {  # name -> which dev questions: by BM25's top-1
    "BM25 right at top-1": lambda bm25: bm25["top1"] > 0,
    "BM25 wrong at top-1": lambda bm25: bm25["top1"] == 0,
}


def losses_folder(out: Path, suffix: str) -> Path:
    """Where the students are: the loss study's OUT beside this study's (run.sh's LOSSES)."""
    return out.parent / f"{LOSSES}{suffix}"


def linear_ranks(eval_dirs: dict[str, Path], split: dict[str, list[int]]) -> np.ndarray:
    """Each dev question's first rank of a passage with the answer under linear fusion, the two
    halves (each scored with the weight tuned on the other) put back in dev order."""
    ranks = np.full(sum(len(rows) for rows in split.values()), np.inf)
    for half, rows in split.items():
        ranks[rows] = first_ranks(eval_dirs[half] / "retrieval.json")
    return ranks


def curve(ranks: list[np.ndarray]) -> list[float]:
    """Hit rate (%) at every depth of :data:`DEPTHS`, the mean over the seeds' ranks."""
    return [float(np.mean([100 * (r < k).mean() for r in ranks])) for k in DEPTHS]


def per_system(
    out: Path, suffix: str, runs_of: dict[str, list[dict]], per_q: dict
) -> tuple[dict[tuple[str, int], dict], dict[str, list[np.ndarray]], dict | None]:
    """Each (system, seed)'s per-question figures, each system's first ranks (one array a seed)
    and BM25's per-question figures (None before BM25 ran). BM25 is the same at every seed."""
    losses = losses_folder(out, suffix)
    figures: dict[tuple[str, int], dict] = {}
    ranks: dict[str, list[np.ndarray]] = {}
    bm25_file = out / f"references{suffix}" / "bm25" / "eval" / "retrieval.json"
    bm25_done = bm25_file.is_file() or bm25_file.with_name("retrieval.ranks.json").is_file()
    bm25 = per_question(bm25_file) if bm25_done else None
    if bm25_done:
        ranks[BM25] = [np.asarray(first_ranks(bm25_file))]
    split = read_json(out / "dev-split" / "split.json")
    for arm, runs in runs_of.items():
        for r in runs:
            figures[arm, r["seed"]] = per_q[arm, r["seed"]]
            alone = losses / f"{arm}{suffix}" / r["dir"] / "eval" / "retrieval.json"
            ranks.setdefault(arm, []).append(np.asarray(first_ranks(alone)))
            fused = out / f"{arm}{suffix}" / r["dir"]
            done = [fused / f"eval-{e}" / "metrics.json" for e in ("rrf", "linear-a", "linear-b")]
            if split and all(p.is_file() for p in done):  # as fused_runs counts a run fused
                halves = {h: fused / f"eval-linear-{h}" for h in "ab"}
                ranks.setdefault(FUSED.format(arm), []).append(linear_ranks(halves, split))
    _, linear = fused_runs(out, suffix, runs_of)
    for (arm, seed), fused_figures in linear.items():
        figures[FUSED.format(arm), seed] = fused_figures
    if bm25 is not None:
        seeds = {seed for _, seed in figures} or {0}
        figures.update({(BM25, seed): bm25 for seed in seeds})
    return figures, ranks, bm25


def _seeds(figures: dict, ours: str, theirs: str) -> list[int]:
    return sorted(s for a, s in figures if a == ours and (theirs, s) in figures)


def differences(figures: dict, pairs: tuple = PAIRS) -> list[dict[str, Any]]:
    """``ours - theirs`` for each of ``pairs`` both sides of which ran: at each seed (the
    interval over the questions) and, with two or more, over the seeds (the two-level interval
    over the questions and the seeds)."""
    diffs = []
    for ours, theirs in pairs:
        seeds = _seeds(figures, ours, theirs)
        mine = [figures[ours, s] for s in seeds]
        other = [figures[theirs, s] for s in seeds]
        for s, a, b in zip(seeds, mine, other, strict=True):
            diffs.append(paired(f"{ours} - {theirs}, seed {s}", [a], [b], [s]))
        if len(seeds) > 1:
            name = f"{ours} - {theirs}, seeds {','.join(map(str, seeds))} ({BOTH})"
            diffs.append(two_level(name, mine, other, seeds))
    return diffs


def systems_rows(figures: dict) -> list[dict[str, Any]]:
    """Each system's figures: the mean and sd over its seeds (BM25: one, it has no seed)."""
    rows = []
    for system in SYSTEMS:
        seeds = sorted(s for a, s in figures if a == system)
        if not seeds:
            continue
        runs = [figures[system, s] for s in seeds[: 1 if system == BM25 else None]]
        row: dict[str, Any] = {"system": system, "seeds": [] if system == BM25 else seeds}
        for m in METRICS:
            row[m], row[m + "_sd"] = mean_sd([float(r[m].mean()) for r in runs])
        rows.append(row)
    return rows


def where(figures: dict, bm25: dict | None) -> list[dict[str, Any]]:
    """The dev questions split by BM25's top-1 (:data:`STRATA`): in each, how many, each
    system's figures, and multi minus control, alone and fused with BM25 (over the seeds)."""
    if bm25 is None:
        return []
    out = []
    for name, pick in STRATA.items():
        rows = np.flatnonzero(pick(bm25))
        if not len(rows):
            continue
        picked = {key: {m: v[rows] for m, v in f.items()} for key, f in figures.items()}
        diffs = differences(picked, MULTI_VS_CONTROL)
        out.append(
            {
                "stratum": name,
                "questions": int(len(rows)),
                "systems": systems_rows(picked),
                "diffs": [d for d in diffs if _pooled(d, picked)],
            }
        )
    return out


def _pooled(row: dict[str, Any], figures: dict) -> bool:
    """A difference's row over every seed both sides ran (its seed row where there is one)."""
    ours, theirs = row["pair"].split(",")[0].split(" - ")
    return len(row["seeds"]) == len(_seeds(figures, ours, theirs))


def same_batches(runs_of: dict[str, list[dict]]) -> dict[str, bool]:
    """At each seed both arms ran: did they log the same batch at every update
    (train_log.jsonl's batch digests: the same questions, positives and negatives)?"""
    control = {r["seed"]: r.get("digests") for r in runs_of.get("control", [])}
    out = {}
    for r in runs_of.get("multi", []):
        if r["seed"] in control:
            ours, theirs = r.get("digests"), control[r["seed"]]
            out[str(r["seed"])] = bool(ours) and None not in ours and ours == theirs
    return out


def index_sizes(out: Path, suffix: str, runs_of: dict[str, list[dict]]) -> list[dict[str, Any]]:
    """Each arm's index as its fusion's run.json recorded it (the first seed's): passages,
    vectors stored, dims and bytes."""
    rows = []
    for arm, runs in runs_of.items():
        for r in runs:
            record = read_json(out / f"{arm}{suffix}" / r["dir"] / "run.json")
            if record and record.get("index"):
                rows.append({"arm": arm, **record["index"]})
                break
    return rows


def gather(out: Path, suffix: str = "") -> dict[str, Any]:
    """Everything the page shows, computed from this study's folder and the loss study's."""
    losses = losses_folder(out, suffix)
    arms, runs_of, per_q = arm_rows(losses, suffix, ARMS)
    figures, ranks, bm25 = per_system(out, suffix, runs_of, per_q)
    hybrids, _ = fused_runs(out, suffix, runs_of)
    costs = {f"{row['folder']} students: training, index, evaluation": row["hours"] for row in arms}
    costs["BM25 on dev"] = machine_hours(collect(out / f"references{suffix}"))
    costs["fused evaluations"] = hybrid_hours(out, suffix)
    questions = bm25 or next(iter(per_q.values()), None)
    return {
        "systems": systems_rows(figures),
        "arms": arms,
        "diffs": differences(figures),
        "hybrids": hybrids,
        "where": where(figures, bm25),
        "curves": {"depths": list(DEPTHS), **{s: curve(r) for s, r in ranks.items()}},
        "same_batches": same_batches(runs_of),
        "index": index_sizes(out, suffix, runs_of),
        "costs": costs,
        "hours": sum(costs.values()),
        "questions": len(questions["top1"]) if questions else 0,
    }


def fused_record(student: Path, arm: str, seed: int) -> dict[str, Any]:
    """What a fusion's run.json records: the student it fused, and the student's index (passages,
    vectors stored, dims, bytes on disk)."""
    meta = json.loads((student / "index" / "meta.json").read_text())
    size = sum(p.stat().st_size for p in (student / "index").rglob("*") if p.is_file())
    index = {
        "vectors": meta.get("vectors", "single"),
        "passages": meta["rows"],
        "stored": meta.get("tokens", meta["rows"]),
        "dim": meta["dim"],
        "bytes": size,
    }
    return {"student": str(student), "arm": arm, "seed": seed, "index": index}
