"""Time and memory sweeps of the training step (full, accumulate, gradcache, peers), the loss
alone (direct versus tiled) and corpus encoding; writes bench.json, bench.md and two plots.

Every point runs in a fresh process (:mod:`dpr_cache.bench.point`), so its peak resident memory
is its own. Points are appended to ``points.jsonl`` as they finish; ``reuse=True`` skips a point
whose exact spec is already there (to resume an interrupted sweep).
"""

from __future__ import annotations

import dataclasses
import datetime
import json
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

from dpr_cache.bench.machine import load_average, machine_info
from dpr_cache.bench.point import OWN_MODES, PointSpec, StepSettings
from dpr_cache.runtime.atomic import append_line, read_lines, write_json_atomic, write_text_atomic
from dpr_cache.runtime.processes import ChildFailed, run_json_child

__all__ = ["BenchPlan", "plan_points", "run_bench"]

POINTS_FILE = "points.jsonl"
LOSS_FILE = "loss.jsonl"
INDEX_FILE = "index.json"


@dataclass(kw_only=True)
class BenchPlan(StepSettings):
    """What to measure. ``batches`` x ``modes`` is the sweep (chunked modes only where
    B >= chunk); at ``focus_batch`` also gradcache with the tiled loss, gradcache without the
    kept last graph and, with ``peers``, the two peers; ``memory_batches`` are gradcache points
    of one step each (their memory is the point). The model and input settings are
    :class:`~dpr_cache.bench.point.StepSettings`, shared by every point."""

    batches: list[int] = field(default_factory=lambda: [8, 16, 32, 64, 128])
    modes: list[str] = field(default_factory=lambda: ["full", "accumulate", "gradcache"])
    focus_batch: int = 128
    memory_batches: list[int] = field(default_factory=lambda: [2048])
    peers: bool = False
    loss_batches: list[int] = field(default_factory=list)
    loss_dim: int = 768
    loss_direct_max: int = 16384
    index_passages: str | None = None
    index_limit: int | None = None
    index_batch_size: int = 64
    index_max_length: int = 256


def plan_points(plan: BenchPlan) -> list[PointSpec]:
    """The encoder-step points of ``plan``, cheapest sweep first, memory points last."""
    timed = {f.name: getattr(plan, f.name) for f in dataclasses.fields(StepSettings)}
    untimed = dict(timed, repeats=1, warmup=0)
    specs = []
    for mode in plan.modes:
        if mode not in OWN_MODES:
            raise ValueError(f"unknown mode {mode!r}; expected some of {OWN_MODES}")
        for b in sorted(plan.batches):
            if mode == "full" or b >= plan.chunk:
                specs.append(PointSpec(mode=mode, batch=b, **timed))
    focus = ["gradcache", "gradcache-tiled", "gradcache-naive"]
    focus += ["st-cmnrl", "gradcache-lib"] if plan.peers else []
    for mode in focus:
        spec = PointSpec(mode=mode, batch=plan.focus_batch, **timed)
        if spec not in specs:
            specs.append(spec)
    for b in sorted(plan.memory_batches):
        spec = PointSpec(mode="gradcache", batch=b, **untimed)
        if not any(s.mode == "gradcache" and s.batch == b for s in specs):
            specs.append(spec)
    return specs


def run_child_or_error(module: str, payload: dict) -> dict:
    """The child's result, or the payload with ``error`` (exit code and last stderr line)."""
    try:
        return run_json_child(module, [json.dumps(payload)])
    except ChildFailed as e:
        return {**payload, "error": f"exit {e.returncode}: {e.tail[:200]}"}


def run_point(spec: PointSpec) -> dict:
    """One point in a fresh process; ``{"error": ...}`` added instead of figures on failure."""
    return run_child_or_error("dpr_cache.bench.point", dataclasses.asdict(spec))


def _load_done(path: Path) -> dict[str, dict]:
    done = {}
    for line in read_lines(path):
        row = json.loads(line)
        if "error" not in row:
            done[PointSpec.from_row(row).key()] = row
    return done


def _loss_sweep(
    plan: BenchPlan, path: Path, reuse: bool, echo: Callable[[str], None]
) -> tuple[list[dict], list[dict]]:
    """Direct (up to ``loss_direct_max``) and tiled loss per batch, each in a fresh process.

    Returns (rows, skipped): a point the machine's free memory cannot hold is not run but listed
    in ``skipped`` with the reason."""
    from dpr_cache.bench.loss import (
        loss_mode,
        measure_loss_memory,
        memory_shortfall,
        sweep_points,
    )

    def key(batch: int, tile: int | None) -> tuple:
        return (batch, plan.loss_dim, tile)

    done = {}
    if reuse:
        for line in read_lines(path):
            row = json.loads(line)
            done[key(row["batch"], row["tile"])] = row
    else:
        write_text_atomic(path, "")
    rows, skipped = [], []
    for b, tile in sweep_points(sorted(plan.loss_batches), plan.tile, plan.loss_direct_max):
        mode = loss_mode(tile)
        row = done.get(key(b, tile))
        if row is None:
            if why := memory_shortfall(b, plan.loss_dim, tile):  # "where memory allows"
                skipped.append({"batch": b, "dim": plan.loss_dim, "tile": tile, "why": why})
                echo(f"{'loss ' + mode:>16} B={b:<6} skipped: {why}")
                continue
            row = measure_loss_memory(b, plan.loss_dim, tile)
            with path.open("a", encoding="utf-8") as f:
                append_line(f, json.dumps(row))
        rows.append(row)
        echo(f"{'loss ' + mode:>16} B={b:<6} {row['ns_per_score']:.3f} ns/score, "
             f"peak {row['peak_rss'] / 1e9:.2f} GB")  # fmt: skip
    return rows, skipped


def cached_child_result(
    module: str, args: dict, path: Path, reuse: bool, echo: Callable[[str], None]
) -> dict | None:
    """``module``'s result for ``args`` in a fresh process, saved in ``path`` with its args.

    With ``reuse``, a result saved for the same args is returned without running the child.
    A failed child is echoed and gives None (nothing is saved)."""
    if reuse and path.is_file():
        try:
            saved = json.loads(path.read_text())
            if saved["args"] == args:
                echo(f"{module}: kept from {path}")
                return saved["result"]
        except (ValueError, KeyError, TypeError):
            echo(f"{path}: not a saved result of this command; measuring again")
    result = run_child_or_error(module, args)
    if "error" in result:
        echo(f"{module}: {result['error']}")
        return None
    write_json_atomic(path, {"args": args, "result": result})
    return result


def _index_run(plan: BenchPlan, path: Path, reuse: bool, echo: Callable[[str], None]):
    """Sorted versus padded corpus encoding in a fresh process (reused if the same args)."""
    args = dict(
        model=plan.model, passages=plan.index_passages, pooling=plan.pooling,
        max_length=plan.index_max_length, batch_size=plan.index_batch_size,
        limit=plan.index_limit, threads=plan.threads,
    )  # fmt: skip
    index = cached_child_result("dpr_cache.bench.index", args, path, reuse, echo)
    if index is not None:
        echo(f"index: padded {index['padded_s']:.1f} s, sorted {index['sorted_s']:.1f} s")
    return index


def run_bench(
    plan: BenchPlan,
    out_dir: str | Path,
    *,
    command: str = "",
    reuse: bool = False,
    echo: Callable[[str], None] = lambda line: print(line, file=sys.stderr, flush=True),
) -> dict:
    """Run every point of ``plan``; write bench.json, bench.md and the plots into ``out_dir``."""
    from dpr_cache.bench import report

    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    started, t0 = datetime.datetime.now().isoformat(timespec="seconds"), time.perf_counter()
    load_at_start = load_average()
    points_file = out / POINTS_FILE
    done = _load_done(points_file) if reuse else {}
    if not reuse:
        write_text_atomic(points_file, "")
    points = []
    for spec in plan_points(plan):
        row = done.get(spec.key())
        if row is None:
            row = run_point(spec)
            with points_file.open("a", encoding="utf-8") as f:
                append_line(f, json.dumps(row))
        points.append(row)
        figures = row.get("error") or (
            f"{row['step_s']:.2f} s/step, {row['pairs_per_s']:.1f} pairs/s, "
            f"peak {row['peak_bytes'] / 1e9:.2f} GB"
        )
        echo(f"{spec.mode:>16} B={spec.batch:<6} {figures}")
    loss, loss_skipped = _loss_sweep(plan, out / LOSS_FILE, reuse, echo)
    index = _index_run(plan, out / INDEX_FILE, reuse, echo) if plan.index_passages else None
    result = {
        "load_average_at_start": load_at_start,
        "started": started,
        "seconds": time.perf_counter() - t0,
        "command": command,
        "machine": machine_info(plan.device, plan.threads),
        "plan": dataclasses.asdict(plan),
        "points": points,
        "loss": loss,
        "loss_skipped": loss_skipped,
        "index": index,
    }
    result["targets"] = report.targets(result)
    write_json_atomic(out / "bench.json", result)
    write_text_atomic(out / "bench.md", report.markdown(result))
    report.plot(result, out)
    return result
