"""Turn a benchmark result (``bench.json``'s content) into target ratios, markdown and plots."""

from __future__ import annotations

import functools
from pathlib import Path

from benchmarks.machine import cpu_text
from dpr_cache.runtime.atomic import write_atomic

__all__ = ["targets", "markdown", "plot", "targets_table", "run_text"]

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


def targets_table(rows: list[dict]) -> str:
    """The targets as a markdown table."""
    lines = ["| target | measured | goal | met | detail |", "|---|---:|---|---|---|"]
    for t in rows:
        met = {True: "yes", False: "**no**", None: "n/a"}[t["met"]]
        value = "-" if t["value"] is None else t["value"]
        lines.append(f"| {t['target']} | {value} | {t['goal']} | {met} | {t['detail']} |")
    return "\n".join(lines)


def load_text(values) -> str:
    """Load averages as "1.0/2.0/3.0" ("n/a" where the OS has none)."""
    return "/".join(f"{v:.1f}" for v in values) if values else "n/a"


def run_text(result: dict) -> str:
    """When the run started, how long it took, and the load average at its start and end."""
    return (
        f"Started {result['started']}, {result['seconds'] / 60:.0f} min; load average (1, 5, 15"
        f" min) at start {load_text(result.get('load_average_at_start'))}, at end"
        f" {load_text(result['machine'].get('load_average'))}."
    )


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


def plot(result: dict, out_dir: Path) -> list[Path]:
    """memory_vs_batch.png and time_vs_batch.png (log-log; encoder steps left, loss right)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    points = [p for p in result["points"] if "error" not in p]
    loss = result.get("loss") or []
    files = []
    for name, field, loss_field, ylabel in (
        ("memory_vs_batch.png", "peak_bytes", "peak_rss", "peak memory (GB)"),
        ("time_vs_batch.png", "step_s", None, "seconds per step"),
    ):
        fig, (left, right) = plt.subplots(1, 2, figsize=(11, 4.2))
        for mode in sorted({p["mode"] for p in points}):
            rows = sorted((p for p in points if p["mode"] == mode), key=lambda p: p["batch"])
            xs = [p["batch"] for p in rows]
            ys = [p[field] / (GB if field == "peak_bytes" else 1) for p in rows]
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
