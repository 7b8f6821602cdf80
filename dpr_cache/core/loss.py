"""DPR's contrastive loss (InfoNCE) over in-batch and hard negatives, in every direction
sentence-transformers' CachedMultipleNegativesRankingLoss offers, direct or tiled (Inf-CL style).

Questions ``q`` [b, d]; passages ``p`` [P, d] grouped per question: question i's positive is row
``positive_offset + i * group_size`` (``group_size = 1 + H``), and every passage row is a
candidate for every question. Each question i is one row of the loss, its anchors' candidates
taken from the directions asked::

    query_to_passage    q_i against every passage          (always; holds the positive)
    passage_to_query    p_pos(i) against every question    (the symmetric loss)
    query_to_query      q_i against the other questions
    passage_to_passage  p_pos(i) against every passage outside question i's own group

    s(a, c)  = raw(a, c) / temperature  (+ hardness_strength * stop_grad(raw(a, c)) on the
               negatives ``hardness`` picks: in_batch, hard or all; query_to_passage only)
    joint:         loss_i = logsumexp over every direction's candidates - s(q_i, p_pos(i))
    per_direction: loss_i = mean over directions of logsumexp over its candidates - s(q_i, p_pos(i))
    loss = mean_i loss_i

``raw`` is the dot product of single-vector reps ([rows, d]) or, for multi-vector reps
([rows, L, d], one vector per token; q and p may have different L), late interaction (MaxSim,
:mod:`dpr_cache.core.similarity`): each anchor token's best match among the candidate's real
(non-zero) tokens, summed over the anchor's real tokens; a candidate without a real token scores
-1e9, constant. The guide's vectors are single vectors whatever the reps.

False negatives are masked by passage id in every direction: a candidate that holds the anchor's
passage (or, for a question, whose positive is that passage), other than the row's own positive
pair, leaves the row. A frozen guide (GIST) masks more: with the guide's unit vectors ``g``, a
candidate c leaves row i when ``g(anchor).g(c) > g(q_i).g(p_pos(i)) - margin`` (``relative``:
``- |g(q_i).g(p_pos(i))| * margin``), the positive pair itself always kept.

The tiled path never builds a [b, P] (or [b, B]) score matrix: a custom autograd function
computes each direction's per-row log-sum-exp block by block with a running max and sum, keeps
only that [b] vector, and recomputes each block in the backward. Memory is
O((b + P) * d + tile^2) whatever the directions. Multi-vector blocks hold their token scores,
[rows, La, cols, Lc]: O((b * La + P * Lc) * d + tile^2 * La * Lc), the tile cut so that one
block stays within :data:`~dpr_cache.core.similarity.TOKEN_BLOCK_ELEMENTS` token scores
(:func:`~dpr_cache.core.similarity.token_tile`).
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch import Tensor

from dpr_cache.core import similarity
from dpr_cache.core.inputs import group_size_of
from dpr_cache.core.similarity import (
    TokenBlocks,
    check_reps,
    is_multi_vector,
    loss_dtype,
    pair_scores,
    token_tile,
)

__all__ = [
    "DIRECTIONS",
    "HARDNESS",
    "PARTITIONS",
    "GUIDE_STRATEGIES",
    "Guide",
    "GuideReps",
    "InfoNCE",
    "contrastive_loss",
    "positive_indices",
    "loss_dtype",
]

DIRECTIONS = ("query_to_passage", "passage_to_query", "query_to_query", "passage_to_passage")
"""The anchors and candidates of a row; the first is always in the loss."""
SAME_SIDE = ("query_to_query", "passage_to_passage")
"""Directions whose candidates do not hold the row's positive pair (no per_direction softmax)."""
PARTITIONS = ("joint", "per_direction")
HARDNESS = ("in_batch", "hard", "all")
"""Negatives that hardness weighting boosts: other questions' passages, the row's own hard
negatives, or both (sentence-transformers' in_batch_negatives, hard_negatives, all_negatives)."""
GUIDE_STRATEGIES = ("absolute", "relative")


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


@dataclass(frozen=True)
class Guide:
    """GIST's rule: a candidate leaves a row when the guide scores it above the row's positive
    pair less ``margin`` (``absolute``), or less ``|positive| * margin`` (``relative``)."""

    margin: float = 0.0
    strategy: str = "absolute"

    def __post_init__(self) -> None:
        if self.strategy not in GUIDE_STRATEGIES:
            raise ValueError(
                f"unknown guide margin strategy {self.strategy!r}; expected one of "
                f"{GUIDE_STRATEGIES}"
            )

    def thresholds(self, positive: Tensor) -> Tensor:
        """The guide's score above which a candidate leaves each row."""
        if self.strategy == "absolute":
            return positive - self.margin
        return positive - positive.abs() * self.margin


@dataclass(frozen=True)
class GuideReps:
    """A frozen guide's vectors of the batch's rows (constants): this process's questions
    ``q`` [b, dg], every passage ``p`` [P, dg] and every question ``q_all`` [B, dg] (default
    ``q``: one process)."""

    q: Tensor
    p: Tensor
    q_all: Tensor | None = None

    def unit(self) -> GuideReps:
        """The same rows scaled to unit length (the guide scores by cosine, as GIST does)."""

        def unit(t: Tensor | None) -> Tensor | None:
            return None if t is None else F.normalize(t.detach().to(torch.float64), dim=-1)

        return GuideReps(unit(self.q), unit(self.p), unit(self.q_all))


@dataclass(frozen=True)
class InfoNCE:
    """The contrastive loss's options (``train.*``): the temperature, the tile of the tiled
    path (None: direct), the directions and their partition, hardness weighting and the guide's
    rule (None: no guide)."""

    temperature: float = 1.0
    tile_size: int | None = None
    directions: tuple[str, ...] = ("query_to_passage",)
    partition: str = "joint"
    hardness: str | None = None
    hardness_strength: float = 0.0
    guide: Guide | None = None

    def __post_init__(self) -> None:
        if self.temperature <= 0:
            raise ValueError(f"temperature must be > 0, got {self.temperature}")
        if self.tile_size is not None and self.tile_size < 1:
            raise ValueError(f"tile_size must be >= 1 or None, got {self.tile_size}")
        unknown = [d for d in self.directions if d not in DIRECTIONS]
        if unknown:
            raise ValueError(f"unknown direction {unknown[0]!r}; expected one of {DIRECTIONS}")
        if len(set(self.directions)) != len(self.directions):
            raise ValueError(f"directions repeat: {list(self.directions)}")
        if self.partition not in PARTITIONS:
            raise ValueError(f"unknown partition {self.partition!r}; expected one of {PARTITIONS}")
        same_side = [d for d in self.directions if d in SAME_SIDE]
        if self.partition == "per_direction" and same_side:
            raise ValueError(
                f"partition per_direction takes no same-side direction ({same_side[0]}): its "
                "softmax would not hold the positive pair; use partition joint"
            )
        if self.hardness is not None and self.hardness not in HARDNESS:
            raise ValueError(f"unknown hardness {self.hardness!r}; expected one of {HARDNESS}")
        if self.hardness_strength < 0:
            raise ValueError(f"hardness_strength must be >= 0, got {self.hardness_strength}")

    @property
    def needs_questions(self) -> bool:
        """Whether every rank's questions are candidates (passage_to_query, query_to_query)."""
        return any(d in ("passage_to_query", "query_to_query") for d in self.directions)

    def __call__(
        self,
        q: Tensor,
        p: Tensor,
        *,
        p_ids: Tensor | None = None,
        group_size: int | None = None,
        positive_offset: int = 0,
        q_all: Tensor | None = None,
        q_offset: int = 0,
        guide: GuideReps | None = None,
    ) -> Tensor:
        """The loss of questions ``q`` against passages ``p`` (and questions ``q_all``, default
        ``q``, where this process's question 0 is row ``q_offset``). ``guide``: the guide's
        vectors of the same rows, needed when :attr:`guide` is set."""
        _check(q, p, p_ids)
        if p_ids is not None:
            p_ids = p_ids.to(q.device)
        if q_all is None:
            q_all, q_offset = q, 0
        if self.guide is not None and guide is None:
            raise ValueError(
                "a guided loss needs the guide's vectors of the batch (guide_q, guide_p)"
            )
        n_q = q.shape[0]
        pos = positive_indices(
            n_q, p.shape[0], group_size=group_size, positive_offset=positive_offset, device=q.device
        )
        group = group_size if group_size is not None else p.shape[0] // n_q
        rows = _Rows(q, p, q_all, pos, group, q_offset, p_ids, self._guide_view(guide, pos))
        lses = [self._lse(direction, rows) for direction in self.directions]
        if len(lses) == 1:
            lse = lses[0]
        elif self.partition == "joint":
            lse = torch.logsumexp(torch.stack(lses), dim=0)
        else:
            lse = torch.stack(lses).mean(dim=0)
        positive = pair_scores(q, p[pos]) / self.temperature
        return (lse - positive).mean()

    def _guide_view(self, guide: GuideReps | None, pos: Tensor) -> _GuideView | None:
        if self.guide is None or guide is None:
            return None
        unit = guide.unit()
        q_all = unit.q if unit.q_all is None else unit.q_all
        positives = unit.p[pos.to(unit.p.device)]
        threshold = self.guide.thresholds((unit.q * positives).sum(-1))
        return _GuideView(unit.q, positives, q_all, unit.p, threshold)

    def _lse(self, direction: str, r: _Rows) -> Tensor:
        """Each row's log-sum-exp over ``direction``'s candidates, [b]."""
        n = r.q.shape[0]
        q_rows = r.q_offset + torch.arange(n, device=r.q.device)
        own_lo, own_hi = r.pos, r.pos + r.group
        pos_ids = None if r.p_ids is None else r.p_ids[r.pos]
        all_q_ids = None if r.p_ids is None else _question_ids(r.p_ids, r.group, r.q_all.shape[0])
        g = r.guide
        if direction == "query_to_passage":
            anchors, cands = r.q, r.p
            rule = _Rule(keep=r.pos, own=(own_lo, own_hi), a_ids=pos_ids, c_ids=r.p_ids)
            rule.boost = (self.hardness, self.hardness_strength) if self.hardness else None
            rule.guide = None if g is None else (g.q, g.p_all, g.threshold)
        elif direction == "passage_to_query":
            anchors, cands = r.p[r.pos], r.q_all
            rule = _Rule(keep=q_rows, a_ids=pos_ids, c_ids=all_q_ids)
            rule.guide = None if g is None else (g.positives, g.q_all, g.threshold)
        elif direction == "query_to_query":
            anchors, cands = r.q, r.q_all
            rule = _Rule(own=(q_rows, q_rows + 1), drop_own=True, a_ids=pos_ids, c_ids=all_q_ids)
            rule.guide = None if g is None else (g.q, g.q_all, g.threshold)
        else:  # passage_to_passage
            anchors, cands = r.p[r.pos], r.p
            rule = _Rule(own=(own_lo, own_hi), drop_own=True, a_ids=pos_ids, c_ids=r.p_ids)
            rule.guide = None if g is None else (g.positives, g.p_all, g.threshold)
        if self.tile_size is None:
            return _direct_lse(anchors, cands, rule, self.temperature)
        if is_multi_vector(anchors):
            tile = token_tile(self.tile_size, anchors.shape[1], cands.shape[1])
            return _TiledMaxSimLSE.apply(anchors, cands, rule, self.temperature, tile)
        return _TiledLSE.apply(anchors, cands, rule, self.temperature, self.tile_size)


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
    """DPR's loss: mean over questions of ``logsumexp_j s_ij - s_i,pos`` (query_to_passage).

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

    :class:`InfoNCE` takes every other option (directions, hardness, a guide).
    """
    spec = InfoNCE(temperature=temperature, tile_size=tile_size)
    return spec(q_reps, p_reps, p_ids=p_ids, group_size=group_size, positive_offset=positive_offset)


@dataclass(frozen=True)
class _GuideView:
    """The guide's unit vectors as the directions read them, and each row's threshold."""

    q: Tensor  # this process's questions [b, dg]
    positives: Tensor  # this process's positives [b, dg]
    q_all: Tensor  # every question [B, dg]
    p_all: Tensor  # every passage [P, dg]
    threshold: Tensor  # [b]


@dataclass(frozen=True)
class _Rows:
    """What the directions read: anchors, candidates, positives, ids, the guide's view."""

    q: Tensor
    p: Tensor
    q_all: Tensor
    pos: Tensor
    group: int
    q_offset: int
    p_ids: Tensor | None
    guide: _GuideView | None


def _question_ids(p_ids: Tensor, group: int, n_questions: int) -> Tensor:
    """Each question's positive passage id (a question stands for its positive)."""
    return p_ids[torch.arange(n_questions, device=p_ids.device) * group]


class _Rule:
    """Which candidates of a block leave each row, and which the hardness weighting boosts.

    ``keep`` [n]: the column of the row's positive pair (never masked by id or by the guide;
    None: no such column). ``own`` ([n], [n]): the row's own columns ``[lo, hi)``, dropped when
    ``drop_own``, else the span hardness weighting reads. ``a_ids`` [n] / ``c_ids`` [m]: the
    passage an anchor and a candidate stand for. ``boost``: (hardness, strength). ``guide``:
    (anchors' unit vectors [n, dg], candidates' [m, dg], thresholds [n]).
    """

    def __init__(self, *, keep=None, own=None, drop_own=False, a_ids=None, c_ids=None):
        self.keep, self.own, self.drop_own = keep, own, drop_own
        self.a_ids, self.c_ids = a_ids, c_ids
        self.boost: tuple[str, float] | None = None
        self.guide: tuple[Tensor, Tensor, Tensor] | None = None

    def _keep(self, rows: slice, col: Tensor) -> Tensor | None:
        return None if self.keep is None else self.keep[rows, None] == col

    def _own(self, rows: slice, col: Tensor) -> Tensor:
        return (col >= self.own[0][rows, None]) & (col < self.own[1][rows, None])

    def excluded(self, rows: slice, cols: slice, device) -> Tensor | None:
        """[r, c] bool: True where the candidate leaves the row (None: none does)."""
        by_id = self.a_ids is not None and self.c_ids is not None
        if not (by_id or self.drop_own or self.guide is not None):
            return None
        col = torch.arange(cols.start, cols.stop, device=device)[None, :]
        keep = self._keep(rows, col)
        out = None
        if by_id:
            out = self.c_ids[cols][None, :] == self.a_ids[rows, None]
            if keep is not None:
                out &= ~keep
        if self.drop_own:
            own = self._own(rows, col)
            out = own if out is None else out | own
        if self.guide is not None:
            ga, gc, threshold = self.guide
            above = (ga[rows] @ gc[cols].T) > threshold[rows, None]
            if keep is not None:
                above &= ~keep
            out = above if out is None else out | above
        return out

    def boosted(self, rows: slice, cols: slice, device) -> Tensor | None:
        """[r, c] bool: the negatives hardness weighting boosts (None: no weighting)."""
        if self.boost is None or self.boost[1] == 0.0:
            return None
        col = torch.arange(cols.start, cols.stop, device=device)[None, :]
        mode = self.boost[0]
        if mode == "in_batch":
            return ~self._own(rows, col)
        if mode == "hard":
            return self._own(rows, col) & ~self._keep(rows, col)
        return ~self._keep(rows, col)


def _direct_lse(anchors: Tensor, cands: Tensor, rule: _Rule, temperature: float) -> Tensor:
    """Each row's log-sum-exp over the whole [n, m] score matrix (autograd throughout; for
    multi-vector reps it builds all [n, La, m, Lc] token scores)."""
    n, m = anchors.shape[0], cands.shape[0]
    rows, cols = slice(0, n), slice(0, m)
    raw = similarity.scores(anchors, cands)
    scores = raw / temperature
    boosted = rule.boosted(rows, cols, anchors.device)
    if boosted is not None:
        scores = scores + rule.boost[1] * raw.detach() * boosted
    excluded = rule.excluded(rows, cols, anchors.device)
    if excluded is None:
        return torch.logsumexp(scores, dim=1)
    empty = excluded.all(dim=1, keepdim=True)  # a row with no candidate: -inf, no gradient
    scores = scores.masked_fill(excluded & ~empty, float("-inf"))
    lse = torch.logsumexp(scores, dim=1)
    return lse.masked_fill(empty.squeeze(1), float("-inf"))


class _TiledLSE(torch.autograd.Function):
    """Per-row log-sum-exp of ``anchors @ cands.T / temperature`` under ``rule``, tiled.

    Forward keeps only the [n] result; backward recomputes each [tile, tile] block of scores
    and accumulates ``da = sum_j w_ij c_j`` and ``dc = sum_i w_ij a_i`` with
    ``w_ij = grad_i * softmax_ij / temperature`` (hardness's term is a constant). Every block
    is written into one reused ``tile * tile`` buffer and transformed in place, so no
    block-sized tensor is allocated per block (on CPU each fresh allocation costs page faults
    comparable to the elementwise work).
    """

    @staticmethod
    def forward(ctx, a, c, rule, temperature, tile):  # noqa: D401
        dtype = loss_dtype(a)
        n, m = a.shape[0], c.shape[0]
        lse = torch.empty(n, dtype=dtype, device=a.device)
        with torch.autocast(a.device.type, enabled=False):
            a_s, cc = _scaled(a.to(dtype), temperature), c.to(dtype)
            buf = _block_buffer(n, m, tile, a_s)
            for r0 in range(0, n, tile):
                rows = slice(r0, min(r0 + tile, n))
                run_max = torch.full((rows.stop - r0,), float("-inf"), dtype=dtype, device=a.device)
                run_sum = torch.zeros_like(run_max)
                for c0 in range(0, m, tile):
                    cols = slice(c0, min(c0 + tile, m))
                    block = _scores(buf, a_s, cc, rows, cols, rule, temperature)
                    run_max = _running_update(run_max, run_sum, block)
                lse[rows] = run_max + torch.log(run_sum)
        ctx.save_for_backward(a, c, lse)
        ctx.rule, ctx.temperature, ctx.tile = rule, temperature, tile
        return lse

    @staticmethod
    def backward(ctx, grad_lse):
        a, c, lse = ctx.saved_tensors
        rule, temperature, tile = ctx.rule, ctx.temperature, ctx.tile
        dtype = lse.dtype
        n, m = a.shape[0], c.shape[0]
        # a row with no candidate (lse -inf) sends no gradient: exp(-inf - inf) = 0
        lse = lse.masked_fill(torch.isneginf(lse), float("inf"))
        with torch.autocast(a.device.type, enabled=False):
            ac, cc = a.to(dtype), c.to(dtype)
            a_s = _scaled(ac, temperature)
            da = torch.zeros_like(ac)
            dc = torch.zeros_like(cc)
            g = grad_lse.to(dtype) / temperature
            buf = _block_buffer(n, m, tile, ac)
            for r0 in range(0, n, tile):
                rows = slice(r0, min(r0 + tile, n))
                for c0 in range(0, m, tile):
                    cols = slice(c0, min(c0 + tile, m))
                    weights = _scores(buf, a_s, cc, rows, cols, rule, temperature)
                    weights.sub_(lse[rows, None]).exp_().mul_(g[rows, None])  # [r, c]
                    da[rows].addmm_(weights, cc[cols])
                    dc[cols].addmm_(weights.T, ac[rows])
        return da.to(a.dtype), dc.to(c.dtype), None, None, None


class _TiledMaxSimLSE(torch.autograd.Function):
    """:class:`_TiledLSE` for multi-vector reps: per-row log-sum-exp of
    ``MaxSim(a_i, c_j) / temperature`` under ``rule``, one block of ``tile`` rows by ``tile``
    candidates at a time (each block's [tile, La, tile, Lc] token scores in one reused buffer).

    Backward recomputes each block with the winning candidate token of every (row, anchor token,
    candidate) and sends ``w_ij = grad_i * softmax_ij / temperature`` through it
    (:meth:`TokenBlocks.accumulate`); hardness's term is a constant there, as in ``_TiledLSE``.
    """

    @staticmethod
    def forward(ctx, a, c, rule, temperature, tile):  # noqa: D401
        dtype = loss_dtype(a)
        n, m = a.shape[0], c.shape[0]
        lse = torch.empty(n, dtype=dtype, device=a.device)
        with torch.autocast(a.device.type, enabled=False):
            blocks = TokenBlocks(a.to(dtype), c.to(dtype), tile)
            for rows in _slices(n, tile):
                shape = (rows.stop - rows.start,)
                run_max = torch.full(shape, float("-inf"), dtype=dtype, device=a.device)
                run_sum = torch.zeros_like(run_max)
                for cols in _slices(m, tile):
                    raw = blocks.raw(rows, cols).div_(temperature)
                    block = _apply_rule(raw, rows, cols, rule, temperature)
                    run_max = _running_update(run_max, run_sum, block)
                lse[rows] = run_max + torch.log(run_sum)
        ctx.save_for_backward(a, c, lse)
        ctx.rule, ctx.temperature, ctx.tile = rule, temperature, tile
        return lse

    @staticmethod
    def backward(ctx, grad_lse):
        a, c, lse = ctx.saved_tensors
        rule, temperature, tile = ctx.rule, ctx.temperature, ctx.tile
        dtype = lse.dtype
        # a row with no candidate (lse -inf) sends no gradient: exp(-inf - inf) = 0
        lse = lse.masked_fill(torch.isneginf(lse), float("inf"))
        with torch.autocast(a.device.type, enabled=False):
            blocks = TokenBlocks(a.to(dtype), c.to(dtype), tile)
            da, dc = torch.zeros_like(blocks.a), torch.zeros_like(blocks.c)
            g = grad_lse.to(dtype) / temperature
            for rows in _slices(a.shape[0], tile):
                for cols in _slices(c.shape[0], tile):
                    raw, argmax = blocks.raw_with_argmax(rows, cols)
                    weights = _apply_rule(raw.div_(temperature), rows, cols, rule, temperature)
                    weights.sub_(lse[rows, None]).exp_().mul_(g[rows, None])  # [r, c]
                    blocks.accumulate(rows, cols, weights, argmax, da, dc)
        return da.to(a.dtype), dc.to(c.dtype), None, None, None


def _slices(n: int, tile: int) -> list[slice]:
    """``[0, n)`` cut into slices of ``tile`` (the last one shorter)."""
    return [slice(start, min(start + tile, n)) for start in range(0, n, tile)]


def _running_update(run_max: Tensor, run_sum: Tensor, block: Tensor) -> Tensor:
    """Fold ``block`` [r, c] (overwritten) into each row's running max and sum of
    ``exp(score - max)``; ``run_sum`` is updated in place, the new max returned."""
    new_max = torch.maximum(run_max, block.amax(dim=1))
    shift = torch.where(torch.isinf(new_max), torch.zeros_like(new_max), new_max)
    run_sum.mul_(torch.exp(run_max - shift))
    run_sum.add_(block.sub_(shift[:, None]).exp_().sum(dim=1))
    return new_max


def _scaled(a: Tensor, temperature: float) -> Tensor:
    """``a / temperature`` once, so the blocks need no division (``a`` itself when it is 1)."""
    return a if temperature == 1.0 else a / temperature


def _block_buffer(n: int, m: int, tile: int, like: Tensor) -> Tensor:
    """Flat storage for the largest block; ``_scores`` views a contiguous prefix of it."""
    return torch.empty(min(tile, n) * min(tile, m), dtype=like.dtype, device=like.device)


def _scores(buf, a_s, c, rows, cols, rule: _Rule, temperature: float) -> Tensor:
    """Block ``a_s[rows] @ c[cols].T`` written into ``buf``, hardness's term added to the
    boosted negatives, excluded candidates set to -inf."""
    block = buf[: (rows.stop - rows.start) * (cols.stop - cols.start)]
    block = block.view(rows.stop - rows.start, cols.stop - cols.start)  # [r, c]
    torch.mm(a_s[rows], c[cols].T, out=block)
    return _apply_rule(block, rows, cols, rule, temperature)


def _apply_rule(block: Tensor, rows: slice, cols: slice, rule: _Rule, temperature: float) -> Tensor:
    """Scores ``block`` [r, c] (raw / temperature) with hardness's term added to the boosted
    negatives and excluded candidates set to -inf, in place."""
    boosted = rule.boosted(rows, cols, block.device)
    if boosted is not None:  # raw / T + alpha * raw = block * (1 + alpha * T), in block's dtype
        block.mul_(boosted.to(block.dtype).mul_(rule.boost[1] * temperature).add_(1.0))
    excluded = rule.excluded(rows, cols, block.device)
    if excluded is not None:
        block.masked_fill_(excluded, float("-inf"))
    return block


def _check(q_reps: Tensor, p_reps: Tensor, p_ids: Tensor | None) -> None:
    """Both reps [rows, d] or both [rows, L, d] with one d; one id a passage row."""
    check_reps(q_reps, p_reps, ("q_reps", "p_reps"))
    if p_ids is not None and tuple(p_ids.shape) != (p_reps.shape[0],):
        raise ValueError(
            f"p_ids must have one id per passage row ({p_reps.shape[0]}), got shape "
            f"{tuple(p_ids.shape)}"
        )
