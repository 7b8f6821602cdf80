"""The teacher study as a page, a plot and its table in docs/studies.md, from the runs of
``run.sh`` (or from the ``results.json`` an earlier build left beside the page: ``--kept``).

    .venv/bin/python -m studies.squad_teachers.table --runs runs/squad_teachers \
        [--readme README.md] [--md PATH --png PATH] [--kept]
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from studies.page import Bar, build_page, hybrid_bars, plot_bars
from studies.squad_batch_size.runs import mean_sd
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
from studies.squad_teachers.collect import gather

HERE = Path(__file__).resolve().parent
REPO = HERE.parent.parent
README_BEGIN, README_END = "<!-- teachers_table:begin -->", "<!-- teachers_table:end -->"
GPU_PAGE = REPO / "docs" / "bench" / "gpu.json"
BEFORE = {"dense": 71.6, "bm25": 79.5, "hybrid": 85.6}  # studies/squad_hard_negatives, top-1


def arms_table(data: dict[str, Any]) -> list[str]:
    lines = [
        f"| retriever | seeds | H | updates | {HEAD} | train (h a run) |",
        f"|---|---|--:|--:|{RULE}|--:|",
    ]
    for r in data["references"]:
        cells = " | ".join(cell(r[m]) for m in METRICS)
        lines.append(f"| {r['arm']} | – | – | – | {cells} | – |")
    for r in data["arms"]:
        cells = " | ".join(cell(r[m], r.get(m + "_sd")) for m in METRICS)
        seeds = ",".join(map(str, r["seeds"]))
        lines.append(
            f"| {r['arm']} | {seeds} | {r['hard_negatives']} | {r['steps']:,} | {cells} | "
            f"{r['train_h']:.2f} |"
        )
    return lines


def teacher_lines(setup: dict[str, Any]) -> list[str]:
    teacher = setup.get("teacher")
    if not teacher:
        return ["(the teacher is not set up yet)"]
    first = teacher["positive_first"]
    lines = [
        f"The teacher: BM25 + {teacher['weight']:g} x round 1's cosine (the weight picked by "
        "`eval.fusion_weight: auto` on the training questions), at softmax temperature "
        f"{teacher['teacher_temperature']:g}: its scores spread {teacher['spread']['teacher']:.2f} "
        "within a question's group (the positive and its "
        f"{teacher['candidates_a_group']:.1f} mined candidates), round 1's at the training "
        f"temperature {teacher['spread']['round1']:.2f}. Over the "
        f"{teacher['groups']:,} training questions, the positive outscores every candidate for "
        f"the teacher in {first['teacher']:.1f}%, for round 1 in {first['round1']:.1f}%, for "
        f"BM25 alone in {first['bm25']:.1f}%.",
        "",
        "| file | questions | candidates | a question | short | looked at | dropped: answer | "
        "round 1's margin | teacher |",
        "|---|--:|--:|--:|--:|--:|--:|--:|--:|",
    ]
    for kind in ("mined", "cleaned-all"):
        s = setup.get(kind)
        if s:
            d = s["dropped"]
            lines.append(
                f"| train.{kind}.jsonl | {s['questions']:,} | {s['negatives']:,} | "
                f"{s['negatives'] / s['questions']:.1f} | {s['short']:,} | {s['candidates']:,} | "
                f"{d['answer']:,} | {d['margin']:,} | {d.get('teacher', 0):,} |"
            )
    kept = setup.get("candidates_keep")
    if kept:
        lines += [
            "",
            f"Every arm trains on the {kept['kept']:,} questions with at least {kept['hard']} "
            f"mined candidates ({kept['dropped']:,} with fewer left out: the distillation loss "
            "needs H of a question's own candidates scored), in the same order.",
        ]
    cleaned = setup.get("cleaned_keep")
    if cleaned:
        lines[-1] += (
            f" In the cleaned file {cleaned['kept_short']:,} of them keep fewer than "
            f"{cleaned['hard']} candidates after the teacher's rule; training fills their groups "
            "with other questions' positives, as DPR does."
        )
    return lines


def cost_lines(data: dict[str, Any]) -> list[str]:
    lines = ["| part | machine hours |", "|---|--:|"]
    names = {r["folder"]: r["arm"].split(":")[0] for r in data["arms"]}
    for part, hours in data["costs"].items():
        lines.append(f"| {names.get(part, part)} | {hours:.2f} |")
    return lines + [f"| all | {data['hours']:.2f} |"]


CPU_SOURCE = (
    '<!-- from studies/squad_teachers/results.json: d["setup"]["score_rate"]["nq"]["hours"] -->'
)
GPU_SOURCE = (
    "<!-- from docs/bench/gpu.json: load('studies/squad_teachers/results.json')['setup']"
    "['score_rate']['nq']['pairs'] / max(r['pairs_a_second'] for r in d['sections']"
    "['teacher_scoring']['result']['rows'] if r['precision'] == 'bf16') / 3600 -->"
)


def _gpu_rate() -> dict[str, Any] | None:
    """score's cross-encoder rate on the GPU, when the GPU suite has measured it, in bf16 (what
    ``precision_for("auto", ...)`` picks on a GPU that has it), the best of its rounds: its row
    (precision, pairs a second) and the device."""
    if not GPU_PAGE.is_file():
        return None
    report = json.loads(GPU_PAGE.read_text())
    result = report["sections"].get("teacher_scoring", {}).get("result")
    if report.get("dry_run") or not result:
        return None
    rows = [row for row in result["rows"] if row["precision"] == "bf16"] or result["rows"]
    fastest = max(rows, key=lambda row: row["pairs_a_second"])
    env = report["environment"]
    return {**fastest, "device": env.get("device_name", env.get("device", "GPU"))}


def score_lines(setup: dict[str, Any], root: str) -> list[str]:
    rate = setup.get("score_rate")
    if not rate:
        return ["(not measured yet)"]
    nq = rate["nq"]
    cpu = rate["cpu"]
    shape = rate["model"]
    lines = [
        f"`dpr-cache score` with a cross-encoder the size of the base model ({shape['layers']} "
        f"layers, {shape['hidden']} wide, {shape['parameters'] / 1e6:.1f}M parameters with a "
        f"fresh one-logit head), {rate['pairs']:,} pairs of {rate['questions']} training "
        f"questions, {rate['tokens_a_pair']:.0f} tokens a pair (cut at {rate['max_length']}), "
        f"batches of {rate['batch_size']}, {rate['precision']}, on {cpu['model']} "
        f"({cpu['cores']} cores; flags {', '.join(cpu['flags']) or 'none of note'}; load "
        f"{rate['load_average']['before'][0]:.1f} before): {rate['pairs_a_second']:.1f} pairs a "
        f"second. NQ's training set, {nq['questions']:,} questions x (1 + 30) passages = "
        f"{nq['pairs']:,} pairs: **{nq['hours']:.1f} h** on this CPU, projected.",
    ]
    gpu = _gpu_rate()
    if gpu:
        lines.append(
            f"On the GPU ({gpu['device']}, {gpu['precision']}, the GPU suite's pairs: dev "
            "questions "
            f"with 100-word passages): {gpu['pairs_a_second']:,.0f} pairs a second, "
            f"**{nq['pairs'] / gpu['pairs_a_second'] / 3600:.2f} h** for NQ "
            f"([docs/bench/gpu.md]({root}docs/bench/gpu.md))."
        )
    else:
        lines.append(
            "On a GPU: not measured yet; the GPU suite measures it when a session has one "
            f"([docs/bench/README.md]({root}docs/bench/README.md))."
        )
    return lines


def _pooled(data: dict[str, Any], arm: str) -> dict[str, Any] | None:
    rows = [d for d in data["diffs"] if d["pair"].startswith(f"{arm} - control, all seeds")]
    if rows:
        return rows[0]
    rows = [d for d in data["diffs"] if d["pair"].startswith(f"{arm} - control, seed")]
    return rows[0] if rows else None


def goals(data: dict[str, Any], root: str = "../../") -> list[str]:
    """The issue's goals, each with what was measured."""
    lines = ["| goal | measured | met |", "|---|---|---|"]
    pooled = _pooled(data, "distill")
    if pooled:
        for m in ("top1", "mrr@10"):
            met = "yes" if pooled[m + "_ci"][0] > 0 else "no"
            lines.append(
                f"| distill ahead of the control at {NAMES[m]}, interval above 0 | "
                f"{pooled['pair']}: {diff_cell(pooled, m)} | {met} |"
            )
    if data["arms"]:
        top = max(data["arms"], key=lambda r: r["top1"])
        met = "yes" if top["top1"] >= BEFORE["bm25"] else "no"
        lines.append(
            f"| a dense model alone at or above BM25's top-1 ({BEFORE['bm25']}) | "
            f"best: {top['arm'].split(':')[0]}, {cell(top['top1'], top.get('top1_sd'))} | {met} |"
        )
    fused = [h for h in data["hybrids"] if h["folder"] == "distill" and h["method"] == "linear"]
    if fused:
        top1, sd = mean_sd([h["top1"] for h in fused])
        met = "yes" if top1 > BEFORE["hybrid"] else "no"
        lines.append(
            f"| BM25 + distill ahead of the best hybrid so far (top-1 {BEFORE['hybrid']}) | "
            f"{cell(top1, sd)} over {len(fused)} seed(s) | {met} |"
        )
    rate = data["setup"].get("score_rate")
    if rate:
        gpu = _gpu_rate()
        on_gpu = (
            f"; GPU {rate['nq']['pairs'] / gpu['pairs_a_second'] / 3600:.2f} h{GPU_SOURCE}"
            if gpu
            else "; GPU: not yet measured"
        )
        lines.append(
            "| `score` with a cross-encoder at NQ's size, projected | "
            f"CPU {rate['nq']['hours']:.1f} h{CPU_SOURCE}{on_gpu} | "
            f"{'yes' if gpu else 'CPU only'} |"
        )
    return lines


def markdown(data: dict[str, Any], png: str, reading: str | None) -> str:
    best = data.get("best")
    picked = (
        f"The best arm, picked at seed 1 by MRR@10 on dev and run at every seed: **{best}**. Its "
        "seed-1 difference helped pick it; the row over the seeds after the pick does not."
        if best
        else "The best arm is not picked yet."
    )
    parts = [
        "# SQuAD teacher study: results",
        "",
        f"SQuAD v1.1 dev, {data['questions']:,} questions over all 2,067 paragraphs (the method, "
        "what was run and how: [README.md](README.md)). Figures in points; ± is the sample sd "
        "over seeds; [a, b] a 95% bootstrap interval over the questions, paired by seed and by "
        f"question. Machine time of everything on this page: {data['hours']:.1f} h. A run's "
        'training time ("train (h a run)" and in the costs) is estimated as its updates at its '
        "median step time, leaving out pauses (the study stopped while CI ran beside it), slow "
        "steps and the time outside steps; the other parts are wall time.",
        "",
        f"![top-1 and MRR@10]({png})",
        "",
        "## Retrievers",
        "",
        *arms_table(data),
        "",
        "## Each treatment against the control, the same seed (the same questions in every update)",
        "",
        picked,
        "",
        *diffs_table(data["diffs"]),
        "",
        "## The teacher and the candidates",
        "",
        *teacher_lines(data["setup"]),
        "",
        "## BM25 + dense",
        "",
        FUSION_NOTE,
        "",
        *hybrids_table(data["hybrids"]),
        "",
        *diffs_table(data["hybrid_diffs"]),
        "",
        "## What each part cost",
        "",
        *cost_lines(data),
        "",
        "## `score` at NQ's size",
        "",
        *score_lines(data["setup"], "../../"),
        "",
        "## Goals",
        "",
        *goals(data),
    ]
    if reading:
        parts += ["", reading.strip()]
    return "\n".join(parts) + "\n"


def plot(data: dict[str, Any], png: Path) -> None:
    bars: list[Bar] = [
        (r["arm"].split(":")[0], r["top1"], r["mrr@10"], r.get("top1_sd"), r.get("mrr@10_sd"))
        for r in data["references"] + data["arms"]
    ]
    bars += hybrid_bars(data["hybrids"], lambda h: h["folder"])
    plot_bars(bars, png, BEFORE["bm25"])


def readme_block(data: dict[str, Any]) -> list[str]:
    pooled = [d for d in data["diffs"] if "all seeds" in d["pair"] or "after" in d["pair"]]
    return [*arms_table(data), "", *diffs_table(pooled), "", *goals(data, root="../")]


def main() -> None:
    markers = (README_BEGIN, README_END)
    build_page(
        __doc__, HERE, Path("runs/squad_teachers"), markers, gather, markdown, plot, readme_block
    )


if __name__ == "__main__":
    main()
