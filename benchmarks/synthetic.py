"""Time and memory sweeps of the training step (full, accumulate, gradcache, peers), every
point in a fresh process (its peak its own), appended to ``points.jsonl`` as it ends (``--reuse``
resumes); bench.json, bench.md, two plots::

    python -m benchmarks.synthetic --peers --out docs/bench
"""

from __future__ import annotations

from dataclasses import asdict, dataclass
from pathlib import Path

from benchmarks import harness, point
from benchmarks.point import PointSpec, StepSettings, opt

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


def plan_points(plan: BenchPlan) -> list[PointSpec]:
    """The encoder-step points of ``plan``, cheapest sweep first, memory points last."""
    timed = {f: getattr(plan, f) for f in StepSettings.__dataclass_fields__}
    specs = []
    if unknown := set(plan.modes) - set(point.OWN_MODES):
        raise ValueError(f"unknown modes {unknown}; expected some of {point.OWN_MODES}")
    for mode, b in ((m, b) for m in plan.modes for b in sorted(plan.batches)):
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


def main(argv: list[str] | None = None) -> None:
    """Time and memory sweeps: writes bench.json, bench.md and two plots under --out."""
    parser = point.plan_parser(BenchPlan, main.__doc__)
    parser.add_argument("--separate", dest="shared", action="store_false", help="Two towers.")
    args = parser.parse_args(argv)
    plan = point.plan_of(BenchPlan, args)
    try:
        jobs = [(f"{s.mode:>16} B={s.batch:<6}", s, {}) for s in plan_points(plan)]
    except ValueError as exc:
        raise SystemExit(f"error: {exc}") from None

    def measure(out: Path) -> dict:
        points, _ = point.run_points(out / POINTS_FILE, jobs, args.reuse, spec_key, harness.echo)
        return {"points": points, "targets": targets({"points": points, "plan": asdict(plan)})}

    command = point.command_line("benchmarks.synthetic")
    result = harness.record_run(args.out, "bench", plan, command, measure, render)
    harness.print_targets(result["targets"])


def targets(result: dict) -> list[dict]:
    """The performance targets as ratios measured within this run (``met`` None = not measured)."""
    plan, points = result["plan"], [p for p in result["points"] if "error" not in p]
    focus, chunk, pick = plan["focus_batch"], plan["chunk"], point.pick
    gc = pick(points, mode="gradcache", batch=focus)
    biggest = pick(points, "batch", mode="gradcache")
    best_full = pick(points, "pairs_per_s", mode="full")
    out = [point.ratio_target(f"gradcache B={focus} vs best full batch", gc, best_full, ">= 0.80")]
    for peer, goal in (("st-cmnrl", ">= 1.3"), ("gradcache-lib", ">= 1.15")):
        name, found = f"gradcache vs {peer}, B={focus}", pick(points, mode=peer, batch=focus)
        out.append(point.ratio_target(name, gc, found, goal))
    name = f"gradcache B={biggest['batch'] if biggest else '?'} peak vs full B={chunk}"
    full = pick(points, mode="full", batch=chunk)
    out.append(point.ratio_target(name, biggest, full, "<= 1.10", "peak_bytes"))
    return out


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


def _point_row(p: dict) -> dict:
    chunk = p["chunk"] if p["mode"] != "full" else "-"
    over = p["step_peak_over_ready_bytes"] / GB
    return {**p, "chunk": chunk, "peak": p["peak_bytes"] / GB, "over": over}


def render(result: dict, folder: Path, source: Path | None = None) -> Path:
    """``bench.md`` (machine, command, targets, the step sweep) and its plots in ``folder``."""
    plan = result["plan"]
    dropout = plan["dropout"] if plan["dropout"] is not None else "as saved"
    points = sorted(result["points"], key=lambda p: (p["mode"], p["batch"]))
    failed = [f"Failed: {p['mode']} B={p['batch']}: {p['error']}" for p in points if "error" in p]
    plot(result, folder)
    return harness.write_page(
        folder / "bench.md",
        "Benchmark: the training step on synthetic text",
        f"{harness.machine_text(result['machine'])} {harness.run_text(result)}",
        f"Command: `{result['command']}`",
        RECIPE.format(**{**plan, "dropout": dropout}),
        "## Targets",
        harness.targets_table(result["targets"]),
        "## Encoder steps",
        harness.format_table(POINTS_TABLE, [_point_row(p) for p in points if "error" not in p]),
        *failed,
        "![memory](memory_vs_batch.png)",
        "![time](time_vs_batch.png)",
    )


def plot(result: dict, out_dir: Path) -> None:
    """memory_vs_batch.png and time_vs_batch.png: log-log, a line a mode, ticked at each B."""
    plt = harness.pyplot()
    points = sorted((p for p in result["points"] if "error" not in p), key=lambda p: p["batch"])
    title = f"encoder step, {Path(result['plan']['model'].split(':')[-1]).name}"
    for ylabel, name in (("peak memory (GB)", "memory"), ("seconds per step", "time")):
        fig, ax = plt.subplots(figsize=(6, 4.2))
        for mode in sorted({p["mode"] for p in points}):
            rows = [p for p in points if p["mode"] == mode]
            ys = [p["peak_bytes"] / GB if name == "memory" else p["step_s"] for p in rows]
            style = "-" if len(rows) > 1 else "none"
            ax.plot([p["batch"] for p in rows], ys, marker="o", linestyle=style, label=mode)
        ax.set(xscale="log", yscale="log", xlabel="batch size B (questions)", ylabel=ylabel)
        ax.set_title(title)
        if ticks := sorted({p["batch"] for p in points}):
            ax.set_xticks(ticks, [f"{b:,}" for b in ticks], fontsize=7)
            ax.minorticks_off()
            ax.legend(fontsize=8)
        ax.grid(True, which="both", alpha=0.3)
        harness.save_figure(fig, out_dir / f"{name}_vs_batch.png")


if __name__ == "__main__":
    main()
