"""The full-scale benchmark: NQ-size data (synthetic, in NQ's structure) through the commands a
user runs, each in a fresh process measured by ``wait4`` (wall time; peak RSS as the kernel
counts it, memory-mapped pages included).

    python -m benchmarks.scale --work runs/scale --out docs/bench   # resumable

Steps run in order; a finished step is skipped on a rerun (its figures live in
``OUT/scale.json``). Big files are deleted once no later step needs them: 32 GB of vectors, a
13 GB TSV and its Arrow cache and GBs of JSON do not fit on this disk together. ``--steps``
runs some steps, ``--redo`` runs finished ones again. ``report`` writes ``OUT/scale.md``.
"""

from __future__ import annotations

import functools
from collections.abc import Callable
from pathlib import Path

from benchmarks import scale_data, scale_vectors
from benchmarks.harness import cpu_info, cpu_text, markdown_table, run_steps
from dpr_cache.runtime.atomic import write_atomic, write_text_atomic

STEPS: dict[str, Callable[[Path], dict]] = {
    "vectors": scale_vectors.step_vectors,
    "exact": scale_vectors.step_exact,
    "ivfpq": scale_vectors.step_ivfpq,
    "hnsw": scale_vectors.step_hnsw,
    "tsv": scale_data.step_tsv,
    "eval": scale_data.step_eval,
    "cleanup": scale_data.step_cleanup,
    "json": scale_data.step_json,
    "tokenize": scale_data.step_tokenize,
}


def main(argv: list[str] | None = None) -> None:
    description = __doc__.splitlines()[0]
    run_steps(argv, description, STEPS, Path("runs/scale"), "scale.json", render, _this_machine)


def _this_machine(results: dict) -> None:
    """The machine this session runs on, as the page's; the steps run before the page kept
    its machine-by-step record under the one it named."""
    machine = cpu_info()
    for step in STEPS:
        if step in results and step not in results["machines"]:
            results["machines"][step] = results.get("machine", machine)
    results["machine"] = machine


# The page.


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


def render(results: dict, out: Path, source: Path | None = None) -> Path:
    """Write ``out/scale.md`` (and ``out/scale.png``) from what has been measured so far, with
    the hand-written reading ``scale_notes.md`` (of ``source``, else ``out``) appended."""
    lines = _head(results) + _exact(results, out) + _approximate(results) + _files(results)
    lines += _eval(results) + _tokenize(results)
    text = "\n".join(lines) + "\n"
    notes = (source or out) / "scale_notes.md"
    if notes.is_file():  # the hand-written reading and projection, kept beside the figures
        text += "\n" + notes.read_text()
    write_text_atomic(out / "scale.md", text)
    return out / "scale.md"


def _head(results: dict) -> list[str]:
    lines = [
        "# dpr-cache at NQ's scale, on one small box",
        "",
        "Written by `python -m benchmarks.scale --work runs/scale --out docs/bench`"
        " (resumable; each step a fresh process measured by `wait4`: wall time and peak RSS as"
        " the kernel counts it, memory-mapped pages included). All data is **synthetic**, in NQ's"
        " structure and size: no NQ file can be downloaded here.",
        "",
        f"Machine: {cpu_text(results.get('machine', {}))}.",
    ]
    machines = results.get("machines", {})
    if len({cpu_text(v) for v in machines.values()}) > 1:
        lines += ["", "The steps ran on different machines:", ""]
        ran = [[k, cpu_text(v)] for k, v in machines.items()]
        lines += markdown_table(["step", "machine"], ran)
    if targets(results):
        lines += ["", "## Targets (exact search)", ""]
        met = {True: "yes", False: "**no**", None: "-"}
        rows = [[t, v, g, met[ok]] for t, v, g, ok in targets(results)]
        lines += markdown_table(["target", "measured", "goal", "met"], rows)
    return lines


def _exact(results: dict, out: Path) -> list[str]:
    exact = results.get("exact")
    if not exact:
        return []
    lines = [
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
    header = ["vectors", "on disk GB", "peak RSS GB", "wall s", "GFLOP/s"]
    rows = [
        [f"{s['rows']:,}", f"{s['rows'] * 768 * 2 / 1e9:.1f}", s["peak_rss_gb"], s["seconds"]]
        + [s["gflops"]]
        for s in exact["sizes"].values()
    ]
    _plot(results, out / "scale.png")
    return (
        lines
        + markdown_table(header, rows)
        + [
            "",
            "![memory and time against the corpus size](scale.png)",
        ]
    )


def _approximate(results: dict) -> list[str]:
    header = ["vectors", "recall@100 vs exact", "build s", "build peak GB", "search s"]
    header += ["search peak GB", "index GB", "params"]
    lines = []
    for kind in ("ivfpq", "hnsw"):
        if kind in results:
            rows = [
                [name, r["recall_at_100"], r["build"]["seconds"], r["build"]["peak_rss_gb"]]
                + [r["search"]["seconds"], r["search"]["peak_rss_gb"], r["index_gb"], r["params"]]
                for name, r in results[kind].items()
            ]
            lines += ["", f"## {kind.upper()}", "", *markdown_table(header, rows)]
    return lines


def _files(results: dict) -> list[str]:
    lines = []
    for key, title in (("tsv", "Passages TSV -> Arrow"), ("json", "Training JSON -> Arrow")):
        if key in results:
            sizes = results[key]["sizes"] if key == "tsv" else results[key]
            rows = [
                [n, s.get("tsv_gb", s.get("json_gb")), s["peak_rss_gb"], s["seconds"]]
                + [s["mb_per_s"]]
                for n, s in sizes.items()
            ]
            header = ["file", "GB", "peak RSS GB", "wall s", "MB/s"]
            lines += ["", f"## {title}", "", *markdown_table(header, rows)]
    return lines


def _eval(results: dict) -> list[str]:
    if "eval" not in results:
        return []
    e = results["eval"]
    return [
        "",
        "## `dpr-cache eval` at full size",
        "",
        f"Whole command: {e['eval']['seconds']} s, peak RSS {e['eval']['peak_rss_gb']}"
        f" GB (`index.memory_gb: {e['memory_gb']}`). Stages:",
        "",
        *markdown_table(["stage", "s"], [[k, v] for k, v in e["stages"].items()]),
    ]


def _tokenize(results: dict) -> list[str]:
    if "tokenize" not in results:
        return []
    rates = [[k, v["passages_per_s"]] for k, v in results["tokenize"].items()]
    return [
        "",
        "## Tokenization (256-token (title, text) pairs, fast tokenizer)",
        "",
        *markdown_table(["loader", "passages/s"], rates),
    ]


if __name__ == "__main__":
    main()
