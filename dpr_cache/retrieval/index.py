"""Build an index folder: encode a passages TSV into resumable shards (``index --config``), or take
precomputed shards (``index --embeddings``: ours, or DPR's ``generate_dense_embeddings`` pickles),
then finish the index type asked for (see :mod:`dpr_cache.retrieval.index_dir`).

Layout of ``output_dir/index/`` when encoding::

    shards/<key>-00000.npy      embeddings of passages [0, shard_size), file order (float16 default)
    shards/<key>-00000.ids.txt  their passage ids, one a line
    meta.json                   type, shards, model fingerprint, passages file, timings
    faiss.index, faiss.ivfdata  approximate types only

``<key>`` hashes all an embedding depends on (see :func:`~dpr_cache.retrieval.shards.shard_key`).
The index type is rebuilt from the shards on every run, so switching it costs no re-encoding.
:func:`build_index` is the entry point that reads the config; the others take plain arguments.
"""

from __future__ import annotations

import glob
import math
import os
import pickle
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import torch
from tqdm.auto import tqdm

from dpr_cache.config import Config
from dpr_cache.data.passages import load_passages
from dpr_cache.errors import InputError
from dpr_cache.model.loading import load_encoder, model_fingerprint, resolve_model_dir
from dpr_cache.retrieval.encode import encode_corpus
from dpr_cache.retrieval.faiss_index import IndexSpec, check_index_spec
from dpr_cache.retrieval.index_dir import finish_index
from dpr_cache.retrieval.shards import (
    remove_stale,
    shard_done,
    shard_key,
    shard_path,
    wait_for_shards,
)
from dpr_cache.retrieval.store import EmbeddingStore, write_shard
from dpr_cache.runtime.device import inference_precision, resolve_device

__all__ = [
    "build_index",
    "encode_passage_shards",
    "EncodedShards",
    "index_passages",
    "index_embeddings",
    "index_dir_of",
    "index_spec",
    "passages_signature",
    "memory_bytes_of",
]


def index_dir_of(output_dir: Path) -> Path:
    """Where a run's index lives: ``output_dir/index``."""
    return Path(output_dir) / "index"


def index_spec(config: Config, type_: str | None = None) -> IndexSpec:
    """The FAISS settings of ``index.*`` (``type_`` overrides ``index.type``)."""
    keep = {"type", "hnsw_m", "hnsw_ef_search", "ivf_nlist", "pq_m", "ivf_nprobe"}
    spec = IndexSpec(**config.index.model_dump(include=keep))
    return spec if type_ is None else IndexSpec(**{**spec.__dict__, "type": type_})


def memory_bytes_of(memory_gb: float) -> int:
    return int(memory_gb * 1e9)


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
        memory_bytes=memory_bytes_of(config.index.memory_gb),
        store_dtype=config.index.store_dtype,
        pooling=config.model.pooling,
        normalize=config.model.normalize,
        max_length=config.model.max_passage_length,
        batch_size=config.index.batch_size,
        shard_size=config.index.shard_size,
        num_workers=config.data.num_workers,
        device=dev,
        precision=config.train.precision,
        rank=rank,
        world_size=world_size,
        progress=progress,
        sort_by_length=sort_by_length,
    )


@dataclass
class EncodedShards:
    """What :func:`encode_passage_shards` wrote: the shards of a corpus and how long it took."""

    paths: list[Path]  # every shard of the corpus, in order
    key: str
    fingerprint: str
    signature: dict[str, Any]
    pooling: str
    normalize: bool
    precision: str
    encoded: int  # passages encoded by this call (the rest were on disk already)
    seconds: float


def encode_passage_shards(
    passages: Path,
    model_dir: Path,
    shard_dir: Path,
    *,
    cache_dir: Path,
    pooling: str,
    max_length: int,
    batch_size: int,
    shard_size: int,
    store_dtype: str,
    device: torch.device,
    normalize: bool | None = None,
    precision: str = "fp32",
    num_workers: int = 1,
    rank: int = 0,
    world_size: int = 1,
    progress: bool = True,
    sort_by_length: bool = True,
    check: Callable[[int, int], None] | None = None,
) -> EncodedShards:
    """Encode this rank's missing shards of ``passages`` (shard k is rank ``k % world_size``'s)
    into ``shard_dir``; rank 0 then waits for every shard. ``check(rows, dim)`` runs before
    any encoding (e.g. that the index type suits the corpus)."""
    dataset = load_passages(passages, cache_dir)
    n = len(dataset)
    if n == 0:
        raise InputError(f"{passages}: no passages")
    model = load_encoder(model_dir, pooling=pooling, normalize=normalize).to(device)
    if check is not None:
        check(n, model.dim)
    precision = inference_precision(device, precision)
    fingerprint = model_fingerprint(model_dir)
    signature = passages_signature(passages)
    key = shard_key(
        fingerprint, signature, shard_size=shard_size, max_length=max_length,
        pooling=model.pooling, precision=precision, store_dtype=store_dtype,
        normalize=model.normalize,
    )  # fmt: skip
    shard_dir.mkdir(parents=True, exist_ok=True)
    if rank == 0:  # other ranks only write this key's files; their tmp files must survive
        remove_stale(shard_dir, key, temporary=world_size == 1)
    sizes = [min(shard_size, n - k * shard_size) for k in range(math.ceil(n / shard_size))]
    mine = [
        (shard_path(shard_dir, key, k), k * shard_size, sizes[k])
        for k in range(rank, len(sizes), world_size)
        if not shard_done(shard_dir, key, k, sizes[k])
    ]
    todo = sum(rows for _, _, rows in mine)
    bar = tqdm(total=todo, unit="psg", desc=f"encode passages (rank {rank})", disable=not progress)
    start = time.perf_counter()
    with bar:
        encode_corpus(
            model, dataset, mine, max_length=max_length, batch_size=batch_size, device=device,
            precision=precision, store_dtype=store_dtype, num_workers=num_workers,
            sort_by_length=sort_by_length, on_batch=bar.update,
        )  # fmt: skip
    seconds = time.perf_counter() - start
    if rank == 0:
        wait_for_shards(shard_dir, key, sizes)
    paths = [shard_path(shard_dir, key, k) for k in range(len(sizes))]
    return EncodedShards(
        paths, key, fingerprint, signature, model.pooling, model.normalize, precision, todo,
        seconds,
    )  # fmt: skip


def index_passages(
    passages: Path,
    model_dir: Path,
    out: Path,
    *,
    spec: IndexSpec,
    memory_bytes: int,
    max_length: int,
    rank: int = 0,
    **encode: Any,
) -> Path:
    """Encode ``passages`` into ``out/shards`` (see :func:`encode_passage_shards`, which takes
    ``encode``'s keywords) and, on rank 0, finish the index."""
    encoded = encode_passage_shards(
        passages, model_dir, out / "shards", max_length=max_length, rank=rank,
        check=lambda n, dim: check_index_spec(spec, n, dim, memory_bytes), **encode,
    )  # fmt: skip
    if rank != 0:
        return out
    extra = {
        "model": {"dir": str(model_dir), "fingerprint": encoded.fingerprint,
                  "pooling": encoded.pooling, "normalize": encoded.normalize,
                  "max_passage_length": max_length,
                  "precision": encoded.precision},
        "passages": encoded.signature,
        "shard_key": encoded.key,
        "sort_by_length": encode.get("sort_by_length", True),
        "timings": {  # this run, rank 0
            "encoded_passages": encoded.encoded,
            "encode_seconds": round(encoded.seconds, 3),
            "passages_per_second": round(encoded.encoded / encoded.seconds, 1)
            if encoded.encoded else None,
        },
    }  # fmt: skip
    finish_index(out, EmbeddingStore.open(encoded.paths), spec, memory_bytes, extra)
    return out


def index_embeddings(
    pattern: str,
    out: Path,
    *,
    spec: IndexSpec,
    memory_bytes: int,
    store_dtype: str = "float16",
) -> Path:
    """``dpr-cache index --embeddings``: an index over precomputed shards. Our ``.npy`` shards
    are validated and recorded in place; DPR's pickles (``.pkl``/``.pickle``: trusted input only,
    pickle runs code) are converted once into shards under ``out/shards``."""
    paths = sorted(glob.glob(os.path.expanduser(pattern)))
    if not paths:
        raise InputError(f"{pattern}: matches no file")
    pickles = [p for p in paths if p.endswith((".pkl", ".pickle"))]
    if pickles and len(pickles) != len(paths):
        raise InputError(f"{pattern}: mixes DPR pickles and .npy shards; give one kind")
    out = Path(out)
    if pickles:
        npys = [
            _dpr_pickle_to_shard(Path(p), out / "shards" / f"dpr-{i:05d}.npy", store_dtype)
            for i, p in enumerate(pickles)
        ]
    else:
        npys = [Path(p) for p in paths if p.endswith(".npy")]
        if not npys:
            raise InputError(f"{pattern}: matches no .npy shard")
    finish_index(out, EmbeddingStore.open(npys), spec, memory_bytes, {"source": pattern})
    return out


def _dpr_pickle_to_shard(path: Path, npy: Path, dtype: str) -> Path:
    """One of DPR's embedding pickles (a list of ``(passage id, float32 vector)``) as a shard."""
    if npy.is_file():
        return npy  # converted by an earlier run
    try:
        with open(path, "rb") as f:
            pairs = pickle.load(f)  # noqa: S301 - trusted input, as the docs say
        ids = [str(pid) for pid, _ in pairs]
        embs = np.stack([np.asarray(vec, dtype=np.float32) for _, vec in pairs])
    except (pickle.UnpicklingError, EOFError, TypeError, ValueError) as e:
        msg = " ".join(str(e).split())[:120]
        raise InputError(f"{path}: not a DPR embeddings pickle ({msg})") from None
    if embs.ndim != 2:
        raise InputError(f"{path}: vectors of shape {embs.shape[1:]}, expected one dimension")
    write_shard(npy, embs, ids, dtype)
    return npy
