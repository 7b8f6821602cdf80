"""The cross-fitted teacher study as a page, a plot and its block of the page named by
``--readme`` (docs/studies.md), from the runs of ``run.sh`` (or from the ``results.json`` an
earlier build left beside the page: ``--kept``).

    .venv/bin/python -m studies.squad_crossfit.table --runs runs/squad_crossfit --suffix="" \
        [--readme docs/studies.md] [--md PATH --png PATH] [--kept]
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from studies.page import Bar, build_page, hybrid_bars, plot_bars
from studies.squad_batch_size.runs import mean_sd
from studies.squad_crossfit.collect import ARMS, BOTH, DISTILLED, TREATMENTS, gather
from studies.squad_hard_negatives.collect import METRICS, N_BOOT
from studies.squad_hard_negatives.table import (
    FUSION_NOTE,
    HEAD,
    RULE,
    cell,
    diff_cell,
    diffs_table,
    hybrids_table,
)

HERE = Path(__file__).resolve().parent
SEEDS = 3  # a goal is judged over this many seeds of each arm, never at one
HOURS = 15  # the study's machine-time budget
README_BEGIN, README_END = "<!-- crossfit_table:begin -->", "<!-- crossfit_table:end -->"
BEFORE = {  # top-1 before this study: BM25, and BM25 + round 1 (linear) in studies/squad_teachers
    "bm25": 79.5,
    "hybrid": 85.8,
}
INTERVALS = (
    "Figures in points; ± is the sample sd over seeds. A row at one seed: [a, b] is a 95% "
    "bootstrap interval over the dev questions, paired by question. A row over seeds: [a, b] is "
    f"a 95% interval that covers both the questions and the seeds, a two-level bootstrap: each of "
    f"{N_BOOT:,} resamples draws the seeds (of those both sides ran) with replacement and the dev "
    "questions with replacement (the same questions for every seed drawn) and averages the "
    "per-question paired differences, so a difference that changes from seed to seed widens it."
)


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
        steps = "–" if r["steps"] is None else f"{r['steps']:,}"
        lines.append(
            f"| {r['arm']} | {seeds} | {r['hard_negatives']} | {steps} | {cells} | "
            f"{r['train_h']:.2f} |"
        )
    return lines


def pooled(data: dict[str, Any], arm: str) -> dict[str, Any] | None:
    """``arm`` minus the control over every seed both ran (the two-level interval), or at the
    one seed they both ran; None before both ran one."""
    rows = [d for d in data["diffs"] if d["pair"].startswith(f"{arm} - control, ")]
    over = [d for d in rows if d.get("interval") == BOTH]
    return (over or rows or [None])[0]


def _count(value: Any) -> str:
    return "–" if value is None else f"{value:,}"


def teacher_lines(setup: dict[str, Any]) -> list[str]:
    """Each fold's teacher and candidates, the cleaning, the temperature and the spreads."""
    folds = setup["folds"]
    if not any(f["weight"] is not None for f in folds):
        return ["(the teachers are not set up yet)"]
    lines = [
        "Round 1 of fold k trains on the other fold's articles (BM25's negatives, H = 1) and, "
        "fused with BM25 (BM25 + weight x its cosine), scores fold k's questions, which it has "
        "not seen. Its weight is picked (`eval.fusion_weight: auto`) on fold k's questions; "
        '"dev" is that teacher\'s fused figures on the dev questions.',
        "",
        "| fold | questions | articles | weight | tuned on fold k: MRR@10 | dev: top-1 | "
        "dev: MRR@10 |",
        "|--:|--:|--:|--:|--:|--:|--:|",
    ]
    for f in folds:
        if f["weight"] is None:
            continue
        tuned = (f["grid"] or {}).get(f"{f['weight']:g}")
        dev = f["dev"] or {}
        lines.append(
            f"| {f['fold']} | {_count(f['questions'])} | {_count(f['articles'])} | "
            f"{f['weight']:g} | {cell(tuned)} | {cell(dev.get('top1'))} | "
            f"{cell(dev.get('mrr@10'))} |"
        )
    lines += [
        "",
        "Candidates: round 1's top passages over its index for each question of its fold "
        "(`mine`, the answer rule only: no margin rule), BM25's negatives after them; then each "
        "scored by the fold's teacher (`score --teacher hybrid`), and cleaned: the candidates the "
        "teacher's rule (`score --teacher-relative`) leaves out.",
        "",
        "| fold | questions | round 1's candidates | BM25's kept | a question | short | "
        "looked at | dropped: answer | dropped: positive | scored | cleaned out |",
        "|--:|--:|--:|--:|--:|--:|--:|--:|--:|--:|--:|",
    ]
    for f in folds:
        mined, cleaned = f["mined"], f["cleaned"]
        if not mined:
            continue
        d = mined["dropped"]
        both = mined["negatives"] + mined.get("kept_bm25", 0)
        scored = f["scored"]["hard_negatives"] if f["scored"] else None
        out = "–"
        if cleaned:
            before = cleaned["hard_negatives"] + cleaned["cleaned"]
            out = f"{cleaned['cleaned']:,} ({100 * cleaned['cleaned'] / max(before, 1):.1f}%)"
        lines.append(
            f"| {f['fold']} | {mined['questions']:,} | {mined['negatives']:,} | "
            f"{mined.get('kept_bm25', 0):,} | {both / max(mined['questions'], 1):.1f} | "
            f"{mined['short']:,} | {mined['candidates']:,} | {d['answer']:,} | "
            f"{d['positive_id'] + d['positive_text']:,} | {_count(scored)} | {out} |"
        )
    teacher = setup.get("teacher")
    if teacher:
        first = teacher["positive_first"]
        weights = teacher["weight"] if isinstance(teacher["weight"], list) else [teacher["weight"]]
        lines += [
            "",
            f"The teachers' softmax temperature, {teacher['teacher_temperature']:g} (the folds "
            f"pooled, weights {' and '.join(f'{w:g}' for w in weights)}): the teachers' scores "
            f"spread {teacher['spread']['teacher']:.2f} within a question's group (the positive "
            f"and its {teacher['candidates_a_group']:.1f} candidates), round 1's (at the training "
            f"temperature, {teacher['train_temperature']:g}) {teacher['spread']['round1']:.2f}. "
            f"Over the {teacher['groups']:,} training questions' groups, the positive outscores "
            f"every candidate for the teacher in {first['teacher']:.1f}%, for round 1 in "
            f"{first['round1']:.1f}%, for BM25 alone in {first['bm25']:.1f}% (round 1's is not "
            "100% by construction: no margin rule filtered the candidates by round 1's scores).",
        ]
    kept = setup.get("scored_keep")
    if kept:
        lines += [
            "",
            f"Every arm trains on the {kept['kept']:,} questions with at least {kept['hard']} "
            f"candidates ({kept['dropped']:,} with fewer left out: the distillation loss needs H "
            "of a question's own candidates scored), in the same order.",
        ]
        cleaned = setup.get("cleaned_keep")
        if cleaned:
            lines[-1] += (
                f" In the cleaned file {cleaned['kept_short']:,} of them keep fewer than "
                f"{cleaned['hard']} candidates after the teacher's rule; training fills their "
                "groups with other questions' positives, as DPR does."
            )
    return lines


def _spread(values: list[float]) -> str:
    """A median and its range: ``median [least, greatest]``."""
    median, least, greatest = values
    return f"{median:.2f} [{least:.2f}, {greatest:.2f}]"


def margin_lines(data: dict[str, Any]) -> list[str]:
    """The teacher's margins against the student's scale, and each arm's logged updates."""
    lines = []
    margins, teacher = data.get("margins"), data["setup"].get("teacher")
    if margins and teacher:
        t = teacher["train_temperature"]
        q = margins["percentiles"]
        lines += [
            "`margin_mse` fits the student's margins (its cosines / the training temperature, "
            f"{t:g}) to the teacher's, which are in the teacher's units (BM25 + weight x "
            "cosine) with no temperature. Over the "
            f"{margins['questions']:,} training questions' {margins['pairs']:,} (positive, "
            "candidate) pairs in the students' file, the positive's teacher score minus the "
            f"candidate's: mean {margins['mean']:.1f} (sd {margins['sd']:.1f}), 10th, 50th and "
            f"90th percentiles {q['10']:.1f}, {q['50']:.1f} and {q['90']:.1f}, mean square "
            f"{margins['mean_square']:.1f}; {margins['not_below']:.1f}% of the candidates score "
            "at or above the positive. At the student's scale the mean margin is a cosine gap "
            f"of {margins['mean'] * t:.2f}, the 90th percentile's {q['90'] * t:.2f} (a cosine "
            "gap is at most 2).",
            "",
        ]
    parts = data["setup"].get("margin_parts")
    if margins and teacher and parts:
        lines += [
            "A teacher's margin is BM25's margin plus the fold's weight times round 1's cosine "
            f"gap. Over the folds' {parts['questions']:,} scored questions' {parts['pairs']:,} "
            "pairs (before the students' file left out those with too few candidates), BM25's "
            f"part averages {parts['bm25']:.1f} and round 1's {parts['round1']:.1f}: round 1's "
            f"own cosine gap averages {parts['round1_cosine']:.2f}, where `margin_mse` asks the "
            f"student for {margins['mean'] * teacher['train_temperature']:.2f}. The variance of "
            f"BM25's part is {parts['bm25_variance']:.0f}% of the margins', round 1's "
            f"{parts['round1_variance']:.0f}% (the rest is their covariance).",
            "",
        ]
    targets = data.get("targets")
    if targets:
        seeds = ("seed " if len(targets["seeds"]) == 1 else "seeds ") + ",".join(
            str(s) for s in targets["seeds"]
        )
        lines += [
            "`distill_kl`'s target is softmax(teacher / "
            f"{targets['temperature']:g}) over a question's group: its positive and the "
            "candidates drawn for it that epoch. In the groups kl0 trained on ("
            f"{seeds}: {targets['groups']:,} groups, every question of every update), it puts "
            f"a mean {targets['mean']:.1f}% of its probability on the positive (median "
            f"{targets['median']:.2f}%): more than 99% in {targets['over_99']:.1f}% of the "
            f"groups, less than half in {targets['under_half']:.1f}%. The contrastive loss's "
            "target is the positive alone, among every passage of the update.",
            "",
        ]
    rows = data.get("updates") or []
    if rows:
        clips = sorted({f"{r['clip']:g}" for r in rows if r["clip"] is not None})
        lines += [
            "Each arm's logged updates over its seeds: the loss and the gradient's norm before "
            f"clipping (`train.max_grad_norm`: {', '.join(clips) or 'none'}), each as median "
            "[least, greatest].",
            "",
            "| arm | seeds | updates | loss | gradient norm |",
            "|---|---|--:|--:|--:|",
        ]
        for r in rows:
            seeds = ",".join(map(str, r["seeds"]))
            lines.append(
                f"| {r['folder']} | {seeds} | {r['updates']:,} | {_spread(r['loss'])} | "
                f"{_spread(r['grad_norm'])} |"
            )
    return lines or ["(no students' file yet, and no student trained)"]


def _recorded(data: dict[str, Any]) -> str:
    """The machine time with each run's training at its recorded wall time, where known."""
    if "wall_hours" not in data:
        return ""
    return f" ({data['wall_hours']:.1f} h with each run's training at its recorded wall time)"


def cost_lines(data: dict[str, Any]) -> list[str]:
    lines = ["| part | machine hours |", "|---|--:|"]
    for part, hours in data["costs"].items():
        lines.append(f"| {part} | {hours:.2f} |")
    return lines + [f"| all | {data['hours']:.2f} |"]


def goals(data: dict[str, Any]) -> list[str]:
    """The study's goals, each with what was measured."""
    lines = ["| goal | measured | met |", "|---|---|---|"]
    for arm in DISTILLED:
        row = pooled(data, arm)
        if not row:
            continue
        ahead = all(row[m + "_ci"][0] > 0 for m in ("top1", "mrr@10"))
        met = "yes" if ahead else "no"
        if row.get("interval") != BOTH or len(row["seeds"]) < SEEDS:
            met = f"pending ({len(row['seeds'])} of {SEEDS} seeds)"
        lines.append(
            f"| {arm} ahead of the control at top-1 and MRR@10, each interval ({BOTH}) above 0 "
            f"| {row['pair']}: top-1 {diff_cell(row, 'top1')}, MRR@10 "
            f"{diff_cell(row, 'mrr@10')} | {met} |"
        )
    students = [r for r in data["arms"] if r["folder"] in ARMS]
    if students:
        top = max(students, key=lambda r: r["top1"])
        met = "yes" if top["top1"] >= BEFORE["bm25"] else "no"
        lines.append(
            f"| a dense model alone at BM25's top-1 ({BEFORE['bm25']}) | best arm: "
            f"{top['folder']}, {cell(top['top1'], top.get('top1_sd'))} over "
            f"{len(top['seeds'])} seed(s) | {met} |"
        )
    fused: dict[str, list[float]] = {}
    for h in data["hybrids"]:
        if h["method"] == "linear":
            fused.setdefault(h["folder"], []).append(h["top1"])
    if fused:
        arm, top1s = max(fused.items(), key=lambda item: mean_sd(item[1])[0])
        top1, sd = mean_sd(top1s)
        met = "yes" if top1 > BEFORE["hybrid"] else "no"
        lines.append(
            f"| fused with BM25 (linear), above {BEFORE['hybrid']} top-1 (BM25 + round 1, the "
            f"teachers study) | best arm: BM25 + {arm}, {cell(top1, sd)} over {len(top1s)} "
            f"seed(s) | {met} |"
        )
    students = sum(len(r["seeds"]) for r in data["arms"] if r["folder"] in ARMS)
    done = students >= SEEDS * len(ARMS)
    hours = max(data["hours"], data.get("wall_hours", 0.0))  # the estimate, or the record
    met = ("yes" if hours <= HOURS else "no") if done else "pending"
    source = "<!-- from studies/squad_crossfit/results.json: d[{!r}] -->".format
    recorded = (
        f", {data['wall_hours']:.1f} h{source('wall_hours')} recorded"
        if "wall_hours" in data
        else ""
    )
    lines.append(
        f"| at most {HOURS} machine hours on this 2-core CPU | {data['hours']:.1f} h"
        f"{source('hours')} estimated"
        f"{recorded} ({students} of {SEEDS * len(ARMS)} students) | {met} |"
    )
    return lines


def markdown(data: dict[str, Any], png: str, reading: str | None) -> str:
    parts = [
        "# SQuAD cross-fitted teacher study: results",
        "",
        f"SQuAD v1.1 dev, {data['questions']:,} questions (the method, what was run and how: "
        f"[README.md](README.md), [run.sh](run.sh)). {INTERVALS} Machine time of the runs, "
        f"the teachers' steps and the fused evaluations on this page: {data['hours']:.1f} h "
        f"estimated{_recorded(data)} "
        "(left out: BM25's mining of the training file, joining the folds' files, the "
        "temperature, the margins' split and each arm's numbers check, seconds to minutes "
        "each). A run's training "
        'time ("train (h a run)" and in the costs) is estimated as its updates at its median '
        "step time, leaving out pauses, slow steps and the time outside steps; the other parts "
        "are their own timings.",
        "",
        f"![top-1 and MRR@10]({png})",
        "",
        "## Retrievers",
        "",
        *arms_table(data),
        "",
        "## Each treatment against the control, the same seed (the same questions in every update)",
        "",
        *diffs_table(data["diffs"]),
        "",
        "## The teachers and the candidates",
        "",
        *teacher_lines(data["setup"]),
        "",
        "## The teacher's margins and the students' updates",
        "",
        *margin_lines(data),
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
    if bars:
        plot_bars(bars, png, BEFORE["bm25"])


def readme_block(data: dict[str, Any]) -> list[str]:
    rows = [row for arm in TREATMENTS if (row := pooled(data, arm))]
    return [*arms_table(data), "", *diffs_table(rows), "", *goals(data)]


def main() -> None:
    markers = (README_BEGIN, README_END)
    build_page(
        __doc__, HERE, Path("runs/squad_crossfit"), markers, gather, markdown, plot, readme_block
    )


if __name__ == "__main__":
    main()
