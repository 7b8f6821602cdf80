"""torch.distributed set-up and the cross-rank gather that keeps gradients exact.

Under ``torchrun`` each rank holds ``b = B / W`` questions and their passage groups. The loss of
rank r covers its local questions against the passages of *all* ranks; :func:`gather_with_grad`
concatenates the ranks' rows and, in the backward, all-reduces (SUM) the incoming gradient and
returns this rank's slice, so each rank receives the gradient every rank's loss sends to its rows.
With DDP averaging the parameter gradients over W, the result is the single-process gradient of
the global-batch loss, with no world-size fudge factor.
"""

from __future__ import annotations

import os
from dataclasses import dataclass

import torch
import torch.distributed as dist
from torch import Tensor

__all__ = ["DistEnv", "setup", "teardown", "gather_with_grad", "gather_no_grad", "barrier"]


@dataclass(frozen=True)
class DistEnv:
    """Where this process stands: rank, world size and its device."""

    rank: int = 0
    world_size: int = 1
    local_rank: int = 0
    device: torch.device = torch.device("cpu")

    @property
    def is_main(self) -> bool:
        return self.rank == 0

    @property
    def enabled(self) -> bool:
        return self.world_size > 1


def _pick_device(preference: str, local_rank: int) -> torch.device:
    if preference == "auto":
        preference = "cuda" if torch.cuda.is_available() else "cpu"
    if preference == "cuda":
        return torch.device("cuda", local_rank)
    return torch.device(preference)


def setup(device: str = "auto") -> DistEnv:
    """Join the process group ``torchrun`` describes (gloo on CPU, NCCL on GPU), if any."""
    world_size = int(os.environ.get("WORLD_SIZE", "1"))
    local_rank = int(os.environ.get("LOCAL_RANK", "0"))
    chosen = _pick_device(device, local_rank)
    if world_size <= 1:
        return DistEnv(device=chosen)
    if chosen.type == "cuda":
        torch.cuda.set_device(chosen)
    if not dist.is_initialized():
        backend = "nccl" if chosen.type == "cuda" else "gloo"
        dist.init_process_group(backend=backend)
    return DistEnv(dist.get_rank(), dist.get_world_size(), local_rank, chosen)


def teardown() -> None:
    if dist.is_available() and dist.is_initialized():
        dist.destroy_process_group()


def barrier() -> None:
    if dist.is_available() and dist.is_initialized():
        dist.barrier()


def _world() -> int:
    return dist.get_world_size() if dist.is_available() and dist.is_initialized() else 1


class _GatherWithGrad(torch.autograd.Function):
    """All-gather whose backward all-reduces (SUM) the gradient and keeps the local slice."""

    @staticmethod
    def forward(ctx, local: Tensor) -> Tensor:
        parts = [torch.empty_like(local) for _ in range(dist.get_world_size())]
        dist.all_gather(parts, local.contiguous())
        ctx.rank, ctx.rows = dist.get_rank(), local.shape[0]
        return torch.cat(parts)

    @staticmethod
    def backward(ctx, grad: Tensor) -> Tensor:
        grad = grad.contiguous().clone()
        dist.all_reduce(grad, op=dist.ReduceOp.SUM)
        return grad[ctx.rank * ctx.rows : (ctx.rank + 1) * ctx.rows]


def gather_with_grad(local: Tensor) -> Tensor:
    """Rows of every rank, in rank order [W * n, ...]; identity on one process."""
    return local if _world() == 1 else _GatherWithGrad.apply(local)


def gather_no_grad(local: Tensor) -> Tensor:
    """Rows of every rank, in rank order, without a gradient (ids, labels)."""
    if _world() == 1:
        return local
    parts = [torch.empty_like(local) for _ in range(dist.get_world_size())]
    dist.all_gather(parts, local.contiguous())
    return torch.cat(parts)
