"""The batch-size study's plot: top-20 and top-5 against the (simulated) batch size."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from dpr_cache.runtime.atomic import write_atomic
from studies.squad_batch_size.runs import MODEL_NAMES


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
    write_atomic(path, lambda tmp: fig.savefig(tmp, dpi=110, format="png"))
    plt.close(fig)
