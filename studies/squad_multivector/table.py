"""The late-interaction study's page: results.md (BM25, the control and multi alone and fused with
BM25, their differences, where multi wins and where it does not, the fusions, the students, the
indexes, the costs, the goals, the reading), results.json and plot.png (each system's hit rate at
every depth from 1 to 100), from this study's folder and the loss study's beside it (or
results.json with --kept).

    python -m studies.squad_multivector.table --runs runs/squad_multivector --readme docs/studies.md
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from studies.page import build_page, save_png
from studies.squad_crossfit.table import BEFORE, INTERVALS
from studies.squad_hard_negatives.collect import METRICS
from studies.squad_hard_negatives.table import (
    FUSION_NOTE,
    HEAD,
    NAMES,
    RULE,
    cell,
    diff_cell,
    diffs_table,
    hybrids_table,
)
from studies.squad_multivector.collect import (
    BM25,
    FUSED,
    MULTI_VS_CONTROL,
    PAIRS,
    SYSTEMS,
    gather,
)

HERE = Path(__file__).resolve().parent
SEEDS = 3  # a goal is judged over this many seeds, never at one
README_BEGIN, README_END = "<!-- multivector_table:begin -->", "<!-- multivector_table:end -->"
WHERE = ("top1", "top20")  # the metrics of the table by BM25's top-1
STYLES = {  # system -> (colour, line style) in the plot
    BM25: ("black", ":"),
    "control": ("tab:blue", "--"),
    "multi": ("tab:red", "--"),
    FUSED.format("control"): ("tab:blue", "-"),
    FUSED.format("multi"): ("tab:red", "-"),
}


def _name(system: str) -> str:
    return f"{system} (linear)" if system.startswith("BM25 +") else system


def systems_table(rows: list[dict[str, Any]]) -> list[str]:
    """The five systems: each figure's mean ± sd over the seeds."""
    lines = [f"| system | seeds | {HEAD} |", f"|---|---|{RULE}|"]
    for r in rows:
        seeds = ",".join(map(str, r["seeds"])) or "–"
        cells = " | ".join(cell(r[m], r.get(m + "_sd")) for m in METRICS)
        lines.append(f"| {_name(r['system'])} | {seeds} | {cells} |")
    return lines


def pooled(diffs: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """For each pair of :data:`PAIRS`: its row over every seed (or its one seed's row)."""
    out = []
    for ours, theirs in PAIRS:
        rows = [d for d in diffs if d["pair"].startswith(f"{ours} - {theirs}, ")]
        over = [d for d in rows if len(d["seeds"]) > 1]
        if over or rows:
            out.append((over or rows)[0])
    return out


def where_table(strata: list[dict[str, Any]]) -> list[str]:
    """Multi against the control, alone and fused, on the questions BM25 gets right at top-1
    and on those it misses: each side's figure and the difference with its interval."""
    if not strata:
        return ["(BM25 and a student are needed first)"]
    head, rule = ["dev questions", "n"], ["---", "--:"]
    for m in WHERE:
        head += [f"{NAMES[m]}: control / multi", f"Δ {NAMES[m]}"]
        head += [f"{NAMES[m]} fused: control / multi", f"Δ fused {NAMES[m]}"]
        rule += ["--:"] * 4
    lines = ["| " + " | ".join(head) + " |", "|" + "|".join(rule) + "|"]
    for s in strata:
        by = {r["system"]: r for r in s["systems"]}
        diffs = {d["pair"].split(",")[0]: d for d in s["diffs"]}
        cells = [s["stratum"], f"{s['questions']:,}"]
        for m in WHERE:
            for ours, theirs in MULTI_VS_CONTROL:
                pair = " / ".join(_figure(by.get(system), m) for system in (theirs, ours))
                d = diffs.get(f"{ours} - {theirs}")
                cells += [pair, diff_cell(d, m) if d else "–"]
        lines.append("| " + " | ".join(cells) + " |")
    return lines


def _figure(row: dict[str, Any] | None, m: str) -> str:
    return "–" if row is None else cell(row[m], row.get(m + "_sd"))


def students_table(data: dict[str, Any]) -> list[str]:
    """The two students: seeds, updates, training time, peak memory, and whether multi trained
    on the control's batches at each seed."""
    same = data["same_batches"]
    lines = [
        "| arm | seeds | H | updates | train (h a run) | peak memory (GB) |",
        "|---|---|--:|--:|--:|--:|",
    ]
    for r in data["arms"]:
        steps = "–" if r["steps"] is None else f"{r['steps']:,}"
        lines.append(
            f"| {r['arm']} | {','.join(map(str, r['seeds']))} | {r['hard_negatives']} | {steps} "
            f"| {r['train_h']:.2f} | {r['peak_gb']:.1f} |"
        )
    if same:
        told = ", ".join(f"seed {s}: {'yes' if ok else 'NO'}" for s, ok in same.items())
        lines += ["", f"Multi trained on the control's batches, update by update: {told}."]
    return lines


def index_table(rows: list[dict[str, Any]]) -> list[str]:
    lines = [
        "| index | vectors | passages | vectors stored | dims | MB | bytes a passage |",
        "|---|---|--:|--:|--:|--:|--:|",
    ]
    for r in rows:
        lines.append(
            f"| {r['arm']} | {r['vectors']} | {r['passages']:,} | {r['stored']:,} | {r['dim']} "
            f"| {r['bytes'] / 1e6:.1f} | {r['bytes'] / r['passages']:,.0f} |"
        )
    return lines


def cost_lines(data: dict[str, Any]) -> list[str]:
    lines = ["| part | machine hours |", "|---|--:|"]
    lines += [f"| {part} | {hours:.2f} |" for part, hours in data["costs"].items()]
    return lines + [f"| all | {data['hours']:.2f} |"]


def _mean(data: dict[str, Any], system: str) -> dict[str, Any] | None:
    return next((r for r in data["systems"] if r["system"] == system), None)


def _pair(data: dict[str, Any], ours: str, theirs: str) -> dict[str, Any] | None:
    return next(
        (d for d in pooled(data["diffs"]) if d["pair"].startswith(f"{ours} - {theirs},")), None
    )


def _met(row: dict[str, Any], ok: bool) -> str:
    if len(row["seeds"]) < SEEDS:
        return f"pending ({len(row['seeds'])} of {SEEDS} seeds)"
    return "yes" if ok else "no"


def goals(data: dict[str, Any]) -> list[str]:
    """The issue's goals on SQuAD, each with what was measured."""
    lines = ["| goal | measured | met |", "|---|---|---|"]
    multi, fused = _mean(data, "multi"), _mean(data, FUSED.format("multi"))
    if multi and multi["seeds"]:
        vs = _pair(data, "multi", BM25)
        lines.append(
            f"| multi alone at BM25's top-1 ({BEFORE['bm25']}; the moonshot) | "
            f"{cell(multi['top1'], multi.get('top1_sd'))}; multi - BM25 "
            f"{diff_cell(vs, 'top1') if vs else '–'} | "
            f"{_met(multi, multi['top1'] >= BEFORE['bm25'])} |"
        )
    if fused and fused["seeds"]:
        lines.append(
            f"| BM25 + multi (linear) above {BEFORE['hybrid']} top-1 (BM25 + round 1, the "
            f"teachers study) | {cell(fused['top1'], fused.get('top1_sd'))} | "
            f"{_met(fused, fused['top1'] > BEFORE['hybrid'])} |"
        )
    ahead = _pair(data, "multi", "control")
    if ahead:
        lines.append(
            f"| multi ahead of the control at top-1, the interval above 0 | "
            f"{diff_cell(ahead, 'top1')} | {_met(ahead, ahead['top1_ci'][0] > 0)} |"
        )
    return lines


def markdown(data: dict[str, Any], png: str, reading: str | None) -> str:
    parts = [
        "# SQuAD late interaction: results",
        "",
        f"SQuAD v1.1 dev, {data['questions']:,} questions (the method, what was run and how: "
        f"[README.md](README.md), [run.sh](run.sh)). {INTERVALS} Machine time of the runs and "
        f"the evaluations on this page: {data['hours']:.1f} h. A run's training time is "
        "estimated as its updates at its median step time.",
        "",
        f"![hit rate at every depth]({png})",
        "",
        "## BM25, the control and multi, alone and fused with BM25",
        "",
        *systems_table(data["systems"]),
        "",
        "## The differences",
        "",
        *diffs_table(pooled(data["diffs"])),
        "",
        "By seed:",
        "",
        *diffs_table([d for d in data["diffs"] if len(d["seeds"]) == 1]),
        "",
        "## Where multi wins and where it does not: the questions BM25 gets right at top-1",
        "",
        "The dev questions split by BM25's top-1 (a passage with the answer first, or not): "
        "multi against the control, alone and fused with BM25 (linear), on each part. "
        "Figures over the seeds; Δ is multi minus the control.",
        "",
        *where_table(data["where"]),
        "",
        "## BM25 + each student",
        "",
        FUSION_NOTE,
        "",
        *hybrids_table(data["hybrids"]),
        "",
        "## The students and their indexes",
        "",
        *students_table(data),
        "",
        *index_table(data["index"]),
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
    """Each system's hit rate at every depth from 1 to 100 (the mean over its seeds)."""
    curves = data["curves"]
    drawn = [s for s in SYSTEMS if s in curves]
    if not drawn:
        return
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(7, 4.2))
    for system in drawn:
        colour, style = STYLES[system]
        ax.plot(curves["depths"], curves[system], style, color=colour, label=_name(system))
    ax.set_xscale("log")
    ax.set_xticks([1, 2, 5, 10, 20, 50, 100], ["1", "2", "5", "10", "20", "50", "100"])
    ax.set_xlabel("k (passages read)")
    ax.set_ylabel("top-k hit rate (%, SQuAD dev)")
    ax.grid(alpha=0.3, which="both")
    ax.legend(fontsize=8, loc="lower right")
    save_png(fig, png)


def readme_block(data: dict[str, Any]) -> list[str]:
    return [
        *systems_table(data["systems"]),
        "",
        *diffs_table(pooled(data["diffs"])),
        "",
        *where_table(data["where"]),
        "",
        *goals(data),
    ]


def main() -> None:
    markers = (README_BEGIN, README_END)
    build_page(
        __doc__, HERE, Path("runs/squad_multivector"), markers, gather, markdown, plot, readme_block
    )


if __name__ == "__main__":
    main()
