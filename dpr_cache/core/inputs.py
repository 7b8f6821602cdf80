"""Batched inputs as the engines take them: a dict of tensors sharing dim 0, cut into chunks.

A step's chunking is planned on the host: each row's length and last attended column are read
from ``attention_mask`` once a tower (one copy to the host, none when the inputs are there
already), and each chunk's rows and width follow from them. Cutting a chunk is then an index
and a slice on the inputs' device, with nothing read back from it in the chunk loop.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass

import torch
from torch import Tensor

__all__ = [
    "Inputs",
    "Chunks",
    "RowSpans",
    "batch_rows",
    "cut_chunks",
    "group_size_of",
    "row_spans",
    "split_inputs",
    "token_chunk_sizes",
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


def split_inputs(inputs: Inputs, chunk_size: int | list[int]) -> list[dict[str, Tensor]]:
    """Cut every tensor of ``inputs`` along dim 0 into chunks of ``chunk_size`` rows (or of
    the sizes listed)."""
    if isinstance(chunk_size, int) and chunk_size < 1:
        raise ValueError(f"chunk_size must be >= 1, got {chunk_size}")
    pieces = {key: t.split(chunk_size) for key, t in inputs.items()}
    n = len(next(iter(pieces.values())))
    return [{key: parts[i] for key, parts in pieces.items()} for i in range(n)]


@dataclass(frozen=True)
class RowSpans:
    """Each row's attended tokens (``lengths``) and one past its last attended column
    (``ends``), as int64 tensors on the host; ``width`` is the mask's."""

    lengths: Tensor
    ends: Tensor
    width: int


def row_spans(inputs: Inputs) -> RowSpans | None:
    """The rows' spans of ``inputs``' 2-D ``attention_mask`` (None without one), read in one
    copy to the host."""
    mask = inputs.get("attention_mask")
    if mask is None or mask.dim() != 2:
        return None
    attended = mask.ne(0)
    columns = torch.arange(1, mask.shape[1] + 1, device=mask.device)
    both = torch.stack((attended.sum(dim=1), (attended * columns).amax(dim=1))).cpu()
    return RowSpans(both[0], both[1], mask.shape[1])


@dataclass(eq=False)
class Chunks:
    """A tower's inputs cut into chunks: ``parts`` in the order they are encoded and, when the
    rows were reordered, ``rows``: each part's batch rows on the inputs' device (None: the
    parts hold consecutive rows in batch order)."""

    parts: list[dict[str, Tensor]]
    rows: list[Tensor] | None


def cut_chunks(
    inputs: Inputs,
    chunk_size: int,
    *,
    length_order: bool = True,
    trim: bool = True,
    length_bucket: int | None = None,
    max_tokens: int | None = None,
) -> Chunks:
    """Cut ``inputs`` into chunks of ``chunk_size`` rows.

    ``max_tokens``: each chunk takes rows (in the order below) while it holds at most that
    many attended tokens and ``chunk_size`` rows; a row longer than that is a chunk alone.

    ``length_order``: rows ordered longest first by attended tokens (ties in batch order), so
    rows of similar length share a chunk. ``trim``: each chunk cut to the columns up to its
    rows' last attended one; with ``length_bucket``, that width rounded up to a multiple of it
    (at most the inputs' width: a batch padded to a multiple of the bucket, as the trainer pads
    it then, gives every chunk such a width), so chunk shapes repeat from step to step. Every
    2-D-or-more tensor whose dim 1 has the mask's width is cut alike, into a contiguous tensor
    (its strides then do not depend on the batch's width either). Both are exact for right-padded
    encoders, whose output ignores masked trailing columns. Inputs without a 2-D
    ``attention_mask`` are chunked in batch order, uncut.
    """
    if chunk_size < 1:
        raise ValueError(f"chunk_size must be >= 1, got {chunk_size}")
    if length_bucket is not None and length_bucket < 1:
        raise ValueError(f"length_bucket must be >= 1, got {length_bucket}")
    if max_tokens is not None and max_tokens < 1:
        raise ValueError(f"max_tokens must be >= 1, got {max_tokens}")
    spans = row_spans(inputs) if length_order or trim or max_tokens else None
    if max_tokens is not None and spans is None:
        raise ValueError("max_tokens counts attended tokens: the inputs need an attention_mask")
    n = batch_rows(inputs)
    order = _longest_first(spans.lengths) if length_order and spans is not None else None
    sizes: int | list[int] = chunk_size
    if max_tokens is not None:
        in_order = spans.lengths if order is None else spans.lengths[order]
        sizes = token_chunk_sizes(in_order.tolist(), max_tokens, chunk_size)
    if order is None:
        host_rows = list(torch.arange(n).split(sizes))
        parts, rows = split_inputs(inputs, sizes), None
    else:
        host_rows = list(order.split(sizes))
        rows = list(_to_device(order, _device_of(inputs)).split(sizes))
        parts = [{key: t.index_select(0, r) for key, t in inputs.items()} for r in rows]
    if trim and spans is not None:
        widths = [_width(spans, r, length_bucket) for r in host_rows]
        parts = [_narrow(part, spans.width, w) for part, w in zip(parts, widths, strict=True)]
    return Chunks(parts, rows)


def token_chunk_sizes(lengths: list[int], max_tokens: int, max_rows: int) -> list[int]:
    """Rows of each chunk when chunks take ``lengths``' rows in order while they hold at most
    ``max_tokens`` tokens and ``max_rows`` rows (a longer row alone)."""
    sizes, rows, tokens = [], 0, 0
    for length in lengths:
        if rows and (rows == max_rows or tokens + length > max_tokens):
            sizes.append(rows)
            rows, tokens = 0, 0
        rows, tokens = rows + 1, tokens + length
    return sizes + [rows] if rows else sizes


def _longest_first(lengths: Tensor) -> Tensor | None:
    """Row order by decreasing length, ties in batch order; None when already in it."""
    if bool((lengths[:-1] >= lengths[1:]).all()):
        return None
    return torch.sort(lengths, descending=True, stable=True).indices


def _width(spans: RowSpans, rows: Tensor, bucket: int | None) -> int:
    """The columns chunk ``rows`` keeps: up to its last attended one (at least 1), rounded up
    to a multiple of ``bucket`` and at most the inputs' width."""
    keep = max(int(spans.ends[rows].max()), 1)
    if bucket is not None:
        keep = -(-keep // bucket) * bucket
    return min(keep, spans.width)


def _narrow(part: dict[str, Tensor], width: int, keep: int) -> dict[str, Tensor]:
    if keep == width:
        return part
    return {
        k: t[:, :keep].contiguous() if t.dim() >= 2 and t.shape[1] == width else t
        for k, t in part.items()
    }


def _device_of(inputs: Inputs) -> torch.device:
    mask = inputs.get("attention_mask")
    return (mask if mask is not None else next(iter(inputs.values()))).device


def _to_device(t: Tensor, device: torch.device) -> Tensor:
    """``t`` (on the host) on ``device``; to CUDA from pinned memory, without a host wait."""
    if device.type != "cuda":
        return t.to(device)
    return t.pin_memory().to(device, non_blocking=True)
