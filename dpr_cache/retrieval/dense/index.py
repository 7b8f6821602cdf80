"""An index folder: ``meta.json`` naming its embedding shards (and, for approximate types, the
FAISS files beside it); opened for search, exact or approximate, on one rank or several.

``meta.json``: ``{"format": 2, "type", "dim", "rows", "store_dtype", "shards": [{"path",
"rows"}], "index_params", ...}``; a shard path is relative to the folder when it lies inside it.
A ``flat`` index is its shards: nothing is copied, the search streams them.

A multi-vector model's index (``"vectors": "multi"``) holds token shards
(:mod:`~dpr_cache.retrieval.dense.tokens`): ``rows`` counts passages, ``tokens`` their
scored tokens, ``dim`` the token vectors' width, and each shard entry its ``tokens`` too. It is
searched by exact MaxSim (:mod:`~dpr_cache.retrieval.dense.maxsim`), streamed, and scored
passage by passage where one vector a passage is scored by a dot product
(:func:`row_scores`).
"""

from __future__ import annotations

import json
import logging
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import faiss
import numpy as np

from dpr_cache.config import IndexConfig
from dpr_cache.data.passages import passage_rows
from dpr_cache.errors import InputError
from dpr_cache.model.encoding import encoding_record
from dpr_cache.model.loading import model_fingerprint
from dpr_cache.retrieval.dense.faiss_index import (
    build_faiss_index,
    check_index_spec,
    hnsw_bytes,
    open_faiss_index,
    search_knobs,
)
from dpr_cache.retrieval.dense.layout import (
    FORMAT,
    META_FILE,
    MULTI,
    index_dir_of,
    meta_passages,
    read_meta,
    recorded_passages,
)
from dpr_cache.retrieval.dense.maxsim import maxsim_search, row_maxsim
from dpr_cache.retrieval.dense.search import (
    Hits,
    exact_search,
    index_search,
    merge_hits,
    plan_blocks,
)
from dpr_cache.retrieval.dense.store import EmbeddingStore, Shard
from dpr_cache.retrieval.dense.token_ivf import build_token_ivf, check_token_ivf, token_ivf_search
from dpr_cache.retrieval.dense.tokens import TokenShard, TokenStore
from dpr_cache.runtime import memory
from dpr_cache.runtime.atomic import write_json_atomic

__all__ = [
    "META_FILE",
    "index_dir_of",
    "recorded_type",
    "search_spec",
    "opened_as",
    "recorded_passages",
    "passages_file",
    "FORMAT",
    "OpenIndex",
    "finish_index",
    "open_index",
    "search_index",
    "row_scores",
    "pair_scores",
    "check_model",
    "check_token_spec",
    "refuse_dim",
    "finish_token_index",
    "encoded_from",
    "passage_rows_of",
    "Corpus",
    "query_encoding",
]

log = logging.getLogger(__name__)


@dataclass
class OpenIndex:
    """An index folder ready to search."""

    path: Path
    meta: dict[str, Any]
    store: EmbeddingStore | TokenStore  # TokenStore: a multi-vector index
    faiss: faiss.Index | None  # None for flat
    spec: IndexConfig | None = None  # the search knobs it was opened with

    @property
    def type(self) -> str:
        return self.meta["type"]

    @property
    def multi(self) -> bool:
        """Whether it holds a multi-vector model's token vectors."""
        return self.meta.get("vectors") == MULTI

    def knobs(self) -> dict[str, int]:
        """The search-time knobs its results depend on besides the queries (none for flat):
        FAISS's, and a multi-vector fast path's depth."""
        knobs = search_knobs(self.faiss)
        if self.multi and self.faiss is not None:
            spec = self.spec or IndexConfig(type=self.type)
            knobs |= {"token_hits": spec.ivf_token_hits, "candidates": spec.ivf_candidates}
        return knobs


def _shard_entry(path: Path, out: Path, rows: int) -> dict[str, Any]:
    path, out = path.resolve(), out.resolve()
    shown = path.relative_to(out) if path.is_relative_to(out) else path
    return {"path": str(shown), "rows": rows}


def finish_index(
    out: Path,
    store: EmbeddingStore | TokenStore,
    spec: IndexConfig,
    extra: dict[str, Any] | None = None,
) -> dict[str, Any]:
    """Build what ``spec.type`` needs over ``store`` into ``out`` within ``spec.memory_gb``
    (:func:`~dpr_cache.runtime.memory.memory_limit`, resolved here) and write ``meta.json``
    last (an index folder without its meta is not an index). Returns the meta. A
    :class:`TokenStore` (a multi-vector model's) is finished by :func:`finish_token_index`."""
    if isinstance(store, TokenStore):
        return finish_token_index(out, store, spec, extra)
    out = Path(out)
    out.mkdir(parents=True, exist_ok=True)
    check_index_spec(spec, store.rows, store.dim, spec.memory_gb)
    limit = memory.memory_limit(spec.memory_gb)
    used = memory.rss_bytes()
    # what the index itself holds while it is built: HNSW its graph, IVF a copy of each block
    # in its part index (half of what is left); the blocks get the rest
    held = (
        hnsw_bytes(store.rows, store.dim, spec.hnsw_m, building=True) if spec.type == "hnsw" else 0
    )
    share = 0.5 if spec.type == "ivf" else 1.0
    plan = plan_blocks(
        limit, store.dim, store.dtype.itemsize, 1, 1, used=used, held=held, share=share
    )
    start = time.perf_counter()
    (out / META_FILE).unlink(missing_ok=True)
    params: dict[str, Any] = {}
    if spec.type != "flat":
        params = build_faiss_index(spec, store, out, plan.block_rows)
    extra = dict(extra or {})
    extra["timings"] = {
        **extra.get("timings", {}),
        "build_seconds": round(time.perf_counter() - start, 3),
    }
    meta = {
        "format": FORMAT,
        "type": spec.type,
        "dim": store.dim,
        "rows": store.rows,
        "store_dtype": str(store.dtype),
        "shards": [_shard_entry(s.path, out, s.rows) for s in store.shards],
        "index_params": params,
        **extra,
    }
    write_json_atomic(out / META_FILE, meta)
    return meta


MULTI_TYPES = ("flat", "ivf", "ivfpq")
"""The index types of a multi-vector model."""


def check_token_spec(spec: IndexConfig) -> None:
    """InputError for what a multi-vector index is not built as: an ``index.type`` other than
    flat (exact MaxSim, streamed), ivf or ivfpq (candidates from an IVF index of the tokens,
    scored by exact MaxSim), or ``index.dim`` (one vector a passage cut to its first dims)."""
    if spec.type not in MULTI_TYPES:
        raise InputError(
            f"index.type: {spec.type!r}: a multi-vector model's index is flat (exact MaxSim, "
            "streamed), ivf or ivfpq (candidates from its tokens' IVF index, scored by MaxSim)"
        )
    refuse_dim(spec.dim)


def refuse_dim(dim: int | None, flag: str = "index.dim (--dim)") -> None:
    """InputError when a width (``index.dim``, ``--dim``) is asked of a multi-vector model or
    index: their token vectors are one width, ``model.multi_dim``."""
    if dim is not None:
        raise InputError(
            f"{flag}: {dim}, but a multi-vector model's token vectors are one width "
            "(model.multi_dim, recorded by the model): leave it unset"
        )


def finish_token_index(
    out: Path, store: TokenStore, spec: IndexConfig, extra: dict[str, Any] | None = None
) -> dict[str, Any]:
    """The meta of a multi-vector index over the token shards of ``store`` (``"vectors":
    "multi"``, its passages as ``rows`` and their ``tokens``), written last into ``out``;
    for ``ivf`` and ``ivfpq``, the tokens' IVF index
    (:mod:`~dpr_cache.retrieval.dense.token_ivf`) is built first within ``spec.memory_gb``;
    nothing else is built for flat."""
    check_token_spec(spec)
    if spec.type != "flat":
        check_token_ivf(spec, store.tokens, store.dim)
    out = Path(out)
    out.mkdir(parents=True, exist_ok=True)
    (out / META_FILE).unlink(missing_ok=True)
    start = time.perf_counter()
    params = {}
    if spec.type != "flat":
        limit, used = memory.memory_limit(spec.memory_gb), memory.rss_bytes()
        itemsize = store.dtype.itemsize
        plan = plan_blocks(limit, store.dim, itemsize, 1, 1, used=used, share=0.5)
        params = build_token_ivf(spec, store, out, plan.block_rows)
    extra = dict(extra or {})
    seconds = round(time.perf_counter() - start, 3)
    extra["timings"] = {**extra.get("timings", {}), "build_seconds": seconds}
    shards = [{**_shard_entry(s.path, out, s.rows), "tokens": s.tokens} for s in store.shards]
    meta = {
        "format": FORMAT,
        "type": spec.type,
        "vectors": MULTI,
        "dim": store.dim,
        "rows": store.rows,
        "tokens": store.tokens,
        "store_dtype": str(store.dtype),
        "shards": shards,
        "index_params": params,
        **extra,
    }
    write_json_atomic(out / META_FILE, meta)
    return meta


def recorded_type(index_dir: str | Path) -> str | None:
    """The type the index at ``index_dir`` records (None when its meta cannot be read:
    :func:`open_index` then says what is wrong)."""
    try:
        return json.loads((Path(index_dir) / META_FILE).read_text()).get("type")
    except (OSError, ValueError, AttributeError):
        return None


def search_spec(index_dir: str | Path, nprobe: int, ef_search: int) -> IndexConfig:
    """The search knobs for the index at ``index_dir``, of the type it records (the default
    when its meta cannot be read: :func:`open_index` then says what is wrong)."""
    spec = IndexConfig(ivf_nprobe=nprobe, hnsw_ef_search=ef_search)
    return opened_as(spec, index_dir)


def opened_as(spec: IndexConfig, index_dir: str | Path) -> IndexConfig:
    """``spec`` with the type the index at ``index_dir`` records (its search knobs kept)."""
    kind = recorded_type(index_dir)
    return spec if kind is None else spec.model_copy(update={"type": kind})


def passages_file(opened: OpenIndex, given: Path | None) -> Path:
    """``given``, else the passages file the opened index records; InputError when it records
    none."""
    if given is not None:
        return Path(given)
    passages = meta_passages(opened.meta)
    if passages is None:
        raise InputError(f"{opened.path}: records no passages file: give --passages TSV")
    return passages


def open_index(index_dir: str | Path, spec: IndexConfig | None = None) -> OpenIndex:
    """The index at ``index_dir``; InputError when it is missing, of another format, or its
    shards changed since it was built. ``spec`` sets the search knobs (nprobe, efSearch)."""
    index_dir = Path(index_dir)
    meta = read_meta(index_dir)
    if meta.get("vectors") == MULTI:
        store, index = _open_tokens(index_dir, meta), None
        if meta["type"] != "flat":
            index = open_faiss_index(index_dir, spec or IndexConfig(type=meta["type"]))
        return OpenIndex(index_dir, meta, store, index, spec)
    shards = []
    for entry in meta["shards"]:
        shard = Shard.open(index_dir / entry["path"])  # absolute paths stay absolute
        if shard.rows != entry["rows"]:
            raise InputError(
                f"{shard.path}: {shard.rows} rows, but the index at {index_dir} recorded "
                f"{entry['rows']}: rerun `dpr-cache index`"
            )
        shards.append(shard)
    store = EmbeddingStore(shards)
    index = None
    if meta["type"] != "flat":
        index = open_faiss_index(index_dir, spec or IndexConfig(type=meta["type"]))
    return OpenIndex(index_dir, meta, store, index)


def _open_tokens(index_dir: Path, meta: dict[str, Any]) -> TokenStore:
    """The token shards a multi-vector index records, checked against their entries."""
    if meta.get("type") not in MULTI_TYPES:
        raise InputError(f"{index_dir}: a multi-vector index of type {meta.get('type')!r}")
    shards = []
    for entry in meta["shards"]:
        shard = TokenShard.open(index_dir / entry["path"])
        if (shard.rows, shard.tokens) != (entry["rows"], entry.get("tokens")):
            raise InputError(
                f"{shard.path}: {shard.rows} passages of {shard.tokens} tokens, but the index "
                f"at {index_dir} recorded {entry['rows']} of {entry.get('tokens')}: rerun "
                "`dpr-cache index`"
            )
        shards.append(shard)
    return TokenStore(shards)


def search_index(
    opened: OpenIndex,
    queries: np.ndarray,
    k: int,
    memory_bytes: int,
    *,
    rank: int = 0,
    world_size: int = 1,
) -> Hits | None:
    """Each query's top ``k`` (``queries`` [n, L, dim] question tokens for a multi-vector
    index, searched by exact MaxSim). Flat on several ranks: each rank scans the shards
    ``i % world_size == rank`` and rank 0 merges (the other ranks get None)."""
    if opened.faiss is not None and opened.multi:
        if rank != 0:
            return None
        spec = opened.spec or IndexConfig(type=opened.type)
        return token_ivf_search(opened.faiss, opened.store, queries, k, memory_bytes, spec)
    if opened.faiss is not None:
        return index_search(opened.faiss, queries, k) if rank == 0 else None
    scan = maxsim_search if opened.multi else exact_search
    if world_size == 1:
        return scan(opened.store, queries, k, memory_bytes)
    n_shards = len(opened.store.shards)
    mine = [i for i in range(n_shards) if i % world_size == rank]
    k = max(1, min(k, opened.store.rows))
    if mine:
        part = scan(opened.store, queries, k, memory_bytes, shards=mine)
    else:
        part = Hits(np.full((len(queries), k), -np.inf, np.float32), np.full((len(queries), k), -1))
    from dpr_cache.runtime.distributed import rank0_gathers

    gathered = rank0_gathers((part.scores, part.rows))
    if gathered is None:
        return None
    return merge_hits([Hits(s, r) for s, r in gathered], k)


def row_scores(opened: OpenIndex, query: np.ndarray, rows: np.ndarray) -> np.ndarray:
    """[len(rows)] float32: one question's score against the passages at store ``rows`` (a
    few), as the search scores them: its vector [dim] times theirs, or, for a multi-vector
    index, the MaxSim of its tokens [L, dim] with theirs."""
    rows = np.asarray(rows, dtype=np.int64)
    if opened.multi:
        return row_maxsim(opened.store, query, rows)
    return opened.store.take(rows) @ np.asarray(query, dtype=np.float32)


def pair_scores(opened: OpenIndex, queries: np.ndarray, rows: np.ndarray) -> np.ndarray:
    """[n] float32: question i's score against the passage at store row ``rows[i]``."""
    if opened.multi:
        scored = [
            row_scores(opened, q, np.array([r]))[0] for q, r in zip(queries, rows, strict=True)
        ]
        return np.array(scored, dtype=np.float32)
    return (np.asarray(queries, dtype=np.float32) * opened.store.take(rows)).sum(axis=1)


def check_model(model_dir: Path, model, opened: OpenIndex) -> None:
    """The model must be the one that encoded the index (its fingerprint; how it encodes is
    settled by :func:`~dpr_cache.model.encoding.resolve_encoding`); an index of precomputed
    embeddings records none, so only the dimension can be checked."""
    built = opened.meta.get("model")
    if built is None:
        if model.dim != opened.store.dim:
            raise InputError(
                f"{model_dir}: {model.dim}-d vectors, but the index at {opened.path} holds "
                f"{opened.store.dim}-d ones"
            )
        log.warning("%s: precomputed embeddings; their model cannot be checked", opened.path)
        return
    if model_fingerprint(model_dir) != built["fingerprint"]:
        raise InputError(
            f"{model_dir}: not the model the index at {opened.path} was built with "
            f"({built['dir']}): pass that --model, or rerun `dpr-cache index`"
        )


def query_encoding(opened: OpenIndex) -> dict[str, Any]:
    """How a question must be encoded to search this index: what it records of the encoding
    of its passages (:data:`~dpr_cache.model.encoding.RECORDED_KEYS`; none for precomputed
    vectors)."""
    return encoding_record(opened.meta.get("model"))


def encoded_from(opened: OpenIndex, dataset, path: Path) -> bool:
    """True when the index was encoded from this very passages file (its rows are the file's
    rows), False for precomputed vectors; InputError when it was encoded from another file."""
    built = opened.meta.get("passages")
    if built is None:
        return False
    if len(dataset) != opened.store.rows or path.stat().st_size != built["size"]:
        raise InputError(
            f"{path}: not the passages file the index at {opened.path} was built from "
            f"({built['path']}): rerun `dpr-cache index`"
        )
    return True


def passage_rows_of(opened: OpenIndex, dataset, path: Path, hit_rows: np.ndarray) -> np.ndarray:
    """Rows of the passages dataset for store rows found by a search (-1: none): the store
    rows themselves when the index was encoded from this very file, else looked up by id."""
    if encoded_from(opened, dataset, path):
        return hit_rows
    ids = opened.store.ids_of(hit_rows)
    rows = np.full(hit_rows.shape, -1, np.int64)
    valid = hit_rows >= 0
    rows[valid] = passage_rows(dataset, ids[valid].tolist())
    missing = valid & (rows < 0)
    if missing.any():  # DPR's own embeddings name passages "wiki:123" where the TSV says "123"
        bare = [pid.split(":", 1)[-1] for pid in ids[missing].tolist()]
        rows[missing] = passage_rows(dataset, bare)
        missing = valid & (rows < 0)
    if missing.any():
        first = ids[missing][0]
        raise InputError(f"{path}: has no passage {first!r} (an id of the index at {opened.path})")
    return rows


@dataclass(frozen=True)
class Corpus:
    """An index and the passages file it searches: the opened index, the file's passages
    (memory-mapped) and its path. A search's hits are store rows; :meth:`rows_of` makes them
    rows of the passages."""

    index: OpenIndex
    dataset: Any
    path: Path

    def encoded_from_file(self) -> bool:
        """See :func:`encoded_from`."""
        return encoded_from(self.index, self.dataset, self.path)

    def rows_of(self, hit_rows: np.ndarray) -> np.ndarray:
        """See :func:`passage_rows_of`."""
        return passage_rows_of(self.index, self.dataset, self.path, hit_rows)
