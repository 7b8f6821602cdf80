"""The contrastive loss's options (directions, partition, hardness, a guide, Matryoshka), direct
and tiled, against a reference written out one row and one candidate at a time in float64 with
autograd through it; and GradCache over each option against the plain full batch."""

from __future__ import annotations

import itertools

import pytest
import torch
import torch.nn.functional as F

from dpr_cache.core.distill import Distillation
from dpr_cache.core.loss import Guide, GuideReps, InfoNCE
from dpr_cache.core.objective import Matryoshka, Objective, make_loss_fn
from dpr_cache.core.steppers import Towers, make_stepper
from tests.core.test_engine import N_Q, grads, make_batch, make_model, max_relative_error
from tests.core.test_loss import make

GROUP = 3
DIRECTION_SETS = [
    ("query_to_passage",),
    ("query_to_passage", "passage_to_query"),
    ("query_to_passage", "query_to_query"),
    ("query_to_passage", "passage_to_passage"),
    ("query_to_passage", "passage_to_query", "query_to_query", "passage_to_passage"),
]


def guide_for(q: torch.Tensor, p: torch.Tensor, seed: int = 3) -> GuideReps:
    """A guide's vectors: a noisy copy of the reps in another width, so that its rule takes
    some candidates out and keeps others."""
    gen = torch.Generator().manual_seed(seed)
    mix = torch.randn(q.shape[1], 5, generator=gen, dtype=torch.float64)
    noise = lambda t: 0.3 * torch.randn(t.shape[0], 5, generator=gen, dtype=torch.float64)  # noqa: E731
    return GuideReps(q.detach() @ mix + noise(q), p.detach() @ mix + noise(p))


def reference(
    q,
    p,
    *,
    group,
    temperature,
    directions,
    partition="joint",
    hardness=None,
    strength=0.0,
    p_ids=None,
    guide=None,
    margin=0.0,
    strategy="absolute",
):
    """sentence-transformers' CMNRL rows (with GIST's guide rule and masking by id), one
    anchor and one candidate at a time."""
    n_q, n_p = q.shape[0], p.shape[0]
    pid = [int(x) for x in p_ids] if p_ids is not None else list(range(n_p))
    qid = [pid[j * group] for j in range(n_q)]

    def cos(a, b):
        return float(F.cosine_similarity(a, b, dim=0))

    total = 0
    for i in range(n_q):
        pos = i * group
        threshold = None
        if guide is not None:
            top = cos(guide.q[i], guide.p[pos])
            threshold = top - margin if strategy == "absolute" else top - abs(top) * margin

        def out(ga, gc, kept, threshold=threshold):  # the guide's rule; the pair is kept
            return guide is not None and not kept and cos(ga, gc) > threshold

        rows = {}
        if "query_to_passage" in directions:
            terms = []
            for j in range(n_p):
                if j != pos and pid[j] == pid[pos]:
                    continue
                if guide is not None and out(guide.q[i], guide.p[j], j == pos):
                    continue
                s = q[i] @ p[j] / temperature
                own = pos <= j < pos + group
                boosted = {
                    None: False,
                    "in_batch": not own,
                    "hard": own and j != pos,
                    "all": j != pos,
                }[hardness]
                if boosted:
                    s = s + strength * (q[i] @ p[j]).detach()
                terms.append(s)
            rows["query_to_passage"] = terms
        if "passage_to_query" in directions:
            terms = []
            for j in range(n_q):
                if j != i and qid[j] == pid[pos]:
                    continue
                if guide is not None and out(guide.p[pos], guide.q[j], j == i):
                    continue
                terms.append(p[pos] @ q[j] / temperature)
            rows["passage_to_query"] = terms
        if "query_to_query" in directions:
            terms = []
            for j in range(n_q):
                if j == i or qid[j] == pid[pos]:
                    continue
                if guide is not None and out(guide.q[i], guide.q[j], False):
                    continue
                terms.append(q[i] @ q[j] / temperature)
            rows["query_to_query"] = terms
        if "passage_to_passage" in directions:
            terms = []
            for j in range(n_p):
                if pos <= j < pos + group or pid[j] == pid[pos]:
                    continue
                if guide is not None and out(guide.p[pos], guide.p[j], False):
                    continue
                terms.append(p[pos] @ p[j] / temperature)
            rows["passage_to_passage"] = terms
        if partition == "joint":
            lse = torch.logsumexp(torch.stack([t for ts in rows.values() for t in ts]), dim=0)
        else:
            lse = sum(torch.logsumexp(torch.stack(ts), dim=0) for ts in rows.values()) / len(rows)
        total = total + lse - q[i] @ p[pos] / temperature
    return total / n_q


CASES = [
    {"directions": d, "hardness": h, "guide": g}
    for d, h, g in itertools.product(
        DIRECTION_SETS, [None, "in_batch", "hard", "all"], [None, "absolute", "relative"]
    )
] + [
    {"directions": ("query_to_passage", "passage_to_query"), "partition": "per_direction"},
    {
        "directions": ("query_to_passage", "passage_to_query"),
        "partition": "per_direction",
        "hardness": "all",
        "guide": "absolute",
    },
]


def _name(case: dict) -> str:
    short = "+".join(d.replace("_to_", "2")[:3] + d[-1] for d in case["directions"])
    return f"{short}-{case.get('partition', 'joint')}-{case.get('hardness')}-{case.get('guide')}"


def _spec(case: dict, tile: int | None, temperature: float = 0.5) -> InfoNCE:
    guide = Guide(0.1, case["guide"]) if case.get("guide") else None
    return InfoNCE(
        temperature=temperature,
        tile_size=tile,
        directions=case["directions"],
        partition=case.get("partition", "joint"),
        hardness=case.get("hardness"),
        hardness_strength=3.0 if case.get("hardness") else 0.0,
        guide=guide,
    )


@pytest.mark.parametrize("case", CASES, ids=_name)
def test_every_option_matches_the_row_by_row_reference_direct_and_tiled(case):
    q, p, p_ids = make(n_q=7, group=GROUP)
    guide = guide_for(q, p) if case.get("guide") else None
    expected = reference(
        q,
        p,
        group=GROUP,
        temperature=0.5,
        directions=case["directions"],
        partition=case.get("partition", "joint"),
        hardness=case.get("hardness"),
        strength=3.0 if case.get("hardness") else 0.0,
        p_ids=p_ids,
        guide=guide,
        margin=0.1,
        strategy=case.get("guide") or "absolute",
    )
    want = torch.autograd.grad(expected, [q, p])
    for tile in (None, 4):  # 4: uneven last tiles of 7 questions and 21 passages
        loss = _spec(case, tile)(q, p, p_ids=p_ids, group_size=GROUP, guide=guide)
        got = torch.autograd.grad(loss, [q, p])
        assert loss.item() == pytest.approx(expected.item(), rel=1e-12), tile
        for g, w in zip(got, want, strict=True):
            assert torch.allclose(g, w, rtol=1e-10, atol=1e-12), tile


def test_the_guide_and_the_ids_each_take_candidates_out():
    """Negative controls: without the ids, or without the guide, the loss differs (so the
    reference's masks are the ones in force)."""
    q, p, p_ids = make(n_q=7, group=GROUP)
    guide = guide_for(q, p)
    guided = _spec({"directions": DIRECTION_SETS[-1], "guide": "absolute"}, None)
    plain = _spec({"directions": DIRECTION_SETS[-1]}, None)
    both = guided(q, p, p_ids=p_ids, group_size=GROUP, guide=guide).item()
    by_ids = plain(q, p, p_ids=p_ids, group_size=GROUP).item()
    neither = plain(q, p, group_size=GROUP).item()
    assert abs(both - by_ids) > 1e-3 and abs(by_ids - neither) > 1e-3


def test_a_row_with_no_candidate_in_a_direction_sends_no_nan():
    """One question: query_to_query has no candidate (its log-sum-exp is -inf); the joint loss
    and its gradient stay finite, direct and tiled alike."""
    q, p, _ = make(n_q=1, group=2, duplicates=False)
    for tile in (None, 2):
        spec = InfoNCE(tile_size=tile, directions=("query_to_passage", "query_to_query"))
        loss = spec(q, p)
        gq, gp = torch.autograd.grad(loss, [q, p])
        assert torch.isfinite(loss) and torch.isfinite(gq).all() and torch.isfinite(gp).all()


def test_two_ranks_rows_give_the_whole_batch_loss():
    """Questions split over two 'ranks' (each its own rows against every row, offsets given)
    average to the whole batch's loss, in every direction with hardness and the guide."""
    q, p, p_ids = make(n_q=8, group=GROUP)
    guide = guide_for(q, p)
    spec = _spec({"directions": DIRECTION_SETS[-1], "hardness": "all", "guide": "relative"}, 3)
    whole = spec(q, p, p_ids=p_ids, group_size=GROUP, guide=guide)
    halves = []
    for rank in (0, 1):
        rows = slice(rank * 4, rank * 4 + 4)
        local = GuideReps(guide.q[rows], guide.p, guide.q)
        halves.append(
            spec(
                q[rows],
                p,
                p_ids=p_ids,
                group_size=GROUP,
                positive_offset=rank * 4 * GROUP,
                q_all=q,
                q_offset=rank * 4,
                guide=local,
            )
        )
    assert ((halves[0] + halves[1]) / 2).item() == pytest.approx(whole.item(), rel=1e-12)


def test_matryoshka_is_the_weighted_sum_of_the_truncated_losses():
    q, p, p_ids = make(n_q=6, group=GROUP, dim=8)
    infonce = InfoNCE(temperature=0.5)
    matryoshka = Matryoshka((8, 4, 2), (1.0, 0.5, 2.0), normalize=True)
    loss_fn = make_loss_fn(Objective(GROUP, infonce, matryoshka=matryoshka))
    got = loss_fn(q, p, p_ids=p_ids)
    want = sum(
        w * infonce(F.normalize(q[:, :d], dim=-1), F.normalize(p[:, :d], dim=-1), p_ids=p_ids)
        for d, w in ((8, 1.0), (4, 0.5), (2, 2.0))
    )
    assert got.item() == pytest.approx(want.item(), rel=1e-12)
    plain = make_loss_fn(Objective(GROUP, infonce, matryoshka=Matryoshka((8, 4, 2))))(
        q, p, p_ids=p_ids
    )
    assert abs(plain.item() - got.item()) > 1e-3  # normalized and weighted, not plain


@pytest.mark.parametrize(
    ("bad", "message"),
    [
        ({"directions": ("query_to_doc",)}, "unknown direction"),
        (
            {"directions": ("query_to_passage", "query_to_query"), "partition": "per_direction"},
            "no same-side direction",
        ),
        ({"hardness": "easy"}, "unknown hardness"),
        ({"hardness_strength": -1.0}, "hardness_strength"),
    ],
)
def test_bad_options_are_named(bad, message):
    with pytest.raises(ValueError, match=message):
        InfoNCE(**bad)


def test_a_guided_loss_without_the_guide_s_vectors_is_refused():
    q, p, _ = make(n_q=3, group=2)
    with pytest.raises(ValueError, match="guide"):
        InfoNCE(guide=Guide())(q, p)


# -- GradCache over every option: float64, chunk 3 of 7 questions (uneven), tiled or not -----

MIXTURES = [
    {"directions": DIRECTION_SETS[1], "partition": "per_direction", "hardness": "hard"},
    {"directions": DIRECTION_SETS[-1], "hardness": "all", "guide": "absolute"},
    {"directions": DIRECTION_SETS[2], "hardness": "in_batch", "matryoshka": (16, 8, 4)},
    {"directions": DIRECTION_SETS[-1], "guide": "relative", "distill": "distill_kl"},
    {
        "directions": DIRECTION_SETS[3],
        "hardness": "all",
        "guide": "absolute",
        "matryoshka": (16, 4),
        "distill": "margin_mse",
    },
]


def _objective(case: dict, tile: int | None, group: int, normalize: bool) -> Objective:
    matryoshka = (
        Matryoshka(case["matryoshka"], normalize=normalize) if "matryoshka" in case else None
    )
    distill = Distillation(case["distill"], weight=0.4) if "distill" in case else None
    return Objective(group, _spec(case, tile), distill, matryoshka)


@pytest.mark.parametrize("case", MIXTURES, ids=lambda c: _name(c) + "-" + str(c.get("distill")))
@pytest.mark.parametrize("tile", [None, 5])
@pytest.mark.parametrize("chunk_tokens", [None, 30])
def test_gradcache_equals_the_full_batch_for_every_mixture(case, tile, chunk_tokens):
    model = make_model(seed=2)
    model.normalize = True
    q_inputs, p_inputs, p_ids = make_batch(hard_negatives=1, n_q=N_Q)
    group = 2
    gen = torch.Generator().manual_seed(5)
    extra = {"teacher_scores": 3 * torch.randn(N_Q * group, generator=gen, dtype=torch.float64)}
    extra["guide_q"] = torch.randn(N_Q, 6, generator=gen, dtype=torch.float64)
    extra["guide_p"] = torch.randn(N_Q * group, 6, generator=gen, dtype=torch.float64)
    extra["guide_p"][::group] = extra["guide_q"] + 0.5 * extra["guide_p"][::group]
    loss_fn = make_loss_fn(_objective(case, tile, group, normalize=True))
    towers = Towers(model.encode_query, model.encode_passage)
    results = {}
    for mode in ("full", "gradcache"):
        model.zero_grad(set_to_none=True)
        tokens = chunk_tokens if mode == "gradcache" else None
        rows = 3 if tokens is None else 2 * N_Q  # under a token budget the rows cap nothing
        stepper = make_stepper(mode, towers, loss_fn, chunk_size=rows, chunk_tokens=tokens)
        loss = stepper.step(q_inputs, p_inputs, p_ids=p_ids, **extra)
        results[mode] = (loss.item(), grads(model))
    assert results["gradcache"][0] == pytest.approx(results["full"][0], rel=1e-12)
    assert max_relative_error(results["gradcache"][1], results["full"][1]) <= 1e-10
