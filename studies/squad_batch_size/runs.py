"""The batch-size study's runs read back: records, recipe check, groups over seeds and the paired
differences of each GradCache run with the full batch of its model and seed."""

from __future__ import annotations

import json
import statistics
from pathlib import Path
from typing import Any

from dpr_cache.runtime.atomic import read_lines

KS = (1, 5, 20, 100)
RECIPE_KEYS = ("epochs", "lr", "warmup_pct", "chunk_size", "dry_run")
MODEL_NAMES = {"minilm": "all-MiniLM-L6-v2", "reinit": "MiniLM, layers re-initialised"}


def _read_log(path: Path) -> dict[str, Any]:
    """Peak memory, summed step seconds and step count of a train_log.jsonl (empty if none)."""
    lines = [json.loads(line) for line in read_lines(path)]
    if not lines:
        return {}
    return {
        "peak_memory_bytes": max(r["peak_memory_bytes"] for r in lines),
        "train_seconds": sum(r["seconds"] for r in lines),
        "steps": lines[-1]["step"],
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


def _mean_sd(values: list[float]) -> tuple[float | None, float | None]:
    """Mean and sample standard deviation; the sd is None below two values (not measured)."""
    mean = statistics.mean(values) if values else None
    return mean, statistics.stdev(values) if len(values) > 1 else None


def check_same_recipe(records: list[dict[str, Any]]) -> None:
    """SystemExit naming the key and two runs if trained runs differ in their recipe."""
    trained = [r for r in records if r["mode"] in ("full", "gradcache")]
    for key in RECIPE_KEYS:
        values = {str(r.get(key)): r["dir"] for r in trained}
        if len(values) > 1:
            (a, run_a), (b, run_b) = list(values.items())[:2]
            raise SystemExit(
                f"error: runs differ in {key} ({run_a}: {a}, {run_b}: {b}); "
                "give each recipe its own --runs folder (OUT=... studies/squad_batch_size/run.sh)"
            )


def first_hit_ranks(retrieval_json: Path) -> list[float]:
    """Per dev question, the 0-based rank of the first passage holding an answer (inf if none)."""
    entries = json.loads(retrieval_json.read_text(encoding="utf-8"))
    ranks = []
    for entry in entries:
        flags = [bool(ctx["has_answer"]) for ctx in entry["ctxs"]]
        ranks.append(flags.index(True) if True in flags else float("inf"))
    return ranks


def paired_differences(
    records: list[dict[str, Any]], runs: Path, ks: tuple[int, ...] = (1, 5, 20), n_boot: int = 10000
) -> list[dict[str, Any]]:
    """Each trained setting minus the full batch of the same model and seed, in top-k points,
    with a 95% paired bootstrap interval over the dev questions (resampling questions, seed 0).

    The interval covers the test-set sampling only; the spread over training seeds is the
    table's standard deviation (one seed: not measured)."""
    import numpy as np

    full = {(r["model"], r["seed"]): r for r in records if r["mode"] == "full"}
    out = []
    for r in records:
        base = full.get((r["model"], r["seed"]))
        if r["mode"] != "gradcache" or base is None:
            continue
        a = np.array(first_hit_ranks(runs / r["dir"] / "eval" / "retrieval.json"))
        b = np.array(first_hit_ranks(runs / base["dir"] / "eval" / "retrieval.json"))
        rng = np.random.default_rng(0)
        idx = rng.integers(0, len(a), size=(n_boot, len(a)))
        row = {"model": r["model"], "setting": r["setting"], "seed": r["seed"]}
        for k in ks:
            diff = (a < k).astype(float) - (b < k).astype(float)  # per question: -1, 0 or 1
            boot = diff[idx].mean(axis=1) * 100
            row[f"top{k}"] = float(diff.mean() * 100)
            row[f"top{k}_ci"] = (float(np.percentile(boot, 2.5)), float(np.percentile(boot, 97.5)))
        out.append(row)
    return out


def seed_spread(diffs: list[dict[str, Any]], ks: tuple[int, ...] = (1, 5, 20)) -> list[dict]:
    """Per model and GradCache setting: the mean and standard deviation over seeds of the paired
    difference with the full batch (each seed compared with its own full-batch run)."""
    groups: dict[tuple[str, str], list[dict[str, Any]]] = {}
    for d in diffs:
        groups.setdefault((d["model"], d["setting"]), []).append(d)
    out = []
    for (model, setting), ds in groups.items():
        row: dict[str, Any] = {
            "model": model,
            "setting": setting,
            "seeds": sorted(d["seed"] for d in ds),
        }
        for k in ks:
            row[f"top{k}"], row[f"top{k}_sd"] = _mean_sd([d[f"top{k}"] for d in ds])
        out.append(row)
    return out


def _order(key: tuple[str, str, int]) -> tuple:
    model, setting, batch = key
    models = list(MODEL_NAMES)
    return (
        models.index(model) if model in models else len(models),
        model,
        setting != "off-the-shelf",
        batch,
        setting,
    )


def group(records: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Mean and standard deviation over seeds per (model, setting)."""
    groups: dict[tuple[str, str, int], list[dict[str, Any]]] = {}
    for r in records:
        groups.setdefault((r["model"], r["setting"], r["batch_size"]), []).append(r)
    rows = []
    for key in sorted(groups, key=_order):
        runs = groups[key]
        row: dict[str, Any] = {"model": key[0], "setting": key[1], "batch_size": key[2]}
        row["seeds"] = sorted(r["seed"] for r in runs)
        for name in [f"top{k}" for k in KS] + ["peak_memory_bytes", "train_seconds", "steps"]:
            row[name], row[name + "_sd"] = _mean_sd(
                [r[name] for r in runs if r.get(name) is not None]
            )
        row["steps_sd"] = None  # steps are fixed by B and epochs: no spread to show
        rows.append(row)
    return rows
