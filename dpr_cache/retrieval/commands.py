"""The config-free commands: ``encode`` (a passages TSV or a questions file into shards) and
``search`` (queries against an index folder, written as a TREC run)."""

from __future__ import annotations

from pathlib import Path

import numpy as np

from dpr_cache.errors import InputError
from dpr_cache.retrieval.faiss_index import IndexSpec
from dpr_cache.retrieval.index_dir import open_index, search_index
from dpr_cache.retrieval.store import Shard, ids_path, write_shard
from dpr_cache.runtime.atomic import write_atomic, write_json_atomic

__all__ = ["encode_file", "read_queries", "search_to_run", "write_trec_run", "QUESTIONS"]

QUESTIONS = "questions.npy"
DEFAULT_QUERY_LENGTH, DEFAULT_PASSAGE_LENGTH = 32, 256  # DPR's, for models that record none


def encode_file(
    model_path: str | Path,
    out: Path,
    *,
    passages: Path | None = None,
    questions: Path | None = None,
    cache_dir: Path,
    pooling: str | None = None,
    max_length: int | None = None,
    batch_size: int = 128,
    shard_size: int = 50_000,
    store_dtype: str = "float16",
    num_workers: int = 1,
    device: str = "auto",
    progress: bool = True,
) -> list[Path]:
    """Encode a passages TSV (into resumable shards ``<key>-00000.npy``) or a qas file (into
    ``questions.npy``, float32, ids = row numbers from 0) into ``out``; returns the .npy files.

    The model's saved settings (pooling, max lengths) apply unless ``pooling`` / ``max_length``
    are given; a sentence-transformers folder its Pooling module's, any other folder CLS pooling
    and DPR's lengths.
    """
    from dpr_cache.data.qas import read_qas
    from dpr_cache.model.loading import load_encoder, resolve_model_dir
    from dpr_cache.retrieval.encode import encode_question_texts
    from dpr_cache.retrieval.index import encode_passage_shards
    from dpr_cache.runtime.device import resolve_device

    if (passages is None) == (questions is None):
        raise InputError("encode: give one of --passages or --questions")
    model_dir = resolve_model_dir(model_path, Path("."))
    dev = resolve_device(device)
    probe = load_encoder(model_dir, pooling=pooling, query_only=True)
    pooling = pooling or probe.pooling
    out = Path(out)
    if questions is not None:
        qas = read_qas(Path(questions))
        if not qas:
            raise InputError(f"{questions}: no questions")
        length = max_length or probe.max_query_length or DEFAULT_QUERY_LENGTH
        embs = encode_question_texts(
            probe.to(dev), [q for q, _ in qas], max_length=length, device=dev,
            batch_size=batch_size,
        )  # fmt: skip
        write_shard(out / QUESTIONS, embs, [str(i) for i in range(len(qas))], "float32")
        record = {"model": str(model_dir), "questions": str(questions), "max_length": length}
        write_json_atomic(out / "encode.json", {**record, "pooling": pooling})
        return [out / QUESTIONS]
    length = max_length or probe.max_passage_length or DEFAULT_PASSAGE_LENGTH
    del probe
    encoded = encode_passage_shards(
        Path(passages), model_dir, out, cache_dir=cache_dir, pooling=pooling, max_length=length,
        batch_size=batch_size, shard_size=shard_size, store_dtype=store_dtype, device=dev,
        num_workers=num_workers, progress=progress,
    )  # fmt: skip
    record = {"model": str(model_dir), "passages": str(passages), "max_length": length}
    write_json_atomic(out / "encode.json", {**record, "pooling": pooling, "shard_key": encoded.key})
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


def write_trec_run(path: Path, qids: list[str], pids, scores, tag: str) -> None:
    """A TREC run: ``qid Q0 pid rank score tag`` a line, ranks from 1, best first (trec_eval,
    ir-measures and ranx read it). ``pids`` and ``scores`` hold a row per query (best first);
    an empty passage id marks a missing hit and is left out. Scores keep float32's precision
    (``.9g``), so trec_eval's sort by score agrees with our ranks."""
    flat = [pid for row in pids for pid in row]
    for name, values in (("query id", qids), ("passage id", flat), ("tag", [tag])):
        bad = next((v for v in values if any(c.isspace() for c in str(v))), None)
        if bad is not None or (name != "passage id" and "" in values):
            raise InputError(f"{path}: {name} {bad!r} is empty or holds white space")

    def write(tmp: Path) -> None:
        with open(tmp, "w", encoding="utf-8") as f:
            for qid, q_pids, q_scores in zip(qids, pids, scores, strict=True):
                rank = 0
                for pid, score in zip(q_pids, q_scores, strict=True):
                    if pid == "":
                        continue
                    rank += 1
                    f.write(f"{qid} Q0 {pid} {rank} {float(score):.9g} {tag}\n")

    write_atomic(path, write)


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
) -> Path | None:
    """Search ``queries`` in the index; rank 0 writes the TREC run ``out`` and returns it."""
    opened = open_index(index_dir, spec)
    hits = search_index(opened, queries, k, memory_bytes, rank=rank, world_size=world_size)
    if hits is None:
        return None
    pids = opened.store.ids_of(hits.rows)
    write_trec_run(Path(out), qids, pids, hits.scores, tag)
    return Path(out)
