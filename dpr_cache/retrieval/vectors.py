"""The config-free commands: ``encode`` (a passages TSV or a questions file into shards) and
``search`` (queries against an index folder, fused with BM25 when asked, written as a TREC
run)."""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import torch

from dpr_cache.data.passages import load_passages, passage_columns
from dpr_cache.data.qas import read_qas
from dpr_cache.errors import InputError
from dpr_cache.model.loading import load_encoder, resolve_model_dir
from dpr_cache.retrieval.approximate import IndexSpec
from dpr_cache.retrieval.encode import encode_question_texts
from dpr_cache.retrieval.fusion import FusionSpec
from dpr_cache.retrieval.hybrid import dense_rankings, hybrid_search, open_sparse
from dpr_cache.retrieval.index import open_index, search_index
from dpr_cache.retrieval.results import write_trec_run
from dpr_cache.retrieval.shards import DEFAULT_QUERY_LENGTH, EncodeSpec, encode_passage_shards
from dpr_cache.retrieval.store import Shard, ids_path, write_shard
from dpr_cache.runtime.atomic import write_json_atomic
from dpr_cache.runtime.lock import output_lock

__all__ = [
    "encode_file", "question_vectors", "read_queries", "search_to_run", "HybridSearch",
    "QUESTIONS",
]  # fmt: skip

QUESTIONS = "questions.npy"


def question_vectors(
    model_dir: Path, questions: Path, spec: EncodeSpec, device: torch.device
) -> tuple[np.ndarray, list[str], EncodeSpec]:
    """The query tower's vectors [n, d] float32 of a qas file's questions, their ids (the row
    numbers from 0), and ``spec`` with what it left to the model filled in (``max_length``
    None: the model's saved question length)."""
    model = load_encoder(
        model_dir, pooling=spec.pooling, normalize=spec.normalize,
        prefixes=(spec.query_prefix, spec.passage_prefix), query_only=True,
    ).to(device)  # fmt: skip
    qas = read_qas(Path(questions))
    if not qas:
        raise InputError(f"{questions}: no questions")
    length = spec.max_length or model.max_query_length or DEFAULT_QUERY_LENGTH
    vectors = encode_question_texts(
        model, [q for q, _ in qas], max_length=length, device=device,
        precision=spec.precision, batch_size=spec.batch_size,
    )  # fmt: skip
    used = dataclasses.replace(
        spec, max_length=length, pooling=model.pooling, normalize=model.normalize,
        query_prefix=model.query_prefix, passage_prefix=model.passage_prefix,
        store_dtype="float32",
    )  # fmt: skip
    return vectors, [str(i) for i in range(len(qas))], used


def encode_file(
    model_path: str | Path,
    out: Path,
    spec: EncodeSpec,
    *,
    passages: Path | None = None,
    questions: Path | None = None,
    device: torch.device,
    cache_dir: Path,
    progress: bool = True,
) -> list[Path]:
    """Encode a passages TSV (into resumable shards ``<key>-00000.npy``) or a qas file (into
    ``questions.npy``, float32, ids = row numbers from 0) into ``out``; returns the .npy files.

    The model's saved settings (pooling, max lengths) apply where ``spec`` leaves them None; a
    sentence-transformers folder its Pooling module's, any other folder CLS pooling and DPR's
    lengths.
    """
    if (passages is None) == (questions is None):
        raise InputError("encode: give one of --passages or --questions")
    model_dir = resolve_model_dir(model_path, Path("."))
    out = Path(out)
    with output_lock(out):
        return _encode_file(model_dir, out, spec, passages, questions, device, cache_dir, progress)


def _encode_file(model_dir, out, spec, passages, questions, device, cache_dir, progress):
    if questions is not None:
        vectors, ids, used = question_vectors(model_dir, questions, spec, device)
        write_shard(out / QUESTIONS, vectors, ids, "float32")
        record = {"model": str(model_dir), "questions": str(questions)}
        write_json_atomic(out / "encode.json", {**record, **dataclasses.asdict(used)})
        return [out / QUESTIONS]
    encoded = encode_passage_shards(
        Path(passages), model_dir, out, spec, device=device, cache_dir=cache_dir,
        progress=progress,
    )  # fmt: skip
    record = {"model": str(model_dir), "passages": str(passages), "shard_key": encoded.key}
    record.update(
        dataclasses.asdict(spec), max_length=encoded.max_length, pooling=encoded.pooling,
        normalize=encoded.normalize, passage_prefix=encoded.passage_prefix,
    )  # fmt: skip
    write_json_atomic(out / "encode.json", record)
    return encoded.paths


def read_queries(path: Path) -> tuple[np.ndarray, list[str]]:
    """Query vectors [n, d] float32 of a ``Q.npy`` and their ids (``Q.ids.txt`` beside it, else
    the row numbers)."""
    shard = Shard.open(path)
    vectors = shard.read(0, np.empty((shard.rows, shard.dim), shard.dtype)).astype(np.float32)
    ids_file = ids_path(Path(path))
    if not ids_file.is_file():
        return vectors, [str(i) for i in range(shard.rows)]
    ids = ids_file.read_text(encoding="utf-8").splitlines()
    if len(ids) != shard.rows:
        raise InputError(f"{ids_file}: {len(ids)} ids for the {shard.rows} rows of {path}")
    return vectors, ids


@dataclass(frozen=True)
class HybridSearch:
    """BM25 for ``search`` to fuse: from ``bm25_run`` (rrf), else built over ``passages`` (the
    index's own by default) for the question texts ``questions``."""

    fusion: FusionSpec
    cache_dir: Path
    questions: list[str] | None = None
    passages: Path | None = None
    bm25_run: Path | None = None


def search_to_run(
    index_dir: Path,
    queries: np.ndarray,
    qids: list[str],
    out: Path,
    *,
    k: int,
    memory_bytes: int,
    spec: IndexSpec | None = None,
    tag: str = "dpr-cache",
    rank: int = 0,
    world_size: int = 1,
    hybrid: HybridSearch | None = None,
) -> Path | None:
    """Search ``queries`` in the index (fused with BM25 per ``hybrid``); rank 0 writes the TREC
    run ``out`` and returns it."""
    with output_lock(out, is_file=True):
        return _search_to_run(index_dir, queries, qids, Path(out), k, memory_bytes, spec, tag,
                              rank, world_size, hybrid)  # fmt: skip


def _search_to_run(index_dir, queries, qids, out, k, memory_bytes, spec, tag, rank, world_size,
                   hybrid):  # fmt: skip
    opened = open_index(index_dir, spec)
    if hybrid is None:
        hits = search_index(opened, queries, k, memory_bytes, rank=rank, world_size=world_size)
        if hits is None:
            return None
        pids = opened.store.ids_of(hits.rows)
    else:
        if hybrid.questions is None and hybrid.bm25_run is None:
            raise InputError(
                "search --fusion: BM25 needs the question texts (--questions) or a run "
                "(--bm25-run) keyed by the query ids"
            )
        passages = hybrid.passages or Path(opened.meta.get("passages", {}).get("path", ""))
        if not passages.name:
            raise InputError(f"{index_dir}: records no passages file: give --passages TSV")
        dataset = load_passages(passages, hybrid.cache_dir)
        dense = dense_rankings(opened, dataset, passages, queries, max(hybrid.fusion.depth, k),
                               memory_bytes, rank=rank, world_size=world_size)  # fmt: skip
        if dense is None:
            return None
        sparse = open_sparse(passages, dataset, hybrid.cache_dir, hybrid.bm25_run, hybrid.fusion)
        hits = hybrid_search(opened, dataset, passages, queries, hybrid.questions or qids, qids,
                             sparse, hybrid.fusion, k, dense)  # fmt: skip
        valid = np.unique(hits.rows[hits.rows >= 0])
        ids = dict(zip(valid.tolist(), passage_columns(dataset, valid.tolist())["id"],
                       strict=True))  # fmt: skip
        pids = np.array([[ids.get(int(r), "") for r in row] for row in hits.rows], dtype=object)
    write_trec_run(Path(out), qids, pids, hits.scores, tag)
    return Path(out)
