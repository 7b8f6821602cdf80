"""Resumable on-disk shards of passage embeddings: ``<key>-00000.npy`` (float32, file order)
and ``<key>-00000.ids.txt`` (their passage ids). ``<key>`` hashes everything an embedding depends
on, so a shard of another model or corpus is never reused."""

from __future__ import annotations

import hashlib
import json
import logging
import time
from pathlib import Path

import numpy as np
import torch

from dpr_cache.errors import InputError
from dpr_cache.retrieval.faiss_index import META_FILE
from dpr_cache.runtime.atomic import write_atomic, write_text_atomic

__all__ = [
    "shard_files",
    "shard_done",
    "save_shard",
    "remove_stale",
    "shard_key",
    "load_shard_embeddings",
    "wait_for_shards",
]

log = logging.getLogger(__name__)

_POLL_SECONDS = 5.0


def shard_files(shard_dir: Path, key: str, k: int) -> tuple[Path, Path]:
    stem = f"{key}-{k:05d}"
    return shard_dir / f"{stem}.npy", shard_dir / f"{stem}.ids.txt"


def shard_done(shard_dir: Path, key: str, k: int, rows: int) -> bool:
    emb_file, ids_file = shard_files(shard_dir, key, k)
    if not (emb_file.is_file() and ids_file.is_file()):
        return False
    try:
        return np.load(emb_file, mmap_mode="r").shape[0] == rows
    except (OSError, ValueError):
        return False


def save_shard(shard_dir: Path, key: str, k: int, embs: np.ndarray, ids: list[str]) -> None:
    """Ids first, embeddings last: a shard is complete once both files exist."""
    emb_file, ids_file = shard_files(shard_dir, key, k)
    for pid in ids:
        if "\n" in pid or "\r" in pid:
            raise InputError(f"passage id {pid!r} contains a line break")
    write_text_atomic(ids_file, "".join(f"{pid}\n" for pid in ids))

    def write_npy(tmp: Path) -> None:
        with open(tmp, "wb") as f:
            np.save(f, embs.astype(np.float32, copy=False))

    write_atomic(emb_file, write_npy)


def remove_stale(shard_dir: Path, key: str, temporary: bool) -> None:
    """Drop shards of another key (model or corpus) and, if ``temporary``, leftover tmp files."""
    for path in shard_dir.iterdir():
        stale = not path.name.startswith(f"{key}-") or (temporary and ".tmp" in path.name)
        if path.is_file() and stale:
            path.unlink(missing_ok=True)


def shard_key(
    fingerprint: str,
    passages: dict,
    *,
    shard_size: int,
    max_length: int,
    pooling: str,
    precision: str,
) -> str:
    """A hash of all an embedding depends on: model weights, passages file, sizes, pooling."""
    ident = [fingerprint, passages, shard_size, max_length, pooling, precision]
    return hashlib.sha256(json.dumps(ident, sort_keys=True).encode()).hexdigest()[:16]


def load_shard_embeddings(index_dir: str | Path) -> np.ndarray:
    """All passage embeddings [n, dim] of a built index, from its shards (file order)."""
    meta = json.loads((Path(index_dir) / META_FILE).read_text())
    shard_dir = Path(index_dir) / "shards"
    parts = [
        np.load(shard_files(shard_dir, meta["shard_key"], k)[0]) for k in range(meta["n_shards"])
    ]
    return np.concatenate(parts)


def wait_for_shards(shard_dir: Path, key: str, sizes: list[int]) -> None:
    """Rank 0 waits for the other ranks' shards to land on disk (no collective time-out)."""
    last_note = 0.0
    while missing := [k for k, r in enumerate(sizes) if not shard_done(shard_dir, key, k, r)]:
        if not (torch.distributed.is_available() and torch.distributed.is_initialized()):
            raise RuntimeError(
                f"{len(missing)} shard(s) of {shard_dir} are missing (first {missing[0]}): "
                "other ranks have not finished; rerun when they have"
            )
        if time.monotonic() - last_note > 60:
            log.info("waiting for %d shard(s) from other ranks", len(missing))
            last_note = time.monotonic()
        time.sleep(_POLL_SECONDS)
