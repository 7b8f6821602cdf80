"""Token vectors of a multi-vector (late interaction) model on disk: token shards, read back a
range of passages at a time in bounded memory.

A token shard is three files: ``X.npy`` [tokens, dim] (float16 or float32), every passage's
scored tokens (its non-zero token vectors) one after another in passage order;
``X.offsets.npy`` [passages + 1] int64, passage i's tokens being rows ``offsets[i] :
offsets[i + 1]`` (0 first, the token count last; a passage without a scored token is an empty
range); and ``X.ids.txt``, one passage id a line. The ``.npy`` is renamed into place last, after
its ids and offsets: a shard is complete once its ``.npy`` exists.

A :class:`TokenStore` is an ordered list of token shards of one width and dtype; its global row
r is a passage, row ``r - start`` of the shard that holds it. Blocks are read with plain file
reads into buffers reused from block to block; a shard's offsets are read when its blocks are
(a shard's worth: ``index.shard_size`` passages), and ids only for the rows a search returns.
"""

from __future__ import annotations

import struct
from collections.abc import Iterable, Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from dpr_cache.errors import InputError
from dpr_cache.retrieval.dense.store import (
    STORE_DTYPES,
    EmbeddingStore,
    Shard,
    check_ids,
    ids_path,
    read_ids,
    widen,
)
from dpr_cache.runtime.atomic import write_atomic, write_text_atomic

__all__ = [
    "TokenShard",
    "TokenStore",
    "offsets_path",
    "write_token_shard",
]

_HEADER_BYTES = 128
"""The ``.npy`` header of a token shard, written before its token count is known: a version
1.0 header padded to this size (numpy pads its own to a multiple of 64)."""


def offsets_path(npy: Path) -> Path:
    """``X.offsets.npy`` beside ``X.npy``."""
    return Path(npy).with_name(Path(npy).name.removesuffix(".npy") + ".offsets.npy")


def _npy_header(shape: tuple[int, int], dtype: np.dtype) -> bytes:
    """A version 1.0 ``.npy`` header of ``_HEADER_BYTES`` bytes for a C-ordered array."""
    header = {"descr": np.lib.format.dtype_to_descr(np.dtype(dtype)), "fortran_order": False}
    header["shape"] = tuple(int(n) for n in shape)
    body = _HEADER_BYTES - 10  # magic (6), version (2), length (2)
    text = repr(header).ljust(body - 1) + "\n"
    return np.lib.format.magic(1, 0) + struct.pack("<H", body) + text.encode("latin1")


def _write_npy(path: Path, array: np.ndarray) -> None:
    """``array`` as ``path`` (np.save's bytes, by plain writes), atomically."""
    array = np.ascontiguousarray(array)

    def write(tmp: Path) -> None:
        with open(tmp, "wb") as f:
            header = np.lib.format.header_data_from_array_1_0(array)
            np.lib.format.write_array_header_1_0(f, header)
            f.write(memoryview(array.reshape(-1)).cast("B"))

    write_atomic(path, write, size_hint=array.nbytes + 128)


def write_token_shard(
    npy: Path,
    pieces: Iterable[tuple[Sequence[str], np.ndarray, np.ndarray]],
    dtype: str = "float16",
) -> int:
    """Write a token shard from ``pieces`` (passages in order: their ids, their scored tokens
    [t, dim] one passage after another, and each passage's token count), the tokens streamed
    to disk as the pieces come (no shard's worth of tokens held); ids and offsets then, the
    ``.npy`` renamed into place last. Returns the passages written."""
    npy = Path(npy)
    ids: list[str] = []
    counts: list[np.ndarray] = []
    store = np.dtype(STORE_DTYPES[dtype])

    def write(tmp: Path) -> None:
        dim = None
        with open(tmp, "wb") as f:
            f.write(b"\0" * _HEADER_BYTES)
            for piece_ids, tokens, lengths in pieces:
                dim = _check_piece(npy, piece_ids, tokens, lengths, dim)
                array = np.ascontiguousarray(tokens, dtype=store)
                f.write(memoryview(array.reshape(-1)).cast("B"))
                ids.extend(piece_ids)
                counts.append(np.asarray(lengths, np.int64))
            offsets = np.concatenate([[0], np.cumsum(np.concatenate(counts or [[]]))])
            f.seek(0)
            f.write(_npy_header((int(offsets[-1]), dim or 0), store))
        write_text_atomic(ids_path(npy), "".join(f"{pid}\n" for pid in ids))
        _write_npy(offsets_path(npy), offsets.astype(np.int64))

    write_atomic(npy, write)
    return len(ids)


def _check_piece(npy: Path, ids, tokens: np.ndarray, lengths, dim: int | None) -> int:
    """The width of a piece's tokens, checked against its ids and counts and the pieces
    before (``dim``); ValueError for what the encoder got wrong, InputError for an id with a
    line break."""
    if tokens.ndim != 2 or (dim is not None and tokens.shape[1] != dim):
        raise ValueError(f"{npy}: tokens of shape {tokens.shape}, after width {dim}")
    if len(ids) != len(lengths) or int(np.sum(lengths)) != len(tokens):
        raise ValueError(f"{npy}: {len(ids)} ids, {len(lengths)} counts, {len(tokens)} tokens")
    for pid in ids:
        if "\n" in pid or "\r" in pid:
            raise InputError(f"passage id {pid!r} contains a line break")
    return int(tokens.shape[1])


def _offsets_header(path: Path) -> tuple[int, int]:
    """The length of an offsets file and the bytes before its first value; InputError for
    what is not a 1-D int64 ``.npy``."""
    if not path.is_file():
        raise InputError(f"{path}: missing (the offsets of a token shard)")
    fmt = np.lib.format
    try:
        with open(path, "rb") as f:
            version = fmt.read_magic(f)
            read = fmt.read_array_header_1_0 if version == (1, 0) else fmt.read_array_header_2_0
            shape, fortran, dtype = read(f)
            start = f.tell()
    except (ValueError, OSError) as e:
        raise InputError(f"{path}: not a .npy file ({' '.join(str(e).split())})") from None
    if len(shape) != 1 or shape[0] < 1 or dtype != np.int64:
        raise InputError(f"{path}: expected 1-D int64 offsets, got shape {shape}, dtype {dtype}")
    if path.stat().st_size < start + 8 * shape[0]:
        raise InputError(f"{path}: truncated")
    return int(shape[0]), start


@dataclass(frozen=True)
class TokenShard:
    """One token shard: its tokens (a :class:`~dpr_cache.retrieval.dense.store.Shard` of
    token rows), its passages and the most tokens one of them has."""

    vectors: Shard
    rows: int  # passages
    longest: int  # the most tokens a passage of it has

    @classmethod
    def open(cls, path: str | Path) -> TokenShard:
        """The shard at ``path`` (its ``.npy``), its offsets checked against its tokens."""
        vectors = Shard.open(path)
        offsets = _read_offsets(offsets_path(vectors.path), vectors.rows)
        longest = int(np.diff(offsets).max()) if len(offsets) > 1 else 0
        return cls(vectors, len(offsets) - 1, longest)

    @property
    def path(self) -> Path:
        """The shard's ``.npy`` (its offsets and ids beside it)."""
        return self.vectors.path

    @property
    def tokens(self) -> int:
        """The token vectors it holds."""
        return self.vectors.rows

    def offsets(self) -> np.ndarray:
        """[rows + 1] int64: where each passage's tokens begin (and the count last)."""
        return _read_offsets(offsets_path(self.path), self.tokens)


def _read_rows(f, vectors: Shard, start: int, out: np.ndarray) -> np.ndarray:
    """Token rows ``start : start + len(out)`` of ``vectors`` read from its open file ``f``
    into ``out``; InputError when the file ends first."""
    f.seek(vectors.offset + start * vectors.row_bytes)
    if f.readinto(memoryview(out.reshape(-1).view(np.uint8))) != out.nbytes:
        raise InputError(f"{vectors.path}: truncated (token rows {start}.. missing)")
    return out


def _read_offsets(path: Path, tokens: int) -> np.ndarray:
    """The offsets file ``path`` of a shard of ``tokens`` token rows, checked: 0 first,
    never decreasing, ``tokens`` last."""
    _offsets_header(path)
    offsets = np.load(path, allow_pickle=False)
    if offsets[0] != 0 or offsets[-1] != tokens or (np.diff(offsets) < 0).any():
        raise InputError(
            f"{path}: not the offsets of {tokens} tokens (0 first, rising, {tokens} last): "
            "rerun `dpr-cache index`"
        )
    return offsets


class TokenStore:
    """Token shards of one width and dtype, in order; global rows (passages) run across
    them."""

    def __init__(self, shards: Sequence[TokenShard], check: bool = True) -> None:
        if not shards:
            raise InputError("no token shards given")
        first = shards[0].vectors
        for shard in shards[1:]:
            if shard.vectors.dim != first.dim or shard.vectors.dtype != first.dtype:
                raise InputError(
                    f"{shard.path}: {shard.vectors.dim} x {shard.vectors.dtype} token vectors, "
                    f"but {first.path} holds {first.dim} x {first.dtype}: every shard needs "
                    "the same width and dtype"
                )
        if check:
            for shard in shards:
                check_ids(shard.path, shard.rows, "passages")
        self.shards = list(shards)
        self.dim, self.dtype = first.dim, first.dtype
        self.starts = np.cumsum([0] + [s.rows for s in shards])  # [n_shards + 1]
        self.rows = int(self.starts[-1])
        self.tokens = sum(s.tokens for s in shards)
        self.longest = max(s.longest for s in shards)

    @classmethod
    def open(cls, paths: Sequence[str | Path], check: bool = True) -> TokenStore:
        """The token shards at ``paths`` (their ``.npy``), in order; ``check``: their ids
        counted too."""
        return cls([TokenShard.open(p) for p in paths], check=check)

    def blocks(
        self, max_tokens: int, shards: Sequence[int] | None = None
    ) -> Iterator[tuple[int, np.ndarray, np.ndarray]]:
        """``(global start row, float32 tokens [t, dim], offsets [n + 1])`` for runs of whole
        passages of ``max_tokens`` tokens at most (more when one passage has more), over every
        shard (or the shard indexes given); the offsets count from the block's first token.
        The arrays are reused buffers: use each block before asking for the next."""
        cap = max(1, max_tokens, self.longest)
        raw = np.empty((cap, self.dim), dtype=self.dtype)
        f32 = raw if self.dtype == np.float32 else np.empty((cap, self.dim), np.float32)
        for k in range(len(self.shards)) if shards is None else shards:
            shard, offsets = self.shards[k], self.shards[k].offsets()
            i = 0
            while i < shard.rows:
                j = int(np.searchsorted(offsets, offsets[i] + cap, side="right")) - 1
                j = min(max(j, i + 1), shard.rows)
                t0, t = int(offsets[i]), int(offsets[j] - offsets[i])
                shard.vectors.read(t0, raw[:t])
                if f32 is not raw:
                    widen(raw[:t], f32[:t])
                yield int(self.starts[k]) + i, f32[:t], offsets[i : j + 1] - t0
                i = j

    def take(
        self, rows: np.ndarray, buffers: tuple[np.ndarray, np.ndarray] | None = None
    ) -> tuple[np.ndarray, np.ndarray]:
        """The tokens of the given global rows (a few passages, not a scan), in their order:
        float32 tokens [t, dim] one passage after another, and offsets [len(rows) + 1].
        ``buffers``: [n, dim] arrays of the store's dtype and of float32, reused from call to
        call (n at least the tokens taken): the tokens are then a view of the second."""
        rows = np.asarray(rows, dtype=np.int64).reshape(-1)
        spans = np.zeros((len(rows), 2), np.int64)
        shard_of = np.searchsorted(self.starts, rows, side="right") - 1
        for k in np.unique(shard_of).tolist():
            picked = np.flatnonzero(shard_of == k)
            spans[picked] = self._spans(k, rows[picked] - self.starts[k])
        lengths = spans[:, 1] - spans[:, 0]
        offsets = np.concatenate([[0], np.cumsum(lengths)]).astype(np.int64)
        t = int(offsets[-1])
        if buffers is not None and t > min(len(b) for b in buffers):
            raise ValueError(f"{t} tokens taken into buffers of {len(buffers[0])} rows")
        raw = np.empty((t, self.dim), self.dtype) if buffers is None else buffers[0][:t]
        for k in np.unique(shard_of).tolist():
            vectors = self.shards[k].vectors
            picked = np.flatnonzero(shard_of == k)
            with open(vectors.path, "rb") as f:  # in file order, the file opened once
                for i in picked[np.argsort(spans[picked, 0], kind="stable")].tolist():
                    _read_rows(f, vectors, int(spans[i, 0]), raw[offsets[i] : offsets[i + 1]])
        if raw.dtype == np.float32:
            return raw, offsets
        out = np.empty(raw.shape, np.float32) if buffers is None else buffers[1][:t]
        return widen(raw, out), offsets

    def sample_tokens(self, n: int, seed: int = 0) -> np.ndarray:
        """float32 [n, dim]: ``n`` token vectors drawn at random (without replacement) from
        the whole store, read one by one (a sample, not a scan)."""
        picked = np.sort(np.random.default_rng(seed).choice(self.tokens, size=n, replace=False))
        return EmbeddingStore([s.vectors for s in self.shards], check_ids=False).take(picked)

    def _spans(self, k: int, local: np.ndarray) -> np.ndarray:
        """[n, 2]: the first and past-the-last token of the passages ``local`` of shard
        ``k``, read from its offsets file at each passage (not the whole file)."""
        path = offsets_path(self.shards[k].path)
        _, start = _offsets_header(path)
        pair = np.empty(2, np.int64)
        spans = np.empty((len(local), 2), np.int64)
        with open(path, "rb") as f:
            for n, i in enumerate(local.tolist()):
                f.seek(start + 8 * i)
                if f.readinto(memoryview(pair.view(np.uint8))) != 16:
                    raise InputError(f"{path}: truncated (passage {i} missing)")
                spans[n] = pair
        return spans

    def ids_of(self, rows: np.ndarray) -> np.ndarray:
        """The passage ids of the given global rows (any shape; -1 gives '')."""
        return read_ids([s.path for s in self.shards], self.starts, rows)
