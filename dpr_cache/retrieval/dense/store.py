"""The embedding store: vectors on disk as shards, read back block by block in bounded memory.

A shard is ``X.npy`` (rows x dim, float16 or float32) with ``X.ids.txt`` beside it (one id a line,
row order). A store is an ordered list of shards of one dimension and dtype; its global row r is
row ``r - start`` of the shard that holds it. Blocks are read with plain file reads into buffers
reused from block to block (no memory map), so the resident memory of a scan is one block, whatever
the corpus size. Ids stay on disk: they are looked up for the rows a search returns only.
"""

from __future__ import annotations

import glob
import os
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import torch

from dpr_cache.errors import InputError
from dpr_cache.runtime.atomic import write_atomic, write_text_atomic

__all__ = [
    "STORE_DTYPES",
    "Shard",
    "EmbeddingStore",
    "write_shard",
    "ids_path",
    "read_ids",
    "check_ids",
    "widen",
]

STORE_DTYPES = {"float16": np.float16, "float32": np.float32}


def ids_path(npy: Path) -> Path:
    """``X.ids.txt`` beside ``X.npy``."""
    return npy.with_name(npy.name.removesuffix(".npy") + ".ids.txt")


def write_shard(npy: Path, embs: np.ndarray, ids: Sequence[str], dtype: str = "float16") -> None:
    """Write ``X.ids.txt`` then ``X.npy`` (``embs`` cast to ``dtype``), each atomically: a shard
    is complete once its ``.npy`` exists."""
    npy = Path(npy)
    if len(ids) != len(embs):
        raise ValueError(f"{npy}: {len(embs)} vectors but {len(ids)} ids")
    for pid in ids:
        if "\n" in pid or "\r" in pid:
            raise InputError(f"passage id {pid!r} contains a line break")
    write_text_atomic(ids_path(npy), "".join(f"{pid}\n" for pid in ids))
    array = np.ascontiguousarray(embs, dtype=STORE_DTYPES[dtype])

    def write(tmp: Path) -> None:  # np.save's bytes, by plain writes: a full disk is ENOSPC
        with open(tmp, "wb") as f:
            header = np.lib.format.header_data_from_array_1_0(array)
            np.lib.format.write_array_header_1_0(f, header)
            f.write(memoryview(array.reshape(-1)).cast("B"))

    write_atomic(npy, write, size_hint=array.nbytes + 128)


@dataclass(frozen=True)
class Shard:
    """One ``.npy`` file: where its rows start on disk, how many, of what."""

    path: Path
    rows: int
    dim: int
    dtype: np.dtype
    offset: int  # bytes before the first row

    @classmethod
    def open(cls, path: str | Path) -> Shard:
        """Read the ``.npy`` header; InputError for what is not a C-ordered 2-D float array."""
        path = Path(path)
        if not path.is_file():
            raise InputError(f"{path}: no such shard")
        fmt = np.lib.format
        try:  # the header only
            with open(path, "rb") as f:
                version = fmt.read_magic(f)
                read = fmt.read_array_header_1_0 if version == (1, 0) else fmt.read_array_header_2_0
                shape, fortran, dtype = read(f)
                offset = f.tell()
        except (ValueError, OSError) as e:
            raise InputError(f"{path}: not a .npy file ({' '.join(str(e).split())})") from None
        if len(shape) != 2 or fortran or dtype not in (np.float16, np.float32):
            raise InputError(
                f"{path}: expected a 2-D float16/float32 array in C order, got shape {shape}, "
                f"dtype {dtype}{', Fortran order' if fortran else ''}"
            )
        shard = cls(path, int(shape[0]), int(shape[1]), np.dtype(dtype), offset)
        size, want = path.stat().st_size, offset + shard.rows * shard.row_bytes
        if size < want:
            raise InputError(f"{path}: truncated: {size} bytes, its header says {want}")
        return shard

    @property
    def row_bytes(self) -> int:
        return self.dim * self.dtype.itemsize

    def read(self, start: int, out: np.ndarray) -> np.ndarray:
        """Rows ``start : start + len(out)`` read into ``out`` (this shard's dtype); returns out."""
        with open(self.path, "rb") as f:
            f.seek(self.offset + start * self.row_bytes)
            view = memoryview(out.reshape(-1).view(np.uint8))
            got = f.readinto(view)
        if got != out.nbytes:
            raise InputError(f"{self.path}: truncated (rows {start}..{start + len(out)} missing)")
        return out


def widen(raw: np.ndarray, out: np.ndarray) -> np.ndarray:
    """Stored rows ``raw`` (float16) converted into ``out`` (float32, the same shape) by
    torch's vectorized conversion (several times numpy's on a CPU); returns ``out``."""
    if raw.shape != out.shape:
        raise ValueError(f"rows of shape {raw.shape} widened into {out.shape}")
    torch.from_numpy(out).copy_(torch.from_numpy(raw))
    return out


class EmbeddingStore:
    """Shards of one dimension and dtype, in order; global rows run across them."""

    def __init__(self, shards: Sequence[Shard], check_ids: bool = True) -> None:
        if not shards:
            raise InputError("no embedding shards given")
        first = shards[0]
        for shard in shards[1:]:
            if shard.dim != first.dim or shard.dtype != first.dtype:
                raise InputError(
                    f"{shard.path}: {shard.dim} x {shard.dtype} vectors, but {first.path} holds "
                    f"{first.dim} x {first.dtype}: every shard needs the same dimension and dtype"
                )
        if check_ids:
            for shard in shards:
                _check_ids(shard)
        self.shards = list(shards)
        self.dim, self.dtype = first.dim, first.dtype
        self.starts = np.cumsum([0] + [s.rows for s in shards])  # [n_shards + 1]
        self.rows = int(self.starts[-1])

    @classmethod
    def open(cls, paths: Sequence[str | Path], check_ids: bool = True) -> EmbeddingStore:
        return cls([Shard.open(p) for p in paths], check_ids=check_ids)

    @classmethod
    def from_glob(cls, pattern: str) -> EmbeddingStore:
        """The ``.npy`` files ``pattern`` matches, in sorted order."""
        paths = sorted(p for p in glob.glob(os.path.expanduser(pattern)) if p.endswith(".npy"))
        if not paths:
            raise InputError(f"{pattern}: matches no .npy shard")
        return cls.open(paths)

    def blocks(
        self, block_rows: int, shards: Sequence[int] | None = None
    ) -> Iterator[tuple[int, np.ndarray]]:
        """``(global start row, float32 [n, dim])`` blocks of ``block_rows`` rows at most, over
        every shard (or the shard indexes given). The arrays are reused buffers: use each block
        before asking for the next."""
        block_rows = max(1, min(block_rows, max(s.rows for s in self.shards)))
        raw = np.empty((block_rows, self.dim), dtype=self.dtype)
        f32 = raw if self.dtype == np.float32 else np.empty((block_rows, self.dim), np.float32)
        for k in range(len(self.shards)) if shards is None else shards:
            shard = self.shards[k]
            for start in range(0, shard.rows, block_rows):
                n = min(block_rows, shard.rows - start)
                shard.read(start, raw[:n])
                if f32 is not raw:
                    widen(raw[:n], f32[:n])
                yield int(self.starts[k]) + start, f32[:n]

    def take(self, rows: np.ndarray) -> np.ndarray:
        """float32 vectors of the given global rows [len(rows), dim] (a sample, not a scan)."""
        rows = np.asarray(rows, dtype=np.int64)
        out = np.empty((len(rows), self.dim), np.float32)
        one = np.empty(self.dim, self.dtype)
        shard_of = np.searchsorted(self.starts, rows, side="right") - 1
        for k in np.unique(shard_of).tolist():  # each shard opened once, its rows in file order
            shard, picked = self.shards[k], np.flatnonzero(shard_of == k)
            picked = picked[np.argsort(rows[picked], kind="stable")]
            with open(shard.path, "rb") as f:
                for i in picked.tolist():
                    local = int(rows[i] - self.starts[k])
                    f.seek(shard.offset + local * shard.row_bytes)
                    if f.readinto(memoryview(one.view(np.uint8))) != one.nbytes:
                        raise InputError(f"{shard.path}: truncated (row {local} missing)")
                    out[i] = one
        return out

    def ids_of(self, rows: np.ndarray) -> np.ndarray:
        """The ids of the given global rows (any shape; -1 gives ''), read from the ids files
        line by line: only the ids asked for are kept."""
        return read_ids([s.path for s in self.shards], self.starts, rows)


def read_ids(paths: Sequence[Path], starts: np.ndarray, rows: np.ndarray) -> np.ndarray:
    """The ids of the given global rows (any shape; -1 gives '') of shards ``paths`` whose
    global rows begin at ``starts`` (one more than the shards: the total last), read from
    their ids files (:func:`ids_path`) line by line: only the ids asked for are kept."""
    rows = np.asarray(rows, dtype=np.int64)
    flat = rows.reshape(-1)
    wanted = np.unique(flat[flat >= 0])
    found: dict[int, str] = {}
    shard_of = np.searchsorted(starts, wanted, side="right") - 1
    for k in np.unique(shard_of).tolist():
        local = set((wanted[shard_of == k] - int(starts[k])).tolist())
        last = max(local)
        with open(ids_path(paths[k]), encoding="utf-8") as f:
            for i, line in enumerate(f):
                if i in local:
                    found[int(starts[k]) + i] = line.rstrip("\n")
                if i == last:
                    break
    out = np.array([found.get(r, "") for r in flat.tolist()], dtype=object)
    return out.reshape(rows.shape)


def _check_ids(shard: Shard) -> None:
    check_ids(shard.path, shard.rows)


def check_ids(npy: Path, rows: int, what: str = "rows") -> None:
    """InputError unless ``X.ids.txt`` beside ``npy`` holds ``rows`` ids (``what``: what they
    name, in words)."""
    ids = ids_path(npy)
    if not ids.is_file():
        raise InputError(f"{ids}: missing (the ids of {npy}, one a line)")
    with open(ids, "rb") as f:
        lines = sum(chunk.count(b"\n") for chunk in iter(lambda: f.read(1 << 20), b""))
    if lines != rows:
        raise InputError(f"{ids}: {lines} ids for the {rows} {what} of {npy}")
