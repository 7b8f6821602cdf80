"""Texts to vectors with a loaded BiEncoder, in inference mode: passages in length-sorted batches
(each padded to its longest), questions in order. Tokenization is :mod:`dpr_cache.data.tokenize`'s,
the same as training's."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

import numpy as np
import torch

from dpr_cache.data.tokenize import encode_questions, pad, tokenize_passages
from dpr_cache.model.biencoder import BiEncoder
from dpr_cache.runtime.device import autocast, inference_precision

__all__ = ["encode_passage_texts", "encode_question_texts"]


def encode_passage_texts(
    model: BiEncoder,
    titles: Sequence[str],
    texts: Sequence[str],
    *,
    max_length: int,
    batch_size: int,
    device: torch.device,
    precision: str = "fp32",
    sort_by_length: bool = True,
    on_batch: Callable[[int], Any] | None = None,
) -> np.ndarray:
    """Passage embeddings [n, dim] (float32, input order) from the passage tower.

    ``sort_by_length``: batches of similar length (longest first), each padded to its longest;
    otherwise batches in input order padded to ``max_length``, as DPR does. ``precision``
    applies on CUDA; the CPU encodes in fp32.
    """
    n = len(texts)
    feats = tokenize_passages(model.tokenizer, titles, texts, max_length)
    lengths = np.fromiter((len(s) for s in feats["input_ids"]), dtype=np.int64, count=n)
    order = np.argsort(-lengths, kind="stable") if sort_by_length else np.arange(n)
    out = np.empty((n, model.dim), dtype=np.float32)  # [n, dim]
    with torch.inference_mode(), autocast(device, inference_precision(device, precision)):
        for start in range(0, n, batch_size):
            rows = order[start : start + batch_size]
            width = int(lengths[rows].max()) if sort_by_length else max_length
            inputs = pad(model.tokenizer, feats, rows, width=width)
            out[rows] = (
                model.encode_passage({k: v.to(device) for k, v in inputs.items()})
                .float()
                .cpu()
                .numpy()
            )
            if on_batch is not None:
                on_batch(len(rows))
    return out


def encode_question_texts(
    model: BiEncoder,
    questions: Sequence[str],
    *,
    max_length: int,
    device: torch.device,
    precision: str = "fp32",
) -> np.ndarray:
    """Question embeddings [n, dim] (float32) from the query tower, one padded batch
    (``precision`` on CUDA, fp32 on the CPU)."""
    inputs = encode_questions(model.tokenizer, questions, max_length)
    with torch.inference_mode(), autocast(device, inference_precision(device, precision)):
        reps = model.encode_query({k: v.to(device) for k, v in inputs.items()})
    return reps.float().cpu().numpy()
