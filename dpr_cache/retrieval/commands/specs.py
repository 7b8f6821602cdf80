"""The one place a ``Config`` becomes the specs the retrieval parts take: where a run's index
lives, its FAISS settings, how passages are encoded, how eval fuses BM25 and how much memory a
search may use."""

from __future__ import annotations

import dataclasses
import json
from pathlib import Path

from dpr_cache.config import Config
from dpr_cache.retrieval.dense.faiss_index import IndexSpec
from dpr_cache.retrieval.dense.shards import EncodeSpec
from dpr_cache.retrieval.fusion import FusionSpec

__all__ = [
    "index_dir_of",
    "index_spec",
    "encode_spec",
    "fusion_spec",
    "opened_type",
]


def index_dir_of(output_dir: Path) -> Path:
    """Where a run's index lives: ``output_dir/index``."""
    return Path(output_dir) / "index"


def index_spec(config: Config, type_: str | None = None) -> IndexSpec:
    """The FAISS settings of ``index.*`` (``type_`` overrides ``index.type``)."""
    keep = {"type", "hnsw_m", "hnsw_ef_search", "ivf_nlist", "pq_m", "ivf_nprobe"}
    spec = IndexSpec(**config.index.model_dump(include=keep))
    return spec if type_ is None else dataclasses.replace(spec, type=type_)


def encode_spec(config: Config) -> EncodeSpec:
    """How ``index`` encodes ``data.passages``: ``model.*`` lengths and pooling, ``index.*``."""
    return EncodeSpec(
        max_length=config.model.max_passage_length,
        max_query_length=config.model.max_query_length,
        pooling=config.model.pooling,
        normalize=config.model.normalize,
        query_prefix=config.model.query_prefix,
        passage_prefix=config.model.passage_prefix,
        precision=config.index.precision,
        store_dtype=config.index.store_dtype,
        shard_size=config.index.shard_size,
        batch_size=config.index.batch_size,
        num_workers=config.data.num_workers,
    )


def fusion_spec(config: Config) -> FusionSpec:
    """``eval.fusion*`` as a spec (an ``auto`` weight is None: tuned)."""
    e = config.eval
    weight = None if e.fusion_weight == "auto" else float(e.fusion_weight)
    return FusionSpec(e.fusion, weight, e.fusion_depth, e.fusion_rrf_k)


def opened_type(index_dir: Path) -> str | None:
    """The type recorded in an index folder's meta (None when there is none yet)."""
    meta = Path(index_dir) / "meta.json"
    return json.loads(meta.read_text()).get("type") if meta.is_file() else None
