"""Precomputed vectors cut to their first ``dim`` dims (``index.dim``, ``--dim``: a Matryoshka
model's smaller widths), re-normalized when they are unit length, as a model that normalizes
encodes them at that width. A model's own vectors are cut as it encodes them
(``BiEncoder.output_dim``); these are the vectors that come from files."""

from __future__ import annotations

from pathlib import Path

import numpy as np

from dpr_cache.errors import InputError
from dpr_cache.retrieval.dense.store import EmbeddingStore, Shard, ids_path
from dpr_cache.runtime.atomic import write_atomic, write_text_atomic

__all__ = ["unit_length", "cut", "cut_shards", "check_dim"]

UNIT_TOLERANCE = 1e-3
"""How far from 1 a stored norm may be (float16 rounding) and still count as unit length."""

_BLOCK_ROWS = 65_536


def unit_length(vectors: np.ndarray) -> bool:
    """Whether every row is a unit vector (within :data:`UNIT_TOLERANCE`)."""
    norms = np.linalg.norm(vectors.astype(np.float32), axis=1)
    return bool(len(norms)) and bool(np.all(np.abs(norms - 1) <= UNIT_TOLERANCE))


def check_dim(dim: int, width: int, what: str) -> None:
    """InputError unless ``1 <= dim <= width`` (``what``: the vectors, in words)."""
    if not 1 <= dim <= width:
        raise InputError(f"--dim {dim}: {what} hold {width}-d vectors; give 1 to {width}")


def cut(vectors: np.ndarray, dim: int, renormalize: bool) -> np.ndarray:
    """The first ``dim`` dims of each row (float32), scaled to unit length when
    ``renormalize``."""
    out = np.ascontiguousarray(vectors[:, :dim], dtype=np.float32)
    if renormalize:
        norms = np.linalg.norm(out, axis=1, keepdims=True)
        out /= np.maximum(norms, 1e-12)
    return out


def cut_shards(store: EmbeddingStore, out_dir: Path, dim: int, source: str) -> list[Path]:
    """Each shard of ``store`` cut to ``dim`` dims into ``out_dir`` (``dim<D>-00000.npy`` with
    its ids), read and written in blocks (memory bounded by a block, whatever the shard's
    size); re-normalized when the first shard's first block is unit length. A shard already
    cut by an earlier run is kept."""
    check_dim(dim, store.dim, source)
    first = next(store.blocks(_BLOCK_ROWS, shards=[0]))[1]
    renormalize = unit_length(first)
    paths = []
    for k, shard in enumerate(store.shards):
        path = Path(out_dir) / f"dim{dim}-{k:05d}.npy"
        if not _cut_done(path, shard.rows, dim):
            _cut_shard(store, k, path, dim, renormalize)
        paths.append(path)
    return paths


def _cut_done(path: Path, rows: int, dim: int) -> bool:
    if not (path.is_file() and ids_path(path).is_file()):
        return False
    try:
        shard = Shard.open(path)
    except InputError:
        return False
    return shard.rows == rows and shard.dim == dim


def _cut_shard(store: EmbeddingStore, k: int, path: Path, dim: int, renormalize: bool) -> None:
    """Shard ``k`` cut into ``path`` (its dtype kept), block by block; ids copied beside."""
    shard = store.shards[k]
    path.parent.mkdir(parents=True, exist_ok=True)
    write_text_atomic(ids_path(path), ids_path(shard.path).read_text(encoding="utf-8"))
    header = {"descr": np.lib.format.dtype_to_descr(shard.dtype), "fortran_order": False}
    header["shape"] = (shard.rows, dim)

    def write(tmp: Path) -> None:
        with open(tmp, "wb") as f:
            np.lib.format.write_array_header_1_0(f, header)
            for _, block in store.blocks(_BLOCK_ROWS, shards=[k]):
                rows = cut(block, dim, renormalize).astype(shard.dtype)
                f.write(memoryview(rows.reshape(-1)).cast("B"))

    write_atomic(path, write, size_hint=shard.rows * dim * shard.dtype.itemsize + 128)
