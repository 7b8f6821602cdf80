"""Questions into vectors for an index, the one way every command does it (``eval``, ``search
--questions``, ``mine``, ``encode --questions`` and validation during training).

The query tower is set as :func:`~dpr_cache.model.encoding.resolve_encoding` settles its
encoding (prefix, pooling, normalization, question length): what the user gave, which must not
contradict what the index records (else, for precomputed vectors, what the model folder
records), else that record, else the command's fallback (the config's values; the question
length defaults to ``model.max_query_length``'s). Where it runs, in which precision and in what
batches is the calling command's own setting (:class:`QuestionRun`).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import torch

from dpr_cache.config import IndexConfig, ModelConfig, default_of
from dpr_cache.model.biencoder import BiEncoder
from dpr_cache.model.encoding import RECORDED_KEYS
from dpr_cache.model.loading import load_settled
from dpr_cache.retrieval.dense.encode import encode_question_texts
from dpr_cache.retrieval.dense.index import OpenIndex, check_model, query_encoding, refuse_dim
from dpr_cache.retrieval.dense.layout import MULTI, check_vectors, model_vectors
from dpr_cache.runtime.device import resolve_precision

__all__ = [
    "QuestionRun",
    "config_encoding",
    "config_loading",
    "query_tower",
    "question_tower",
    "question_vectors",
]


@dataclass(frozen=True)
class QuestionRun:
    """Where and how a command encodes its questions: its own device, autocast precision
    (auto | fp32 | bf16 | fp16; ``auto`` is resolved for the device on creation, so
    ``precision`` always names the one used) and batch size (default ``eval.batch_size``'s)."""

    device: torch.device
    precision: str
    batch_size: int = default_of("eval.batch_size")

    def __post_init__(self) -> None:
        object.__setattr__(self, "precision", resolve_precision(self.precision, self.device))


def config_encoding(
    model: ModelConfig, index: IndexConfig | None = None
) -> tuple[dict[str, Any], dict[str, Any]]:
    """The encoding settings of a config's ``model.*`` (and ``index.dim``) for
    :func:`question_tower`: those its file or a ``--set`` gave (checked against what is
    recorded), and every one with its value or default (the fallback where nothing is
    recorded)."""
    keys = [key for key in RECORDED_KEYS if key != "dim"]
    given = {key: getattr(model, key) for key in keys if key in model.model_fields_set}
    fallback = {key: getattr(model, key) for key in keys}
    dim = index.dim if index is not None else None
    if dim is not None:
        given["dim"] = dim
    return given, {**fallback, "dim": dim}


def config_loading(model: ModelConfig) -> dict[str, Any]:
    """How a config's ``model.*`` loads the weights to encode: ``model.dtype`` where its file
    or a ``--set`` gave it (else None: the dtype the model folder records) and
    ``model.attn_implementation``. Neither is part of the query encoding: they change a
    vector's rounding, not what it means."""
    given = "dtype" in model.model_fields_set
    return {
        "dtype": model.dtype if given else None,
        "attn_implementation": model.attn_implementation,
    }


def question_tower(
    model_dir: Path,
    device: torch.device,
    asked: Mapping[str, Any] | None = None,
    fallback: Mapping[str, Any] | None = None,
    records: Sequence[tuple[str, Mapping[str, Any], str]] = (),
    loading: Mapping[str, Any] | None = None,
) -> BiEncoder:
    """The query tower of ``model_dir`` on ``device``, its encoding settled by
    :func:`~dpr_cache.model.encoding.resolve_encoding` from ``asked`` (the settings the user
    gave, by config key), ``records`` (an index's) and the model folder's own record, and
    ``fallback`` (None where the folder's own setting applies; the question length
    ``model.max_query_length``'s default); its weights loaded as ``loading`` says
    (:func:`config_loading`; None: as the folder records). A width asked of a multi-vector
    model (``dim``) is an InputError."""
    if model_vectors(model_dir) == MULTI:
        refuse_dim((asked or {}).get("dim"))
    fallback = {"max_query_length": default_of("model.max_query_length"), **(fallback or {})}
    model = load_settled(
        model_dir, asked or {}, fallback, records, query_only=True, loading=loading
    )
    return model.to(device)


def query_tower(
    model_dir: Path,
    opened: OpenIndex,
    device: torch.device,
    asked: Mapping[str, Any] | None = None,
    fallback: Mapping[str, Any] | None = None,
    loading: Mapping[str, Any] | None = None,
) -> BiEncoder:
    """The query tower of ``model_dir`` set as the index ``opened`` was encoded (a setting in
    ``asked`` that contradicts it is an InputError naming both; see :func:`question_tower`)
    and checked to be its model, on ``device``, its weights loaded as ``loading`` says. A
    model of another kind than the index (a multi-vector model's token vectors, or one vector a
    text) is an InputError, before it loads."""
    check_vectors(model_dir, opened.meta, opened.path)
    built = ("the index was built with", query_encoding(opened), "rerun `dpr-cache index`")
    model = question_tower(model_dir, device, asked, fallback, [built], loading)
    check_model(model_dir, model, opened)
    return model


def question_vectors(
    model: BiEncoder, questions: Sequence[str], run: QuestionRun, max_length: int | None = None
) -> np.ndarray:
    """The questions' vectors [n, d] float32 (a multi-vector model's: their token vectors
    [n, L, d], padding the zero vector): each after the model's query prefix, cut at
    ``max_length`` (None: the model's question length, as :func:`question_tower` set it)."""
    return encode_question_texts(
        model,
        list(questions),
        max_length=max_length or model.max_query_length,
        device=run.device,
        precision=run.precision,
        batch_size=run.batch_size,
    )
