"""contrastive_loss: direct path against a loop-by-loop reference; tiled path against direct."""

from __future__ import annotations

import math

import pytest
import torch

from dpr_cache.core.loss import contrastive_loss


def reference_loss(q, p, temperature, p_ids, group):
    """DESIGN.md section 2 written out one question at a time, with plain Python sums."""
    total = 0.0
    for i in range(q.shape[0]):
        pos = i * group
        terms = []
        for j in range(p.shape[0]):
            if p_ids is not None and j != pos and int(p_ids[j]) == int(p_ids[pos]):
                continue  # a copy of question i's positive: a false negative
            terms.append(float(q[i] @ p[j]) / temperature)
        s_pos = float(q[i] @ p[pos]) / temperature
        top = max(terms)
        total += top + math.log(sum(math.exp(t - top) for t in terms)) - s_pos
    return total / q.shape[0]


def make(n_q=13, group=3, dim=8, seed=0, duplicates=True):
    gen = torch.Generator().manual_seed(seed)
    q = torch.randn(n_q, dim, generator=gen, dtype=torch.float64)
    p = torch.randn(n_q * group, dim, generator=gen, dtype=torch.float64)
    p_ids = torch.arange(n_q * group) + 1000
    if duplicates:
        # question 0's positive is also question 1's hard negative and question 2's positive;
        # with enough rows, a hard negative is shared by two questions too
        p_ids[1 * group + group - 1] = p_ids[0]
        p_ids[2 * group] = p_ids[0]
        if n_q >= 8:
            p_ids[3 * group + 1] = p_ids[7 * group + 1]
        # copies of one passage embed alike but not identically (dropout): near, not equal
        first = {}
        for j, pid in enumerate(p_ids.tolist()):
            if pid in first:
                p[j] = p[first[pid]] + 0.01 * torch.randn(dim, generator=gen, dtype=p.dtype)
            first.setdefault(pid, j)
    q = 0.5 * q + p[::group]  # a half-trained encoder: each question leans to its positive
    return q.requires_grad_(), p.requires_grad_(), p_ids


@pytest.mark.parametrize("temperature", [1.0, 0.05])
@pytest.mark.parametrize("with_ids", [False, True])
def test_direct_matches_loop_reference(temperature, with_ids):
    q, p, p_ids = make()
    ids = p_ids if with_ids else None
    loss = contrastive_loss(q, p, temperature=temperature, p_ids=ids)
    expected = reference_loss(q.detach(), p.detach(), temperature, ids, 3)
    assert loss.item() == pytest.approx(expected, rel=1e-12)


def test_masking_changes_the_loss():
    """Negative control: the duplicated ids must matter, or the masking test proves nothing."""
    q, p, p_ids = make()
    masked = contrastive_loss(q, p, p_ids=p_ids)
    unmasked = contrastive_loss(q, p)
    assert abs(masked.item() - unmasked.item()) > 1e-3


def test_direct_gradient_passes_gradcheck():
    q, p, p_ids = make(n_q=4, group=2, dim=3)
    assert torch.autograd.gradcheck(
        lambda a, b: contrastive_loss(a, b, p_ids=p_ids, temperature=0.5), (q, p)
    )


@pytest.mark.parametrize("tile", [1, 4, 5, 16, 1000])
@pytest.mark.parametrize("temperature", [1.0, 0.05])
@pytest.mark.parametrize("with_ids", [False, True])
def test_tiled_equals_direct(tile, temperature, with_ids):
    q, p, p_ids = make()
    ids = p_ids if with_ids else None
    direct = contrastive_loss(q, p, temperature=temperature, p_ids=ids)
    dq, dp = torch.autograd.grad(direct, [q, p])
    tiled = contrastive_loss(q, p, temperature=temperature, p_ids=ids, tile_size=tile)
    tq, tp = torch.autograd.grad(tiled, [q, p])
    assert tiled.item() == pytest.approx(direct.item(), rel=1e-12)
    torch.testing.assert_close(tq, dq, rtol=1e-10, atol=1e-12)
    torch.testing.assert_close(tp, dp, rtol=1e-10, atol=1e-12)


def test_tiled_passes_gradcheck_with_upstream_grad():
    """The custom backward is checked against finite differences, not only against direct."""
    q, p, p_ids = make(n_q=5, group=2, dim=3)
    assert torch.autograd.gradcheck(
        lambda a, b: 3.0 * contrastive_loss(a, b, p_ids=p_ids, tile_size=3, temperature=0.3),
        (q, p),
    )


def test_offset_and_group_size_select_gathered_positives():
    """Local questions against gathered passages: rank 1 of 2 sees its positives offset."""
    q, p, p_ids = make(n_q=6, group=2)
    full = contrastive_loss(q, p, p_ids=p_ids)
    halves = [
        contrastive_loss(
            q[r * 3 : (r + 1) * 3], p, p_ids=p_ids, group_size=2, positive_offset=r * 6
        )
        for r in range(2)
    ]
    assert ((halves[0] + halves[1]) / 2).item() == pytest.approx(full.item(), rel=1e-12)
    tiled = contrastive_loss(q[3:], p, p_ids=p_ids, group_size=2, positive_offset=6, tile_size=4)
    assert tiled.item() == pytest.approx(halves[1].item(), rel=1e-12)


def test_bad_shapes_are_named():
    q, p, _ = make(n_q=4, group=2)
    with pytest.raises(ValueError, match="multiple of question rows"):
        contrastive_loss(q, p[:-1])
    with pytest.raises(ValueError, match="dim"):
        contrastive_loss(q, p[:, :-1])
    with pytest.raises(ValueError, match="p_ids"):
        contrastive_loss(q, p, p_ids=torch.arange(3))
    with pytest.raises(ValueError, match="tile_size"):
        contrastive_loss(q, p, tile_size=0)
