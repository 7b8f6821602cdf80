"""Scores of single-vector and multi-vector representations.

Single-vector reps are [rows, d] and score by dot product. Multi-vector reps are [rows, L, d],
one vector per token, and score by late interaction (ColBERT's MaxSim)::

    MaxSim(a_i, c_j) = sum over a_i's tokens t of max over c_j's real tokens u of <a_it, c_ju>

A token vector that is all zeros is padding (or masked) and every other one is real. A zero
token of ``a`` adds nothing and receives no gradient; a zero token of ``c`` never wins the max
(filled with -inf before it). A candidate with no real token scores :data:`EMPTY_SCORE`, a
constant without gradient. Multi-vector scores are computed in the loss's dtype
(:func:`loss_dtype`); single-vector ones in the reps' own, as they always were.

:class:`TokenBlocks` scores multi-vector reps one block of [rows, cols] pairs at a time, in a
reused buffer, for the tiled loss: the forward's raw scores and the backward's gradients from
the argmax of each (row, col, token).
"""

from __future__ import annotations

import math

import torch
from torch import Tensor

__all__ = [
    "EMPTY_SCORE",
    "TOKEN_BLOCK_ELEMENTS",
    "TokenBlocks",
    "check_reps",
    "group_scores",
    "is_multi_vector",
    "loss_dtype",
    "pair_scores",
    "real_tokens",
    "scores",
    "token_tile",
]

EMPTY_SCORE = -1e9
"""MaxSim of a candidate without a real token (sentence-transformers' ``_EMPTY_DOCUMENT_SCORE``):
below every real score, finite, constant."""

TOKEN_BLOCK_ELEMENTS = 2**25
"""Most token-pair scores in one block of the tiled multi-vector loss (128 MiB in fp32)."""


def loss_dtype(t: Tensor) -> torch.dtype:
    """The dtype the loss is computed in for reps of ``t``'s dtype: fp32 for half types (the
    cache and the loss stay in fp32 under autocast), else their own (fp64 stays fp64)."""
    return torch.float32 if t.dtype in (torch.float16, torch.bfloat16) else t.dtype


def is_multi_vector(t: Tensor) -> bool:
    """Whether ``t`` holds multi-vector reps [rows, L, d]."""
    return t.dim() == 3


def check_reps(a: Tensor, c: Tensor, names: tuple[str, str] = ("a", "c")) -> None:
    """Raise ValueError unless ``a`` and ``c`` are both [rows, d] or both [rows, L, d] with the
    same d (the widths L may differ)."""
    for name, t in zip(names, (a, c), strict=True):
        if t.dim() not in (2, 3):
            raise ValueError(
                f"{name} must be 2-D [rows, dim] or 3-D [rows, tokens, dim], got shape "
                f"{tuple(t.shape)}"
            )
    if a.dim() != c.dim():
        raise ValueError(
            f"{names[0]} is {a.dim()}-D and {names[1]} is {c.dim()}-D: single-vector and "
            f"multi-vector reps do not score against each other ({tuple(a.shape)} vs "
            f"{tuple(c.shape)})"
        )
    if a.shape[-1] != c.shape[-1]:
        raise ValueError(f"{names[0]} dim {a.shape[-1]} differs from {names[1]} dim {c.shape[-1]}")


def real_tokens(t: Tensor) -> Tensor:
    """[rows, L] bool: the tokens of multi-vector reps that are not all zeros."""
    return t.ne(0).any(dim=-1)


def scores(a: Tensor, c: Tensor) -> Tensor:
    """[n, m]: every row of ``a`` against every row of ``c`` (dot product, or MaxSim for
    multi-vector reps), with autograd through it. MaxSim builds [n, La, m, Lc] token scores."""
    check_reps(a, c)
    if a.dim() == 2:
        return a @ c.T
    a, c = _in_loss_dtype(a, c)
    n, la, d = a.shape
    m, lc, _ = c.shape
    sim = (a.reshape(n * la, d) @ c.reshape(m * lc, d).T).view(n, la, m, lc)
    c_real = real_tokens(c)
    return _reduce(sim, real_tokens(a), c_real.view(1, 1, m, lc), ~c_real.any(-1).view(1, m))


def pair_scores(a: Tensor, c: Tensor) -> Tensor:
    """[n]: row i of ``a`` against row i of ``c`` (dot product, or MaxSim)."""
    check_reps(a, c)
    if a.shape[0] != c.shape[0]:
        raise ValueError(f"pair_scores pairs rows: {a.shape[0]} rows against {c.shape[0]}")
    if a.dim() == 2:
        return (a * c).sum(-1)
    return group_scores(a, c.unsqueeze(1)).squeeze(1)


def group_scores(a: Tensor, groups: Tensor) -> Tensor:
    """[n, G]: row i of ``a`` against each of its own G candidates ``groups[i]`` ([n, G, d], or
    [n, G, L, d] for multi-vector reps)."""
    if groups.dim() != a.dim() + 1 or groups.shape[0] != a.shape[0]:
        raise ValueError(
            f"groups must be [rows, G, ...] with a's rows and shape, got {tuple(groups.shape)} "
            f"for a {tuple(a.shape)}"
        )
    check_reps(a, groups[:, 0])
    if a.dim() == 2:
        return torch.einsum("bd,bgd->bg", a, groups)
    a, groups = _in_loss_dtype(a, groups)
    n, la, d = a.shape
    g, lc = groups.shape[1], groups.shape[2]
    sim = torch.bmm(a, groups.reshape(n, g * lc, d).transpose(1, 2)).view(n, la, g, lc)
    c_real = real_tokens(groups)  # [n, G, Lc]
    return _reduce(sim, real_tokens(a), c_real.view(n, 1, g, lc), ~c_real.any(-1))


def _in_loss_dtype(a: Tensor, c: Tensor) -> tuple[Tensor, Tensor]:
    dtype = loss_dtype(a)
    return a.to(dtype), c.to(dtype)


def _reduce(sim: Tensor, a_real: Tensor, c_real: Tensor, c_empty: Tensor) -> Tensor:
    """MaxSim from token scores ``sim`` [n, La, k, Lc] (autograd): padded candidate tokens
    (``c_real`` False, broadcast) filled with -inf before the max over Lc, padded anchor tokens
    set to 0 (``a_real`` [n, La]) before the sum over La, empty candidates (``c_empty`` [., k])
    set to :data:`EMPTY_SCORE`. Selections, not products: no 0 * -inf."""
    best = sim.masked_fill(~c_real, float("-inf")).max(dim=-1).values  # [n, La, k]
    best = torch.where(a_real.unsqueeze(-1), best, 0.0)
    total = best.sum(dim=1)  # [n, k]
    return torch.where(c_empty, EMPTY_SCORE, total)


def token_tile(tile: int, a_width: int, c_width: int, budget: int | None = None) -> int:
    """Rows (and candidate rows) of one block of the tiled multi-vector loss: ``tile``, cut so
    that a block's ``rows * a_width * cols * c_width`` token scores stay within ``budget``
    (default :data:`TOKEN_BLOCK_ELEMENTS`); at least 1 (one pair may exceed it)."""
    budget = TOKEN_BLOCK_ELEMENTS if budget is None else budget
    side = math.isqrt(budget // max(a_width * c_width, 1))
    return max(1, min(tile, side))


class TokenBlocks:
    """Multi-vector anchors ``a`` [n, La, d] and candidates ``c`` [m, Lc, d] (contiguous, in
    the loss's dtype) scored block by block in one reused buffer of
    ``tile^2 * La * Lc`` elements at most."""

    def __init__(self, a: Tensor, c: Tensor, tile: int) -> None:
        self.a, self.c = a.contiguous(), c.contiguous()
        self.a_pad = ~real_tokens(self.a)  # [n, La]
        c_real = real_tokens(self.c)
        self.c_pad = ~c_real  # [m, Lc]
        self.c_empty = ~c_real.any(-1)  # [m]
        la, lc = a.shape[1], c.shape[1]
        r, k = min(tile, a.shape[0]), min(tile, c.shape[0])
        self.buf = torch.empty(r * la * k * lc, dtype=self.a.dtype, device=self.a.device)

    def _sim(self, rows: slice, cols: slice) -> Tensor:
        """Token scores [r, La, k, Lc] of the block, padded candidate tokens at -inf."""
        a, c = self.a[rows], self.c[cols]
        (r, la, d), (k, lc) = a.shape, c.shape[:2]
        flat = self.buf[: r * la * k * lc].view(r * la, k * lc)
        torch.mm(a.view(r * la, d), c.view(k * lc, d).T, out=flat)
        sim = flat.view(r, la, k, lc)
        return sim.masked_fill_(self.c_pad[cols].view(1, 1, k, lc), float("-inf"))

    def raw(self, rows: slice, cols: slice) -> Tensor:
        """[r, k] MaxSim of the block (a fresh tensor, no graph)."""
        best = self._sim(rows, cols).amax(dim=-1)  # [r, La, k]
        return self._total(best, rows, cols)

    def _total(self, best: Tensor, rows: slice, cols: slice) -> Tensor:
        best.masked_fill_(self.a_pad[rows].unsqueeze(-1), 0.0)
        total = best.sum(dim=1)
        return total.masked_fill_(self.c_empty[cols].unsqueeze(0), EMPTY_SCORE)

    def raw_with_argmax(self, rows: slice, cols: slice) -> tuple[Tensor, Tensor]:
        """[r, k] MaxSim of the block and the winning candidate token of each (row, anchor
        token, col) [r, La, k]."""
        best, argmax = self._sim(rows, cols).max(dim=-1)
        return self._total(best, rows, cols), argmax

    def accumulate(
        self, rows: slice, cols: slice, weights: Tensor, argmax: Tensor, da: Tensor, dc: Tensor
    ) -> None:
        """Add the block's gradients to ``da`` [n, La, d] and ``dc`` [m, Lc, d] for
        ``weights`` [r, k] = dloss/dMaxSim: each real anchor token t of row i gets
        ``w_ij * c_j,u*`` and the winning token u* gets ``w_ij * a_it``. Empty candidates
        (constant scores) send nothing."""
        a, c = self.a[rows], self.c[cols]
        (r, la, d), (k, lc) = a.shape, c.shape[:2]
        w = weights.masked_fill(self.c_empty[cols].unsqueeze(0), 0.0)  # [r, k]
        w = w.unsqueeze(1).expand(r, la, k).masked_fill(self.a_pad[rows].unsqueeze(-1), 0.0)
        flat = self.buf[: r * la * k * lc].view(r * la, k * lc).zero_()
        flat.view(r, la, k, lc).scatter_(3, argmax.unsqueeze(-1), w.unsqueeze(-1))
        da[rows].view(r * la, d).addmm_(flat, c.view(k * lc, d))
        dc[cols].view(k * lc, d).addmm_(flat.T, a.view(r * la, d))
