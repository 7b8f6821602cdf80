"""The loss-options study's page: results.md (the arms, each against the control, the control
and Matryoshka at every dim, the costs, the reading), results.json and plot.png (hit rate at
every dim), from the runs under runs/squad_losses (or results.json with --kept).

    python -m studies.squad_losses.table --runs runs/squad_losses --readme docs/studies.md
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from studies.page import build_page, save_png
from studies.squad_crossfit.table import INTERVALS, arms_table
from studies.squad_hard_negatives.table import NAMES, cell, diff_cell, diffs_table
from studies.squad_losses.collect import AT_DIMS, TREATMENTS, gather

HERE = Path(__file__).resolve().parent
SEEDS = 3
HOURS = 15  # the study's machine-time budget
README_BEGIN, README_END = "<!-- losses_table:begin -->", "<!-- losses_table:end -->"
PLOTTED = ("top1", "top20")


def pooled_diffs(data: dict[str, Any]) -> list[dict[str, Any]]:
    """Each treatment minus the control over every seed both ran (or at the one seed)."""
    out = []
    for arm in TREATMENTS:
        rows = [d for d in data["diffs"] if d["pair"].startswith(f"{arm} - control, ")]
        over = [d for d in rows if len(d["seeds"]) > 1]
        if over or rows:
            out.append((over or rows)[0])
    return out


def dims_table(dims: dict[str, Any]) -> list[str]:
    """The control truncated and Matryoshka at each dim, and their difference."""
    by = {(r["arm"], r["dim"]): r for r in dims["rows"]}
    diffs = {d["dim"]: d for d in dims["diffs"]}
    lines = [
        "| dim | "
        + " | ".join(f"{NAMES[m]}: control / Matryoshka" for m in PLOTTED)
        + " | "
        + " | ".join(f"Δ {NAMES[m]}" for m in PLOTTED)
        + " |",
        "|--:|" + "|".join("--:" for _ in PLOTTED * 2) + "|",
    ]
    for d in sorted({dim for _, dim in by}, reverse=True):
        control, ours = by.get(("control", d)), by.get(("matryoshka", d))
        pair = [f"{cell(*_figure(control, m))} / {cell(*_figure(ours, m))}" for m in PLOTTED]
        delta = [diff_cell(diffs[d], m) if d in diffs else "–" for m in PLOTTED]
        lines.append(f"| {d} | " + " | ".join(pair + delta) + " |")
    return lines


def _figure(row: dict[str, Any] | None, m: str) -> tuple[float | None, float | None]:
    return (None, None) if row is None else (row[m], row.get(m + "_sd"))


def cost_lines(data: dict[str, Any]) -> list[str]:
    """Each part's hours and, for an arm, its step's median and fastest seconds over its runs: a
    step timed while other work shared the 2 cores is slower, so the fastest says more of what the
    option itself costs than the median of an arm that mostly ran beside other work."""
    steps = data.get("steps", {})
    lines = ["| part | machine hours | median step (s) | fastest step (s) |", "|---|--:|--:|--:|"]
    for part, hours in data["costs"].items():
        step = steps.get(part)
        times = f"{step['median_s']:.1f} | {step['fastest_s']:.1f}" if step else "– | –"
        lines.append(f"| {part} | {hours:.2f} | {times} |")
    return lines + [f"| all | {data['hours']:.2f} | | |"]


def goals(data: dict[str, Any]) -> list[str]:
    students = sum(len(r["seeds"]) for r in data["arms"])
    met = "met" if data["hours"] <= HOURS else "not met"
    return [
        f"- At most {HOURS} machine hours: **{met}**, {data['hours']:.1f} h for {students} of "
        f"{SEEDS * (len(TREATMENTS) + 1)} students and their evaluations."
    ]


def markdown(data: dict[str, Any], png: str, reading: str | None) -> str:
    parts = [
        "# SQuAD loss options: results",
        "",
        f"SQuAD v1.1 dev, {data['questions']:,} questions (the method, what was run and how: "
        f"[README.md](README.md), [run.sh](run.sh)). {INTERVALS} Machine time of the runs and "
        f"their evaluations on this page: {data['hours']:.1f} h. A run's training time is "
        "estimated as its updates at its median step time; an arm that ran mostly beside other "
        "work has a slow median, and its fastest step (the cost table) says more of what its "
        "option costs.",
        "",
        "## Retrievers",
        "",
        *arms_table(data),
        "",
        "## Each option against the control, the same seed (the same questions in every update)",
        "",
        *diffs_table(pooled_diffs(data)),
        "",
        "By seed:",
        "",
        *diffs_table([d for d in data["diffs"] if len(d["seeds"]) == 1]),
        "",
        "## Matryoshka: hit rate at every dim against the control truncated",
        "",
        f"![top-1 and top-20 at every dim]({png})",
        "",
        "The control and the Matryoshka arm, each run's stored passage vectors cut to the dim "
        "and re-normalized (`index --embeddings --dim`), its questions encoded at the dim "
        "(`eval --dim`). Figures over the seeds; Δ is Matryoshka minus the control at that dim.",
        "",
        *dims_table(data["dims"]),
        "",
        "## What each part cost",
        "",
        *cost_lines(data),
        "",
        "## Goals",
        "",
        *goals(data),
    ]
    if reading:
        parts += ["", reading.strip()]
    return "\n".join(parts) + "\n"


def plot(data: dict[str, Any], png: Path) -> None:
    """Hit rate (top-1, top-20) at every dim, the control truncated and Matryoshka, ± sd."""
    rows = data["dims"]["rows"]
    if not rows:
        return
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(1, len(PLOTTED), figsize=(9, 3.6))
    for ax, m in zip(axes, PLOTTED, strict=True):
        for arm, style in zip(AT_DIMS, ("o--", "s-"), strict=True):
            mine = sorted((r for r in rows if r["arm"] == arm), key=lambda r: r["dim"])
            if mine:
                dims = [r["dim"] for r in mine]
                sds = [r.get(m + "_sd") or 0.0 for r in mine]
                ax.errorbar(dims, [r[m] for r in mine], yerr=sds, fmt=style, capsize=3, label=arm)
        ax.set_xscale("log", base=2)
        ax.set_xticks(
            sorted({r["dim"] for r in rows}), [str(d) for d in sorted({r["dim"] for r in rows})]
        )
        ax.set_xlabel("dims kept")
        ax.set_ylabel(f"{NAMES[m]} (%)")
        ax.grid(alpha=0.3)
        ax.legend(fontsize=8)
    save_png(fig, png)


def readme_block(data: dict[str, Any]) -> list[str]:
    return [
        *arms_table(data),
        "",
        *diffs_table(pooled_diffs(data)),
        "",
        *dims_table(data["dims"]),
        "",
        *goals(data),
    ]


def main() -> None:
    markers = (README_BEGIN, README_END)
    build_page(
        __doc__, HERE, Path("runs/squad_losses"), markers, gather, markdown, plot, readme_block
    )


if __name__ == "__main__":
    main()
