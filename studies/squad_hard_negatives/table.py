"""The hard-negative study as a page, a plot and its table in docs/studies.md, from the runs
of ``run.sh`` (or from the ``results.json`` an earlier build left beside the page: ``--kept``).

    .venv/bin/python -m studies.squad_hard_negatives.table --runs runs/squad_hard_negatives \
        [--readme README.md] [--md PATH --png PATH] [--kept]
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from studies.page import Bar, build_page, hybrid_bars, plot_bars
from studies.squad_hard_negatives.collect import METRICS, gather

HERE = Path(__file__).resolve().parent
NAMES = {
    "top1": "top-1",
    "top5": "top-5",
    "top20": "top-20",
    "top100": "top-100",
    "mrr@10": "MRR@10",
}
README_BEGIN, README_END = (
    "<!-- hard_negatives_table:begin -->",
    "<!-- hard_negatives_table:end -->",
)
HEAD = " | ".join(NAMES[m] for m in METRICS)
RULE = "|".join("--:" for _ in METRICS)
FUSION_NOTE = (
    "Linear: BM25 + weight x dense score over the union of each side's top 1,000, the "
    "missing side's score computed; the weight picked (MRR@10, a grid of 17 from 0.01 to "
    "1,000) on the other half of the dev articles, so no question is scored with a weight "
    "tuned on it. RRF: k = 60, the same candidates."
)


def cell(value, sd=None) -> str:
    return "–" if value is None else f"{value:.1f}" + (f" ± {sd:.1f}" if sd is not None else "")


def arms_table(data: dict[str, Any]) -> list[str]:
    lines = [
        f"| retriever | seeds | updates | {HEAD} | train (h a run) |",
        f"|---|---|--:|{RULE}|--:|",
    ]
    for r in data["references"]:
        lines.append(
            f"| {r['arm']} | – | – | " + " | ".join(cell(r[m]) for m in METRICS) + " | – |"
        )
    for r in data["arms"]:
        cells = " | ".join(cell(r[m], r.get(m + "_sd")) for m in METRICS)
        seeds = ",".join(map(str, r["seeds"]))
        lines.append(f"| {r['arm']} | {seeds} | {r['steps']:,} | {cells} | {r['train_h']:.2f} |")
    return lines


def diff_cell(row: dict[str, Any], m: str) -> str:
    lo, hi = row[m + "_ci"]
    text = f"{row[m]:+.1f} [{lo:+.1f}, {hi:+.1f}]"
    return text + (f" ± {row[m + '_sd']:.1f}" if row.get(m + "_sd") is not None else "")


def diffs_table(rows: list[dict[str, Any]]) -> list[str]:
    lines = [f"| difference | {' | '.join('Δ ' + NAMES[m] for m in METRICS)} |", f"|---|{RULE}|"]
    return lines + [
        f"| {r['pair']} | " + " | ".join(diff_cell(r, m) for m in METRICS) + " |" for r in rows
    ]


def hybrids_table(rows: list[dict[str, Any]]) -> list[str]:
    lines = [
        f"| BM25 fused with | fusion | weight (half a / b) | {HEAD} |",
        f"|---|---|---|{RULE}|",
    ]
    for r in rows:
        w = "–" if not r["weights"] else f"{r['weights']['a']:g} / {r['weights']['b']:g}"
        cells = " | ".join(cell(r[m]) for m in METRICS)
        lines.append(f"| {r['model']} | {r['method']} | {w} | {cells} |")
    return lines


def filter_table(f: dict[str, Any]) -> list[str]:
    if "mined" not in f:
        return ["(not mined yet)"]
    lines = [
        "| file | questions | negatives | a question | short | looked at | "
        "dropped: positive id | positive text | judged | answer | margin |",
        "|---|--:|--:|--:|--:|--:|--:|--:|--:|--:|--:|",
    ]
    for kind in ("mined", "both"):
        s = f.get(kind)
        if s:
            d = s["dropped"]
            lines.append(
                f"| train.{kind}.jsonl | {s['questions']:,} | {s['negatives']:,} | "
                f"{s['negatives'] / s['questions']:.1f} | {s['short']:,} | {s['candidates']:,} | "
                f"{d['positive_id']:,} | {d['positive_text']:,} | {d['judged']:,} | "
                f"{d['answer']:,} | {d['margin']:,} |"
            )
    return lines


def goals(data: dict[str, Any], root: str = "../../") -> list[str]:
    """The issue's goals, each with what was measured (``root``: the repository from the page)."""
    pooled = next((d for d in data["diffs"] if d["pair"].startswith("(b) - round 1, all")), None)
    lines = ["| goal | measured | met |", "|---|---|---|"]
    if pooled:
        for m in ("top1", "mrr@10"):
            lo = pooled[m + "_ci"][0]
            lines.append(
                f"| round 2 (b) ahead of round 1 at {NAMES[m]}, interval above 0 | "
                f"{diff_cell(pooled, m)} | {'yes' if lo > 0 else 'no'} |"
            )
    best = None
    for d in [d for d in data["hybrid_diffs"] if d["pair"].endswith(") - BM25")]:
        ahead = all(d[m + "_ci"][0] > 0 for m in ("top1", "top5", "top20"))
        if best is None or (ahead, d["top1"]) > best[0]:
            best = ((ahead, d["top1"]), d)
    if best:
        d = best[1]
        lines.append(
            f"| a hybrid ahead of BM25 at top-1, 5, 20 | {d['pair']}: "
            f"{', '.join(diff_cell(d, m) for m in ('top1', 'top5', 'top20'))} | "
            f"{'yes' if best[0][0] else 'no'} |"
        )
    lines.append(
        "| `mine` at NQ's size (58,880 questions, 21M passages) | projected from measured "
        f"rates on [docs/bench/mine.md]({root}docs/bench/mine.md) (its total), on 2 cores, peak "
        "memory within `--memory-gb` | measured there |"
    )
    return lines


def markdown(data: dict[str, Any], png: str, reading: str | None) -> str:
    parts = [
        "# SQuAD hard-negative study: results",
        "",
        f"SQuAD v1.1 dev, {data['questions']:,} questions over all 2,067 paragraphs (the method, "
        "what was run and how: [README.md](README.md)). Figures in points; ± is the sample sd "
        "over seeds; [a, b] a 95% bootstrap interval over the questions. Machine time of the "
        f"runs on this page: {data['hours']:.1f} h (a run's training: its wall time, or its "
        "steps' logged seconds where a session ended mid-run and left no wall time).",
        "",
        f"![top-1 and MRR@10]({png})",
        "",
        "## Retrievers",
        "",
        *arms_table(data),
        "",
        "## Round 2 against round 1, the same seed (the same questions in every update)",
        "",
        *diffs_table(data["diffs"]),
        "",
        "## BM25 + dense",
        "",
        FUSION_NOTE,
        "",
        *hybrids_table(data["hybrids"]),
        "",
        *diffs_table(data["hybrid_diffs"]),
        "",
        "## The mining filter",
        "",
        *filter_table(data["filter"]),
    ]
    check = data["filter"].get("check")
    if check:
        parts += [
            "",
            f"Looser rules than DPR's flag {check['flagged']:,} of the "
            f"{check['mined_negatives']:,} mined negatives: {check['by_rule']['prefix']:,} "
            "where an answer starts a word, "
            f"{check['by_rule']['words']:,} where every word of an answer appears in the "
            "passage (a negative can be flagged by both); the sample read is in the "
            "reading below.",
        ]
    parts += ["", "## Goals", "", *goals(data)]
    if reading:
        parts += ["", reading.strip()]
    return "\n".join(parts) + "\n"


def plot(data: dict[str, Any], png: Path) -> None:
    bars: list[Bar] = [
        (r["arm"], r["top1"], r["mrr@10"], r.get("top1_sd"), r.get("mrr@10_sd"))
        for r in data["references"] + data["arms"]
    ]
    bars += hybrid_bars(data["hybrids"], lambda h: h["model"].split(" ")[0])
    plot_bars(bars, png)


def readme_block(data: dict[str, Any]) -> list[str]:
    pooled = [d for d in data["diffs"] if "all" in d["pair"] or d["pair"].startswith("(a)")]
    return [*arms_table(data), "", *diffs_table(pooled), "", *goals(data, root="../")]


def main() -> None:
    markers = (README_BEGIN, README_END)
    build_page(
        __doc__,
        HERE,
        Path("runs/squad_hard_negatives"),
        markers,
        gather,
        markdown,
        plot,
        readme_block,
    )


if __name__ == "__main__":
    main()
