"""The cross-rank gather that keeps contrastive gradients exact.

Under ``torchrun`` each rank holds ``b = B / W`` questions and their passage groups. The loss of
rank r covers its local questions against the passages of *all* ranks; :func:`gather_with_grad`
concatenates the ranks' rows and, in the backward, all-reduces (SUM) the incoming gradient and
returns this rank's slice, so each rank receives the gradient every rank's loss sends to its rows.
With DDP averaging the parameter gradients over W, the result is the single-process gradient of
the global-batch loss, with no world-size fudge factor.
"""

from __future__ import annotations

import torch
import torch.distributed as dist
from torch import Tensor

__all__ = ["gather_with_grad", "gather_no_grad", "all_finite_or_nan", "world_size"]


def world_size() -> int:
    """Ranks in the process group (1 without one)."""
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
    return local if world_size() == 1 else _GatherWithGrad.apply(local)


def gather_no_grad(local: Tensor) -> Tensor:
    """Rows of every rank, in rank order, without a gradient (ids, labels)."""
    if world_size() == 1:
        return local
    parts = [torch.empty_like(local) for _ in range(dist.get_world_size())]
    dist.all_gather(parts, local.contiguous())
    return torch.cat(parts)


def all_finite_or_nan(loss: Tensor) -> Tensor:
    """``loss`` where every rank's loss is finite, else NaN on every rank: the ranks agree on a
    step that cannot be taken, so none goes on into a backward the others left."""
    finite = torch.isfinite(loss.detach()).to(torch.float32).reshape(1)
    dist.all_reduce(finite, op=dist.ReduceOp.MIN)
    return loss if bool(finite.item()) else loss + float("nan")
