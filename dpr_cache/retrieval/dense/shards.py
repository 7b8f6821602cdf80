"""Resumable encoding of a corpus into store shards: ``<key>-00000.npy`` (float16 or float32, file
order) and ``<key>-00000.ids.txt``. ``<key>`` hashes everything an embedding depends on, so a shard
of another model, corpus or dtype is never reused; a finished shard is skipped on a rerun, and
shard k belongs to rank ``k % world_size``. How a corpus is encoded is the config's
``index.*`` section (precision, stored dtype, shard and batch sizes) and the model's encoding
settled by :func:`~dpr_cache.model.loading.load_settled`."""

from __future__ import annotations

import dataclasses
import functools
import hashlib
import json
import logging
import math
import re
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any, NamedTuple

import torch
from tqdm.auto import tqdm

from dpr_cache.config import IndexConfig, default_of
from dpr_cache.data.passages import load_passages
from dpr_cache.errors import InputError
from dpr_cache.model.decoders import dtype_name
from dpr_cache.model.encoding import QueryEncoding
from dpr_cache.model.loading import load_settled, model_fingerprint
from dpr_cache.retrieval.dense.encode import encode_corpus, encode_corpus_tokens
from dpr_cache.retrieval.dense.store import Shard, ids_path
from dpr_cache.retrieval.dense.tokens import TokenShard
from dpr_cache.runtime.device import resolve_precision

__all__ = [
    "EncodedShards",
    "PassageSource",
    "encode_passage_shards",
    "passages_signature",
    "shard_path",
    "shard_done",
    "remove_stale",
    "shard_key",
    "wait_for_shards",
]

log = logging.getLogger(__name__)

_POLL_SECONDS = 5.0


def shard_path(shard_dir: Path, key: str, k: int) -> Path:
    """The ``.npy`` of shard ``k`` (its ids beside it, see :func:`ids_path`)."""
    return Path(shard_dir) / f"{key}-{k:05d}.npy"


def shard_done(shard_dir: Path, key: str, k: int, rows: int, multi: bool = False) -> bool:
    """Whether shard ``k`` is on disk, whole, with ``rows`` rows and its ids (``multi``: a
    token shard of ``rows`` passages, with its offsets)."""
    path = shard_path(shard_dir, key, k)
    if not (path.is_file() and ids_path(path).is_file()):
        return False
    try:
        return (TokenShard.open(path) if multi else Shard.open(path)).rows == rows
    except InputError:
        return False


_SHARD_NAME = re.compile(r"[0-9a-f]{16}-\d{5}(\.npy|\.ids\.txt|\.offsets\.npy)(\.tmp\d+)?")


def remove_stale(shard_dir: Path, key: str, temporary: bool) -> None:
    """Drop shards of another key (another model, corpus, encoding setting or dpr-cache version:
    their vectors are not this run's) and, if ``temporary``, leftover tmp files, saying how many
    shards of another key went. Only files named like shards are touched: the folder may hold
    the user's other files."""
    other = 0
    for path in Path(shard_dir).iterdir():
        if not (path.is_file() and _SHARD_NAME.fullmatch(path.name)):
            continue
        stale = not path.name.startswith(f"{key}-")
        if stale or (temporary and ".tmp" in path.name):
            path.unlink(missing_ok=True)
            other += stale and path.name.endswith(".npy")
    if other:
        log.warning(
            "%s: removed %d shard(s) encoded with another model, corpus or setting; encoding "
            "afresh as %s",
            shard_dir,
            other,
            key,
        )


def shard_key(
    fingerprint: str,
    passages: dict,
    *,
    shard_size: int,
    max_length: int,
    pooling: str,
    precision: str,
    store_dtype: str,
    normalize: bool,
    passage_prefix: str = "",
    weights_dtype: str = "fp32",
    dim: int | None = None,
    vectors: dict[str, Any] | None = None,
) -> str:
    """A hash of all an embedding depends on: weights (and the dtype they were loaded in),
    passages file, sizes, pooling, normalization and prompt, dtypes, a width the vectors
    are cut to (``dim``; None: the full width), and for a multi-vector model what its token
    vectors are (``vectors``: ``{"vectors": "multi", "multi_dim", "skiplist"}``)."""
    ident = [fingerprint, passages, shard_size, max_length, pooling, normalize, precision]
    ident += [store_dtype, passage_prefix]
    if weights_dtype != "fp32":  # fp32 weights keep the keys their shards were written under
        ident.append(weights_dtype)
    if dim is not None:  # full-width vectors keep their keys too
        ident.append({"dim": dim})
    if vectors is not None:  # one vector a passage keeps its keys
        ident.append(vectors)
    return hashlib.sha256(json.dumps(ident, sort_keys=True).encode()).hexdigest()[:16]


def wait_for_shards(shard_dir: Path, key: str, sizes: list[int], multi: bool = False) -> None:
    """Rank 0 waits for the other ranks' shards to land on disk (no collective time-out)."""
    from dpr_cache.runtime.distributed import joined

    last_note = 0.0
    while missing := [
        k for k, r in enumerate(sizes) if not shard_done(shard_dir, key, k, r, multi)
    ]:
        if not joined():
            raise RuntimeError(
                f"{len(missing)} shard(s) of {shard_dir} are missing (first {missing[0]}): "
                "other ranks have not finished; rerun when they have"
            )
        if time.monotonic() - last_note > 60:
            log.info("waiting for %d shard(s) from other ranks", len(missing))
            last_note = time.monotonic()
        time.sleep(_POLL_SECONDS)


@dataclass
class EncodedShards:
    """What :func:`encode_passage_shards` wrote: the shards of a corpus and how long it took."""

    paths: list[Path]  # every shard of the corpus, in order
    key: str
    fingerprint: str
    signature: dict[str, Any]
    max_length: int
    encoding: QueryEncoding  # the model's, recorded so that its questions are encoded alike
    passage_prefix: str
    precision: str  # the precision the passages were encoded in (``auto`` resolved)
    weights_dtype: str  # the dtype the passage tower's weights were loaded in (fp32 | bf16 | fp16)
    encoded: int  # passages encoded by this call (the rest were on disk already)
    seconds: float  # its encoding
    open_seconds: float  # its reading of the passages (the TSV into its Arrow cache, or the cache)
    first_batch: tuple[float, int] | None  # seconds to its first batch encoded, and its passages
    multi: dict[str, Any] | None = None  # a multi-vector model's token vectors (shard_key's)

    def settings(self, index: IndexConfig, num_workers: int) -> dict[str, Any]:
        """What the passages were encoded with: ``index``'s stored dtype, shard and batch
        sizes, the precision as resolved, the weights' dtype, the tokens kept and the
        tokenizing processes."""
        kept = index.model_dump(include={"store_dtype", "shard_size", "batch_size"})
        used = {"precision": self.precision, "weights_dtype": self.weights_dtype}
        used["max_length"] = self.max_length
        return {**kept, **used, "num_workers": num_workers}

    def timings(self) -> dict[str, Any]:
        """This call's passages encoded, its seconds reading and encoding them (start-up and
        model loading left out), the encoding's rate, and its first batch: the seconds to it
        (tokenizing workers started, the first rows tokenized, the first kernels) and its size,
        so that a rate past them can be told from the whole."""
        seconds, passages = self.first_batch or (None, None)
        return {
            "encoded_passages": self.encoded,
            "open_seconds": round(self.open_seconds, 3),
            "encode_seconds": round(self.seconds, 3),
            "passages_per_second": round(self.encoded / self.seconds, 1) if self.encoded else None,
            "first_batch_seconds": None if seconds is None else round(seconds, 3),
            "first_batch_passages": passages,
        }


def passages_signature(path: Path) -> dict[str, Any]:
    """What identifies a passages file: its absolute path, size and modification time."""
    st = path.stat()
    return {"path": str(path.resolve()), "size": st.st_size, "mtime_ns": st.st_mtime_ns}


@dataclass(frozen=True)
class PassageSource:
    """What a corpus is encoded from and how: the passages TSV (read through its Arrow cache in
    ``cache_dir``), the model folder, its encoding settled from ``asked`` and ``fallback``
    (:func:`~dpr_cache.model.loading.load_settled`), the tokens kept (None: the model's saved
    length, else ``model.max_passage_length``'s default), the tokenizing processes ahead, and
    how the weights load (``loading``: ``dtype``, ``attn_implementation``; empty: as the model
    folder records)."""

    passages: Path
    model_dir: Path
    asked: Mapping[str, Any]
    fallback: Mapping[str, Any]
    max_length: int | None
    num_workers: int
    cache_dir: Path
    loading: Mapping[str, Any] = dataclasses.field(default_factory=dict)


def encode_passage_shards(
    source: PassageSource,
    shard_dir: Path,
    index: IndexConfig,
    *,
    device: torch.device,
    rank: int = 0,
    world_size: int = 1,
    progress: bool = True,
    check: Callable[[int, int], None] | None = None,
) -> EncodedShards:
    """Encode this rank's missing shards of ``source``'s passages (shard k is rank
    ``k % world_size``'s) into ``shard_dir`` as ``index.*`` says; rank 0 then waits for every
    shard. ``check(rows, dim)`` runs before any encoding (e.g. that the index type suits the
    corpus). ``index.precision`` is resolved for ``device`` first: the shards' key and what is
    returned hold fp32, bf16 or fp16, never ``auto``. A multi-vector model's shards are token
    shards (:mod:`~dpr_cache.retrieval.dense.tokens`)."""
    start = time.perf_counter()
    dataset = load_passages(source.passages, source.cache_dir)
    open_seconds = time.perf_counter() - start
    if (n := len(dataset)) == 0:
        raise InputError(f"{source.passages}: no passages")
    model = load_settled(source.model_dir, source.asked, source.fallback, loading=source.loading)
    model = model.to(device)
    if check is not None:
        check(n, model.dim)
    keyed = _keyed(source, model, index, device)
    key, multi = keyed.key, keyed.multi is not None
    shard_dir.mkdir(parents=True, exist_ok=True)
    if rank == 0:  # other ranks only write this key's files; their tmp files must survive
        remove_stale(shard_dir, key, temporary=world_size == 1)
    sizes = _shard_sizes(n, index.shard_size)
    mine = _missing(shard_dir, key, sizes, index.shard_size, multi, rank, world_size)
    encode = _encoder(model, dataset, mine, keyed, index, device, source.num_workers)
    todo = sum(rows for _, _, rows in mine)
    seconds, first_batch = _with_progress(encode, todo, f"encode passages (rank {rank})", progress)
    if rank == 0:
        wait_for_shards(shard_dir, key, sizes, multi)
    return EncodedShards(
        [shard_path(shard_dir, key, k) for k in range(len(sizes))],
        key,
        keyed.fingerprint,
        keyed.signature,
        keyed.length,
        model.query_encoding,
        model.passage_prefix,
        keyed.precision,
        keyed.weights_dtype,
        todo,
        seconds,
        open_seconds,
        first_batch,
        keyed.multi,
    )


class _Keyed(NamedTuple):
    """What a corpus's shards are encoded with, and the key that names them."""

    key: str
    fingerprint: str
    signature: dict[str, Any]
    length: int
    precision: str
    weights_dtype: str
    multi: dict[str, Any] | None  # a multi-vector model's token vectors; None: one a passage


def _keyed(source: PassageSource, model, index: IndexConfig, device: torch.device) -> _Keyed:
    """The settings ``model`` encodes ``source``'s passages with under ``index.*`` on
    ``device`` (the tokens kept, the precision resolved, the weights' dtype, what a
    multi-vector model's token vectors are), and their :func:`shard_key`."""
    length = source.max_length or model.max_passage_length or default_of("model.max_passage_length")
    precision = resolve_precision(index.precision, device)
    weights_dtype = dtype_name(model.passage_encoder.dtype)
    fingerprint = model_fingerprint(source.model_dir)
    signature = passages_signature(source.passages)
    multi = None
    if model.multi is not None:
        multi = {"vectors": "multi", **model.multi.record()}
    key = shard_key(
        fingerprint,
        signature,
        shard_size=index.shard_size,
        max_length=length,
        pooling=model.pooling,
        precision=precision,
        store_dtype=index.store_dtype,
        normalize=model.normalize,
        passage_prefix=model.passage_prefix,
        weights_dtype=weights_dtype,
        dim=None if multi else model.output_dim,
        vectors=multi,
    )
    return _Keyed(key, fingerprint, signature, length, precision, weights_dtype, multi)


def _encoder(
    model, dataset, mine, keyed: _Keyed, index: IndexConfig, device, num_workers: int
) -> Callable[..., None]:
    """The encoding of the shards ``mine`` (one vector a passage, or a multi-vector model's
    token shards) as ``keyed`` and ``index.*`` say, waiting for its ``on_batch``."""
    return functools.partial(
        encode_corpus if keyed.multi is None else encode_corpus_tokens,
        model,
        dataset,
        mine,
        max_length=keyed.length,
        batch_size=index.batch_size,
        device=device,
        precision=keyed.precision,
        store_dtype=index.store_dtype,
        num_workers=num_workers,
    )


def _missing(
    shard_dir: Path,
    key: str,
    sizes: list[int],
    shard_size: int,
    multi: bool,
    rank: int,
    world_size: int,
) -> list[tuple[Path, int, int]]:
    """This rank's shards (k % world_size == rank) not yet on disk whole: ``(path, first
    row, rows)`` each."""
    return [
        (shard_path(shard_dir, key, k), k * shard_size, sizes[k])
        for k in range(rank, len(sizes), world_size)
        if not shard_done(shard_dir, key, k, sizes[k], multi)
    ]


def _shard_sizes(rows: int, shard_size: int) -> list[int]:
    """The rows of each shard of a corpus of ``rows`` passages."""
    return [min(shard_size, rows - k * shard_size) for k in range(math.ceil(rows / shard_size))]


def _with_progress(
    encode: Callable[..., None], todo: int, desc: str, progress: bool
) -> tuple[float, tuple[float, int] | None]:
    """Run ``encode(on_batch=...)`` under a progress bar of ``todo`` passages: its seconds, and
    the seconds to its first batch with that batch's passages (None when nothing was left)."""
    bar = tqdm(total=todo, unit="psg", desc=desc, disable=not progress)
    start = time.perf_counter()
    first_batch: list[tuple[float, int]] = []

    def on_batch(rows: int) -> None:
        if not first_batch:
            first_batch.append((time.perf_counter() - start, rows))
        bar.update(rows)

    with bar:
        encode(on_batch=on_batch)
    return time.perf_counter() - start, first_batch[0] if first_batch else None
