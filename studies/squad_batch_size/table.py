"""The SQuAD batch-size study as a markdown table and a plot, from the runs of ``run.sh``.

Reads ``RUNS/*/run.json``, ``eval/metrics.json`` and ``train_log.jsonl``; one row per model and
setting with the mean ± standard deviation over seeds; peak memory is the largest
``peak_memory_bytes`` of the train log (peak RSS on CPU), time the sum of its step seconds.

The BM25 row is the ``bm25`` run (``bm25_eval.py``). With ``--readme``, the results table is
also written between the README's ``<!-- reproduce_table:begin -->`` and ``:end`` markers.
Refuses to mix runs trained with different epochs, lr, warmup or chunk.

    .venv/bin/python -m studies.squad_batch_size.table [--runs runs/reproduce]
        [--md studies/squad_batch_size/results.md] [--png studies/squad_batch_size/plot.png]
        [--readme README.md]
"""

from __future__ import annotations

import argparse
from pathlib import Path
from typing import Any

from dpr_cache.runtime.atomic import write_text_atomic
from studies.squad_batch_size.plot import plot
from studies.squad_batch_size.runs import (
    KS,
    MODEL_NAMES,
    check_same_recipe,
    collect,
    group,
    paired_differences,
    seed_spread,
)

HERE = Path(__file__).resolve().parent

# The BM25 figures published with the SQuAD dev split in DPR's formats (k1=0.9, b=0.4, title +
# text, tokenizer undocumented), quoted beside ours.
SHARED_README_BM25 = {"top1": 82.0, "top5": 94.1, "top20": 97.5, "top100": 99.5}
README_BEGIN, README_END = "<!-- reproduce_table:begin -->", "<!-- reproduce_table:end -->"
# The GradCache paper's Table 1 (Gao et al., 2021, "Scaling Deep Contrastive Learning Batch Size
# under Memory Limited Setup"): NQ test top-5 / top-20 / top-100, BERT-base, DPR's recipe (lr 2e-5,
# 40 epochs, one BM25 negative); the 8-GPU DPR row is DPR's own paper (no top-5 reported).
PAPER_NQ = [
    ("DPR, B=128 on 8 GPUs (DPR's paper)", None, 78.4, 85.4),
    ("one GPU, sequential B=8 (what fits)", 59.3, 71.9, 80.9),
    ("one GPU, accumulation 16 x 8 (128 examples an update, 8 in a batch)", 64.3, 77.2, 84.9),
    ("one GPU, GradCache B=128", 68.6, 79.3, 86.0),
    ("one GPU, GradCache B=512", 68.3, 79.9, 86.6),
]


def _cell(row: dict[str, Any], name: str, scale: float = 1.0, digits: int = 1) -> str:
    if row.get(name) is None:
        return "–"
    text = f"{row[name] / scale:.{digits}f}"
    if row.get(name + "_sd") is not None:
        text += f" ± {row[name + '_sd'] / scale:.{digits}f}"
    return text


def _cells(values: dict[str, Any]) -> list[str]:
    return [_cell(values, f"top{k}") for k in KS]


def results_table(rows: list[dict[str, Any]], bm25: dict[str, Any] | None) -> list[str]:
    """The table of every (model, setting), BM25 first: markdown lines."""
    lines = [
        "| model | setting | seeds | updates | top-1 | top-5 | top-20 | top-100 | peak RSS (GB) "
        "| train (min) |",
        "|---|---|---|--:|--:|--:|--:|--:|--:|--:|",
    ]
    if bm25 is not None:
        lines.append(
            "| BM25 (bm25s, as mined) | – | – | – | " + " | ".join(_cells(bm25)) + " | – | – |"
        )
    lines.append(
        "| BM25 (the data's README) | – | – | – | "
        + " | ".join(f"{SHARED_README_BM25[f'top{k}']:.1f}" for k in KS)
        + " | – | – |"
    )
    for row in rows:
        seeds = ",".join(str(s) for s in row["seeds"]) if row["setting"] != "off-the-shelf" else "–"
        cells = [MODEL_NAMES.get(row["model"], row["model"]), row["setting"], seeds]
        cells += [_cell(row, "steps", digits=0), *_cells(row)]
        cells += [_cell(row, "peak_memory_bytes", 1e9, 2), _cell(row, "train_seconds", 60.0)]
        lines.append("| " + " | ".join(cells) + " |")
    return lines


def _seed_mismatch(rows: list[dict[str, Any]]) -> list[str]:
    """A warning line per model whose trained rows average different seeds."""
    out = []
    for model in dict.fromkeys(r["model"] for r in rows):
        seed_sets = {
            tuple(r["seeds"])
            for r in rows
            if r["model"] == model and r["setting"] != "off-the-shelf"
        }
        if len(seed_sets) > 1:
            out.append(
                f"Note: the {MODEL_NAMES.get(model, model)} rows average different seeds; compare"
                " them through the paired differences below, which pair each run with the full"
                " batch of its own seed."
            )
    return out


def table_block(rows: list[dict[str, Any]], bm25: dict[str, Any] | None) -> list[str]:
    """The results table, then a note per model whose rows average different seeds."""
    mismatch = _seed_mismatch(rows)
    return results_table(rows, bm25) + (["", *mismatch] if mismatch else [])


def markdown(
    rows: list[dict[str, Any]],
    records: list[dict[str, Any]],
    png: str,
    diffs: list[dict[str, Any]] | None = None,
    bm25: dict[str, Any] | None = None,
) -> str:
    """The results page: settings, table, paired differences, plot, the paper's figures."""
    first = next((r for r in records if r["mode"] in ("full", "gradcache")), {})
    lines = ["# SQuAD batch-size study: full batch vs GradCache", ""]
    if any(r.get("dry_run") for r in records):
        lines += ["**Dry run** (toy data, tiny BERT, 2 steps a run): the numbers mean nothing.", ""]
    lines += [
        "Written by `studies/squad_batch_size/table.py` from the runs of"
        " `studies/squad_batch_size/run.sh` (method: [README.md](README.md)).",
        f"Training: {first.get('epochs', '?')} epoch(s), lr {first.get('lr', '?')} for every batch"
        f" size, linear warmup over the first {first.get('warmup_pct', '?')}% of each run's steps"
        " then linear decay, 1 BM25 hard negative, GradCache chunk"
        f" {first.get('chunk_size', '?')}. {records[0].get('n_questions', '?')} dev questions."
        " Cells: mean ± standard deviation over seeds; updates are optimizer steps; peak RSS is"
        " the trainer's peak resident memory (CPU); train time sums the logged step times.",
        "",
        *table_block(rows, bm25),
    ]
    if diffs:
        lines += [
            "",
            "Each GradCache run minus the full-batch run of the same model and seed,"
            " in points, with a 95% paired bootstrap interval over the dev questions (10,000"
            " resamples of the questions): how sure the difference is given this test set, not"
            " given another training seed.",
            "",
            "| model | setting | seed | Δ top-1 | Δ top-5 | Δ top-20 |",
            "|---|---|---|--:|--:|--:|",
        ]
        for d in diffs:
            cells = [MODEL_NAMES.get(d["model"], d["model"]), d["setting"], str(d["seed"])]
            cells += [
                f"{d[f'top{k}']:+.1f} [{d[f'top{k}_ci'][0]:+.1f}, {d[f'top{k}_ci'][1]:+.1f}]"
                for k in (1, 5, 20)
            ]
            lines.append("| " + " | ".join(cells) + " |")
        spread = [s for s in seed_spread(diffs) if len(s["seeds"]) > 1]
        if spread:
            lines += [
                "",
                "Over seeds: the mean ± standard deviation of those differences (the spread a"
                " new training seed would show).",
                "",
                "| model | setting | seeds | Δ top-1 | Δ top-5 | Δ top-20 |",
                "|---|---|---|--:|--:|--:|",
            ]
            for d in spread:
                cells = [MODEL_NAMES.get(d["model"], d["model"]), d["setting"]]
                cells.append(",".join(str(x) for x in d["seeds"]))
                cells += [f"{d[f'top{k}']:+.1f} ± {d[f'top{k}_sd']:.1f}" for k in (1, 5, 20)]
                lines.append("| " + " | ".join(cells) + " |")
    lines += ["", f"![top-20 and top-5 against the (simulated) batch size]({png})", ""]
    lines += [
        "For reference, the shape this study looks for: the GradCache paper's Table 1 (NQ test,"
        " BERT-base; a different corpus, model and training length, so compare the direction,"
        " not the level).",
        "",
        "| GradCache paper, NQ | top-5 | top-20 | top-100 |",
        "|---|--:|--:|--:|",
        *[
            f"| {name} | {'–' if t5 is None else t5} | {t20} | {t100} |"
            for name, t5, t20, t100 in PAPER_NQ
        ],
        "",
    ]
    return "\n".join(lines)


def write_readme_block(readme: Path, lines: list[str]) -> None:
    """Replace what lies between the README's begin and end markers with ``lines``."""
    text = readme.read_text(encoding="utf-8")
    if text.count(README_BEGIN) != 1 or text.count(README_END) != 1:
        raise SystemExit(f"error: {readme}: needs one {README_BEGIN} and one {README_END} line")
    head, rest = text.split(README_BEGIN)
    _, tail = rest.split(README_END)
    write_text_atomic(
        readme, head + README_BEGIN + "\n" + "\n".join(lines) + "\n" + README_END + tail
    )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--runs", type=Path, default=Path("runs/reproduce"))
    parser.add_argument("--md", type=Path, default=HERE / "results.md")
    parser.add_argument("--png", type=Path, default=HERE / "plot.png")
    parser.add_argument("--readme", type=Path, default=None, help="also rewrite its table block")
    args = parser.parse_args()
    records = collect(args.runs)
    bm25 = next((r for r in records if r["mode"] == "bm25"), None)
    records = [r for r in records if r["mode"] != "bm25"]
    if not records:
        raise SystemExit(f"error: no finished runs under {args.runs}")
    check_same_recipe(records)
    rows = group(records)
    plot(rows, args.png, bm25)
    png = args.png.name if args.png.parent == args.md.parent else str(args.png)
    diffs = paired_differences(records, args.runs)
    write_text_atomic(args.md, markdown(rows, records, png, diffs, bm25))
    if args.readme is not None:
        write_readme_block(args.readme, table_block(rows, bm25))
    print(
        f"{len(records)} runs -> {args.md}, {args.png}"
        + (f", {args.readme}" if args.readme else "")
    )


if __name__ == "__main__":
    main()
