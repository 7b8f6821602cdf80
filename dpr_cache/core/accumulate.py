"""Baselines with GradCache's ``.step`` interface: the plain full batch and plain accumulation.

Plain gradient accumulation (Caffe's ``iter_size``) is **not** a large batch for a contrastive
loss: each micro-batch only sees its own passages, so a question meets ``k`` times fewer
negatives. It is offered as a labelled baseline (``train.mode: accumulate``) to show that gap.
"""

from __future__ import annotations

from collections.abc import Callable
from contextlib import nullcontext

import torch
from torch import Tensor

from dpr_cache.core.engine import Encoder
from dpr_cache.core.inputs import Inputs, batch_rows, cut_chunks, group_size_of
from dpr_cache.core.loss import loss_dtype

__all__ = ["FullBatch", "Accumulate", "PASSAGE_ROW_KWARGS", "QUESTION_ROW_KWARGS"]

PASSAGE_ROW_KWARGS = ("p_ids", "teacher_scores", "guide_p")
"""Loss arguments with one value a passage row: each micro-batch gets its rows' values."""
QUESTION_ROW_KWARGS = ("guide_q",)
"""Loss arguments with one value a question row, cut alike."""


class FullBatch:
    """One forward and one backward over the whole batch (the reference GradCache must equal)."""

    def __init__(
        self,
        encode_q: Encoder,
        encode_p: Encoder,
        loss_fn: Callable[..., Tensor],
        *,
        scaler: torch.amp.GradScaler | None = None,
    ) -> None:
        self.encode_q, self.encode_p, self.loss_fn, self.scaler = (
            encode_q,
            encode_p,
            loss_fn,
            scaler,
        )

    def step(self, q_inputs: Inputs, p_inputs: Inputs, **loss_kwargs) -> Tensor:
        """Accumulate the batch's gradient into ``.grad``; return the detached loss."""
        _group_size(q_inputs, p_inputs)
        return self.weighted_step(q_inputs, p_inputs, 1.0, **loss_kwargs)

    def weighted_step(
        self, q_inputs: Inputs, p_inputs: Inputs, weight: float, **loss_kwargs
    ) -> Tensor:
        """Backpropagate ``weight * loss``; return the detached weighted loss."""
        q_reps, p_reps = self.encode_q(q_inputs), self.encode_p(p_inputs)
        with torch.autocast(q_reps.device.type, enabled=False):
            q_reps, p_reps = q_reps.to(loss_dtype(q_reps)), p_reps.to(loss_dtype(p_reps))
            loss = self.loss_fn(q_reps, p_reps, **loss_kwargs) * weight
        if not torch.isfinite(loss):
            raise FloatingPointError(f"non-finite loss ({loss.item()}); no gradient was written")
        (self.scaler.scale(loss) if self.scaler is not None else loss).backward()
        return loss.detach()

    __call__ = step


class Accumulate:
    """``k`` micro-batches of ``micro_batch`` questions (with their passage groups), each with
    its own in-batch negatives; losses weighted by micro-batch size so that for a loss that is
    a mean of per-question terms (separable) the gradient equals the big batch's. Each
    micro-batch is cut to its own longest row (``trim_padding``, planned on the host once a
    step; exact as in :class:`GradCache`: with dropout, the masks are drawn at the trimmed
    width), so it costs what a batch of its size alone would.
    """

    def __init__(
        self,
        encode_q: Encoder,
        encode_p: Encoder,
        loss_fn: Callable[..., Tensor],
        micro_batch: int,
        *,
        scaler: torch.amp.GradScaler | None = None,
        no_sync: Callable | None = None,
        trim_padding: bool = True,
    ) -> None:
        if not isinstance(micro_batch, int) or micro_batch < 1:
            raise ValueError(f"micro_batch must be an integer >= 1, got {micro_batch!r}")
        self.full = FullBatch(encode_q, encode_p, loss_fn, scaler=scaler)
        self.micro_batch = micro_batch
        self.no_sync = no_sync
        self.trim_padding = trim_padding

    def step(self, q_inputs: Inputs, p_inputs: Inputs, **loss_kwargs) -> Tensor:
        """Accumulate the micro-batches' weighted gradients; return the weighted mean loss."""
        group = _group_size(q_inputs, p_inputs)
        n_q = batch_rows(q_inputs)
        cut = {"length_order": False, "trim": self.trim_padding}
        q_chunks = cut_chunks(q_inputs, self.micro_batch, **cut).parts
        p_chunks = cut_chunks(p_inputs, self.micro_batch * group, **cut).parts
        rows_of = {
            **{key: self.micro_batch * group for key in PASSAGE_ROW_KWARGS},
            **{key: self.micro_batch for key in QUESTION_ROW_KWARGS},
        }
        row_chunks = {
            key: loss_kwargs.pop(key).split(rows)
            for key, rows in rows_of.items()
            if loss_kwargs.get(key) is not None
        }
        losses = []
        for i, (q_chunk, p_chunk) in enumerate(zip(q_chunks, p_chunks, strict=True)):
            kwargs = dict(loss_kwargs, **{key: parts[i] for key, parts in row_chunks.items()})
            weight = batch_rows(q_chunk) / n_q
            last = i == len(q_chunks) - 1
            sync = self.no_sync() if self.no_sync is not None and not last else nullcontext()
            with sync:
                losses.append(self.full.weighted_step(q_chunk, p_chunk, weight, **kwargs))
        return torch.stack(losses).sum()

    __call__ = step


def _group_size(q_inputs: Inputs, p_inputs: Inputs) -> int:
    return group_size_of(batch_rows(q_inputs, "q_inputs"), batch_rows(p_inputs, "p_inputs"))
