"""Batched inputs as the engines take them: a dict of tensors sharing dim 0, cut into chunks."""

from __future__ import annotations

from collections.abc import Mapping

import torch
from torch import Tensor

__all__ = [
    "Inputs",
    "batch_rows",
    "group_size_of",
    "order_by_length",
    "split_inputs",
    "trim_padding",
]

Inputs = Mapping[str, Tensor]


def batch_rows(inputs: Inputs, name: str = "inputs") -> int:
    """Rows shared by every tensor of ``inputs``; raises if they differ."""
    if not isinstance(inputs, Mapping) or not inputs:
        raise ValueError(f"{name} must be a non-empty dict of tensors")
    rows = {key: t.shape[0] for key, t in inputs.items() if isinstance(t, Tensor)}
    if len(rows) != len(inputs):
        bad = [k for k, t in inputs.items() if not isinstance(t, Tensor)]
        raise ValueError(f"{name}: values must be tensors, not for {bad}")
    if len(set(rows.values())) != 1:
        raise ValueError(f"{name}: tensors have different batch sizes {rows}")
    return next(iter(rows.values()))


def group_size_of(n_questions: int, n_passages: int) -> int:
    """Passage rows per question (its positive and hard negatives); raises unless the passage
    rows are a whole multiple of the question rows."""
    if n_questions < 1 or n_passages % n_questions != 0:
        raise ValueError(
            f"passage rows ({n_passages}) must be a multiple of question rows ({n_questions}): "
            "each question brings its positive and the same number of hard negatives"
        )
    return n_passages // n_questions


def split_inputs(inputs: Inputs, chunk_size: int) -> list[dict[str, Tensor]]:
    """Cut every tensor of ``inputs`` along dim 0 into chunks of ``chunk_size`` rows."""
    if chunk_size < 1:
        raise ValueError(f"chunk_size must be >= 1, got {chunk_size}")
    pieces = {key: t.split(chunk_size) for key, t in inputs.items()}
    n = len(next(iter(pieces.values())))
    return [{key: parts[i] for key, parts in pieces.items()} for i in range(n)]


def trim_padding(chunk: dict[str, Tensor]) -> dict[str, Tensor]:
    """Drop trailing sequence columns that no row attends to (``attention_mask`` all zero).

    Every 2-D-or-more tensor whose dim 1 has the mask's width is cut the same way; a chunk
    without an ``attention_mask`` is returned unchanged. Exact for right-padded encoders: the
    dropped positions are masked out of attention and pooling.
    """
    mask = chunk.get("attention_mask")
    if mask is None or mask.dim() != 2 or mask.shape[1] < 2:
        return chunk
    width = mask.shape[1]
    used = torch.nonzero(mask.any(dim=0))
    keep = int(used[-1]) + 1 if used.numel() else 1
    if keep == width:
        return chunk
    return {
        key: t[:, :keep] if t.dim() >= 2 and t.shape[1] == width else t for key, t in chunk.items()
    }


def order_by_length(inputs: Inputs) -> Tensor | None:
    """Row order by decreasing ``attention_mask`` length (ties in batch order) [rows]; None
    when there is no mask or the rows are already in that order (nothing to gain)."""
    mask = inputs.get("attention_mask")
    if mask is None or mask.dim() != 2:
        return None
    lengths = mask.sum(dim=1).cpu()
    if bool((lengths[:-1] >= lengths[1:]).all()):
        return None
    return torch.sort(lengths, descending=True, stable=True).indices
