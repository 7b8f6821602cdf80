"""Distillation losses: their values against formulas written out here (and torch's ``kl_div``),
and their gradients under GradCache against plain full-batch autograd, in float64."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

from dpr_cache.core.accumulate import Accumulate, FullBatch
from dpr_cache.core.distill import Distillation, distill_kl, group_scores, margin_mse, mixed_loss
from dpr_cache.core.loss import InfoNCE
from dpr_cache.core.objective import Objective, make_loss_fn
from dpr_cache.core.steppers import Towers, make_stepper
from tests.core.test_engine import N_Q, grads, make_batch, make_model, max_relative_error
from tests.core.test_loss import make
from tests.core.test_loss import reference_loss as reference_contrastive

LOSSES = ["distill_kl", "margin_mse"]


def teacher_for(n_rows: int, seed: int = 7) -> torch.Tensor:
    gen = torch.Generator().manual_seed(seed)
    return 3.0 * torch.randn(n_rows, generator=gen, dtype=torch.float64)


def reference_terms(q, p, t, *, group, temperature, teacher_temperature, kind):
    """Each question's distillation term, one question and one passage at a time (autograd
    flows through ``q`` and ``p``)."""
    terms = []
    for i in range(q.shape[0]):
        rows = range(i * group, (i + 1) * group)
        s = [torch.dot(q[i], p[j]) / temperature for j in rows]
        ts = [float(t[j]) for j in rows]
        if kind == "distill_kl":
            top_t = max(ts)
            exp_t = [
                torch.tensor((x - top_t) / teacher_temperature, dtype=torch.float64).exp()
                for x in ts
            ]
            pt = [e / sum(exp_t) for e in exp_t]
            log_norm = torch.logsumexp(torch.stack(s), dim=0)
            terms.append(sum(pt[g] * (pt[g].log() - (s[g] - log_norm)) for g in range(group)))
        else:
            diffs = [((s[0] - s[h]) - (ts[0] - ts[h])) ** 2 for h in range(1, group)]
            terms.append(sum(diffs) / (group - 1))
    return terms


def reference_contrastive_autograd(q, p, *, group, temperature, p_ids):
    """Section 2's loss, one question at a time, with autograd through it."""
    total = 0
    for i in range(q.shape[0]):
        pos = i * group
        keep = [
            j
            for j in range(p.shape[0])
            if p_ids is None or j == pos or int(p_ids[j]) != int(p_ids[pos])
        ]
        s = torch.stack([torch.dot(q[i], p[j]) / temperature for j in keep])
        total = total + torch.logsumexp(s, dim=0) - torch.dot(q[i], p[pos]) / temperature
    return total / q.shape[0]


def reference_mixed(
    q, p, t, *, group, temperature, kind, weight, teacher_temperature=1.0, p_ids=None
):
    """``weight * contrastive + (1 - weight) * mean_i term_i``, written out."""
    terms = reference_terms(
        q,
        p,
        t,
        group=group,
        temperature=temperature,
        teacher_temperature=teacher_temperature,
        kind=kind,
    )
    distill = sum(terms) / len(terms)
    if weight == 0:
        return distill
    contrastive = reference_contrastive_autograd(
        q, p, group=group, temperature=temperature, p_ids=p_ids
    )
    return weight * contrastive + (1 - weight) * distill


# -- values -------------------------------------------------------------------------------


@pytest.mark.parametrize("kind", LOSSES)
@pytest.mark.parametrize("group", [2, 4])
@pytest.mark.parametrize("temperature", [1.0, 0.3])
def test_loss_value_equals_the_formula(kind, group, temperature):
    q, p, _ = make(n_q=5, group=group, duplicates=False)
    t = teacher_for(p.shape[0])
    student = group_scores(q, p, group_size=group, temperature=temperature)
    got = (
        distill_kl(student, t, teacher_temperature=2.0)
        if kind == "distill_kl"
        else margin_mse(student, t)
    )
    terms = reference_terms(
        q, p, t, group=group, temperature=temperature, teacher_temperature=2.0, kind=kind
    )
    want = sum(terms) / len(terms)
    assert float(got.detach()) == pytest.approx(float(want.detach()), rel=1e-12)


@pytest.mark.parametrize("teacher_temperature", [1.0, 0.5, 4.0])
def test_distill_kl_equals_torch_kl_div(teacher_temperature):
    q, p, _ = make(n_q=6, group=4, duplicates=False)
    t = teacher_for(p.shape[0])
    student = group_scores(q, p, group_size=4, temperature=0.7)
    target = torch.softmax(t.view(6, 4) / teacher_temperature, dim=1)
    want = F.kl_div(torch.log_softmax(student, dim=1), target, reduction="batchmean")
    got = distill_kl(student, t, teacher_temperature=teacher_temperature)
    assert float(got.detach()) == pytest.approx(float(want.detach()), rel=1e-12)
    (g_got,) = torch.autograd.grad(got, q, retain_graph=True)
    (g_want,) = torch.autograd.grad(want, q)
    assert torch.allclose(g_got, g_want, rtol=1e-12, atol=1e-14)


def test_distill_kl_is_zero_when_the_student_matches_the_teacher():
    q, p, _ = make(n_q=4, group=3, duplicates=False)
    student = group_scores(q, p, group_size=3).detach()
    assert distill_kl(student, student.flatten(), teacher_temperature=1.0).item() < 1e-14
    assert distill_kl(student, student.flatten(), teacher_temperature=3.0).item() > 1e-3
    assert margin_mse(student, student.flatten() + 5.0).item() < 1e-20  # margins only count


@pytest.mark.parametrize("kind", LOSSES)
@pytest.mark.parametrize("weight", [0.0, 0.25])
@pytest.mark.parametrize("tile", [None, 4])
def test_mixed_loss_value_and_gradient_equal_the_formula(kind, weight, tile):
    q, p, p_ids = make(n_q=7, group=3)
    t = teacher_for(p.shape[0])
    spec = Distillation(kind, weight=weight, teacher_temperature=0.5)
    got = mixed_loss(
        q,
        p,
        group_size=3,
        temperature=0.3,
        tile_size=tile,
        distillation=spec,
        p_ids=p_ids,
        teacher_scores=t,
    )
    want = reference_mixed(
        q,
        p,
        t,
        group=3,
        temperature=0.3,
        kind=kind,
        weight=weight,
        teacher_temperature=0.5,
        p_ids=p_ids,
    )
    if weight:  # the written-out contrastive part against the loss tests' own reference
        contrastive = reference_contrastive(q.detach(), p.detach(), 0.3, p_ids, 3)
        alone = reference_mixed(
            q, p, t, group=3, temperature=0.3, kind=kind, weight=0.0, teacher_temperature=0.5
        )
        mixed = weight * contrastive + (1 - weight) * float(alone.detach())
        assert float(want.detach()) == pytest.approx(mixed, rel=1e-12)
    assert got.detach().item() == pytest.approx(want.detach().item(), rel=1e-12)
    got_g = torch.autograd.grad(got, [q, p])
    want_g = torch.autograd.grad(want, [q, p])
    for a, b in zip(got_g, want_g, strict=True):
        assert torch.allclose(a, b, rtol=1e-10, atol=1e-12)


def test_contrastive_rows_of_other_ranks_and_local_groups():
    """A rank's slice of questions: the contrastive part over all rows at the rank's offset,
    the group terms over its own rows; the mean over ranks is the whole batch's loss."""
    q, p, p_ids = make(n_q=6, group=2)
    t = teacher_for(p.shape[0])
    spec = Distillation("distill_kl", weight=0.5)
    whole = mixed_loss(q, p, group_size=2, distillation=spec, p_ids=p_ids, teacher_scores=t)
    parts = [
        mixed_loss(
            q[r * 3 : (r + 1) * 3],
            p[r * 6 : (r + 1) * 6],
            group_size=2,
            distillation=spec,
            teacher_scores=t[r * 6 : (r + 1) * 6],
            all_p_reps=p,
            all_p_ids=p_ids,
            positive_offset=r * 6,
        )
        for r in range(2)
    ]
    assert (sum(parts) / 2).item() == pytest.approx(whole.item(), rel=1e-12)


def test_bad_arguments_raise():
    q, p, _ = make(n_q=3, group=2, duplicates=False)
    with pytest.raises(ValueError, match="teacher_scores has 5 values"):
        distill_kl(group_scores(q, p, group_size=2), torch.zeros(5))
    with pytest.raises(ValueError, match="needs teacher_scores"):
        mixed_loss(q, p, group_size=2, distillation=Distillation("margin_mse"))
    with pytest.raises(ValueError, match="at least one hard negative"):
        margin_mse(group_scores(q, p[:3], group_size=1), torch.zeros(3))
    with pytest.raises(ValueError, match="teacher_temperature"):
        Distillation("distill_kl", teacher_temperature=0.0)
    with pytest.raises(ValueError, match="unknown distillation loss"):
        Distillation("contrastive")


# -- GradCache = full batch, float64, tiny BERT ---------------------------------------------


def full_batch_reference(
    model, q_inputs, p_inputs, t, p_ids, *, group, kind, weight, temperature, teacher_temperature
):
    """One forward over the whole batch, the formula written out above, one backward."""
    model.zero_grad(set_to_none=True)
    loss = reference_mixed(
        model.encode_query(q_inputs),
        model.encode_passage(p_inputs),
        t,
        group=group,
        temperature=temperature,
        kind=kind,
        weight=weight,
        teacher_temperature=teacher_temperature,
        p_ids=p_ids,
    )
    loss.backward()
    return loss.item(), grads(model)


def stepper_grads(
    mode, model, q_inputs, p_inputs, t, p_ids, *, chunk, group, spec, tile, temperature
):
    model.zero_grad(set_to_none=True)
    loss_fn = make_loss_fn(Objective(group, InfoNCE(temperature, tile), spec))
    towers = Towers(model.encode_query, model.encode_passage)
    stepper = make_stepper(mode, towers, loss_fn, chunk_size=chunk)
    loss = stepper.step(q_inputs, p_inputs, p_ids=p_ids, teacher_scores=t)
    return loss.item(), grads(model)


@pytest.mark.parametrize("kind", LOSSES)
@pytest.mark.parametrize(("weight", "tile"), [(0.0, None), (0.3, None), (0.3, 4)])
@pytest.mark.parametrize("chunk", [3, N_Q])
@pytest.mark.parametrize("hard_negatives", [1, 3])
@pytest.mark.parametrize("shared", [False, True])
def test_gradcache_equals_full_batch(kind, weight, tile, chunk, hard_negatives, shared):
    model = make_model(shared=shared)
    q_inputs, p_inputs, p_ids = make_batch(hard_negatives)
    group = 1 + hard_negatives
    t = teacher_for(N_Q * group)
    setting = dict(group=group, temperature=0.4)
    want_loss, want = full_batch_reference(
        model,
        q_inputs,
        p_inputs,
        t,
        p_ids,
        kind=kind,
        weight=weight,
        teacher_temperature=2.0,
        **setting,
    )
    spec = Distillation(kind, weight=weight, teacher_temperature=2.0)
    got_loss, got = stepper_grads(
        "gradcache",
        model,
        q_inputs,
        p_inputs,
        t,
        p_ids,
        chunk=chunk,
        spec=spec,
        tile=tile,
        **setting,
    )
    assert len(want) == len([p for p in model.parameters() if p.requires_grad])
    assert got_loss == pytest.approx(want_loss, rel=1e-12)
    assert max_relative_error(got, want) < 1e-10


@pytest.mark.parametrize("kind", LOSSES)
def test_accumulate_equals_full_batch_for_distillation_alone(kind):
    """Distillation alone is a mean of per-question terms: accumulation is exact for it (and
    each micro-batch gets its own rows' teacher scores)."""
    model = make_model()
    q_inputs, p_inputs, p_ids = make_batch(2)
    t = teacher_for(N_Q * 3)
    spec = Distillation(kind)
    loss_fn = make_loss_fn(Objective(3, InfoNCE(0.5), spec))
    model.zero_grad(set_to_none=True)
    FullBatch(model.encode_query, model.encode_passage, loss_fn).step(
        q_inputs, p_inputs, teacher_scores=t
    )
    want = grads(model)
    model.zero_grad(set_to_none=True)
    Accumulate(model.encode_query, model.encode_passage, loss_fn, 3).step(
        q_inputs, p_inputs, p_ids=p_ids, teacher_scores=t
    )
    assert max_relative_error(grads(model), want) < 1e-10


CONTROLS = [
    ("distill_kl", "shuffled teacher"),
    ("distill_kl", "teacher temperature"),
    ("distill_kl", "temperature"),
    ("margin_mse", "shuffled teacher"),
    ("margin_mse", "temperature"),
]


@pytest.mark.parametrize(("kind", "control"), CONTROLS)
def test_negative_controls_change_the_gradient(kind, control):
    """The proof can fail: a shuffled teacher, another teacher temperature (distill_kl; margin_mse
    reads the teacher's raw margins) or another model temperature give another gradient."""
    model = make_model()
    q_inputs, p_inputs, p_ids = make_batch(2)
    t = teacher_for(N_Q * 3)
    _, want = full_batch_reference(
        model,
        q_inputs,
        p_inputs,
        t,
        p_ids,
        group=3,
        kind=kind,
        weight=0.0,
        temperature=0.4,
        teacher_temperature=2.0,
    )
    spec, temperature, teacher = Distillation(kind, teacher_temperature=2.0), 0.4, t
    if control == "shuffled teacher":
        teacher = t[torch.randperm(t.numel(), generator=torch.Generator().manual_seed(0))]
    elif control == "teacher temperature":
        spec = Distillation(kind, teacher_temperature=1.0)
    else:
        temperature = 1.0
    _, got = stepper_grads(
        "gradcache",
        model,
        q_inputs,
        p_inputs,
        teacher,
        p_ids,
        chunk=3,
        group=3,
        spec=spec,
        tile=None,
        temperature=temperature,
    )
    assert max_relative_error(got, want) > 1e-3


def test_group_terms_never_build_the_batch_score_matrix():
    """Distillation alone touches B * G scores: no op, forward or backward, makes a tensor with
    both a question axis (B = 8) and a passage axis (P = 24), however it is multiplied."""
    from torch.utils._python_dispatch import TorchDispatchMode

    class Shapes(TorchDispatchMode):
        def __init__(self) -> None:
            super().__init__()
            self.seen: list[tuple[int, ...]] = []

        def __torch_dispatch__(self, func, types, args=(), kwargs=None):
            out = func(*args, **(kwargs or {}))
            for t in out if isinstance(out, (tuple, list)) else [out]:
                if isinstance(t, torch.Tensor):
                    self.seen.append(tuple(t.shape))
            return out

    def b_by_p(weight: float) -> list[tuple[int, ...]]:
        q, p, _ = make(n_q=8, group=3, dim=16, duplicates=False)
        q.requires_grad_(True)
        p.requires_grad_(True)
        with Shapes() as shapes:
            loss = mixed_loss(
                q,
                p,
                group_size=3,
                teacher_scores=teacher_for(24),
                distillation=Distillation("distill_kl", weight=weight),
            )
            loss.backward()
        return [s for s in shapes.seen if 8 in s and 24 in s]

    assert b_by_p(0.0) == []
    assert b_by_p(0.5)  # the control: the contrastive part builds [B, P] scores


def test_the_tiled_mix_builds_no_block_larger_than_a_tile(monkeypatch):
    """Mixed with the tiled contrastive loss, forward and backward: only tile x tile blocks."""
    q, p, _ = make(n_q=8, group=3, duplicates=False)
    blocks, matmuls = [], []
    real_mm, real_matmul = torch.mm, torch.Tensor.__matmul__

    def mm(a, b, **kw):
        blocks.append((a.shape[0], b.shape[1]))
        return real_mm(a, b, **kw)

    def matmul(a, b):
        matmuls.append((tuple(a.shape), tuple(b.shape)))
        return real_matmul(a, b)

    monkeypatch.setattr(torch, "mm", mm)
    monkeypatch.setattr(torch.Tensor, "__matmul__", matmul)
    spec = Distillation("margin_mse", weight=0.5)
    mixed_loss(
        q, p, group_size=3, tile_size=4, distillation=spec, teacher_scores=teacher_for(24)
    ).backward()
    assert blocks and max(r for r, _ in blocks) <= 4 and max(c for _, c in blocks) <= 4
    assert matmuls == []
