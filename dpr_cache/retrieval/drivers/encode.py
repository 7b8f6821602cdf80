"""``dpr-cache encode``: a passages TSV into resumable shards, or a questions file into one
``questions.npy``, with the ids beside each. What it does is the config's ``index.*`` settings
that its flags mirror (precision, stored dtype, shard and batch sizes) and the encoding
settings the user gave (``model.pooling``, a length), settled against what the model folder
records (:func:`~dpr_cache.model.loading.load_settled`)."""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path
from typing import Any

import numpy as np
import torch

from dpr_cache.config import IndexConfig
from dpr_cache.data.qas import question_ids, read_qas
from dpr_cache.errors import InputError
from dpr_cache.model.loading import resolve_model_dir
from dpr_cache.retrieval.dense.layout import MULTI, model_vectors
from dpr_cache.retrieval.dense.questions import QuestionRun, question_tower, question_vectors
from dpr_cache.retrieval.dense.shards import PassageSource, encode_passage_shards
from dpr_cache.retrieval.dense.store import write_shard
from dpr_cache.runtime.atomic import write_json_atomic
from dpr_cache.runtime.device import advises_on_out_of_memory
from dpr_cache.runtime.lock import output_lock

__all__ = ["encode_file", "question_file_vectors", "QUESTIONS"]

QUESTIONS = "questions.npy"


def question_file_vectors(
    model_dir: Path,
    questions: Path,
    index: IndexConfig,
    asked: Mapping[str, Any],
    device: torch.device,
) -> tuple[np.ndarray, list[str], dict[str, Any]]:
    """The query tower's vectors [n, d] float32 of a qas file's questions (in batches of
    ``index.batch_size``, under ``index.precision``), their ids (the file's own,
    ``X.ids.txt``, else its row numbers), and what they were encoded with: the encoding
    settled from ``asked`` and the model folder, the precision as resolved on ``device``."""
    model = question_tower(model_dir, device, asked)
    qas = read_qas(Path(questions))
    if not qas:
        raise InputError(f"{questions}: no questions")
    run = QuestionRun(device, index.precision, index.batch_size)
    vectors = question_vectors(model, [q for q, _ in qas], run)
    used = {
        **model.query_encoding.record(),
        "max_length": model.max_query_length,
        "precision": run.precision,
        "store_dtype": "float32",
        "batch_size": run.batch_size,
    }
    return vectors, question_ids(Path(questions), len(qas)), used


@advises_on_out_of_memory("lower --batch-size")
def encode_file(
    model_path: str | Path,
    out: Path,
    index: IndexConfig,
    *,
    pooling: str | None = None,
    max_length: int | None = None,
    num_workers: int,
    passages: Path | None = None,
    questions: Path | None = None,
    device: torch.device,
    cache_dir: Path,
    progress: bool = True,
) -> list[Path]:
    """Encode a passages TSV (into resumable shards ``<key>-00000.npy``) or a qas file (into
    ``questions.npy``, float32, ids = the file's own, else row numbers from 0) into ``out`` as
    ``index.*`` says; returns the .npy files.

    ``pooling`` and ``max_length`` (the passages' or the questions') left None are the model's:
    a dpr-cache folder's record, a sentence-transformers folder's Pooling module, else CLS
    pooling and ``model.max_query_length`` / ``model.max_passage_length``'s defaults (DPR's).
    Given, they must not contradict what the model folder records. A multi-vector model is
    refused (InputError): its vectors are not written as files of their own yet.
    """
    if (passages is None) == (questions is None):
        raise InputError("encode: give one of --passages or --questions")
    model_dir = resolve_model_dir(model_path, Path("."))
    _refuse_multi(model_dir)
    out = Path(out)
    with output_lock(out):
        if questions is not None:
            asked = {"pooling": pooling, "max_query_length": max_length, "dim": index.dim}
            vectors, ids, used = question_file_vectors(model_dir, questions, index, asked, device)
            write_shard(out / QUESTIONS, vectors, ids, "float32")
            record = {"model": str(model_dir), "questions": str(questions)}
            write_json_atomic(out / "encode.json", {**record, **used})
            return [out / QUESTIONS]
        source = PassageSource(
            Path(passages),
            model_dir,
            {"pooling": pooling, "dim": index.dim},
            {},
            max_length,
            num_workers,
            cache_dir,
        )
        encoded = encode_passage_shards(source, out, index, device=device, progress=progress)
        record = {"model": str(model_dir), "passages": str(passages), "shard_key": encoded.key}
        record.update(
            encoded.settings(index, num_workers),
            pooling=encoded.encoding.pooling,
            normalize=encoded.encoding.normalize,
            passage_prefix=encoded.passage_prefix,
            dim=encoded.encoding.dim,
            timings=encoded.timings(),
        )
        write_json_atomic(out / "encode.json", record)
        return encoded.paths


def _refuse_multi(model_dir: Path) -> None:
    """InputError for a multi-vector model: its vectors are not written as files of their own
    yet."""
    if model_vectors(model_dir) == MULTI:
        raise InputError(
            f"encode: {model_dir} is a multi-vector model: encode is not built yet for "
            "multi-vector models (`dpr-cache index` encodes its passages into token shards, "
            "and search and eval its questions)"
        )
