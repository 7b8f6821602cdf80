"""The study's runs kept as data in the repository, beside the page.

A run's folder holds a model, an index and retrieval files too large to commit, and it lives on
one machine. So each time the page is written, ``results.json`` beside it keeps a compact record
of every run on the page (its recipe, metrics, memory, times, where it came from) and every
paired difference; the next build starts from that file (``table.py --kept``) and lays the runs
it finds over it. A run is known by (mode, batch size, lr, seed): a run made again replaces its
kept record, and the arms are averaged again from the records. A difference cannot be computed
again without its runs' per-question results, so a kept one stays only while all of its runs
are still the kept ones; the runs found give theirs afresh.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from dpr_cache.runtime.atomic import write_json_atomic
from studies.squad_batch_size.runs import METRICS, RECIPE_KEYS, diff_order

# What a kept run record holds: enough to average the arms and fill every cell of the page.
RUN_FIELDS = (
    "mode",
    "batch_size",
    "lr",
    "seed",
    "dir",
    "code",
    *METRICS,
    *RECIPE_KEYS,
    "peak_memory_bytes",
    "train_seconds",
    "train_wall_seconds",
    "index_seconds",
    "eval_seconds",
    "steps",
    "negatives_per_question",
)
# runs: RUN_FIELDS and "source" each; diffs: as runs.paired_differences gives them;
# unattributed: machine hours known only as a total over some runs ({"hours", "runs": keys})
KEPT_KEYS = ("runs", "diffs", "unattributed")


def empty() -> dict[str, Any]:
    return {"runs": [], "diffs": [], "unattributed": {"hours": 0.0, "runs": []}}


def compact(record: dict[str, Any], source: str) -> dict[str, Any]:
    """A run record from runs.collect, cut to RUN_FIELDS, with where it came from."""
    return {**{k: record.get(k) for k in RUN_FIELDS}, "source": source}


def run_key(run: dict[str, Any]) -> tuple[str, int, float, int]:
    """(mode, batch size, lr, seed); 0 where a reference run (BM25) has none."""
    return (
        run["mode"],
        int(run.get("batch_size") or 0),
        float(run.get("lr") or 0),
        int(run.get("seed") or 0),
    )


def remade(kept: dict[str, Any], runs: list[dict[str, Any]]) -> set[tuple]:
    """Keys of the fresh runs that replace a kept record with other values (a run made again,
    not the kept run's own folder read a second time)."""
    old = {run_key(r): {k: v for k, v in r.items() if k != "source"} for r in kept["runs"]}
    return {
        run_key(r)
        for r in runs
        if run_key(r) in old and {k: v for k, v in r.items() if k != "source"} != old[run_key(r)]
    }


def load(path: Path) -> dict[str, Any]:
    """A results.json; SystemExit naming the file if it cannot be read or is not one."""
    try:
        kept = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, json.JSONDecodeError) as err:
        raise SystemExit(f"error: {path}: cannot read kept results ({err})") from None
    missing = [k for k in KEPT_KEYS if not isinstance(kept, dict) or k not in kept]
    if missing:
        raise SystemExit(f"error: {path}: not a results.json (no {', '.join(missing)})")
    return kept


def save(path: Path, kept: dict[str, Any]) -> None:
    write_json_atomic(path, kept)


def merge_runs(kept: dict[str, Any], runs: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """The kept run records with fresh ones laid over them (a run made again replaces its
    record), in the order of lr, mode, batch size and seed."""
    by_key = {run_key(r): r for r in kept["runs"]} | {run_key(r): r for r in runs}
    return [by_key[k] for k in sorted(by_key, key=lambda k: (k[2], k[0], k[1], k[3]))]


def merge_diffs(
    kept: dict[str, Any], runs: list[dict[str, Any]], diffs: list[dict[str, Any]]
) -> tuple[list[dict[str, Any]], list[str]]:
    """The kept differences none of whose runs was made again, then the fresh ``diffs`` (of the
    fresh ``runs``); with a warning for each kept difference dropped and not computed again, each
    fresh GradCache run left without one, and each row over seeds that leaves out a seed."""
    again = remade(kept, runs)
    merged, dropped = {}, []
    for d in kept["diffs"]:
        seeds = d["seeds"] if d["seed"] == "all" else [d["seed"]]
        pair = {
            (m, int(d["batch_size"]), float(d["lr"]), int(s))
            for m in ("accumulate", "gradcache")
            for s in seeds
        }
        if again & pair:
            dropped.append(d)
        else:
            merged[diff_order(d)] = d
    merged |= {diff_order(d): d for d in diffs}
    warnings = [
        f"kept difference B={d['batch_size']}, lr {d['lr']:g}, seed {d['seed']} dropped: "
        "a run of it was made again, and the runs do not give it again"
        for d in dropped
        if diff_order(d) not in merged
    ]
    for mode, batch, lr, seed in sorted(run_key(r) for r in runs):
        if mode == "gradcache" and (lr, batch, False, (seed,)) not in merged:
            warnings.append(
                f"no difference for GradCache B={batch}, lr {lr:g}, seed {seed}: "
                "its accumulation run is not among the runs"
            )
    for lr, batch, pooled, seeds in merged:
        paired = sorted(k[3][0] for k in merged if k[:3] == (lr, batch, False))
        if pooled and list(seeds) != paired:
            warnings.append(
                f"the difference B={batch}, lr {lr:g} over seeds {list(seeds)} "
                f"leaves out some of the paired seeds {paired}"
            )
    return [merged[k] for k in sorted(merged)], warnings


def unattributed(kept: dict[str, Any], runs: list[dict[str, Any]]) -> dict[str, Any]:
    """The kept total of hours over some runs, less the share (spread evenly) of those made
    again: their new times count instead."""
    covered = [tuple(k) for k in kept["unattributed"]["runs"]]
    left = [k for k in covered if k not in remade(kept, runs)]
    hours = kept["unattributed"]["hours"] * len(left) / len(covered) if covered else 0.0
    return {"hours": hours, "runs": [list(k) for k in left]}
