"""``dpr-cache encode``: a passages TSV into resumable shards, or a questions file into one
``questions.npy``, with the ids beside each."""

from __future__ import annotations

import dataclasses
from pathlib import Path

import numpy as np
import torch

from dpr_cache.data.qas import question_ids, read_qas
from dpr_cache.errors import InputError
from dpr_cache.model.loading import load_encoder, resolve_model_dir
from dpr_cache.retrieval.dense.questions import QuestionRun, question_vectors
from dpr_cache.retrieval.dense.shards import DEFAULT_QUERY_LENGTH, EncodeSpec, encode_passage_shards
from dpr_cache.retrieval.dense.store import write_shard
from dpr_cache.runtime.atomic import write_json_atomic
from dpr_cache.runtime.lock import output_lock

__all__ = ["encode_file", "encode_questions", "QUESTIONS"]

QUESTIONS = "questions.npy"


def encode_questions(
    model_dir: Path, questions: Path, spec: EncodeSpec, device: torch.device
) -> tuple[np.ndarray, list[str], EncodeSpec]:
    """The query tower's vectors [n, d] float32 of a qas file's questions, their ids (the
    file's own, ``X.ids.txt``, else its row numbers), and ``spec`` with what it left to the
    model or the device filled in (``max_length`` None: the model's saved question length;
    ``precision`` auto: as resolved on ``device``)."""
    model = load_encoder(
        model_dir,
        pooling=spec.pooling,
        normalize=spec.normalize,
        prefixes=(spec.query_prefix, spec.passage_prefix),
        query_only=True,
    ).to(device)
    qas = read_qas(Path(questions))
    if not qas:
        raise InputError(f"{questions}: no questions")
    length = spec.max_length or model.max_query_length or DEFAULT_QUERY_LENGTH
    run = QuestionRun(device, spec.precision, spec.batch_size)
    vectors = question_vectors(model, [q for q, _ in qas], run, max_length=length)
    used = dataclasses.replace(
        spec,
        precision=run.precision,
        max_length=length,
        pooling=model.pooling,
        normalize=model.normalize,
        query_prefix=model.query_prefix,
        passage_prefix=model.passage_prefix,
        store_dtype="float32",
    )
    return vectors, question_ids(Path(questions), len(qas)), used


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
    ``questions.npy``, float32, ids = the file's own, else row numbers from 0) into ``out``;
    returns the .npy files.

    The model's saved settings (pooling, max lengths) apply where ``spec`` leaves them None; a
    sentence-transformers folder its Pooling module's, any other folder CLS pooling and DPR's
    lengths.
    """
    if (passages is None) == (questions is None):
        raise InputError("encode: give one of --passages or --questions")
    model_dir = resolve_model_dir(model_path, Path("."))
    out = Path(out)
    with output_lock(out):
        if questions is not None:
            vectors, ids, used = encode_questions(model_dir, questions, spec, device)
            write_shard(out / QUESTIONS, vectors, ids, "float32")
            record = {"model": str(model_dir), "questions": str(questions)}
            write_json_atomic(out / "encode.json", {**record, **dataclasses.asdict(used)})
            return [out / QUESTIONS]
        encoded = encode_passage_shards(
            Path(passages),
            model_dir,
            out,
            spec,
            device=device,
            cache_dir=cache_dir,
            progress=progress,
        )
        record = {"model": str(model_dir), "passages": str(passages), "shard_key": encoded.key}
        record.update(
            dataclasses.asdict(spec),
            precision=encoded.precision,
            max_length=encoded.max_length,
            pooling=encoded.pooling,
            normalize=encoded.normalize,
            passage_prefix=encoded.passage_prefix,
            timings=encoded.timings(),
        )
        write_json_atomic(out / "encode.json", record)
        return encoded.paths
