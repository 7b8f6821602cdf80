"""Encode the passage corpus into resumable on-disk shards, then build a FAISS index over them.

Layout under ``output_dir/index/``::

    shards/<key>-00000.npy      float32 embeddings of passages [0, shard_size), file order
    shards/<key>-00000.ids.txt  their passage ids, one a line
    faiss.index                 the index: row i is passage row i of the passages file
    passage_ids.txt             the passage id of every index row, one a line
    meta.json                   model, weights fingerprint, sizes, index type, timings

``<key>`` hashes all an embedding depends on (weights, passages file, lengths, pooling, precision,
shard size), so a shard of another model or corpus is never reused. A finished shard is skipped on
a rerun; shard k belongs to rank ``k % world_size``. The final index is rebuilt from the shards on
every run, so switching ``index.type`` costs no re-encoding. :func:`build_index` is the entry point
(it reads the config); :func:`index_passages` does the work from plain arguments.
"""

from __future__ import annotations

import math
import time
from pathlib import Path
from typing import Any

import faiss
import numpy as np
import torch
from tqdm.auto import tqdm

from dpr_cache.config import Config
from dpr_cache.data.passages import load_passages
from dpr_cache.errors import InputError
from dpr_cache.model.loading import load_encoder, model_fingerprint, resolve_model_dir
from dpr_cache.retrieval.encode import encode_passage_texts
from dpr_cache.retrieval.faiss_index import (
    IDS_FILE,
    INDEX_FILE,
    META_FILE,
    IndexSpec,
    check_index_spec,
    new_index,
)
from dpr_cache.retrieval.shards import (
    remove_stale,
    save_shard,
    shard_done,
    shard_files,
    shard_key,
    wait_for_shards,
)
from dpr_cache.runtime.atomic import write_atomic, write_json_atomic
from dpr_cache.runtime.device import inference_precision, resolve_device

__all__ = ["build_index", "index_passages", "index_dir_of", "index_spec", "passages_signature"]


def index_dir_of(output_dir: Path) -> Path:
    """Where a run's index lives: ``output_dir/index``."""
    return Path(output_dir) / "index"


def index_spec(config: Config) -> IndexSpec:
    """The FAISS settings of ``index.*``."""
    return IndexSpec(**config.index.model_dump(exclude={"batch_size", "shard_size"}))


def passages_signature(path: Path) -> dict[str, Any]:
    st = path.stat()
    return {"path": str(path.resolve()), "size": st.st_size, "mtime_ns": st.st_mtime_ns}


def build_index(
    config: Config,
    model_dir: str | Path | None = None,
    *,
    rank: int = 0,
    world_size: int = 1,
    progress: bool = True,
    sort_by_length: bool = True,
    device: str | torch.device | None = None,
) -> Path:
    """``dpr-cache index --config``: encode ``data.passages`` with the passage tower of
    ``model_dir`` (default ``output_dir/model``) and build ``index.type``; returns the folder."""
    model_dir = resolve_model_dir(model_dir, config.output_path / "model")
    if not config.data.passages:
        raise InputError("data.passages: not set (a DPR passages TSV)")
    dev = resolve_device(device if device is not None else config.train.device)
    return index_passages(
        Path(config.data.passages),
        model_dir,
        index_dir_of(config.output_path),
        cache_dir=config.cache_path,
        spec=index_spec(config),
        pooling=config.model.pooling,
        max_length=config.model.max_passage_length,
        batch_size=config.index.batch_size,
        shard_size=config.index.shard_size,
        device=dev,
        precision=inference_precision(dev, config.train.precision),
        rank=rank,
        world_size=world_size,
        progress=progress,
        sort_by_length=sort_by_length,
    )


def index_passages(
    passages: Path,
    model_dir: Path,
    out: Path,
    *,
    cache_dir: Path,
    spec: IndexSpec,
    pooling: str,
    max_length: int,
    batch_size: int,
    shard_size: int,
    device: torch.device,
    precision: str = "fp32",
    rank: int = 0,
    world_size: int = 1,
    progress: bool = True,
    sort_by_length: bool = True,
) -> Path:
    """Encode ``passages`` into shards (this rank's share) and, on rank 0, build the index.

    Rank 0 waits for the other ranks' shards by watching the shard folder (a long encode never
    hits a collective time-out); the other ranks return as soon as their shards are written.
    """
    dataset = load_passages(passages, cache_dir)
    n = len(dataset)
    if n == 0:
        raise InputError(f"{passages}: no passages")
    model = load_encoder(model_dir, pooling=pooling).to(device)
    check_index_spec(spec, n, model.dim)
    fingerprint = model_fingerprint(model_dir)
    signature = passages_signature(passages)
    key = shard_key(
        fingerprint, signature, shard_size=shard_size, max_length=max_length,
        pooling=model.pooling, precision=precision,
    )  # fmt: skip
    shard_dir = out / "shards"
    shard_dir.mkdir(parents=True, exist_ok=True)
    if rank == 0:  # other ranks only write this key's files; their tmp files must survive
        remove_stale(shard_dir, key, temporary=world_size == 1)
    sizes = [min(shard_size, n - k * shard_size) for k in range(math.ceil(n / shard_size))]
    mine = [
        k
        for k in range(rank, len(sizes), world_size)
        if not shard_done(shard_dir, key, k, sizes[k])
    ]
    todo = sum(sizes[k] for k in mine)
    bar = tqdm(total=todo, unit="psg", desc=f"encode passages (rank {rank})", disable=not progress)
    start = time.perf_counter()
    with bar:
        for k in mine:
            chunk = dataset[k * shard_size : k * shard_size + sizes[k]]
            embs = encode_passage_texts(
                model, chunk["title"], chunk["text"], max_length=max_length,
                batch_size=batch_size, device=device, precision=precision,
                sort_by_length=sort_by_length, on_batch=bar.update,
            )  # fmt: skip
            save_shard(shard_dir, key, k, embs, chunk["id"])
    encode_seconds = time.perf_counter() - start
    dim, pooling = model.dim, model.pooling
    del model
    if rank != 0:
        return out
    wait_for_shards(shard_dir, key, sizes)

    start = time.perf_counter()
    shard_embs = [
        np.load(shard_files(shard_dir, key, k)[0], mmap_mode="r") for k in range(len(sizes))
    ]
    index, params = new_index(spec, shard_embs, shard_size, n, dim)
    for emb in shard_embs:
        index.add(np.ascontiguousarray(emb, dtype=np.float32))
    (out / META_FILE).unlink(missing_ok=True)  # no meta = no index, until all files are new
    write_atomic(out / INDEX_FILE, lambda tmp: faiss.write_index(index, str(tmp)))

    def write_ids(tmp: Path) -> None:
        with open(tmp, "w", encoding="utf-8") as f:
            for k in range(len(sizes)):
                f.write(shard_files(shard_dir, key, k)[1].read_text(encoding="utf-8"))

    write_atomic(out / IDS_FILE, write_ids)
    meta = {
        "model_dir": str(model_dir),
        "fingerprint": fingerprint,
        "passages": signature,
        "n_passages": n,
        "dim": dim,
        "index_type": spec.type,
        "index_params": params,
        "pooling": pooling,
        "max_passage_length": max_length,
        "precision": precision,
        "shard_size": shard_size,
        "n_shards": len(sizes),
        "shard_key": key,
        "sort_by_length": sort_by_length,
        "timings": {  # this run, rank 0
            "encoded_passages": todo,
            "encode_seconds": round(encode_seconds, 3),
            "passages_per_second": round(todo / encode_seconds, 1) if todo else None,
            "build_seconds": round(time.perf_counter() - start, 3),
        },
    }
    write_json_atomic(out / META_FILE, meta)
    return out
