"""``dpr-cache search``: queries against an index folder (fused with BM25 when asked), written
as a TREC run. The queries are precomputed vectors (``Q.npy``, their ids in ``Q.ids.txt``) or a
questions file the model encodes as the index asks
(:mod:`~dpr_cache.retrieval.dense.questions`), its ids the file's own (``X.ids.txt``) else its
row numbers, as ``eval`` names them. What it does is the config's settings that its flags mirror:
``eval.*`` (the depth, where and in what precision questions are encoded, BM25 fusion) and
``index.*`` (the memory bound and the index's search knobs)."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import numpy as np

from dpr_cache.config import EvalConfig, IndexConfig
from dpr_cache.data.passages import load_passages, passage_columns
from dpr_cache.data.qas import question_ids, read_qas
from dpr_cache.errors import InputError
from dpr_cache.model.loading import resolve_model_dir
from dpr_cache.retrieval.dense.index import (
    Corpus,
    OpenIndex,
    open_index,
    opened_as,
    passages_file,
    recorded_passages,
    refuse_dim,
    search_index,
)
from dpr_cache.retrieval.dense.questions import QuestionRun, query_tower, question_vectors
from dpr_cache.retrieval.dense.store import Shard, ids_path
from dpr_cache.retrieval.dense.widths import check_dim, cut, unit_length
from dpr_cache.retrieval.hybrid import fused_search
from dpr_cache.retrieval.results import write_trec_run
from dpr_cache.runtime import distributed
from dpr_cache.runtime.atomic import check_output_file
from dpr_cache.runtime.device import advises_on_out_of_memory
from dpr_cache.runtime.lock import output_lock
from dpr_cache.runtime.memory import memory_limit

__all__ = ["Queries", "Lexical", "read_queries", "search"]


@dataclass(frozen=True)
class Queries:
    """What to search: precomputed vectors (``embeddings``), or the questions of a qas file
    (``questions``) encoded by ``model``."""

    embeddings: Path | None = None
    questions: Path | None = None
    model: str | None = None
    dim: int | None = None  # the vectors' width asked (--dim); None: the index's

    def check(self) -> None:
        """InputError unless exactly one kind of query is given, with what it needs."""
        if (self.embeddings is None) == (self.questions is None):
            raise InputError(
                "search: give --query-embeddings Q.npy or --questions FILE --model DIR"
            )
        if self.questions is not None and self.model is None:
            raise InputError("search --questions: --model DIR is needed to encode them")


@dataclass(frozen=True)
class Lexical:
    """Where BM25's passages come from for a fused search (the index's own file by default)
    and where its index is cached."""

    cache_dir: Path
    passages: Path | None = None


def read_queries(path: Path) -> tuple[np.ndarray, list[str]]:
    """Query vectors [n, d] float32 of a ``Q.npy`` and their ids (``Q.ids.txt`` beside it, else
    the row numbers)."""
    shard = Shard.open(path)
    vectors = shard.read(0, np.empty((shard.rows, shard.dim), shard.dtype)).astype(np.float32)
    finite = np.isfinite(vectors).all(axis=1)
    if not finite.all():
        row = int(np.flatnonzero(~finite)[0])
        raise InputError(f"{path}: row {row} is not finite (NaN or inf)")
    ids_file = ids_path(Path(path))
    if not ids_file.is_file():
        return vectors, [str(i) for i in range(shard.rows)]
    ids = ids_file.read_text(encoding="utf-8").splitlines()
    if len(ids) != shard.rows:
        raise InputError(f"{ids_file}: {len(ids)} ids for the {shard.rows} rows of {path}")
    return vectors, ids


@advises_on_out_of_memory("run it with --device cpu")
def search(
    index_dir: Path,
    queries: Queries,
    out: Path,
    settings: EvalConfig,
    index: IndexConfig,
    lexical: Lexical,
    tag: str,
) -> Path | None:
    """Search the queries in the index for each one's ``settings.top_k`` passages (its one k),
    fused with BM25 per ``settings.fusion``; rank 0 writes the TREC run ``out`` (its last
    column ``tag``) and returns it. Under ``torchrun`` each rank scans its share of the
    shards."""
    queries.check()
    out = Path(out)
    inputs = {"the questions file": queries.questions, "the query vectors": queries.embeddings}
    if queries.embeddings is not None:
        inputs["the query ids"] = ids_path(Path(queries.embeddings))
    if settings.fusion != "none":
        passages = lexical.passages or recorded_passages(index_dir)
        bm25_run = None if settings.bm25_run is None else Path(settings.bm25_run)
        inputs.update({"the passages file": passages, "the BM25 run": bm25_run})
    check_output_file(out, inputs, folders={"the index": index_dir})
    env = distributed.setup(settings.device, "--device")
    try:
        with output_lock(out, is_file=True):
            opened = open_index(index_dir, opened_as(index, index_dir))
            vectors, qids, texts = _queries(
                queries, opened, QuestionRun(env.device, settings.precision, settings.batch_size)
            )
            memory = memory_limit(index.memory_gb)
            k = max(settings.top_k)
            if settings.fusion == "none":
                hits = search_index(
                    opened, vectors, k, memory, rank=env.rank, world_size=env.world_size
                )
                if hits is None:
                    return None
                pids = opened.store.ids_of(hits.rows)
            else:
                found = _fused(opened, vectors, qids, texts, settings, lexical, memory, env)
                if found is None:
                    return None
                hits, pids = found
            write_trec_run(out, qids, pids, hits.scores, tag)
            return out
    finally:
        distributed.teardown()


def _queries(
    queries: Queries, opened: OpenIndex, run: QuestionRun
) -> tuple[np.ndarray, list[str], list[str] | None]:
    """The query vectors, their ids and (for a questions file) their texts. A multi-vector
    index takes questions only (encoded into token vectors by its model), at its one width."""
    if opened.multi:
        refuse_dim(queries.dim, "--dim")
        if queries.embeddings is not None:
            raise InputError(
                f"--query-embeddings: the index at {opened.path} holds a multi-vector model's "
                "token vectors: give --questions FILE --model DIR (its model encodes them)"
            )
    if queries.embeddings is not None:
        vectors, qids = read_queries(queries.embeddings)
        return _cut_to(vectors, queries, opened), qids, None
    qas = read_qas(Path(queries.questions))
    if not qas:
        raise InputError(f"{queries.questions}: no questions")
    texts = [question for question, _ in qas]
    asked = {"dim": queries.dim} if queries.dim is not None else None
    model = query_tower(resolve_model_dir(queries.model, Path(".")), opened, run.device, asked)
    return question_vectors(model, texts, run), question_ids(queries.questions, len(qas)), texts


def _cut_to(vectors: np.ndarray, queries: Queries, opened: OpenIndex) -> np.ndarray:
    """Precomputed query vectors cut to ``--dim`` (re-normalized when unit length), which must
    be the index's width."""
    if queries.dim is None:
        return vectors
    if queries.dim != opened.store.dim:
        raise InputError(
            f"--dim {queries.dim}: the index at {opened.path} holds {opened.store.dim}-d "
            "vectors; give that width, or build the index at it (index --dim)"
        )
    check_dim(queries.dim, vectors.shape[1], f"the query vectors {queries.embeddings}")
    return cut(vectors, queries.dim, unit_length(vectors))


def _fused(opened, vectors, qids, texts, settings: EvalConfig, lexical: Lexical, memory, env):
    """The fused hits and their passage ids; None on ranks but 0."""
    if texts is None and settings.bm25_run is None:
        raise InputError(
            "search --fusion: BM25 needs the question texts (--questions) or a run "
            "(--bm25-run) keyed by the query ids"
        )
    passages = passages_file(opened, lexical.passages)
    corpus = Corpus(opened, load_passages(passages, lexical.cache_dir), passages)
    found = fused_search(
        corpus,
        vectors,
        texts or qids,
        qids,
        settings,
        lexical.cache_dir,
        memory,
        rank=env.rank,
        world_size=env.world_size,
    )
    if found is None:
        return None
    hits, _ = found
    valid = np.unique(hits.rows[hits.rows >= 0])
    ids = dict(
        zip(valid.tolist(), passage_columns(corpus.dataset, valid.tolist())["id"], strict=True)
    )
    pids = np.array([[ids.get(int(r), "") for r in row] for row in hits.rows], dtype=object)
    return hits, pids
