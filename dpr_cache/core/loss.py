"""DPR's contrastive loss over in-batch and hard negatives, direct or tiled (Inf-CL style).

Questions ``q_reps`` [B, d]; passages ``p_reps`` [P, d] grouped per question: question i's
positive is row ``positive_offset + i * group_size`` (``group_size = 1 + H``) and every passage
row is a candidate for every question::

    s_ij = <q_i, p_j> / temperature
    loss = mean_i [ logsumexp_j s_ij - s_i,pos(i) ]

The tiled path never builds the [B, P] score matrix: a custom autograd function computes the
per-row log-sum-exp block by block with a running max and sum, keeps only that [B] vector, and
recomputes each block in the backward. Memory is O((B + P) * d + tile^2).
"""

from __future__ import annotations

import torch
from torch import Tensor

from dpr_cache.core.inputs import group_size_of

__all__ = ["contrastive_loss", "positive_indices", "loss_dtype"]


def positive_indices(
    n_questions: int,
    n_passages: int,
    *,
    group_size: int | None = None,
    positive_offset: int = 0,
    device: torch.device | None = None,
) -> Tensor:
    """Column of each question's positive: ``positive_offset + i * group_size`` ([B] int64).

    ``group_size`` defaults to ``n_passages // n_questions`` (one process, no gathered rows).
    """
    if group_size is None:
        group_size = group_size_of(n_questions, n_passages)
    if group_size < 1:
        raise ValueError(f"group_size must be >= 1, got {group_size}")
    pos = positive_offset + torch.arange(n_questions, device=device) * group_size
    if n_questions and (positive_offset < 0 or int(pos[-1]) >= n_passages):
        raise ValueError(
            f"positive rows run past the passages: last positive {int(pos[-1])}, "
            f"passage rows {n_passages}"
        )
    return pos


def _false_negative_mask(p_ids: Tensor, pos_idx: Tensor, cols: slice, rows: slice) -> Tensor:
    """[rows, cols] bool: True where column j holds a copy of row i's positive that is not it."""
    pos_pid = p_ids[pos_idx[rows]]  # [r]
    col_pid = p_ids[cols]  # [c]
    col_idx = torch.arange(cols.start, cols.stop, device=p_ids.device)
    return (col_pid[None, :] == pos_pid[:, None]) & (col_idx[None, :] != pos_idx[rows, None])


def _check(q_reps: Tensor, p_reps: Tensor, p_ids: Tensor | None) -> None:
    if q_reps.dim() != 2 or p_reps.dim() != 2:
        raise ValueError(
            f"q_reps and p_reps must be 2-D [rows, dim], got {tuple(q_reps.shape)} and "
            f"{tuple(p_reps.shape)}"
        )
    if q_reps.shape[1] != p_reps.shape[1]:
        raise ValueError(f"q_reps dim {q_reps.shape[1]} differs from p_reps dim {p_reps.shape[1]}")
    if p_ids is not None and tuple(p_ids.shape) != (p_reps.shape[0],):
        raise ValueError(
            f"p_ids must have one id per passage row ({p_reps.shape[0]}), got shape "
            f"{tuple(p_ids.shape)}"
        )


def contrastive_loss(
    q_reps: Tensor,
    p_reps: Tensor,
    *,
    temperature: float = 1.0,
    tile_size: int | None = None,
    p_ids: Tensor | None = None,
    group_size: int | None = None,
    positive_offset: int = 0,
) -> Tensor:
    """DPR's loss: mean over questions of ``logsumexp_j s_ij - s_i,pos``.

    Args:
        q_reps: [B, d] question representations.
        p_reps: [P, d] passage representations, grouped per question (positive first).
        temperature: scores are divided by it (DPR uses 1).
        tile_size: ``None`` builds the full [B, P] score matrix; an int tiles it.
        p_ids: [P] int64 passage ids; a column carrying the id of question i's positive,
            other than that positive itself, is removed from question i's candidates.
        group_size: passage rows per question (1 + hard negatives); default ``P // B``.
        positive_offset: column of question 0's positive (rank offset when ``p_reps`` are
            gathered from several processes).
    """
    _check(q_reps, p_reps, p_ids)
    if temperature <= 0:
        raise ValueError(f"temperature must be > 0, got {temperature}")
    if tile_size is not None and tile_size < 1:
        raise ValueError(f"tile_size must be >= 1 or None, got {tile_size}")
    n_q, n_p = q_reps.shape[0], p_reps.shape[0]
    pos_idx = positive_indices(
        n_q, n_p, group_size=group_size, positive_offset=positive_offset, device=q_reps.device
    )
    if p_ids is not None:
        p_ids = p_ids.to(q_reps.device)
    if tile_size is None:
        scores = q_reps @ p_reps.T / temperature  # [B, P]
        if p_ids is not None:
            mask = _false_negative_mask(p_ids, pos_idx, slice(0, n_p), slice(0, n_q))
            scores = scores.masked_fill(mask, float("-inf"))
        lse = torch.logsumexp(scores, dim=1)
        pos_scores = scores.gather(1, pos_idx[:, None]).squeeze(1)
    else:
        lse = _TiledLSE.apply(q_reps, p_reps, pos_idx, p_ids, temperature, tile_size)
        pos_scores = (q_reps * p_reps[pos_idx]).sum(-1) / temperature
    return (lse - pos_scores).mean()


def loss_dtype(t: Tensor) -> torch.dtype:
    """The dtype the loss is computed in for reps of ``t``'s dtype: fp32 for half types (the
    cache and the loss stay in fp32 under autocast), else their own (fp64 stays fp64)."""
    return torch.float32 if t.dtype in (torch.float16, torch.bfloat16) else t.dtype


class _TiledLSE(torch.autograd.Function):
    """Per-row log-sum-exp of ``q @ p.T / temperature`` (false negatives masked), tiled.

    Forward keeps only the [B] result; backward recomputes each [tile, tile] block of scores
    and accumulates ``dq = sum_j w_ij p_j`` and ``dp = sum_i w_ij q_i`` with
    ``w_ij = grad_i * softmax_ij / temperature``. Every block is written into one reused
    ``tile * tile`` buffer and transformed in place, so no block-sized tensor is allocated per
    block (on CPU each fresh allocation costs page faults comparable to the elementwise work).
    """

    @staticmethod
    def forward(ctx, q, p, pos_idx, p_ids, temperature, tile):  # noqa: D401
        dtype = loss_dtype(q)
        n_q, n_p = q.shape[0], p.shape[0]
        lse = torch.empty(n_q, dtype=dtype, device=q.device)
        with torch.autocast(q.device.type, enabled=False):
            qs, pc = _scaled(q.to(dtype), temperature), p.to(dtype)
            buf = _block_buffer(n_q, n_p, tile, qs)
            for r0 in range(0, n_q, tile):
                rows = slice(r0, min(r0 + tile, n_q))
                run_max = torch.full((rows.stop - r0,), float("-inf"), dtype=dtype, device=q.device)
                run_sum = torch.zeros_like(run_max)
                for c0 in range(0, n_p, tile):
                    cols = slice(c0, min(c0 + tile, n_p))
                    block = _scores(buf, qs, pc, rows, cols, p_ids, pos_idx)
                    new_max = torch.maximum(run_max, block.amax(dim=1))
                    shift = torch.where(torch.isinf(new_max), torch.zeros_like(new_max), new_max)
                    run_sum.mul_(torch.exp(run_max - shift))
                    run_sum.add_(block.sub_(shift[:, None]).exp_().sum(dim=1))
                    run_max = new_max
                lse[rows] = run_max + torch.log(run_sum)
        ctx.save_for_backward(q, p, pos_idx, lse, *(() if p_ids is None else (p_ids,)))
        ctx.temperature, ctx.tile = temperature, tile
        return lse

    @staticmethod
    def backward(ctx, grad_lse):
        q, p, pos_idx, lse, *rest = ctx.saved_tensors
        p_ids = rest[0] if rest else None
        temperature, tile = ctx.temperature, ctx.tile
        dtype = lse.dtype
        n_q, n_p = q.shape[0], p.shape[0]
        with torch.autocast(q.device.type, enabled=False):
            qc, pc = q.to(dtype), p.to(dtype)
            qs = _scaled(qc, temperature)
            dq = torch.zeros_like(qc)
            dp = torch.zeros_like(pc)
            g = grad_lse.to(dtype) / temperature
            buf = _block_buffer(n_q, n_p, tile, qc)
            for r0 in range(0, n_q, tile):
                rows = slice(r0, min(r0 + tile, n_q))
                for c0 in range(0, n_p, tile):
                    cols = slice(c0, min(c0 + tile, n_p))
                    weights = _scores(buf, qs, pc, rows, cols, p_ids, pos_idx)
                    weights.sub_(lse[rows, None]).exp_().mul_(g[rows, None])  # [r, c]
                    dq[rows].addmm_(weights, pc[cols])
                    dp[cols].addmm_(weights.T, qc[rows])
        return dq.to(q.dtype), dp.to(p.dtype), None, None, None, None


def _scaled(q: Tensor, temperature: float) -> Tensor:
    """``q / temperature`` once, so the blocks need no division (``q`` itself when it is 1)."""
    return q if temperature == 1.0 else q / temperature


def _block_buffer(n_q: int, n_p: int, tile: int, like: Tensor) -> Tensor:
    """Flat storage for the largest block; ``_scores`` views a contiguous prefix of it."""
    return torch.empty(min(tile, n_q) * min(tile, n_p), dtype=like.dtype, device=like.device)


def _scores(buf, qs, p, rows, cols, p_ids, pos_idx) -> Tensor:
    """Block ``qs[rows] @ p[cols].T`` written into ``buf``, false negatives set to -inf."""
    block = buf[: (rows.stop - rows.start) * (cols.stop - cols.start)]
    block = block.view(rows.stop - rows.start, cols.stop - cols.start)  # [r, c]
    torch.mm(qs[rows], p[cols].T, out=block)
    if p_ids is not None:
        block.masked_fill_(_false_negative_mask(p_ids, pos_idx, cols, rows), float("-inf"))
    return block
