"""Distillation: a teacher's scores of each question's own group, learnt by the student.

Question i's group is its positive and its H hard negatives: passage rows
``positive_offset + i * G .. + G - 1`` (``G = 1 + H``). ``t`` [B, G] are the teacher's scores of
those rows (constants), ``s`` [B, G] the student's, ``s_ig = raw(q_i, p_ig) / temperature`` (the
contrastive loss's scores: a dot product, or MaxSim for multi-vector reps)::

    distill_kl = mean_i KL(softmax(t_i / teacher_temperature) || softmax(s_i))
               = mean_i sum_g pt_ig * (log pt_ig - log_softmax(s_i)_g)
    margin_mse = mean_i mean_h ((s_i0 - s_ih) - (t_i0 - t_ih))^2        (h = 1 .. H)

Mixed with the in-batch contrastive loss (:class:`~dpr_cache.core.loss.InfoNCE`) by ``weight``, the
contrastive loss's share::

    loss = weight * contrastive + (1 - weight) * distill

``weight = 0`` is distillation alone (the contrastive term, and its B x B scores, are not
computed). The group terms read B * G passage rows: O(B * G * d) work and memory, never B x B.
The teacher's scores are inputs, so the gradient stays a function of the reps alone and
GradCache's cached gradient is exact for every loss here.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
from torch import Tensor

from dpr_cache.core import similarity
from dpr_cache.core.loss import GuideReps, InfoNCE

__all__ = ["Distillation", "group_scores", "distill_kl", "margin_mse", "mixed_loss"]


@dataclass(frozen=True)
class Distillation:
    """A distillation loss: ``loss`` (``distill_kl`` or ``margin_mse``), the contrastive loss's
    share ``weight`` in the mix (0: distillation alone) and the teacher's softmax temperature
    ``teacher_temperature`` (``distill_kl``)."""

    loss: str
    weight: float = 0.0
    teacher_temperature: float = 1.0

    def __post_init__(self) -> None:
        if self.loss not in _GROUP_LOSSES:
            raise ValueError(
                f"unknown distillation loss {self.loss!r}; expected one of {tuple(_GROUP_LOSSES)}"
            )
        if self.teacher_temperature <= 0:
            raise ValueError(f"teacher_temperature must be > 0, got {self.teacher_temperature}")
        if not 0.0 <= self.weight <= 1.0:
            raise ValueError(f"weight must be in [0, 1], got {self.weight}")


def group_scores(
    q_reps: Tensor,
    p_reps: Tensor,
    *,
    group_size: int,
    temperature: float = 1.0,
    positive_offset: int = 0,
) -> Tensor:
    """``s(q_i, p_ig) / temperature`` for each question's own group [B, G]: B * G dot products,
    or B * G MaxSims for multi-vector reps ([rows, L, d])."""
    n_q = q_reps.shape[0]
    rows = positive_offset + torch.arange(n_q * group_size, device=p_reps.device)
    if n_q and (positive_offset < 0 or int(rows[-1]) >= p_reps.shape[0]):
        raise ValueError(
            f"group rows run past the passages: last row {int(rows[-1])}, "
            f"passage rows {p_reps.shape[0]}"
        )
    groups = p_reps.index_select(0, rows).view(n_q, group_size, *p_reps.shape[1:])  # [B, G, ...]
    return similarity.group_scores(q_reps, groups) / temperature


def _teacher(teacher_scores: Tensor, like: Tensor) -> Tensor:
    """The teacher's scores as [B, G] constants in the student's dtype and device."""
    t = teacher_scores.detach().to(device=like.device, dtype=like.dtype)
    if t.numel() != like.numel():
        raise ValueError(
            f"teacher_scores has {t.numel()} values; the groups have {like.numel()} rows "
            f"({tuple(like.shape)})"
        )
    return t.reshape(like.shape)


def distill_kl(student: Tensor, teacher: Tensor, *, teacher_temperature: float = 1.0) -> Tensor:
    """``mean_i KL(softmax(teacher_i / teacher_temperature) || softmax(student_i))`` over
    [B, G] scores (the student's already at its temperature)."""
    t = _teacher(teacher, student)
    target = torch.softmax(t / teacher_temperature, dim=1)
    log_student = torch.log_softmax(student, dim=1)
    kl = (torch.xlogy(target, target) - target * log_student).sum(dim=1)
    return kl.mean()


def margin_mse(student: Tensor, teacher: Tensor) -> Tensor:
    """``mean_i mean_h ((s_i0 - s_ih) - (t_i0 - t_ih))^2`` over [B, G] scores, G >= 2."""
    if student.shape[1] < 2:
        raise ValueError("margin_mse needs at least one hard negative a question")
    t = _teacher(teacher, student)
    margins = student[:, :1] - student[:, 1:]
    return ((margins - (t[:, :1] - t[:, 1:])) ** 2).mean()


def mixed_loss(
    q_reps: Tensor,
    p_reps: Tensor,
    *,
    group_size: int,
    temperature: float = 1.0,
    tile_size: int | None = None,
    distillation: Distillation | None = None,
    p_ids: Tensor | None = None,
    teacher_scores: Tensor | None = None,
    all_p_reps: Tensor | None = None,
    all_p_ids: Tensor | None = None,
    positive_offset: int = 0,
    infonce: InfoNCE | None = None,
    all_q_reps: Tensor | None = None,
    guide: GuideReps | None = None,
) -> Tensor:
    """The loss of questions ``q_reps`` whose groups are the rows of ``p_reps``: the contrastive
    loss alone (``distillation`` None) or mixed with a distillation loss.

    ``teacher_scores`` [rows of p_reps] are the teacher's scores of ``p_reps``'s rows. The
    contrastive part (``infonce``: its options, default DPR's loss at ``temperature`` and
    ``tile_size``) scores every row of ``all_p_reps`` (default ``p_reps``; under several ranks,
    the rows of every rank, question 0's positive at ``positive_offset`` there, with ids
    ``all_p_ids``) and, for the directions that read them, every question ``all_q_reps``
    (default ``q_reps``); ``guide`` holds a guide's vectors of the same rows.
    """
    if infonce is None:
        infonce = InfoNCE(temperature=temperature, tile_size=tile_size)
    contrastive = None
    if distillation is None or distillation.weight > 0:
        gathered = all_p_reps is not None
        contrastive = infonce(
            q_reps,
            all_p_reps if gathered else p_reps,
            p_ids=all_p_ids if gathered else p_ids,
            group_size=group_size,
            positive_offset=positive_offset if gathered else 0,
            q_all=all_q_reps,
            q_offset=positive_offset // group_size if gathered else 0,
            guide=guide,
        )
    if distillation is None:
        return contrastive
    if teacher_scores is None:
        raise ValueError(f"loss {distillation.loss} needs teacher_scores")
    student = group_scores(q_reps, p_reps, group_size=group_size, temperature=infonce.temperature)
    distill = _GROUP_LOSSES[distillation.loss](student, teacher_scores, distillation)
    if contrastive is None:
        return distill
    w = distillation.weight
    return w * contrastive + (1.0 - w) * distill


# each distillation loss of a student's and a teacher's group scores, by its name
_GROUP_LOSSES = {
    "distill_kl": lambda student, teacher, d: distill_kl(
        student, teacher, teacher_temperature=d.teacher_temperature
    ),
    "margin_mse": lambda student, teacher, d: margin_mse(student, teacher),
}
