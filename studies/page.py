"""What the hard-negative and teacher studies' page writers share: the bar plot of their
retrievers, and the command line that builds a page, its plot and the block of docs/studies.md."""

from __future__ import annotations

import argparse
import functools
import json
from collections.abc import Callable
from pathlib import Path
from typing import Any

from dpr_cache.runtime.atomic import write_atomic, write_json_atomic, write_text_atomic
from studies.readme_block import write_readme_block
from studies.squad_batch_size.runs import mean_sd

# (label, top-1, MRR@10, top-1's sd or None, MRR@10's sd or None)
Bar = tuple[str, float, float, float | None, float | None]


def hybrid_bars(hybrids: list[dict[str, Any]], model: Callable[[dict[str, Any]], str]) -> list[Bar]:
    """One bar per (model, fusion method): the mean over its seeds, as for the models alone."""
    by_arm: dict[tuple[str, str], list[dict[str, Any]]] = {}
    for h in hybrids:
        by_arm.setdefault((model(h), h["method"]), []).append(h)
    bars: list[Bar] = []
    for (name, method), hs in by_arm.items():
        top1, top1_sd = mean_sd([h["top1"] for h in hs])
        mrr, mrr_sd = mean_sd([h["mrr@10"] for h in hs])
        seeds = f", {len(hs)} seeds" if len(hs) > 1 else ""
        bars.append((f"BM25 + {name} ({method}{seeds})", top1, mrr, top1_sd, mrr_sd))
    return bars


def plot_bars(bars: list[Bar], png: Path, bm25_top1: float | None = None) -> None:
    """Top-1 and MRR@10 side by side for each retriever, error bars at one sd over seeds; a
    dotted line at BM25's top-1 when given."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(9, 0.45 * len(bars) + 1.2))
    y = range(len(bars))
    for shift, i, sd, label in ((-0.2, 1, 3, "top-1"), (0.2, 2, 4, "MRR@10")):
        ax.barh(
            [k + shift for k in y],
            [b[i] for b in bars],
            0.4,
            xerr=[b[sd] or 0 for b in bars],
            label=label,
        )
    if bm25_top1 is not None:
        ax.axvline(bm25_top1, color="grey", linestyle=":", label="BM25 top-1")
    ax.set_yticks(list(y), [b[0] for b in bars], fontsize=8)
    ax.invert_yaxis()
    lo = min(min(b[1], b[2]) for b in bars)
    ax.set_xlim(max(0, lo - 5), 100)
    ax.set_xlabel("points (SQuAD dev)")
    ax.legend(loc="lower right", fontsize=8)
    ax.grid(axis="x", alpha=0.3)
    save_png(fig, png)


def save_png(fig, png: Path) -> None:
    """A study's figure laid out, written to ``png`` atomically and closed."""
    import matplotlib.pyplot as plt

    fig.tight_layout()
    write_atomic(png, functools.partial(fig.savefig, dpi=110, format="png"))
    plt.close(fig)


def build_page(
    doc: str,
    here: Path,
    runs: Path,
    markers: tuple[str, str],
    gather: Callable[[Path, str], dict[str, Any]],
    markdown: Callable[[dict[str, Any], str, str | None], str],
    plot: Callable[[dict[str, Any], Path], None],
    readme_block: Callable[[dict[str, Any]], list[str]],
) -> None:
    """The page writer's command line: gather the runs (or read ``results.json`` with
    ``--kept``), write the page, its data, its plot and, with ``--readme``, the study's block of
    docs/studies.md, the page of every study's table (its markers checked before anything is
    written)."""
    parser = argparse.ArgumentParser(description=doc.splitlines()[0])
    parser.add_argument("--runs", type=Path, default=runs)
    parser.add_argument("--suffix", default="")
    parser.add_argument("--md", type=Path, default=here / "results.md")
    parser.add_argument("--png", type=Path, default=here / "plot.png")
    parser.add_argument("--readme", type=Path, default=None)
    parser.add_argument("--kept", action="store_true", help="From results.json beside --md.")
    parser.add_argument(
        "--reading", type=Path, default=here / "reading.md", help="Closes the page if it exists."
    )
    args = parser.parse_args()
    kept = args.md.with_suffix(".json")
    data = json.loads(kept.read_text()) if args.kept else gather(args.runs, args.suffix)
    if args.readme:
        write_readme_block(args.readme, markers, [], check_only=True)
    reading = args.reading.read_text() if args.reading.is_file() else None
    md = markdown(data, args.png.name, reading)
    write_text_atomic(args.md, md)
    write_json_atomic(kept, data)
    plot(data, args.png)
    if args.readme:
        write_readme_block(args.readme, markers, readme_block(data))
    print(f"written to {args.md}")
