"""The step object a training mode asks for (gradcache | full | accumulate) and its loss.

Shared by the trainer, ``verify`` and ``bench`` so that all three run the same code path. Each
step object has ``.step(q_inputs, p_inputs, p_ids=..., teacher_scores=...) -> loss`` and fills
``.grad``.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field

import torch
from torch import Tensor, nn

from dpr_cache.core.accumulate import Accumulate, FullBatch
from dpr_cache.core.distill import Distillation, mixed_loss
from dpr_cache.core.engine import GradCache
from dpr_cache.core.gather import all_finite_or_nan, gather_no_grad, gather_with_grad

__all__ = ["Towers", "make_loss_fn", "make_stepper"]


def make_loss_fn(
    *,
    temperature: float,
    tile_size: int | None,
    group_size: int,
    rank: int = 0,
    world_size: int = 1,
    distillation: Distillation | None = None,
) -> Callable[..., Tensor]:
    """DPR's loss of this rank's questions against the passages of every rank, mixed with
    ``distillation``'s loss (see :func:`mixed_loss`) when given.

    The distillation terms of a question read its own group only, which lies in this rank's
    passage rows: they use the local rows and ``teacher_scores`` ([local passage rows]). Each
    rank's loss is a mean over its questions, so DDP's average over ranks gives the global
    batch's mean, as for the contrastive loss.
    """

    def loss_fn(
        q_reps: Tensor,
        p_reps: Tensor,
        p_ids: Tensor | None = None,
        teacher_scores: Tensor | None = None,
    ) -> Tensor:
        gathered = {}
        if world_size > 1 and (distillation is None or distillation.weight > 0):
            gathered = {
                "all_p_reps": gather_with_grad(p_reps),
                "all_p_ids": gather_no_grad(p_ids) if p_ids is not None else None,
                "positive_offset": rank * p_reps.shape[0],
            }
        loss = mixed_loss(
            q_reps,
            p_reps,
            group_size=group_size,
            temperature=temperature,
            tile_size=tile_size,
            distillation=distillation,
            p_ids=p_ids,
            teacher_scores=teacher_scores,
            **gathered,
        )
        return all_finite_or_nan(loss) if world_size > 1 else loss

    return loss_fn


@dataclass
class Towers:
    """The encode functions of a bi-encoder and, under DDP, the contexts that silence its sync.

    ``no_sync`` is what :class:`GradCache` takes (one context, or a pair for two wrapped
    towers); ``no_sync_all`` silences every wrapper at once (accumulation).
    """

    encode_q: Callable
    encode_p: Callable
    no_sync: Callable | tuple[Callable, Callable] | None = None
    no_sync_all: Callable | None = None
    wrappers: list[nn.Module] = field(default_factory=list)


def make_stepper(
    mode: str,
    towers: Towers,
    loss_fn: Callable[..., Tensor],
    *,
    chunk_size: int,
    p_chunk_size: int | None = None,
    scaler: torch.amp.GradScaler | None = None,
    keep_last_graph: bool = True,
    length_order: bool = True,
    length_bucket: int | None = None,
    release_memory: Callable[[], object] | None = None,
):
    """The step object of ``mode`` (``train.mode``: gradcache, full or accumulate) over
    ``towers``."""
    if mode == "gradcache":
        return GradCache(
            towers.encode_q,
            towers.encode_p,
            loss_fn,
            chunk_size,
            p_chunk_size=p_chunk_size,
            scaler=scaler,
            no_sync=towers.no_sync,
            keep_last_graph=keep_last_graph,
            length_order=length_order,
            length_bucket=length_bucket,
            release_memory=release_memory,
        )
    if mode == "full":
        return FullBatch(towers.encode_q, towers.encode_p, loss_fn, scaler=scaler)
    if mode == "accumulate":
        return Accumulate(
            towers.encode_q,
            towers.encode_p,
            loss_fn,
            chunk_size,
            scaler=scaler,
            no_sync=towers.no_sync_all,
        )
    raise ValueError(f"unknown train.mode {mode!r}")
