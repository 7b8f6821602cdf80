"""Build the step object a training mode asks for (gradcache | full | accumulate) and its loss.

Shared by the trainer, ``verify`` and ``bench`` so that all three run the same code path.
"""

from __future__ import annotations

import contextlib
import functools
from collections.abc import Callable
from dataclasses import dataclass

import torch
from torch import Tensor, nn
from torch.nn.parallel import DistributedDataParallel

from dpr_cache import cpu_memory
from dpr_cache.accumulate import Accumulate, FullBatch
from dpr_cache.distributed import DistEnv, gather_no_grad, gather_with_grad
from dpr_cache.engine import GradCache
from dpr_cache.loss import contrastive_loss
from dpr_cache.model import BiEncoder

__all__ = ["make_loss_fn", "Towers", "wrap_towers", "make_stepper"]


def make_loss_fn(
    *, temperature: float, tile_size: int | None, group_size: int, env: DistEnv | None = None
) -> Callable[..., Tensor]:
    """DPR's loss of the local questions against the passages of every rank."""

    def loss_fn(q_reps: Tensor, p_reps: Tensor, p_ids: Tensor | None = None) -> Tensor:
        offset = 0
        if env is not None and env.enabled:
            offset = env.rank * p_reps.shape[0]
            p_reps = gather_with_grad(p_reps)
            p_ids = gather_no_grad(p_ids) if p_ids is not None else None
        return contrastive_loss(
            q_reps,
            p_reps,
            temperature=temperature,
            tile_size=tile_size,
            p_ids=p_ids,
            group_size=group_size,
            positive_offset=offset,
        )

    return loss_fn


@dataclass
class Towers:
    """The encode functions and DDP's no_sync contexts for one BiEncoder (wrapped or not)."""

    encode_q: Callable
    encode_p: Callable
    no_sync: Callable | tuple[Callable, Callable] | None  # as GradCache takes it
    no_sync_all: Callable | None  # one context silencing every wrapper (accumulate)
    wrappers: list[nn.Module]


def wrap_towers(model: BiEncoder, env: DistEnv) -> Towers:
    """Wrap each distinct tower in DDP when running on several ranks.

    A shared tower is one DDP module used by both sides (its last chunk syncs); separate
    towers get one DDP each, so each tower's last chunk syncs its own parameters once.
    """
    if not env.enabled:
        return Towers(model.encode_query, model.encode_passage, None, None, [])
    device_ids = [env.device.index] if env.device.type == "cuda" else None
    q_ddp = DistributedDataParallel(model.query_encoder, device_ids=device_ids)
    p_ddp = (
        q_ddp
        if model.shared
        else DistributedDataParallel(model.passage_encoder, device_ids=device_ids)
    )
    encode_q = functools.partial(model.encode_with, q_ddp)
    encode_p = functools.partial(model.encode_with, p_ddp)
    wrappers = [q_ddp] if model.shared else [q_ddp, p_ddp]

    @contextlib.contextmanager
    def no_sync_all():
        with contextlib.ExitStack() as stack:
            for wrapper in wrappers:
                stack.enter_context(wrapper.no_sync())
            yield

    no_sync = q_ddp.no_sync if model.shared else (q_ddp.no_sync, p_ddp.no_sync)
    return Towers(encode_q, encode_p, no_sync, no_sync_all, wrappers)


def make_stepper(
    mode: str,
    towers: Towers,
    loss_fn: Callable[..., Tensor],
    *,
    chunk_size: int,
    p_chunk_size: int | None = None,
    scaler: torch.amp.GradScaler | None = None,
    keep_last_graph: bool = True,
):
    """An object with ``.step(q_inputs, p_inputs, p_ids=...) -> loss`` filling ``.grad``."""
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
            release_memory=cpu_memory.trim,
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
