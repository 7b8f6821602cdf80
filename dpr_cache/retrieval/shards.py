"""Resumable encoding of a corpus into store shards: ``<key>-00000.npy`` (float16 or float32, file
order) and ``<key>-00000.ids.txt``. ``<key>`` hashes everything an embedding depends on, so a shard
of another model, corpus or dtype is never reused; a finished shard is skipped on a rerun, and
shard k belongs to rank ``k % world_size``."""

from __future__ import annotations

import hashlib
import json
import logging
import re
import time
from pathlib import Path

from dpr_cache.errors import InputError
from dpr_cache.retrieval.store import Shard, ids_path

__all__ = ["shard_path", "shard_done", "remove_stale", "shard_key", "wait_for_shards"]

log = logging.getLogger(__name__)

_POLL_SECONDS = 5.0


def shard_path(shard_dir: Path, key: str, k: int) -> Path:
    """The ``.npy`` of shard ``k`` (its ids beside it, see :func:`ids_path`)."""
    return Path(shard_dir) / f"{key}-{k:05d}.npy"


def shard_done(shard_dir: Path, key: str, k: int, rows: int) -> bool:
    """Whether shard ``k`` is on disk, whole, with ``rows`` rows and its ids."""
    path = shard_path(shard_dir, key, k)
    if not (path.is_file() and ids_path(path).is_file()):
        return False
    try:
        return Shard.open(path).rows == rows
    except InputError:
        return False


_SHARD_NAME = re.compile(r"[0-9a-f]{16}-\d{5}(\.npy|\.ids\.txt)(\.tmp\d+)?")


def remove_stale(shard_dir: Path, key: str, temporary: bool) -> None:
    """Drop shards of another key (model or corpus) and, if ``temporary``, leftover tmp files.
    Only files named like shards are touched: the folder may hold the user's other files."""
    for path in Path(shard_dir).iterdir():
        if not (path.is_file() and _SHARD_NAME.fullmatch(path.name)):
            continue
        if not path.name.startswith(f"{key}-") or (temporary and ".tmp" in path.name):
            path.unlink(missing_ok=True)


def shard_key(
    fingerprint: str,
    passages: dict,
    *,
    shard_size: int,
    max_length: int,
    pooling: str,
    precision: str,
    store_dtype: str,
    normalize: bool = False,
) -> str:
    """A hash of all an embedding depends on: weights, passages file, sizes, pooling and
    normalization, dtypes."""
    ident = [fingerprint, passages, shard_size, max_length, pooling, precision, store_dtype]
    ident += ["normalize"] if normalize else []  # keys of unnormalized shards stay as they were
    return hashlib.sha256(json.dumps(ident, sort_keys=True).encode()).hexdigest()[:16]


def wait_for_shards(shard_dir: Path, key: str, sizes: list[int]) -> None:
    """Rank 0 waits for the other ranks' shards to land on disk (no collective time-out)."""
    import torch.distributed as dist

    last_note = 0.0
    while missing := [k for k, r in enumerate(sizes) if not shard_done(shard_dir, key, k, r)]:
        if not (dist.is_available() and dist.is_initialized()):
            raise RuntimeError(
                f"{len(missing)} shard(s) of {shard_dir} are missing (first {missing[0]}): "
                "other ranks have not finished; rerun when they have"
            )
        if time.monotonic() - last_note > 60:
            log.info("waiting for %d shard(s) from other ranks", len(missing))
            last_note = time.monotonic()
        time.sleep(_POLL_SECONDS)
