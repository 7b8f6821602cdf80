"""The loss a step trains, with every option, as one spec (:class:`Objective`), and the loss
function the step objects call (:func:`make_loss_fn`).

An objective is the contrastive loss's options (:class:`~dpr_cache.core.loss.InfoNCE`: the
temperature, the tile, directions, hardness, a guide's rule), the passage rows a question
brings, a distillation loss mixed in, and Matryoshka's dims::

    loss = sum_d w_d * mixed(q[:, :d], p[:, :d])     (each prefix re-normalized when the model
                                                       normalizes; one term at the full width
                                                       without Matryoshka)

All of it is a function of the cached representations and of constants (passage ids, a
teacher's scores, a guide's vectors), so GradCache's cached gradient stays exact.

Under ``torchrun`` each rank's loss covers its own questions against the rows of every rank:
the passages (and the questions, for the directions that read them) are gathered once a step
with a gather whose backward sums the ranks' gradients; ids and guide vectors are gathered as
constants. Each rank's loss is a mean over its questions, so DDP's average gives the global
batch's mean.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field

import torch.nn.functional as F
from torch import Tensor

from dpr_cache.core.distill import Distillation, mixed_loss
from dpr_cache.core.gather import all_finite_or_nan, gather_no_grad, gather_with_grad
from dpr_cache.core.loss import GuideReps, InfoNCE

__all__ = ["Matryoshka", "Objective", "make_loss_fn", "truncated"]


def truncated(reps: Tensor, dim: int, normalize: bool) -> Tensor:
    """The first ``dim`` dims of each row, re-scaled to unit length when ``normalize``."""
    prefix = reps[..., :dim]
    return F.normalize(prefix, dim=-1) if normalize else prefix


@dataclass(frozen=True)
class Matryoshka:
    """The loss summed over the leading ``dims`` (descending) with ``weights``; each prefix
    re-normalized when ``normalize`` (the model's vectors are unit length). Single-vector reps
    only: the loss function raises on multi-vector ([rows, L, d]) reps."""

    dims: tuple[int, ...]
    weights: tuple[float, ...] | None = None
    normalize: bool = False

    def __post_init__(self) -> None:
        if not self.dims or any(d < 1 for d in self.dims):
            raise ValueError(f"matryoshka dims must be integers >= 1, got {list(self.dims)}")
        if list(self.dims) != sorted(set(self.dims), reverse=True):
            raise ValueError(f"matryoshka dims must descend, got {list(self.dims)}")
        if self.weights is not None and len(self.weights) != len(self.dims):
            raise ValueError(
                f"matryoshka weights ({len(self.weights)}) must match the dims ({len(self.dims)})"
            )

    def terms(self) -> list[tuple[int, float]]:
        """(dim, weight) of each term."""
        weights = self.weights if self.weights is not None else (1.0,) * len(self.dims)
        return list(zip(self.dims, weights, strict=True))


@dataclass(frozen=True)
class Objective:
    """The loss of a step: the contrastive options, the passage rows a question brings
    (``group_size = 1 + H``), a distillation loss and Matryoshka's dims (each None: off)."""

    group_size: int
    infonce: InfoNCE = field(default_factory=InfoNCE)
    distillation: Distillation | None = None
    matryoshka: Matryoshka | None = None

    @property
    def contrastive(self) -> bool:
        """Whether the contrastive term is computed (distillation alone drops it)."""
        return self.distillation is None or self.distillation.weight > 0

    @property
    def guided(self) -> bool:
        return self.infonce.guide is not None


def make_loss_fn(objective: Objective, *, rank: int = 0, world_size: int = 1) -> Callable:
    """``loss_fn(q_reps, p_reps, p_ids=None, teacher_scores=None, guide_q=None, guide_p=None)``:
    ``objective``'s loss of this rank's questions and passage groups against the rows of every
    rank.

    The distillation terms of a question read its own group only, which lies in this rank's
    passage rows: they use the local rows and ``teacher_scores`` ([local passage rows]).
    """

    def loss_fn(
        q_reps: Tensor,
        p_reps: Tensor,
        p_ids: Tensor | None = None,
        teacher_scores: Tensor | None = None,
        guide_q: Tensor | None = None,
        guide_p: Tensor | None = None,
    ) -> Tensor:
        if objective.guided and (guide_q is None or guide_p is None):
            raise ValueError("the loss is guided (train.guide): it needs guide_q and guide_p")
        matryoshka = objective.matryoshka
        if matryoshka is not None and (q_reps.dim() == 3 or p_reps.dim() == 3):
            raise ValueError("matryoshka truncates single vectors; multi-vector reps take none")
        rows = _gathered(objective, rank, world_size, q_reps, p_reps, p_ids, guide_q, guide_p)
        if matryoshka is None:
            loss = _mixed(objective, rows, q_reps, p_reps, p_ids, teacher_scores)
        else:
            loss = 0.0
            for dim, weight in matryoshka.terms():
                views = {k: _cut(v, dim, matryoshka.normalize) for k, v in rows.items()}
                q_cut = _cut(q_reps, dim, matryoshka.normalize)
                p_cut = _cut(p_reps, dim, matryoshka.normalize)
                term = _mixed(objective, views, q_cut, p_cut, p_ids, teacher_scores)
                loss = loss + weight * term
        return all_finite_or_nan(loss) if world_size > 1 else loss

    return loss_fn


def _cut(t, dim: int, normalize: bool):
    """A tensor of reps truncated (see :func:`truncated`); anything else as it is."""
    return truncated(t, dim, normalize) if isinstance(t, Tensor) and t.dim() == 2 else t


def _mixed(objective: Objective, rows: dict, q, p, p_ids, teacher_scores) -> Tensor:
    """One term of the loss: :func:`mixed_loss` over this rank's rows and ``rows``."""
    return mixed_loss(
        q,
        p,
        group_size=objective.group_size,
        distillation=objective.distillation,
        teacher_scores=teacher_scores,
        infonce=objective.infonce,
        p_ids=p_ids,
        **rows,
    )


def _gathered(objective, rank, world_size, q, p, p_ids, guide_q, guide_p) -> dict:
    """The rows of every rank the contrastive term reads (None: this rank's own suffice)."""
    guide = None if guide_q is None or not objective.guided else GuideReps(guide_q, guide_p)
    rows = {"all_p_reps": None, "all_p_ids": None, "all_q_reps": None, "positive_offset": 0}
    if world_size == 1 or not objective.contrastive:
        return {**rows, "guide": guide}
    needs_q = objective.infonce.needs_questions
    rows = {
        "all_p_reps": gather_with_grad(p),
        "all_p_ids": gather_no_grad(p_ids) if p_ids is not None else None,
        "all_q_reps": gather_with_grad(q) if needs_q else None,
        "positive_offset": rank * p.shape[0],
    }
    if guide is not None:
        guide = GuideReps(guide.q, gather_no_grad(guide.p), gather_no_grad(guide.q))
    return {**rows, "guide": guide}
