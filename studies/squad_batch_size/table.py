"""The SQuAD batch-size study as a results page and a plot, from the runs of ``run.sh``.

Reads ``RUNS/*/run.json``, ``eval/metrics.json`` and ``train_log.jsonl``, laid over the run
records kept in an earlier ``results.json`` if ``--kept`` names one (kept.py: runs whose folders
are gone stay). Then one row per arm (mode, batch size, lr) with the mean ± sample sd over
seeds, and each GradCache run minus the accumulation run of its seed and lr, with a bootstrap
interval over the dev questions, after checking from the train logs that the two trained on the
same batches. The run records and differences go to ``results.json`` beside the page (or
``--json``). The hand-written ``reading.md`` beside this script, if present, closes the page.
With ``--readme``, the arms and the pooled difference also go between the
``<!-- reproduce_table:begin -->`` and ``:end`` markers of docs/studies.md. Refuses
to mix runs of different epochs, warmup, chunk, passage length, temperature or dry-run flag.

    .venv/bin/python -m studies.squad_batch_size.table [--runs runs/squad_batch_size]
        [--kept studies/squad_batch_size/results.json] [--md studies/squad_batch_size/results.md]
        [--png studies/squad_batch_size/plot.png] [--json PATH] [--readme README.md]
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path
from typing import Any

from dpr_cache.runtime.atomic import write_text_atomic
from studies import readme_block
from studies.squad_batch_size import kept
from studies.squad_batch_size.plot import plot
from studies.squad_batch_size.runs import (
    METRICS,
    RECIPE_KEYS,
    TRAINED,
    arm_label,
    check_same_recipe,
    collect,
    format_lr,
    group,
    machine_hours,
    paired_differences,
    references,
)

HERE = Path(__file__).resolve().parent
KEPT = HERE / "results.json"
NAMES = {"top1": "top-1", "top5": "top-5", "top20": "top-20", "top100": "top-100"}
NAMES["mrr@10"] = "MRR@10"

# The BM25 figures published with the SQuAD dev split in DPR's formats (k1=0.9, b=0.4, title +
# text, tokenizer undocumented), quoted beside ours.
SHARED_README_BM25 = {"top1": 82.0, "top5": 94.1, "top20": 97.5, "top100": 99.5}
README_BEGIN, README_END = "<!-- reproduce_table:begin -->", "<!-- reproduce_table:end -->"
# The GradCache paper's Table 1 (Gao et al., 2021, "Scaling Deep Contrastive Learning Batch Size
# under Memory Limited Setup"): NQ test top-5 / top-20 / top-100, BERT-base, DPR's recipe (lr 2e-5,
# 40 epochs, one BM25 negative); the 8-GPU DPR row is DPR's own paper (no top-5 reported).
# Keys: the (mode, batch) of our arm that matches the row, if we ran one.
PAPER_NQ = [
    ("sequential B=8 (what fits one GPU)", ("full", 8), 59.3, 71.9, 80.9),
    (
        "accumulation 16 x 8 (128 examples an update, 8 in a batch)",
        ("accumulate", 128),
        64.3,
        77.2,
        84.9,
    ),
    ("GradCache B=128", ("gradcache", 128), 68.6, 79.3, 86.0),
    ("GradCache B=512", ("gradcache", 512), 68.3, 79.9, 86.6),
    ("DPR, B=128 on 8 GPUs (DPR's paper)", None, None, 78.4, 85.4),
]


def _num(value: float | None, digits: int = 1) -> str:
    return "–" if value is None else f"{value:.{digits}f}"


def _cell(row: dict[str, Any], name: str, scale: float = 1.0, digits: int = 1) -> str:
    if row.get(name) is None:
        return "–"
    text = f"{row[name] / scale:.{digits}f}"
    if row.get(name + "_sd") is not None:
        text += f" ± {row[name + '_sd'] / scale:.{digits}f}"
    return text


def _label(row: dict[str, Any], chunk: int, base_lr: float) -> str:
    return arm_label(row["mode"], row["batch_size"], row["lr"], chunk, base_lr)


def _tick(row: dict[str, Any], chunk: int, base_lr: float) -> str:
    """The arm's name over a few short lines, then its updates and negatives."""
    name = _label(row, chunk, base_lr).replace(", ", "\n").replace("ion ", "ion\n")
    name = name.replace(" B=", "\nB=")
    return f"{name}\n{row['steps']:,} updates\n{row['negatives_per_question']} negatives"


def arms_table(
    rows: list[dict[str, Any]], chunk: int, base_lr: float, refs: list[tuple[str, dict]]
) -> list[str]:
    """Reference rows (BM25, the untrained encoder), then one row per trained arm."""
    lines = [
        "| arm | seeds | updates | negatives a question | "
        + " | ".join(NAMES[m] for m in METRICS)
        + " | peak RSS (GB) | train (h a run) |",
        "|---|---|--:|--:|" + "--:|" * len(METRICS) + "--:|--:|",
    ]
    for name, ref in refs:
        cells = [name, "–", "–", "–", *(_num(ref.get(m)) for m in METRICS), "–", "–"]
        lines.append("| " + " | ".join(cells) + " |")
    for row in rows:
        cells = [_label(row, chunk, base_lr), ",".join(str(s) for s in row["seeds"])]
        cells += [f"{row['steps']:,}", str(row["negatives_per_question"])]
        cells += [_cell(row, m) for m in METRICS]
        cells += [
            _cell(row, "peak_memory_bytes", 1e9, 2),
            _cell(row, "train_wall_seconds", 3600, 2),
        ]
        lines.append("| " + " | ".join(cells) + " |")
    return lines


def _diff_cell(d: dict[str, Any], m: str) -> str:
    lo, hi = d[m + "_ci"]
    text = f"{d[m]:+.1f} [{lo:+.1f}, {hi:+.1f}]"
    return text + (f" ± {d[m + '_sd']:.1f}" if d.get(m + "_sd") is not None else "")


def diffs_table(diffs: list[dict[str, Any]], chunk: int, base_lr: float) -> list[str]:
    """GradCache minus accumulation, per seed and over all seeds."""
    lines = [
        "| pair | seed | " + " | ".join(f"Δ {NAMES[m]}" for m in METRICS) + " |",
        "|---|---|" + "--:|" * len(METRICS),
    ]
    for d in diffs:
        pair = (
            f"{arm_label('gradcache', d['batch_size'], d['lr'], chunk, base_lr)} − "
            f"{arm_label('accumulate', d['batch_size'], d['lr'], chunk, base_lr)}"
        )
        seed = "all: " + ",".join(map(str, d["seeds"])) if d["seed"] == "all" else str(d["seed"])
        lines.append("| " + " | ".join([pair, seed, *(_diff_cell(d, m) for m in METRICS)]) + " |")
    return lines


def paper_table(rows: list[dict[str, Any]]) -> list[str]:
    """The paper's NQ rows beside our SQuAD arm of the same name (at the base lr)."""
    ours = {(r["mode"], r["batch_size"]): r for r in reversed(rows)}  # first lr in order wins
    lines = [
        "| arm | paper, NQ top-5 | top-20 | top-100 | ours, SQuAD top-5 | top-20 | top-100 |",
        "|---|--:|--:|--:|--:|--:|--:|",
    ]
    for name, key, t5, t20, t100 in PAPER_NQ:
        row = ours.get(key) if key is not None else None
        mine = [_cell(row, m) for m in ("top5", "top20", "top100")] if row else ["not run"] * 3
        lines.append(
            f"| {name} | {_num(t5)} | {_num(t20)} | {_num(t100)} | " + " | ".join(mine) + " |"
        )
    return lines


def page_data(kept_runs: dict[str, Any]) -> dict[str, Any]:
    """What the page shows, from kept run records and differences (kept.py): the shared recipe,
    the arms averaged over seeds, reference rows (the data's published BM25 among them, BM25
    rows first), machine hours and where the runs came from."""
    runs = kept_runs["runs"]
    trained = [r for r in runs if r["mode"] in TRAINED]
    refs = [("BM25 (the data's README)", SHARED_README_BM25), *references(runs)]
    sources: dict[tuple[str, str], list[str]] = {}
    for r in runs:
        sources.setdefault((r["source"], r.get("code")), []).append(r["dir"])
    return {
        "recipe": {k: trained[0].get(k) for k in RECIPE_KEYS},
        "arms": group(trained),
        "diffs": kept_runs["diffs"],
        "refs": sorted(refs, key=lambda ref: (not ref[0].startswith("BM25"), "README" in ref[0])),
        "machine_hours": machine_hours(runs) + kept_runs["unattributed"]["hours"],
        "sources": [
            f"{', '.join(dirs)}: " + (f"package at {code}, " if code else "") + source
            for (source, code), dirs in sources.items()
        ],
    }


def markdown(page: dict[str, Any], png: str, reading: str | None) -> str:
    """The results page: recipe, arms, paired differences, plot, the paper's rows, reading."""
    recipe, rows, diffs = page["recipe"], page["arms"], page["diffs"]
    chunk, base_lr = int(recipe["chunk_size"]), min(r["lr"] for r in rows)
    lines = ["# SQuAD: accumulation against GradCache at the same updates", ""]
    if recipe.get("dry_run"):
        lines += ["**Dry run** (toy data, tiny BERT, 2 steps a run): the numbers mean nothing.", ""]
    lines += [
        "Written by `studies/squad_batch_size/table.py` from the runs of"
        " `studies/squad_batch_size/run.sh` (method: [README.md](README.md)); its runs are also"
        " stored in `results.json` beside it (kept.py). The runs behind it:",
        "",
        *(f"- {source}" for source in page["sources"]),
        "",
        f"all-MiniLM-L6-v2, {recipe['epochs']} epochs of the training questions, lr"
        f" {format_lr(base_lr)} unless the arm says otherwise, linear warmup over the first"
        f" {recipe['warmup_pct']}% of each run's updates then linear decay, 1 BM25 hard negative,"
        f" passages cut at {recipe['max_passage_length']} tokens in training (256 in the index),"
        f" micro-batch and chunk {chunk}, cosine scores at temperature"
        f" {recipe.get('temperature') or 1}. {recipe.get('n_questions') or '?'} dev questions, all"
        f" 2,067 passages as the corpus. Cells: mean ± sample sd over seeds; peak RSS is the"
        f" trainer's peak resident memory; train time is the wall time of a run's training."
        f" Machine time of the runs behind this page: {page['machine_hours']:.1f} h.",
        "",
        *arms_table(rows, chunk, base_lr, page["refs"]),
    ]
    if diffs:
        lines += [
            "",
            "GradCache minus accumulation: the same seed, hence the same 128 examples in every"
            " update (checked against the batch digests of both train logs); only the negatives"
            " a question meets and the dropout draws differ. In points, with a 95% bootstrap"
            " interval over the dev questions (10,000 resamples), which covers the test set's"
            " sampling only. The `all` row averages the seeds (one resample applied to every"
            " seed) and adds ± the sample sd of the per-seed differences: the spread a new"
            " training seed shows.",
            "",
            *diffs_table(diffs, chunk, base_lr),
        ]
    lines += ["", f"![each metric per arm, a dot per seed]({png})", ""]
    lines += [
        "The GradCache paper's Table 1 beside our arms of the same name. NQ test with"
        " BERT-base for 40 epochs there, SQuAD dev with MiniLM for"
        f" {recipe['epochs']} epochs here: compare the order of the rows, not their level.",
        "",
        *paper_table(rows),
        "",
    ]
    if reading:
        lines += [reading.strip(), ""]
    return "\n".join(lines)


def write_readme_block(readme: Path, lines: list[str], check_only: bool = False) -> None:
    """This study's README block (or only a check of its markers)."""
    readme_block.write_readme_block(readme, (README_BEGIN, README_END), lines, check_only)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--runs", type=Path, default=Path("runs/squad_batch_size"))
    parser.add_argument("--kept", type=Path, default=None, help="a results.json to start from")
    parser.add_argument("--md", type=Path, default=HERE / "results.md")
    parser.add_argument("--png", type=Path, default=HERE / "plot.png")
    parser.add_argument("--json", type=Path, default=None, help="default: beside --md")
    parser.add_argument("--reading", type=Path, default=HERE / "reading.md")
    parser.add_argument("--readme", type=Path, default=None, help="also rewrite its table block")
    args = parser.parse_args()
    if args.kept is None and args.md == HERE / "results.md" and KEPT.is_file():
        args.kept = KEPT  # the committed page: never drop the runs it keeps
    if args.readme is not None:
        write_readme_block(args.readme, [], check_only=True)  # before anything is written
    base = kept.load(args.kept) if args.kept is not None else kept.empty()
    records = collect(args.runs) if args.runs.is_dir() else []
    fresh = [kept.compact(r, f"`{args.runs}`") for r in records]
    runs = kept.merge_runs(base, fresh)
    trained = [r for r in runs if r["mode"] in TRAINED]
    if not trained:
        raise SystemExit(
            f"error: no finished training runs under {args.runs}"
            + (f" nor in {args.kept}" if args.kept else "")
        )
    check_same_recipe(trained)
    fresh_trained = [r for r in records if r["mode"] in TRAINED]
    diffs, warnings = kept.merge_diffs(base, fresh, paired_differences(fresh_trained, args.runs))
    for warning in warnings:
        print(f"warning: {warning}", file=sys.stderr)
    kept_runs = {"runs": runs, "diffs": diffs, "unattributed": kept.unattributed(base, fresh)}
    page = page_data(kept_runs)
    rows = page["arms"]
    chunk, base_lr = int(page["recipe"]["chunk_size"]), min(r["lr"] for r in rows)
    plot(rows, [_tick(r, chunk, base_lr) for r in rows], args.png)
    png = args.png.name if args.png.parent == args.md.parent else str(args.png)
    reading = args.reading.read_text(encoding="utf-8") if args.reading.is_file() else None
    write_text_atomic(args.md, markdown(page, png, reading))
    json_path = args.json or args.md.with_suffix(".json")
    kept.save(json_path, kept_runs)
    if args.readme is not None:
        # per arm, the row over seeds, or the one seed's row where there is one seed
        pooled_arms = {(d["batch_size"], d["lr"]) for d in diffs if d["seed"] == "all"}
        pooled = [
            d for d in diffs if d["seed"] == "all" or (d["batch_size"], d["lr"]) not in pooled_arms
        ]
        block = arms_table(rows, chunk, base_lr, page["refs"])
        if pooled:
            block += ["", *diffs_table(pooled, chunk, base_lr)]
        write_readme_block(args.readme, block)
    print(
        f"{len(rows)} arms -> {args.md}, {args.png}, {json_path}"
        + (f", {args.readme}" if args.readme else "")
    )


if __name__ == "__main__":
    main()
