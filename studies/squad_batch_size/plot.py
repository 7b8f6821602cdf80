"""The batch-size study's plot: each metric per arm, every seed a point, the pairs joined."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from dpr_cache.runtime.atomic import write_atomic

PANELS = (("top1", "top-1"), ("top5", "top-5"), ("top20", "top-20"), ("mrr@10", "MRR@10"))


def plot(
    rows: list[dict[str, Any]],
    labels: list[str],
    path: Path,
) -> None:
    """One panel per metric; x: the trained arms (``rows`` in order, ``labels`` their tick
    text); a dot per seed, a bar at the mean; a thin line joins the accumulation and GradCache
    runs of one seed and lr (a pair). BM25 and the untrained encoder stay in the table: drawn
    here they would squeeze the seeds' spread into a few pixels."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, grid = plt.subplots(2, 2, figsize=(12, 8), constrained_layout=True)
    xs = {id(r): i for i, r in enumerate(rows)}
    for ax, (key, title) in zip(grid.flat, PANELS, strict=True):
        for r in rows:
            x, values = xs[id(r)], r["per_seed"][key]
            color = f"C{['full', 'accumulate', 'gradcache'].index(r['mode'])}"
            ax.scatter([x] * len(values), values, color=color, s=22, zorder=3)
            ax.hlines(r[key], x - 0.25, x + 0.25, color=color, linewidth=2)
        for a in rows:  # join each seed's accumulation and GradCache runs
            for b in rows:
                if (a["mode"], b["mode"]) != ("accumulate", "gradcache"):
                    continue
                if (a["batch_size"], a["lr"]) != (b["batch_size"], b["lr"]):
                    continue
                for seed, va in zip(a["seeds"], a["per_seed"][key], strict=True):
                    if seed in b["seeds"]:
                        vb = b["per_seed"][key][b["seeds"].index(seed)]
                        ax.plot([xs[id(a)], xs[id(b)]], [va, vb], color="gray", lw=0.7, zorder=2)
        ax.set_xticks(range(len(rows)), labels, fontsize=8)
        ax.set_xlim(-0.6, len(rows) - 0.4)
        ax.set_ylabel(f"{title} (%)")
        ax.set_title(f"SQuAD dev, {title}")
        ax.grid(axis="y", alpha=0.3)
    fig.suptitle(
        "all-MiniLM-L6-v2 trained on SQuAD: a dot per seed, a bar at the mean, pairs joined"
    )
    write_atomic(path, lambda tmp: fig.savefig(tmp, dpi=110, format="png"))
    plt.close(fig)
