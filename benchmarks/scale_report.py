"""``scale.json`` as a page: ``scale.md`` (tables, targets, projection) and ``scale.png``."""

from __future__ import annotations

import functools
from pathlib import Path

from benchmarks.machine import cpu_text
from dpr_cache.runtime.atomic import write_atomic, write_text_atomic

__all__ = ["write_report", "targets", "markdown_table"]


def targets(results: dict) -> list[tuple[str, str, str, bool | None]]:
    """(target, measured, goal, met) of the exact search at 1M, 4M and 21M vectors."""
    exact = results.get("exact")
    if not exact:
        return []
    sizes = exact["sizes"]
    full = sizes.get("21M")
    rss = [s["peak_rss_gb"] for s in sizes.values()]
    per_row = [s["seconds"] / s["rows"] for s in sizes.values()]
    spread = max(rss) / min(rss) - 1
    linear = max(per_row) / min(per_row) - 1
    rate = full["gflops"] / exact["matmul_gflops"] if full else None
    out = [
        (
            "peak RSS at 21M, --memory-gb 2",
            f"{full['peak_rss_gb']:.2f} GB" if full else "-",
            "<= 3 GB",
            full["peak_rss_gb"] <= 3 if full else None,
        ),
        ("peak RSS spread over 1M, 4M, 21M", f"{spread:.1%}", "<= 10%", spread <= 0.10),
        (
            "time per vector, spread over 1M, 4M, 21M",
            f"{linear:.1%}",
            "linear in N (<= 15%)",
            linear <= 0.15,
        ),
        (
            "scan rate / matmul rate",
            f"{rate:.2f}" if rate else "-",
            ">= 0.50",
            rate >= 0.5 if rate else None,
        ),
    ]
    return out


def markdown_table(header: list[str], rows: list[list]) -> list[str]:
    """A markdown table's lines."""
    lines = ["| " + " | ".join(header) + " |", "|" + "---|" * len(header)]
    return lines + ["| " + " | ".join(str(c) for c in row) + " |" for row in rows]


def _plot(results: dict, path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    sizes = results["exact"]["sizes"]
    rows = [s["rows"] / 1e6 for s in sizes.values()]
    fig, (left, right) = plt.subplots(1, 2, figsize=(10, 3.8))
    left.plot(rows, [s["peak_rss_gb"] for s in sizes.values()], marker="o", label="peak RSS")
    left.axhline(results["exact"]["memory_gb"], color="gray", linestyle="--", label="--memory-gb")
    left.set(xlabel="vectors (millions, 768-d float16)", ylabel="GB", ylim=(0, None))
    left.set_title("exact top-100 of 3,610 queries: memory")
    left.legend(fontsize=8)
    right.plot(rows, [s["seconds"] / 60 for s in sizes.values()], marker="o")
    right.set(xlabel="vectors (millions)", ylabel="minutes", ylim=(0, None))
    right.set_title("the same search: wall time")
    for ax in (left, right):
        ax.grid(alpha=0.3)
    fig.tight_layout()
    write_atomic(path, functools.partial(fig.savefig, dpi=110, format="png"))
    plt.close(fig)


def write_report(results: dict, out: Path, notes: Path | None = None) -> Path:
    """Write ``out/scale.md`` (and ``out/scale.png``) from what has been measured so far, with
    the hand-written reading ``notes`` (default ``out/scale_notes.md``) appended."""
    m = results.get("machine", {})
    lines = [
        "# dpr-cache at NQ's scale, on one small box",
        "",
        "Written by `python -m benchmarks.scale --work runs/scale --out docs/bench`"
        " (resumable; each step a fresh process measured by `wait4`: wall time and peak RSS as"
        " the kernel counts it, memory-mapped pages included). All data is **synthetic**, in NQ's"
        " structure and size: no NQ file can be downloaded here.",
        "",
        f"Machine: {cpu_text(m)}.",
    ]
    machines = results.get("machines", {})
    if len({cpu_text(v) for v in machines.values()}) > 1:
        lines += ["", "The steps ran on different machines:", ""]
        ran = [[k, cpu_text(v)] for k, v in machines.items()]
        lines += markdown_table(["step", "machine"], ran)
    if targets(results):
        lines += ["", "## Targets (exact search)", ""]
        lines += markdown_table(
            ["target", "measured", "goal", "met"],
            [
                [t, v, g, {True: "yes", False: "**no**", None: "-"}[ok]]
                for t, v, g, ok in targets(results)
            ],
        )
    exact = results.get("exact")
    if exact:
        lines += [
            "",
            "## Exact search, streamed from disk",
            "",
            f"Top-{exact['k']} of {exact['queries']:,} unit queries over clustered unit"
            " vectors (768-d, float16 shards of 500,000 rows, read block by block into"
            f" reused buffers; float32 scores), `--memory-gb {exact['memory_gb']}`."
            f" Plain float32 matmul on this machine: {exact['matmul_gflops']} GFLOP/s"
            f" before, {exact.get('matmul_gflops_after', '-')} after.",
            "",
        ]
        lines += markdown_table(
            ["vectors", "on disk GB", "peak RSS GB", "wall s", "GFLOP/s"],
            [
                [
                    f"{s['rows']:,}",
                    f"{s['rows'] * 768 * 2 / 1e9:.1f}",
                    s["peak_rss_gb"],
                    s["seconds"],
                    s["gflops"],
                ]
                for s in exact["sizes"].values()
            ],
        )
        _plot(results, out / "scale.png")
        lines += ["", "![memory and time against the corpus size](scale.png)"]
    for kind in ("ivfpq", "hnsw"):
        if kind in results:
            lines += ["", f"## {kind.upper()}", ""]
            lines += markdown_table(
                [
                    "vectors",
                    "recall@100 vs exact",
                    "build s",
                    "build peak GB",
                    "search s",
                    "search peak GB",
                    "index GB",
                    "params",
                ],
                [
                    [
                        name,
                        r["recall_at_100"],
                        r["build"]["seconds"],
                        r["build"]["peak_rss_gb"],
                        r["search"]["seconds"],
                        r["search"]["peak_rss_gb"],
                        r["index_gb"],
                        r["params"],
                    ]
                    for name, r in results[kind].items()
                ],
            )
    for key, title in (("tsv", "Passages TSV -> Arrow"), ("json", "Training JSON -> Arrow")):
        if key in results:
            sizes = results[key]["sizes"] if key == "tsv" else results[key]
            lines += ["", f"## {title}", ""]
            lines += markdown_table(
                ["file", "GB", "peak RSS GB", "wall s", "MB/s"],
                [
                    [
                        n,
                        s.get("tsv_gb", s.get("json_gb")),
                        s["peak_rss_gb"],
                        s["seconds"],
                        s["mb_per_s"],
                    ]
                    for n, s in sizes.items()
                ],
            )
    if "eval" in results:
        e = results["eval"]
        lines += [
            "",
            "## `dpr-cache eval` at full size",
            "",
            f"Whole command: {e['eval']['seconds']} s, peak RSS {e['eval']['peak_rss_gb']}"
            f" GB (`index.memory_gb: {e['memory_gb']}`). Stages:",
            "",
        ]
        lines += markdown_table(["stage", "s"], [[k, v] for k, v in e["stages"].items()])
    if "tokenize" in results:
        lines += ["", "## Tokenization (256-token (title, text) pairs, fast tokenizer)", ""]
        rates = [[k, v["passages_per_s"]] for k, v in results["tokenize"].items()]
        lines += markdown_table(["loader", "passages/s"], rates)
    text = "\n".join(lines) + "\n"
    notes = out / "scale_notes.md" if notes is None else notes
    if notes.is_file():  # the hand-written reading and projection, kept beside the figures
        text += "\n" + notes.read_text()
    write_text_atomic(out / "scale.md", text)
    return out / "scale.md"
