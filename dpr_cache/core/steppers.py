"""The step object a training mode asks for (gradcache | full | accumulate) over a bi-encoder's
towers and a loss function (:func:`~dpr_cache.core.objective.make_loss_fn`).

Each step object has ``.step(q_inputs, p_inputs, **loss_inputs) -> loss`` and fills ``.grad``;
``dpr_cache.train.step.build_step`` assembles the one that train, verify and bench all run.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field

import torch
from torch import Tensor, nn

from dpr_cache.core.accumulate import Accumulate, FullBatch
from dpr_cache.core.engine import GradCache

__all__ = ["Towers", "make_stepper"]


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
    chunk_tokens: int | None = None,
    scaler: torch.amp.GradScaler | None = None,
    keep_last_graph: bool = True,
    length_order: bool = True,
    length_bucket: int | None = None,
    release_memory: Callable[[], object] | None = None,
    trim_padding: bool = True,
):
    """The step object of ``mode`` (``train.mode``: gradcache, full or accumulate) over
    ``towers``; ``trim_padding`` cuts each chunk to its longest row (GradCache, accumulate)."""
    if mode == "gradcache":
        return GradCache(
            towers.encode_q,
            towers.encode_p,
            loss_fn,
            chunk_size,
            p_chunk_size=p_chunk_size,
            chunk_tokens=chunk_tokens,
            scaler=scaler,
            no_sync=towers.no_sync,
            keep_last_graph=keep_last_graph,
            length_order=length_order,
            length_bucket=length_bucket,
            release_memory=release_memory,
            trim_padding=trim_padding,
        )
    if chunk_tokens is not None:
        raise ValueError(f"chunk_tokens packs GradCache's chunks; train.mode {mode} has none")
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
            trim_padding=trim_padding,
        )
    raise ValueError(f"unknown train.mode {mode!r}")
