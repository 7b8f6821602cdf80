"""The study's results as data: what the page shows, kept in the repository beside it.

A run's folder holds models and retrieval files too large to commit, and a machine can be lost
between sessions. So each time the page is written, its arms, paired differences, reference
rows, recipe and machine hours also go to ``results.json``; the next build can start from that
file (``table.py --kept``), so arms whose runs are gone stay on the page. Arms and differences
are merged by what they are (mode, batch size, lr; batch size, lr, seed): a fresh run's value
replaces a kept one, and a kept file of another recipe is refused.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from dpr_cache.runtime.atomic import write_json_atomic
from studies.squad_batch_size.runs import RECIPE_KEYS, arm_key, arm_order

RECIPE_FIELDS = (*RECIPE_KEYS, "n_questions")


def recipe_of(records: list[dict[str, Any]]) -> dict[str, Any]:
    """The shared recipe of trained records (check_same_recipe has run), as the page states it."""
    return {k: records[0].get(k) for k in RECIPE_FIELDS}


def results(
    recipe: dict[str, Any],
    rows: list[dict[str, Any]],
    diffs: list[dict[str, Any]],
    refs: list[tuple[str, dict[str, Any]]],
    machine_hours: float,
    sources: list[str],
) -> dict[str, Any]:
    """What the page shows, as one JSON-ready dict."""
    return {
        "recipe": recipe,
        "machine_hours": machine_hours,
        "sources": sources,
        "refs": [[name, ref] for name, ref in refs],
        "arms": rows,
        "diffs": [{**d, **{k: list(v) for k, v in d.items() if k.endswith("_ci")}} for d in diffs],
    }


def load(path: Path) -> dict[str, Any]:
    """A results.json; SystemExit naming the file if it is missing or not one."""
    try:
        kept = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, json.JSONDecodeError) as err:
        raise SystemExit(f"error: {path}: cannot read kept results ({err})") from None
    missing = {"recipe", "machine_hours", "sources", "refs", "arms", "diffs"} - set(kept)
    if missing:
        raise SystemExit(f"error: {path}: not a results.json (no {', '.join(sorted(missing))})")
    return kept


def save(path: Path, kept: dict[str, Any]) -> None:
    write_json_atomic(path, kept)


def _diff_key(d: dict[str, Any]) -> tuple[int, float, str]:
    return int(d["batch_size"]), float(d["lr"]), str(d["seed"])


def merge(kept: dict[str, Any], fresh: dict[str, Any] | None, kept_path: Path) -> dict[str, Any]:
    """Kept results with fresh ones laid over them (fresh wins per arm, difference and
    reference row); machine hours add up. SystemExit if the two recipes differ."""
    if fresh is None:
        return kept
    for key in RECIPE_FIELDS:
        if str(kept["recipe"].get(key)) != str(fresh["recipe"].get(key)):
            raise SystemExit(
                f"error: {kept_path}: kept results differ from the runs in {key} "
                f"({kept['recipe'].get(key)} against {fresh['recipe'].get(key)}); "
                "give each recipe its own page"
            )
    arms = {arm_key(r): r for r in kept["arms"]} | {arm_key(r): r for r in fresh["arms"]}
    diffs = {_diff_key(d): d for d in kept["diffs"]} | {_diff_key(d): d for d in fresh["diffs"]}
    refs = dict(kept["refs"]) | dict(fresh["refs"])
    return {
        "recipe": fresh["recipe"],
        "machine_hours": kept["machine_hours"] + fresh["machine_hours"],
        "sources": [*kept["sources"], *fresh["sources"]],
        "refs": [[name, ref] for name, ref in refs.items()],
        "arms": sorted(arms.values(), key=arm_order),
        "diffs": sorted(
            diffs.values(),
            key=lambda d: (d["lr"], d["batch_size"], d["seed"] == "all", str(d["seed"])),
        ),
    }
