"""The hard-negative study as a page, a plot and the README's table, from the runs of ``run.sh``
(or from the ``results.json`` an earlier build left beside the page: ``--kept``).

    .venv/bin/python -m studies.squad_hard_negatives.table --runs runs/squad_hard_negatives \
        [--readme README.md] [--md PATH --png PATH] [--kept]
"""

from __future__ import annotations

import argparse
import functools
import json
from pathlib import Path
from typing import Any

from dpr_cache.runtime.atomic import write_atomic, write_json_atomic, write_text_atomic
from studies.readme_block import write_readme_block
from studies.squad_batch_size.runs import mean_sd
from studies.squad_hard_negatives.collect import METRICS, gather

HERE = Path(__file__).resolve().parent
NAMES = {"top1": "top-1", "top5": "top-5", "top20": "top-20", "top100": "top-100",
         "mrr@10": "MRR@10"}  # fmt: skip
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
    lines = ["| file | questions | negatives | a question | short | looked at | "
             "dropped: positive id | positive text | judged | answer | margin |",
             "|---|--:|--:|--:|--:|--:|--:|--:|--:|--:|--:|"]  # fmt: skip
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
            lines.append(f"| round 2 (b) ahead of round 1 at {NAMES[m]}, interval above 0 | "
                         f"{diff_cell(pooled, m)} | {'yes' if lo > 0 else 'no'} |")  # fmt: skip
    best = None
    for d in [d for d in data["hybrid_diffs"] if d["pair"].endswith(") - BM25")]:
        ahead = all(d[m + "_ci"][0] > 0 for m in ("top1", "top5", "top20"))
        if best is None or (ahead, d["top1"]) > best[0]:
            best = ((ahead, d["top1"]), d)
    if best:
        d = best[1]
        lines.append(f"| a hybrid ahead of BM25 at top-1, 5, 20 | {d['pair']}: "
                     f"{', '.join(diff_cell(d, m) for m in ('top1', 'top5', 'top20'))} | "
                     f"{'yes' if best[0][0] else 'no'} |")  # fmt: skip
    lines.append("| `mine` at NQ's size (58,880 questions, 21M passages) | projected from measured "
                 f"rates on [docs/bench/mine.md]({root}docs/bench/mine.md): 3.2 h on 2 cores, peak "
                 "memory within `--memory-gb` | measured there |")  # fmt: skip
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
        parts += ["", f"Looser rules than DPR's flag {check['flagged']:,} of the "
                  f"{check['mined_negatives']:,} mined negatives: {check['by_rule']['prefix']:,} "
                  "where an answer starts a word, "
                  f"{check['by_rule']['words']:,} where every word of an answer appears in the "
                  "passage (a negative can be flagged by both); the sample read is in the "
                  "reading below."]  # fmt: skip
    parts += ["", "## Goals", "", *goals(data)]
    if reading:
        parts += ["", reading.strip()]
    return "\n".join(parts) + "\n"


def plot(data: dict[str, Any], png: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    rows = [(r["arm"], r["top1"], r["mrr@10"], r.get("top1_sd"), r.get("mrr@10_sd"))
            for r in data["references"] + data["arms"]]  # fmt: skip
    by_arm: dict[tuple[str, str], list[dict[str, Any]]] = {}  # (model, fusion) -> one per seed
    for h in data["hybrids"]:
        by_arm.setdefault((h["model"].split(" ")[0], h["method"]), []).append(h)
    for (model, method), hs in by_arm.items():  # the mean over seeds, as for the models alone
        top1, top1_sd = mean_sd([h["top1"] for h in hs])
        mrr, mrr_sd = mean_sd([h["mrr@10"] for h in hs])
        seeds = f", {len(hs)} seeds" if len(hs) > 1 else ""
        rows.append((f"BM25 + {model} ({method}{seeds})", top1, mrr, top1_sd, mrr_sd))
    fig, ax = plt.subplots(figsize=(9, 0.45 * len(rows) + 1.2))
    y = range(len(rows))
    ax.barh([i - 0.2 for i in y], [r[1] for r in rows], 0.4, xerr=[r[3] or 0 for r in rows],
            label="top-1")  # fmt: skip
    ax.barh([i + 0.2 for i in y], [r[2] for r in rows], 0.4, xerr=[r[4] or 0 for r in rows],
            label="MRR@10")  # fmt: skip
    ax.set_yticks(list(y), [r[0] for r in rows], fontsize=8)
    ax.invert_yaxis()
    lo = min(min(r[1], r[2]) for r in rows)
    ax.set_xlim(max(0, lo - 5), 100)
    ax.set_xlabel("points (SQuAD dev)")
    ax.legend(loc="lower right")
    ax.grid(axis="x", alpha=0.3)
    fig.tight_layout()
    write_atomic(png, functools.partial(fig.savefig, dpi=110, format="png"))
    plt.close(fig)


def readme_block(data: dict[str, Any]) -> list[str]:
    pooled = [d for d in data["diffs"] if "all" in d["pair"] or d["pair"].startswith("(a)")]
    return [*arms_table(data), "", *diffs_table(pooled), "", *goals(data, root="")]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--runs", type=Path, default=Path("runs/squad_hard_negatives"))
    parser.add_argument("--suffix", default="")
    parser.add_argument("--md", type=Path, default=HERE / "results.md")
    parser.add_argument("--png", type=Path, default=HERE / "plot.png")
    parser.add_argument("--readme", type=Path, default=None)
    parser.add_argument("--kept", action="store_true", help="From results.json beside --md.")
    args = parser.parse_args()
    kept = args.md.with_suffix(".json")
    data = json.loads(kept.read_text()) if args.kept else gather(args.runs, args.suffix)
    markers = (README_BEGIN, README_END)
    if args.readme:  # checked first: nothing is written when the markers are missing
        write_readme_block(args.readme, markers, [], check_only=True)
    reading = HERE / "reading.md"
    md = markdown(data, args.png.name, reading.read_text() if reading.is_file() else None)
    write_text_atomic(args.md, md)
    write_json_atomic(kept, data)
    plot(data, args.png)
    if args.readme:
        write_readme_block(args.readme, markers, readme_block(data))
    print(f"written to {args.md}")


if __name__ == "__main__":
    main()
