"""The real-text benchmark's page and plot, from ``realtext.json``'s content."""

from __future__ import annotations

import functools
from pathlib import Path

from benchmarks.machine import cpu_text
from benchmarks.synthetic_report import run_text, targets_table
from dpr_cache.runtime.atomic import write_atomic

__all__ = ["markdown", "plot"]


def _configs_table(configs: list[dict]) -> list[str]:
    lines = [
        "| configuration | rounds | step s (median) | each round | pairs / s | real tokens / s "
        "| tokens encoded a step (padding, passes) | real tokens a step | peak GB |",
        "|---|--:|--:|---|--:|--:|--:|--:|--:|",
    ]
    for c in configs:
        if not c["rounds"]:
            lines.append(f"| {c['label']} | 0 | failed: {'; '.join(c['errors'])[:160]} |")
            continue
        each = " / ".join(f"{s:.1f}" for s in c["step_s_each"])
        over = "" if c["within_budget"] else " (over budget)"
        lines.append(
            f"| {c['label']} | {c['rounds']} | {c['step_s']:.2f} | {each} | {c['pairs_per_s']:.2f}"
            f" | {c['real_tokens_per_s']:,.0f} | {c['encoded_tokens']:,}"
            f" ({c['encoded_tokens'] / c['real_tokens']:.2f} x real) | {c['real_tokens']:,}"
            f" | {c['peak_gb']:.2f}{over} |"
        )
    return lines


PHASE_NAMES = {
    "collate_s": "collate (tokenize the batch; off the step, in a loader worker when training)",
    "split": "order by length and chunk",
    "forward_no_grad": "graph-less forward, all chunks but the kept last",
    "forward_last": "forward of the kept last chunks, with graph",
    "build_cache": "loss and d(loss)/d(reps)",
    "forward_backward": "re-forward with graph + backward",
    "optimizer": "optimizer (AdamW step)",
}


def _profile_table(profile: dict) -> list[str]:
    on, off = profile["dropout_on"], profile["dropout_off"]
    total = on["step"] + on["optimizer"]
    lines = [
        "| phase | seconds, dropout on | share of step + optimizer | seconds, dropout off "
        "| dropout's cost |",
        "|---|--:|--:|--:|--:|",
    ]
    for key, name in PHASE_NAMES.items():
        if key == "collate_s":
            value = profile.get("collate_s")
            if value is not None:
                lines.append(f"| {name} | {value:.3f} | – | {value:.3f} | – |")
            continue
        lines.append(
            f"| {name} | {on[key]:.3f} | {on[key] / total:.0%} | {off[key]:.3f}"
            f" | {on[key] - off[key]:+.3f} |"
        )
    lines.append(
        f"| **step + optimizer** | {total:.3f} | 100% | {off['step'] + off['optimizer']:.3f}"
        f" | {total - off['step'] - off['optimizer']:+.3f} |"
    )
    return lines


def _when(result: dict) -> str:
    """When this run measured, and the load then; or that it only rewrote the page."""
    if result.get("rows_kept") and not result.get("rows_measured"):
        return f"Page written {result['started']} from kept rows (this run measured none)."
    return run_text(result)


def _provenance(result: dict) -> str:
    """How many rows this run measured, when some were kept from earlier runs."""
    measured, kept = result.get("rows_measured", 0), result.get("rows_kept", 0)
    if not kept:
        return ""
    return (
        f" (this run measured {measured} of the {measured + kept} rows; the other {kept} were"
        " kept from earlier runs with the same settings)"
    )


def markdown(result: dict) -> str:
    """realtext.md: machine (CPU model and flags), command, recipe, targets, every config."""
    m, plan = result["machine"], result["plan"]
    lines = [
        "# Benchmark: the training step on real text",
        "",
        f"Machine: {cpu_text(m)}; torch {m['torch']} ({m['threads']} threads),"
        f" transformers {m['transformers']}. {_when(result)}",
        "",
        f"Command: `{result['command']}`{_provenance(result)}",
        "",
        f"Text: the trainer's first batch of `{plan['text']}` (its questions and passages as"
        f" they are, cut at {plan['q_len']} and {plan['p_len']} tokens, padded to the batch's"
        f" longest row), {plan['hard_negatives']} hard negative a question; model"
        f" `{plan['model']}` in train mode (its dropout). A step is zero_grad, forward, loss and"
        " backward (no optimizer). Each configuration runs in a fresh process:"
        f" {plan['warmup']} warm-up step (batches up to {plan['warmup_max_batch']}; larger ones,"
        " whose one-time costs are a small share of a step, none) then"
        f" {plan['repeats']} timed; the configurations are"
        f" interleaved over {plan['rounds']} rounds and the table gives the median. *Tokens"
        " encoded* counts every token position the encoders were given in the step, padding and"
        " second passes included; *real tokens* are the batch's unpadded tokens, and real"
        " tokens / s divides them by the step time. The budget for the full batch is"
        f" {plan['budget_gb']:g} GB of peak resident memory.",
        "",
        "## Targets",
        "",
        targets_table(result["targets"]),
        "",
        "## Configurations",
        "",
        *_configs_table(result["configs"]),
        "",
        "![pairs per second and tokens encoded per configuration](realtext.png)",
        "",
    ]
    if result.get("profile"):
        prof = result["profile"]
        lines += [
            "## Where the time goes",
            "",
            f"Ours at B={prof['batch']}, chunk {prof['chunk']}, fp32: each phase of the engine"
            " timed by wrapping its method, median of"
            f" {prof['repeats']} step(s) after {prof['warmup']} warm-up, in one fresh process;"
            " then the same with the model in eval mode (no dropout). Dropout's cost is the"
            " difference.",
            "",
            *_profile_table(prof),
            "",
        ]
    return "\n".join(lines)


def plot(result: dict, path: Path) -> Path:
    """Pairs per second (every round a dot, the median a bar) and tokens encoded per pair."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    configs = [c for c in result["configs"] if c["rounds"]]
    fig, (left, right) = plt.subplots(1, 2, figsize=(13, 0.45 * len(configs) + 2.2))
    ys = list(range(len(configs)))[::-1]
    for y, c in zip(ys, configs, strict=True):
        color = "C0" if c["mode"] == "gradcache" else "C1" if c["mode"] == "full" else "C2"
        left.barh(y, c["pairs_per_s"], color=color, alpha=0.6)
        left.scatter(
            [c["batch"] / s for s in c["step_s_each"]],
            [y] * len(c["step_s_each"]),
            color="black",
            s=10,
            zorder=3,
        )
        right.barh(y, c["encoded_tokens"] / c["batch"], color=color, alpha=0.6)
        right.scatter(
            [c["real_tokens"] / c["batch"]], [y], marker="|", s=200, color="black", zorder=3
        )
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
