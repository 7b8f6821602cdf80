"""The cross-rank gather that keeps contrastive gradients exact.

Under ``torchrun`` each rank holds ``b = B / W`` questions and their passage groups. The loss of
rank r covers its local questions against the passages of *all* ranks; :func:`gather_with_grad`
concatenates the ranks' rows and, in the backward, all-reduces (SUM) the incoming gradient and
returns this rank's slice, so each rank receives the gradient every rank's loss sends to its rows.
With DDP averaging the parameter gradients over W, the result is the single-process gradient of
the global-batch loss, with no world-size fudge factor.

Multi-vector reps [n, L, d] may have another width L on each rank (each rank's chunks are cut to
their own longest row): every rank pads its rows with zero vectors (padding, to the loss) to the
widest rank's width before the gather, and the backward cuts this rank's gradient back to its own.
2-D reps gather as they are.
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
        ctx.rank, ctx.rows = dist.get_rank(), local.shape[0]
        ctx.width = local.shape[1] if local.dim() > 2 else None
        return _all_gather(_padded_to_widest(local))

    @staticmethod
    def backward(ctx, grad: Tensor) -> Tensor:
        grad = grad.contiguous().clone()
        dist.all_reduce(grad, op=dist.ReduceOp.SUM)
        mine = grad[ctx.rank * ctx.rows : (ctx.rank + 1) * ctx.rows]
        return mine if ctx.width is None else mine[:, : ctx.width]


def _all_gather(local: Tensor) -> Tensor:
    """Every rank's ``local`` (one shape on every rank), concatenated in rank order."""
    parts = [torch.empty_like(local) for _ in range(dist.get_world_size())]
    dist.all_gather(parts, local.contiguous())
    return torch.cat(parts)


def _padded_to_widest(local: Tensor) -> Tensor:
    """``local`` itself when 2-D; else its rows padded along dim 1 with zeros to the widest
    rank's dim 1 (one all_reduce MAX of the width)."""
    if local.dim() <= 2:
        return local
    width = torch.tensor([local.shape[1]], dtype=torch.int64, device=local.device)
    dist.all_reduce(width, op=dist.ReduceOp.MAX)
    widest = int(width.item())
    if widest == local.shape[1]:
        return local
    padded = local.new_zeros((local.shape[0], widest, *local.shape[2:]))
    padded[:, : local.shape[1]].copy_(local)
    return padded


def gather_with_grad(local: Tensor) -> Tensor:
    """Rows of every rank, in rank order [W * n, ...] (3-D and up: padded to the widest rank's
    dim 1); identity on one process."""
    return local if world_size() == 1 else _GatherWithGrad.apply(local)


def gather_no_grad(local: Tensor) -> Tensor:
    """Rows of every rank, in rank order, without a gradient (ids, labels; 3-D and up: padded
    to the widest rank's dim 1)."""
    if world_size() == 1:
        return local
    return _all_gather(_padded_to_widest(local))


def all_finite_or_nan(loss: Tensor) -> Tensor:
    """``loss`` where every rank's loss is finite, else NaN on every rank: the ranks agree on a
    step that cannot be taken, so none goes on into a backward the others left."""
    finite = torch.isfinite(loss.detach()).to(torch.float32).reshape(1)
    dist.all_reduce(finite, op=dist.ReduceOp.MIN)
    return loss if bool(finite.item()) else loss + float("nan")
