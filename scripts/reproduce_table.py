"""The SQuAD batch-size study as a markdown table and a plot, from scripts/reproduce_squad.sh runs.

Reads ``RUNS/*/run.json``, ``eval/metrics.json`` and ``train_log.jsonl``; one row per model and
setting with the mean ± standard deviation over seeds; peak memory is the largest
``peak_memory_bytes`` of the train log (peak RSS on CPU), time the sum of its step seconds.

The BM25 row is the ``bm25`` run (scripts/bm25_eval.py). With ``--readme``, the results table is
also written between the README's ``<!-- reproduce_table:begin -->`` and ``:end`` markers.
Refuses to mix runs trained with different epochs, lr, warmup or chunk.

    .venv/bin/python scripts/reproduce_table.py [--runs runs/reproduce]
        [--md docs/reproduce_squad.md] [--png docs/reproduce_squad.png] [--readme README.md]
"""

from __future__ import annotations

import argparse
import json
import statistics
from pathlib import Path
from typing import Any

KS = (1, 5, 20, 100)
# The data's own BM25 figures on the dev split (../shared/data/squad1.1-dev/README.md: k1=0.9,
# b=0.4, title + text, its tokenizer undocumented), quoted beside ours.
SHARED_README_BM25 = {"top1": 82.0, "top5": 94.1, "top20": 97.5, "top100": 99.5}
RECIPE_KEYS = ("epochs", "lr", "warmup_pct", "chunk_size", "dry_run")
README_BEGIN, README_END = "<!-- reproduce_table:begin -->", "<!-- reproduce_table:end -->"
# The GradCache paper's NQ figures (Gao et al., 2021, "Scaling Deep Contrastive Learning Batch
# Size under Memory Limited Setup"), top-20 on the NQ test set, BERT-base, one 11 GB GPU, as
# issue 6 quotes them (the paper itself is not on this offline machine to re-check).
PAPER_NQ_TOP20 = [
    ("DPR, B=128 on 8 GPUs", 78.4),
    ("one GPU, full batch B=8", 77.2),
    ("one GPU, GradCache B=128", 79.3),
    ("one GPU, GradCache B=512", 79.9),
]
MODEL_NAMES = {"minilm": "all-MiniLM-L6-v2", "reinit": "MiniLM, layers re-initialised"}


def _read_log(path: Path) -> dict[str, Any]:
    """Peak memory, summed step seconds and step count of a train_log.jsonl (empty if none)."""
    if not path.is_file():
        return {}
    lines = [json.loads(line) for line in path.read_text().splitlines() if line.strip()]
    if not lines:
        return {}
    return {
        "peak_memory_bytes": max(r["peak_memory_bytes"] for r in lines),
        "train_seconds": sum(r["seconds"] for r in lines),
        "steps": lines[-1]["step"],
    }


def collect(runs: Path) -> list[dict[str, Any]]:
    """One record per finished run (run.json and eval/metrics.json present)."""
    records = []
    for run_json in sorted(runs.glob("*/run.json")):
        metrics = run_json.parent / "eval" / "metrics.json"
        if not metrics.is_file():
            continue
        record = json.loads(run_json.read_text())
        record.update(json.loads(metrics.read_text()))
        record.update(_read_log(run_json.parent / "train_log.jsonl"))
        record["dir"] = run_json.parent.name
        records.append(record)
    return records


def _mean_sd(values: list[float]) -> tuple[float | None, float | None]:
    """Mean and sample standard deviation; the sd is None below two values (not measured)."""
    mean = statistics.mean(values) if values else None
    return mean, statistics.stdev(values) if len(values) > 1 else None


def check_same_recipe(records: list[dict[str, Any]]) -> None:
    """SystemExit naming the key and two runs if trained runs differ in their recipe."""
    trained = [r for r in records if r["mode"] in ("full", "gradcache")]
    for key in RECIPE_KEYS:
        values = {str(r.get(key)): r["dir"] for r in trained}
        if len(values) > 1:
            (a, run_a), (b, run_b) = list(values.items())[:2]
            raise SystemExit(
                f"error: runs differ in {key} ({run_a}: {a}, {run_b}: {b}); "
                "give each recipe its own --runs folder (OUT=... scripts/reproduce_squad.sh)"
            )


def first_hit_ranks(retrieval_json: Path) -> list[float]:
    """Per dev question, the 0-based rank of the first passage holding an answer (inf if none)."""
    entries = json.loads(retrieval_json.read_text(encoding="utf-8"))
    ranks = []
    for entry in entries:
        flags = [bool(ctx["has_answer"]) for ctx in entry["ctxs"]]
        ranks.append(flags.index(True) if True in flags else float("inf"))
    return ranks


def paired_differences(
    records: list[dict[str, Any]], runs: Path, ks: tuple[int, ...] = (1, 5, 20), n_boot: int = 10000
) -> list[dict[str, Any]]:
    """Each trained setting minus the full batch of the same model and seed, in top-k points,
    with a 95% paired bootstrap interval over the dev questions (resampling questions, seed 0).

    The interval covers the test-set sampling only; the spread over training seeds is the
    table's standard deviation (one seed: not measured)."""
    import numpy as np

    full = {(r["model"], r["seed"]): r for r in records if r["mode"] == "full"}
    out = []
    for r in records:
        base = full.get((r["model"], r["seed"]))
        if r["mode"] != "gradcache" or base is None:
            continue
        a = np.array(first_hit_ranks(runs / r["dir"] / "eval" / "retrieval.json"))
        b = np.array(first_hit_ranks(runs / base["dir"] / "eval" / "retrieval.json"))
        rng = np.random.default_rng(0)
        idx = rng.integers(0, len(a), size=(n_boot, len(a)))
        row = {"model": r["model"], "setting": r["setting"], "seed": r["seed"]}
        for k in ks:
            diff = (a < k).astype(float) - (b < k).astype(float)  # per question: -1, 0 or 1
            boot = diff[idx].mean(axis=1) * 100
            row[f"top{k}"] = float(diff.mean() * 100)
            row[f"top{k}_ci"] = (float(np.percentile(boot, 2.5)), float(np.percentile(boot, 97.5)))
        out.append(row)
    return out


def seed_spread(diffs: list[dict[str, Any]], ks: tuple[int, ...] = (1, 5, 20)) -> list[dict]:
    """Per model and GradCache setting: the mean and standard deviation over seeds of the paired
    difference with the full batch (each seed compared with its own full-batch run)."""
    groups: dict[tuple[str, str], list[dict[str, Any]]] = {}
    for d in diffs:
        groups.setdefault((d["model"], d["setting"]), []).append(d)
    out = []
    for (model, setting), ds in groups.items():
        row: dict[str, Any] = {
            "model": model,
            "setting": setting,
            "seeds": sorted(d["seed"] for d in ds),
        }
        for k in ks:
            row[f"top{k}"], row[f"top{k}_sd"] = _mean_sd([d[f"top{k}"] for d in ds])
        out.append(row)
    return out


def _order(key: tuple[str, str, int]) -> tuple:
    model, setting, batch = key
    models = list(MODEL_NAMES)
    return (
        models.index(model) if model in models else len(models),
        model,
        setting != "off-the-shelf",
        batch,
        setting,
    )


def group(records: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Mean and standard deviation over seeds per (model, setting)."""
    groups: dict[tuple[str, str, int], list[dict[str, Any]]] = {}
    for r in records:
        groups.setdefault((r["model"], r["setting"], r["batch_size"]), []).append(r)
    rows = []
    for key in sorted(groups, key=_order):
        runs = groups[key]
        row: dict[str, Any] = {"model": key[0], "setting": key[1], "batch_size": key[2]}
        row["seeds"] = sorted(r["seed"] for r in runs)
        for name in [f"top{k}" for k in KS] + ["peak_memory_bytes", "train_seconds", "steps"]:
            row[name], row[name + "_sd"] = _mean_sd(
                [r[name] for r in runs if r.get(name) is not None]
            )
        row["steps_sd"] = None  # steps are fixed by B and epochs: no spread to show
        rows.append(row)
    return rows


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
        "Written by `scripts/reproduce_table.py` from the runs of `scripts/reproduce_squad.sh`"
        " (method: [reproduce_squad_method.md](reproduce_squad_method.md)).",
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
        "For reference, the shape this study looks for: the GradCache paper's NQ results"
        " (BERT-base, top-20 on NQ test, as the project's issue quotes them; a different corpus,"
        " model and training length, so compare the direction, not the level).",
        "",
        "| GradCache paper, NQ | top-20 |",
        "|---|--:|",
        *[f"| {name} | {top20:.1f} |" for name, top20 in PAPER_NQ_TOP20],
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
    readme.write_text(head + README_BEGIN + "\n" + "\n".join(lines) + "\n" + README_END + tail)


def plot(rows: list[dict[str, Any]], path: Path, bm25: dict[str, Any] | None = None) -> None:
    """Top-20 and top-5 against the (simulated) batch size: a row of panels per model (each on
    its own scale), the off-the-shelf encoder and BM25 as horizontal lines; error bars (the
    standard deviation over seeds) only where a setting has two or more seeds."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    models = list(dict.fromkeys(r["model"] for r in rows))
    fig, grid = plt.subplots(
        len(models), 2, figsize=(10, 3.6 * len(models)), constrained_layout=True, squeeze=False
    )
    batches = sorted({r["batch_size"] for r in rows if r["setting"] != "off-the-shelf"})
    for axes, model in zip(grid, models, strict=True):
        name = MODEL_NAMES.get(model, model)
        trained = [r for r in rows if r["model"] == model and r["setting"] != "off-the-shelf"]
        trained.sort(key=lambda r: r["batch_size"])
        shelf = [r for r in rows if r["model"] == model and r["setting"] == "off-the-shelf"]
        for ax, k in zip(axes, (20, 5), strict=True):
            key = f"top{k}"
            if bm25 is not None:
                ax.axhline(bm25[key], color="black", linestyle="--", linewidth=1, label="BM25")
            for r in shelf:
                ax.axhline(r[key], color="gray", linestyle=":", linewidth=1.5,
                           label="off the shelf")  # fmt: skip
            if trained:
                xs = [r["batch_size"] for r in trained]
                line = ax.plot(xs, [r[key] for r in trained], marker="o", label="trained")[0]
                spread = [r for r in trained if r[key + "_sd"] is not None]  # 2+ seeds only
                if spread:
                    ax.errorbar(
                        [r["batch_size"] for r in spread],
                        [r[key] for r in spread],
                        yerr=[r[key + "_sd"] for r in spread],
                        fmt="none",
                        capsize=3,
                        color=line.get_color(),
                        label="± sd over seeds",
                    )
            ax.set_xscale("log", base=2)
            if batches:
                ax.set_xticks(batches, [str(b) for b in batches])
                ax.set_xlim(batches[0] / 1.5, batches[-1] * 1.5)
            ax.minorticks_off()
            ax.set_xlabel("batch size (smallest: full batch; larger: GradCache, same chunk)")
            ax.set_ylabel(f"top-{k} hit rate (%)")
            ax.set_title(f"{name}: SQuAD dev, top-{k}")
            ax.grid(alpha=0.3)
        axes[0].legend(fontsize=8, loc="best")
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=110)
    plt.close(fig)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--runs", type=Path, default=Path("runs/reproduce"))
    parser.add_argument("--md", type=Path, default=Path("docs/reproduce_squad.md"))
    parser.add_argument("--png", type=Path, default=Path("docs/reproduce_squad.png"))
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
    args.md.parent.mkdir(parents=True, exist_ok=True)
    diffs = paired_differences(records, args.runs)
    args.md.write_text(markdown(rows, records, png, diffs, bm25))
    if args.readme is not None:
        write_readme_block(args.readme, table_block(rows, bm25))
    print(
        f"{len(records)} runs -> {args.md}, {args.png}"
        + (f", {args.readme}" if args.readme else "")
    )


if __name__ == "__main__":
    main()
