"""Time and memory sweeps of the training step (full, accumulate, gradcache, peers), the loss
alone (direct and tiled) and corpus encoding, every point in a fresh process (its peak its own),
appended to ``points.jsonl`` as it ends (``--reuse`` resumes); bench.json, bench.md, two plots::

    python -m benchmarks.synthetic --peers --loss-sweep --index-sweep --out docs/bench
"""

from __future__ import annotations

import functools
import json
from collections.abc import Callable
from dataclasses import asdict, dataclass, field
from pathlib import Path

from benchmarks import harness, point
from benchmarks.point import PointSpec, StepSettings, opt
from dpr_cache.runtime import atomic

POINTS_FILE = "points.jsonl"
GB = 1e9


@dataclass(kw_only=True)
class BenchPlan(StepSettings):
    """``batches`` x ``modes`` (chunked modes where B >= chunk); at ``focus_batch`` also the tiled
    loss, no kept last graph and the peers; ``memory_batches``: one-step gradcache points."""

    batches: list[int] = opt([8, 16, 32, 64, 128], "Sweep batch sizes.")
    modes: list[str] = opt(["full", "accumulate", "gradcache"], "Of full, accumulate, gradcache.")
    focus_batch: int = opt(128, "Batch for the tiled / no-kept-graph / peer comparisons.")
    memory_batches: list[int] = opt([2048], "One-step gradcache points.")
    peers: bool = opt(False, "Also st-cmnrl and gradcache-lib (bench extra).")
    loss_batches: list[int] = field(default_factory=list)  # the loss sweep's sizes; none: no sweep
    loss_dim: int = opt(768, "Loss sweep rep dim.")
    loss_direct_max: int = opt(16384, "Largest untiled loss B.")
    index_passages: str | None = None  # passages to encode, sorted and padded; None: none
    index_limit: int | None = opt(None, "First N passages only.")
    index_batch_size: int = opt(64, "Encoding batch.")
    index_max_length: int = opt(256, "Max passage tokens.", "--index-length")


def plan_points(plan: BenchPlan) -> list[PointSpec]:
    """The encoder-step points of ``plan``, cheapest sweep first, memory points last."""
    timed = {f: getattr(plan, f) for f in StepSettings.__dataclass_fields__}
    specs = []
    for mode in plan.modes:
        if mode not in point.OWN_MODES:
            raise ValueError(f"unknown mode {mode!r}; expected some of {point.OWN_MODES}")
        for b in sorted(plan.batches):
            if mode == "full" or b >= plan.chunk:
                specs.append(PointSpec(mode=mode, batch=b, **timed))
    focus = ["gradcache", "gradcache-tiled", "gradcache-naive"]
    for mode in focus + (["st-cmnrl", "gradcache-lib"] if plan.peers else []):
        spec = PointSpec(mode=mode, batch=plan.focus_batch, **timed)
        specs += [] if spec in specs else [spec]
    for b in sorted(plan.memory_batches):
        if not any(s.mode == "gradcache" and s.batch == b for s in specs):
            one_step = {**timed, "repeats": 1, "warmup": 0}
            specs.append(PointSpec(mode="gradcache", batch=b, **one_step))
    return specs


def spec_key(row: dict) -> str | None:
    """The key of the spec a saved row was measured with (None: a row lacking a setting)."""
    spec = PointSpec.from_row(row)
    return spec.key() if spec else None


def _loss_sweep(
    plan: BenchPlan, path: Path, reuse: bool, echo: Callable[[str], None]
) -> tuple[list[dict], list[dict]]:
    """Direct (up to ``loss_direct_max``) and tiled loss per batch, each in a fresh process.
    Returns (rows, skipped): a point the machine's free memory cannot hold is not run but listed
    in ``skipped`` with the reason."""
    from benchmarks.loss import loss_mode, measure_loss_memory, memory_shortfall, sweep_points

    if not reuse:
        atomic.write_text_atomic(path, "")
    rows = [json.loads(line) for line in atomic.read_lines(path)]
    done = {(row["batch"], row["dim"], row["tile"]): row for row in rows}
    rows, skipped = [], []
    for b, tile in sweep_points(sorted(plan.loss_batches), plan.tile, plan.loss_direct_max):
        name = f"{'loss ' + loss_mode(tile):>16} B={b:<6}"
        row = done.get((b, plan.loss_dim, tile))
        if row is None:
            if why := memory_shortfall(b, plan.loss_dim, tile):  # "where memory allows"
                skipped.append({"batch": b, "dim": plan.loss_dim, "tile": tile, "why": why})
                echo(f"{name} skipped: {why}")
                continue
            row = measure_loss_memory(b, plan.loss_dim, tile)
            with path.open("a", encoding="utf-8") as f:
                atomic.append_line(f, json.dumps(row))
        rows.append(row)
        echo(f"{name} {row['ns_per_score']:.3f} ns/score, peak {row['peak_rss'] / GB:.2f} GB")
    return rows, skipped


def run_bench(
    plan: BenchPlan, out_dir: Path, *, command: str = "", reuse: bool = False, echo=harness.echo
) -> dict:
    """Run every point of ``plan``; write bench.json, bench.md and the plots into ``out_dir``."""

    def measure(out: Path) -> dict:
        jobs = [(f"{s.mode:>16} B={s.batch:<6}", s, {}) for s in plan_points(plan)]
        points, _ = point.run_points(out / POINTS_FILE, jobs, reuse, spec_key, echo)
        loss, loss_skipped = _loss_sweep(plan, out / "loss.jsonl", reuse, echo)
        index = None
        if plan.index_passages:
            args = {n: getattr(plan, n) for n in ("model", "pooling", "threads")}
            args.update(passages=plan.index_passages, max_length=plan.index_max_length)
            args.update(batch_size=plan.index_batch_size, limit=plan.index_limit)
            index_args = ("benchmarks.index", args, out / "index.json", reuse, echo)
            index = harness.cached_child_result(*index_args)
        figures = {"points": points, "loss": loss, "loss_skipped": loss_skipped, "index": index}
        return {**figures, "targets": targets({**figures, "plan": asdict(plan)})}

    return harness.record_run(out_dir, "bench", plan, command, measure, render)


def main(argv: list[str] | None = None) -> None:
    """Time and memory sweeps: writes bench.json, bench.md and two plots under --out."""
    parser = point.plan_parser(BenchPlan, main.__doc__)
    parser.add_argument("--separate", dest="shared", action="store_false", help="Two towers.")
    parser.add_argument("--loss-sweep", action="store_true", help="Loss only sweep.")
    sizes = "Loss sweep sizes (a size RAM cannot hold is skipped)."
    batches = point.comma_list(int)
    parser.add_argument(
        "--loss-batches", type=batches, default="1024,4096,16384,65536,262144", help=sizes
    )
    parser.add_argument("--index-sweep", action="store_true", help="Sorted vs padded encoding.")
    passages = Path("data/squad/passages.tsv")
    parser.add_argument("--passages", type=Path, default=passages, help="For --index-sweep.")
    args = parser.parse_args(argv)
    if args.index_sweep and not args.passages.is_file():
        raise SystemExit(f"error: {args.passages}: no passages file (run `dpr-cache data squad`)")
    loss_batches = args.loss_batches if args.loss_sweep else []
    index_passages = str(args.passages) if args.index_sweep else None
    plan = point.plan_of(BenchPlan, args, loss_batches=loss_batches, index_passages=index_passages)
    command = point.command_line("benchmarks.synthetic")
    try:
        result = run_bench(plan, args.out, command=command, reuse=args.reuse)
    except ValueError as exc:
        raise SystemExit(f"error: {exc}") from None
    harness.print_targets(result["targets"], args.out)


def _vs(name: str, num: dict | None, den: dict | None, goal: str, key="pairs_per_s") -> dict:
    if num is None or den is None:
        return harness.goal_target(name, None, goal, "not measured in this run")
    detail = f"{num[key]:.4g} / {den[key]:.4g} ({num['mode']} B={num['batch']} vs "
    detail += f"{den['mode']} B={den['batch']})"
    return harness.goal_target(name, num[key] / den[key], goal, detail)


def targets(result: dict) -> list[dict]:
    """The performance targets as ratios measured within this run (``met`` None = not measured)."""
    plan, points = result["plan"], [p for p in result["points"] if "error" not in p]
    focus, chunk = plan["focus_batch"], plan["chunk"]

    def find(mode: str, batch: int | None = None, by: str = "") -> dict | None:
        found = [p for p in points if p["mode"] == mode and batch in (None, p["batch"])]
        return max(found, key=lambda p: p[by], default=None) if by else (found or [None])[-1]

    gc, biggest = find("gradcache", focus), find("gradcache", by="batch")
    best_full = find("full", by="pairs_per_s")
    out = [_vs(f"gradcache B={focus} vs best full batch", gc, best_full, ">= 0.80")]
    for peer, goal in (("st-cmnrl", ">= 1.3"), ("gradcache-lib", ">= 1.15")):
        out.append(_vs(f"gradcache vs {peer}, B={focus}", gc, find(peer, focus), goal))
    name = f"gradcache B={biggest['batch'] if biggest else '?'} peak vs full B={chunk}"
    out.append(_vs(name, biggest, find("full", chunk), "<= 1.10", "peak_bytes"))
    loss, big = result.get("loss") or [], 65536
    tiled = ([r for r in loss if r["tile"] is not None and r["batch"] == big] or [None])[-1]
    direct = max((r for r in loss if r["tile"] is None), key=lambda r: r["batch"], default=None)
    if tiled:
        detail = f"peak RSS of the whole process, d={tiled['dim']}"
        peak = tiled["peak_rss"] / GB
        out.append(harness.goal_target(f"tiled loss peak at B={big}", peak, "< 2.5 GB", detail))
    if tiled and direct:
        name = f"tiled time/score at B={big} vs direct at B={direct['batch']}"
        ns = (tiled["ns_per_score"], direct["ns_per_score"])
        detail = f"{ns[0]:.3f} / {ns[1]:.3f} ns per score"
        out.append(harness.goal_target(name, ns[0] / ns[1], "<= 1.3", detail))
    if index := result.get("index"):
        detail = f"{index['padded_s']:.1f} s / {index['sorted_s']:.1f} s, "
        detail += f"{index['passages']} passages, max {index['max_length']} tokens"
        name = "index: sorted vs padded batches"
        out.append(harness.goal_target(name, index["speedup"], ">= 1.3", detail))
    return out


TITLE = "Benchmark: the training step on synthetic text, the loss, corpus encoding"
RECIPE = """\
Model `{model}` (shared={shared}, pooling={pooling}, train mode, dropout {dropout}), fp32 on \
{device}; synthetic batches: random token ids, questions exactly {q_len} and passages exactly \
{p_len} tokens (no padding), {hard_negatives} hard negatives. Step = zero_grad + forward + loss + \
backward (no optimizer); median of {repeats} after {warmup} warm-up, each point in a fresh \
process; memory-only points (one step, no warm-up) show `steps timed` 1."""
POINTS_TABLE = (
    "mode | B | chunk | step s (median) | steps timed | pairs / s | peak GB | step over ready GB",
    "{mode} | {batch} | {chunk} | {step_s:.2f} | {repeats} | {pairs_per_s:.2f} | {peak:.3f}"
    " | {over:.3f}",
)
INDEX_TABLE = (
    "passages | mean tokens | max length | batch | padded, file order s | sorted by length s"
    " | speed-up",
    "{passages} | {mean_tokens:.0f} | {max_length} | {batch_size} | {padded_s:.1f}"
    " | {sorted_s:.1f} | {speedup:.2f}",
)


def _point_row(p: dict) -> dict:
    chunk = p["chunk"] if p["mode"] != "full" else "-"
    over = p["step_peak_over_ready_bytes"] / GB
    return {**p, "chunk": chunk, "peak": p["peak_bytes"] / GB, "over": over}


def markdown(result: dict) -> str:
    """bench.md: machine, command, targets, the step sweep, the loss sweep, the index run."""
    from benchmarks.loss import sweep_table

    plan = result["plan"]
    dropout = plan["dropout"] if plan["dropout"] is not None else "as saved"
    points = sorted(result["points"], key=lambda p: (p["mode"], p["batch"]))
    machine = f"{harness.machine_text(result['machine'])} {harness.run_text(result)}"
    recipe = RECIPE.format(**{**plan, "dropout": dropout})
    head = [machine, f"Command: `{result['command']}`", recipe]
    rows = [_point_row(p) for p in points if "error" not in p]
    parts = [*harness.page_head(TITLE, head, result["targets"]), "## Encoder steps", ""]
    parts += harness.format_table(POINTS_TABLE, rows, "lrrrrrrr")
    for p in points:
        parts += ["", f"Failed: {p['mode']} B={p['batch']}: {p['error']}"] if "error" in p else []
    if result.get("loss"):
        parts += ["", "## Loss only (random fp32 reps, forward + backward)", ""]
        parts += [sweep_table(result["loss"])]
    for skip in result.get("loss_skipped") or []:
        mode = "direct" if skip["tile"] is None else f"tiled ({skip['tile']})"
        parts += [
            "",
            f"Not run, too big for this machine's memory: B={skip['batch']} {mode}, {skip['why']}.",
        ]
    if index := result.get("index"):
        parts += ["", "## Index encoding", "", *harness.format_table(INDEX_TABLE, [index], "r" * 7)]
    parts += ["", "![memory](memory_vs_batch.png)", "", "![time](time_vs_batch.png)", ""]
    return "\n".join(parts)


def render(result: dict, folder: Path, source: Path | None = None) -> Path:
    """``bench.md`` and its plots in ``folder``."""
    atomic.write_text_atomic(folder / "bench.md", markdown(result))
    plot(result, folder)
    return folder / "bench.md"


def _panel(ax, series: dict[str, list[dict]], y, title: str, xlabel: str, ylabel: str) -> None:
    """Log-log axes, a line a series, ticked at the measured batch sizes as plain numbers."""
    for name, rows in series.items():
        xs, style = [r["batch"] for r in rows], "-" if len(rows) > 1 else "none"
        ax.plot(xs, [y(r) for r in rows], marker="o", linestyle=style, label=name)
    ax.set(xscale="log", yscale="log", xlabel=xlabel, ylabel=ylabel, title=title)
    if ticks := sorted({r["batch"] for rows in series.values() for r in rows}):
        ax.set_xticks(ticks, [f"{b:,}" for b in ticks], fontsize=7)
        ax.minorticks_off()
        ax.legend(fontsize=8)
    ax.grid(True, which="both", alpha=0.3)


def plot(result: dict, out_dir: Path) -> list[Path]:
    """memory_vs_batch.png and time_vs_batch.png (log-log; encoder steps left, loss right)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    points = sorted((p for p in result["points"] if "error" not in p), key=lambda p: p["batch"])
    modes = {m: [p for p in points if p["mode"] == m] for m in sorted({p["mode"] for p in points})}
    loss = sorted(result.get("loss") or [], key=lambda r: r["batch"])
    kinds = {
        f"loss {k}": [r for r in loss if (r["tile"] is None) == (k == "direct")]
        for k in ("direct", "tiled")
    }
    model = Path(result["plan"]["model"].split(":")[-1]).name
    loss_title = f"contrastive loss only, d={loss[0]['dim'] if loss else '?'}"
    files = []
    for memory, name in ((True, "memory_vs_batch.png"), (False, "time_vs_batch.png")):
        ylabel = "peak memory (GB)" if memory else "seconds per step"
        step_y = (lambda p: p["peak_bytes"] / GB) if memory else (lambda p: p["step_s"])
        loss_y = (
            (lambda r: r["peak_rss"] / GB)
            if memory
            else (lambda r: r["forward_s"] + (r["backward_s"] or 0.0))
        )
        fig, (left, right) = plt.subplots(1, 2, figsize=(11, 4.2))
        _panel(left, modes, step_y, f"encoder step, {model}", "batch size B (questions)", ylabel)
        _panel(right, kinds, loss_y, loss_title, "batch size B", ylabel)
        fig.tight_layout()
        save = functools.partial(fig.savefig, dpi=110, format="png")
        files.append(atomic.write_atomic(out_dir / name, save))
        plt.close(fig)
    return files


if __name__ == "__main__":
    main()
