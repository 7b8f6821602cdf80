"""Questions into vectors for an index, the one way every command does it (``eval``, ``search
--questions``, ``mine``, ``encode --questions`` and validation during training).

The query tower is set up as the index's passages were encoded (the pooling, normalization and
prompts the index records, :func:`~dpr_cache.retrieval.dense.index.query_encoding`); each
question gets the model's query prefix and is cut at the question length the index records (else
the model's saved one, else DPR's 32). Where it runs, in which precision and in what batches is
the calling command's own setting (:class:`QuestionRun`).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import torch

from dpr_cache.model.biencoder import BiEncoder
from dpr_cache.model.loading import load_encoder
from dpr_cache.retrieval.dense.encode import encode_question_texts
from dpr_cache.retrieval.dense.index import OpenIndex, check_model, query_encoding
from dpr_cache.retrieval.dense.shards import DEFAULT_QUERY_LENGTH
from dpr_cache.runtime.device import resolve_precision

__all__ = ["QuestionRun", "query_tower", "question_vectors"]


@dataclass(frozen=True)
class QuestionRun:
    """Where and how a command encodes its questions: its own device, autocast precision
    (fp32 | bf16 | fp16; ``auto`` is resolved for the device on creation, so ``precision``
    always names the one used) and batch size."""

    device: torch.device
    precision: str = "fp32"
    batch_size: int = 128

    def __post_init__(self) -> None:
        object.__setattr__(self, "precision", resolve_precision(self.precision, self.device))


def query_tower(
    model_dir: Path,
    opened: OpenIndex,
    device: torch.device,
    unrecorded: dict[str, Any] | None = None,
) -> BiEncoder:
    """The query tower of ``model_dir``, set as the index ``opened`` was encoded and checked to
    be its model, on ``device``. What the index does not record (precomputed vectors record
    nothing) is taken from ``unrecorded`` (keys of
    :func:`~dpr_cache.retrieval.dense.index.query_encoding`), else as the model saved it."""
    encoding = query_encoding(opened)
    for key, value in (unrecorded or {}).items():
        if encoding[key] is None or encoding[key] == (None, None):
            encoding[key] = value
    model = load_encoder(
        model_dir,
        pooling=encoding["pooling"],
        normalize=encoding["normalize"],
        prefixes=encoding["prefixes"],
        query_only=True,
    ).to(device)
    if encoding["max_query_length"] is not None:
        model.max_query_length = encoding["max_query_length"]
    check_model(model_dir, model, opened)
    return model


def question_vectors(
    model: BiEncoder, questions: Sequence[str], run: QuestionRun, max_length: int | None = None
) -> np.ndarray:
    """The questions' vectors [n, d] float32: each after the model's query prefix, cut at
    ``max_length`` (None: the model's question length, else DPR's)."""
    length = max_length or model.max_query_length or DEFAULT_QUERY_LENGTH
    return encode_question_texts(
        model,
        list(questions),
        max_length=length,
        device=run.device,
        precision=run.precision,
        batch_size=run.batch_size,
    )
