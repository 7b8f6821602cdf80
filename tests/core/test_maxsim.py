"""Multi-vector (late interaction, MaxSim) reps in the core, float64 throughout.

Scores against a numpy triple loop; InfoNCE's tiled path against its direct path over every
option, and both against sentence-transformers' MaxSim cross-entropy written out one pair at a
time; distillation's group scores; GradCache over a toy token encoder against one full-batch
backward; two gloo ranks whose reps have different widths against one process. Negative
controls show that each comparison can fail.
"""

from __future__ import annotations

import dataclasses

import numpy as np
import pytest
import torch
import torch.nn.functional as F
from torch import nn

from dpr_cache.core import similarity
from dpr_cache.core.distill import Distillation, group_scores
from dpr_cache.core.engine import GradCache
from dpr_cache.core.inputs import cut_chunks
from dpr_cache.core.loss import Guide, GuideReps, InfoNCE
from dpr_cache.core.objective import Matryoshka, Objective, make_loss_fn
from dpr_cache.core.similarity import EMPTY_SCORE, pair_scores, scores, token_tile
from tests.core.test_loss_options import DIRECTION_SETS
from tests.support.fixtures import random_inputs

D = 6
N_Q, GROUP, LA, LC = 5, 3, 4, 6
EMPTY_ROW = 1  # question 0's first hard negative has no real token
SAME_SIDE = {"query_to_query", "passage_to_passage"}
LAYOUTS = [
    (dirs, part)
    for dirs in DIRECTION_SETS
    for part in ("joint", "per_direction")
    if part == "joint" or not SAME_SIDE & set(dirs)
]


# -- data -------------------------------------------------------------------------------------


def unit(t: torch.Tensor) -> torch.Tensor:
    return F.normalize(t, dim=-1)


def padded(tokens: torch.Tensor, gen: torch.Generator, min_len: int = 1) -> torch.Tensor:
    """Each row's tokens after a random length set to zero (at least ``min_len`` kept)."""
    rows, width = tokens.shape[:2]
    lengths = torch.randint(min_len, width + 1, (rows,), generator=gen)
    keep = torch.arange(width)[None, :] < lengths[:, None]
    return tokens * keep[..., None]


def make_multi(n_q=N_Q, group=GROUP, la=LA, lc=LC, seed=0, duplicates=True, empty=True):
    """Questions [n_q, la, D] and passages [n_q * group, lc, D] of unit tokens with zero
    padding (and a zero punctuation token inside every third passage), each question leaning
    to its positive; with ``duplicates`` ids repeat (near-equal copies), with ``empty`` one
    hard negative has no real token."""
    gen = torch.Generator().manual_seed(seed)
    n_p = n_q * group
    p = padded(unit(torch.randn(n_p, lc, D, generator=gen, dtype=torch.float64)), gen, 2)
    p[::3, 1] = 0.0
    p_ids = torch.arange(n_p) + 1000
    if duplicates:
        p_ids[group + group - 1] = p_ids[0]
        p_ids[2 * group] = p_ids[0]
        for j in (group + group - 1, 2 * group):
            noise = 0.01 * torch.randn(lc, D, generator=gen, dtype=torch.float64)
            p[j] = unit(p[0] + noise) * p[0].ne(0).any(-1, keepdim=True)
    if empty:
        p[EMPTY_ROW] = 0.0
    positives = p[::group, :la]
    q = unit(torch.randn(n_q, la, D, generator=gen, dtype=torch.float64) + 1.5 * positives)
    q = padded(q, gen)
    return q.requires_grad_(), p.requires_grad_(), p_ids


def guide_for(q: torch.Tensor, p: torch.Tensor, seed: int = 3) -> GuideReps:
    """A guide's single vectors: a noisy projection of the summed tokens."""
    gen = torch.Generator().manual_seed(seed)
    mix = torch.randn(D, 5, generator=gen, dtype=torch.float64)

    def vectors(t):
        noise = 0.3 * torch.randn(t.shape[0], 5, generator=gen, dtype=torch.float64)
        return t.detach().sum(1) @ mix + noise

    return GuideReps(vectors(q), vectors(p))


def relative(got: torch.Tensor, want: torch.Tensor) -> float:
    """max |got - want| / max |want|."""
    return float((got - want).abs().max() / want.abs().max())


# -- references --------------------------------------------------------------------------------


def numpy_maxsim(a: np.ndarray, c: np.ndarray) -> float:
    """MaxSim of one pair by three loops; -1e9 for a candidate without a real token."""
    real_c = [u for u in range(c.shape[0]) if np.any(c[u] != 0)]
    if not real_c:
        return EMPTY_SCORE
    total = 0.0
    for t in range(a.shape[0]):
        if np.any(a[t] != 0):
            total += max(float(np.dot(a[t], c[u])) for u in real_c)
    return total


def torch_maxsim(a: torch.Tensor, c: torch.Tensor, zero_is_real: bool = False) -> torch.Tensor:
    """MaxSim of one pair, one token pair at a time, with autograd (``zero_is_real``: the
    negative control that lets zero candidate tokens into the max)."""
    real_c = [u for u in range(c.shape[0]) if zero_is_real or bool(c[u].any())]
    if not real_c:
        return torch.tensor(EMPTY_SCORE, dtype=a.dtype)
    terms = [
        max((a[t] @ c[u] for u in real_c), key=lambda x: x.detach().item())
        for t in range(a.shape[0])
    ]
    return torch.stack([x for t, x in enumerate(terms) if bool(a[t].any())]).sum()


def score_matrix(q, p, zero_is_real=False) -> torch.Tensor:
    return torch.stack(
        [
            torch.stack([torch_maxsim(q[i], p[j], zero_is_real) for j in range(len(p))])
            for i in range(len(q))
        ]
    )


def grad_of(loss: torch.Tensor, *inputs: torch.Tensor) -> list[torch.Tensor]:
    return list(torch.autograd.grad(loss, inputs))


# -- similarity --------------------------------------------------------------------------------


def test_scores_and_pair_scores_match_a_numpy_triple_loop():
    q, p, _ = make_multi()
    a, c = q.detach().numpy(), p.detach().numpy()
    want = np.array([[numpy_maxsim(a[i], c[j]) for j in range(len(c))] for i in range(len(a))])
    assert (want[:, EMPTY_ROW] == EMPTY_SCORE).all()
    assert (want[:, [j for j in range(len(c)) if j != EMPTY_ROW]] < 0).any()  # negatives met
    got = scores(q, p).detach().numpy()
    assert np.abs(got - want).max() <= 1e-12 * np.abs(want[want != EMPTY_SCORE]).max()
    pairs = pair_scores(q, p[::GROUP]).detach().numpy()
    assert np.abs(pairs - np.diag(want[:, ::GROUP])).max() <= 1e-12 * np.abs(pairs).max()


def test_padding_tokens_and_empty_candidates_get_no_gradient():
    q, p, _ = make_multi()
    with torch.no_grad():
        q[2] = 0.0  # a question without any real token
    s = scores(q, p)
    assert not s[2, [j for j in range(len(p)) if j != EMPTY_ROW]].any()
    dq, dp = grad_of((s * torch.randn(s.shape, dtype=s.dtype)).sum(), q, p)
    assert torch.isfinite(dq).all() and torch.isfinite(dp).all()
    assert not dq[~similarity.real_tokens(q)].any() and not dp[~similarity.real_tokens(p)].any()
    assert dq.abs().sum() > 0 and dp.abs().sum() > 0


def test_half_reps_score_in_float32_and_single_vectors_as_a_matmul():
    q, p, _ = make_multi()
    assert scores(q.detach().bfloat16(), p.detach().bfloat16()).dtype == torch.float32
    a, c = torch.randn(3, D, dtype=torch.float64), torch.randn(4, D, dtype=torch.float64)
    assert torch.equal(scores(a, c), a @ c.T)
    assert torch.equal(pair_scores(a, c[:3]), (a * c[:3]).sum(-1))


@pytest.mark.parametrize(
    "a_shape, c_shape, match",
    [
        ((3, D), (2, 4, D), "single-vector and multi-vector"),
        ((3, 2, D), (2, 4, D - 1), "dim"),
        ((3,), (2, D), "2-D .* or 3-D"),
        ((3, 2, 2, D), (2, 2, 2, D), "2-D .* or 3-D"),
    ],
)
def test_bad_shapes_raise(a_shape, c_shape, match):
    a, c = torch.zeros(a_shape), torch.zeros(c_shape)
    for score in (scores, InfoNCE(), InfoNCE(tile_size=2)):
        with pytest.raises(ValueError, match=match):
            score(a, c)


def test_token_tile_keeps_a_block_within_the_budget():
    assert token_tile(64, 32, 180) == 64
    assert token_tile(1024, 32, 180) == 76  # 76^2 * 32 * 180 <= 2^25 < 77^2 * 32 * 180
    assert token_tile(8, 10, 10, budget=5) == 1


# -- InfoNCE: tiled against direct -------------------------------------------------------------


def infonce(tile, directions, partition, hardness, guided, temperature=0.3) -> InfoNCE:
    return InfoNCE(
        temperature=temperature,
        tile_size=tile,
        directions=directions,
        partition=partition,
        hardness=hardness,
        hardness_strength=2.0 if hardness else 0.0,
        guide=Guide(margin=0.05) if guided else None,
    )


@pytest.mark.parametrize("directions, partition", LAYOUTS)
@pytest.mark.parametrize("hardness", [None, "in_batch", "hard", "all"])
@pytest.mark.parametrize("guided", [False, True])
@pytest.mark.parametrize("with_ids", [False, True])
def test_tiled_equals_direct(directions, partition, hardness, guided, with_ids):
    q, p, p_ids = make_multi()
    kwargs = {"p_ids": p_ids if with_ids else None, "guide": guide_for(q, p) if guided else None}
    direct = infonce(None, directions, partition, hardness, guided)(q, p, **kwargs)
    want = grad_of(direct, q, p)
    for tile in (1, 2, 4, 7, 1000):  # 7: uneven last tiles of 5 questions and 15 passages
        tiled = infonce(tile, directions, partition, hardness, guided)(q, p, **kwargs)
        got = grad_of(tiled, q, p)
        assert abs(tiled.item() - direct.item()) <= 1e-12 * abs(direct.item()), tile
        assert max(relative(g, w) for g, w in zip(got, want, strict=True)) <= 1e-12, tile


def test_tiled_equals_direct_when_the_token_budget_cuts_the_tile(monkeypatch):
    q, p, p_ids = make_multi()
    spec = infonce(1000, DIRECTION_SETS[-1], "joint", "all", False)
    direct = dataclasses.replace(spec, tile_size=None)(q, p, p_ids=p_ids)
    buffers = []
    init = similarity.TokenBlocks.__init__

    def spy(self, *args):
        init(self, *args)
        buffers.append(self.buf.numel())

    monkeypatch.setattr(similarity, "TOKEN_BLOCK_ELEMENTS", 4 * LA * LC)  # 2 x 2 pairs a block
    monkeypatch.setattr(similarity.TokenBlocks, "__init__", spy)
    tiled = spec(q, p, p_ids=p_ids)
    assert buffers and max(buffers) <= 4 * LA * LC
    assert abs(tiled.item() - direct.item()) <= 1e-12 * abs(direct.item())
    for got, want in zip(grad_of(tiled, q, p), grad_of(direct, q, p), strict=True):
        assert relative(got, want) <= 1e-12


@pytest.mark.parametrize("emptied", [[0], "all"])
def test_empty_passages_send_no_gradient(emptied):
    """Question 0's positive, or every passage, without a real token: a row's softmax may then
    rest on constant scores alone, which the tiled backward must not send into padding."""
    q, p, p_ids = make_multi()
    with torch.no_grad():
        p[slice(None) if emptied == "all" else emptied] = 0.0
    direct = InfoNCE(temperature=0.3)(q, p, p_ids=p_ids)
    want = grad_of(direct, q, p)
    assert not want[1][[0, EMPTY_ROW]].any() and torch.isfinite(want[0]).all()
    for tile in (1, 4):
        tiled = InfoNCE(temperature=0.3, tile_size=tile)(q, p, p_ids=p_ids)
        assert abs(tiled.item() - direct.item()) <= 1e-12 * abs(direct.item())
        for got, w in zip(grad_of(tiled, q, p), want, strict=True):
            assert (got - w).abs().max() <= 1e-12 * max(w.abs().max(), 1.0)


# -- InfoNCE against references written out here -----------------------------------------------


@pytest.mark.parametrize("tile", [None, 1, 4])
def test_matches_maxsim_cross_entropy_written_out(tile):
    """sentence-transformers' MultiVectorMultipleNegativesRankingLoss at scale 1: cross-entropy
    of the [B, P] MaxSim matrix with each question's positive column as its label."""
    q, p, _ = make_multi()
    want = F.cross_entropy(score_matrix(q, p), torch.arange(N_Q) * GROUP)
    got = InfoNCE(tile_size=tile)(q, p)
    assert abs(got.item() - want.item()) <= 1e-12 * abs(want.item())
    for g, w in zip(grad_of(got, q, p), grad_of(want, q, p), strict=True):
        assert relative(g, w) <= 1e-12


def hardness_reference(q, p, *, mode, strength, temperature, detach=True) -> torch.Tensor:
    """Cross-entropy of ``M / T + strength * stop_grad(M)`` on the boosted negatives."""
    raw = score_matrix(q, p)
    col = torch.arange(len(p))[None, :]
    pos = (torch.arange(N_Q) * GROUP)[:, None]
    own = (col >= pos) & (col < pos + GROUP)
    boosted = {"in_batch": ~own, "hard": own & (col != pos), "all": col != pos}[mode]
    extra = raw.detach() if detach else raw
    s = raw / temperature + strength * extra * boosted
    return F.cross_entropy(s, pos.squeeze(1))


@pytest.mark.parametrize("mode", ["in_batch", "hard", "all"])
def test_hardness_boost_is_a_constant_in_the_gradient(mode):
    q, p, _ = make_multi()
    want = hardness_reference(q, p, mode=mode, strength=3.0, temperature=0.5)
    want_grads = grad_of(want, q, p)
    for tile in (None, 2):
        spec = InfoNCE(temperature=0.5, tile_size=tile, hardness=mode, hardness_strength=3.0)
        got = spec(q, p)
        assert abs(got.item() - want.item()) <= 1e-12 * abs(want.item())
        for g, w in zip(grad_of(got, q, p), want_grads, strict=True):
            assert relative(g, w) <= 1e-12
    # control: the boost with a gradient of its own is another gradient
    live = hardness_reference(q, p, mode=mode, strength=3.0, temperature=0.5, detach=False)
    assert max(relative(g, w) for g, w in zip(grad_of(live, q, p), want_grads, strict=True)) > 1e-3


def test_negative_control_zero_passage_tokens_scored_as_real_change_the_loss():
    """With every real token score negative, a zero token let into the max would win it."""
    gen = torch.Generator().manual_seed(4)
    e = unit(torch.randn(D, generator=gen, dtype=torch.float64))
    q = padded(unit(e + 0.3 * torch.randn(N_Q, LA, D, generator=gen, dtype=torch.float64)), gen)
    p = unit(-e + 0.3 * torch.randn(N_Q * GROUP, LC, D, generator=gen, dtype=torch.float64))
    p = padded(p, gen, 2).requires_grad_()
    assert (scores(q, p) < 0).all() and not similarity.real_tokens(p).all()
    labels = torch.arange(N_Q) * GROUP
    right = F.cross_entropy(score_matrix(q, p), labels)
    wrong = F.cross_entropy(score_matrix(q, p, zero_is_real=True), labels)
    for tile in (None, 3):
        got = InfoNCE(tile_size=tile)(q, p)
        assert abs(got.item() - right.item()) <= 1e-12 * abs(right.item())
        assert abs(got.item() - wrong.item()) > 1e-3


def test_negative_control_hardness_strength_moves_loss_and_gradient():
    q, p, _ = make_multi()
    weak, strong = (
        InfoNCE(tile_size=2, hardness="all", hardness_strength=s)(q, p) for s in (0.0, 5.0)
    )
    assert abs(weak.item() - strong.item()) > 1e-3
    assert relative(grad_of(weak, q, p)[0], grad_of(strong, q, p)[0]) > 1e-3


# -- distillation and Matryoshka ---------------------------------------------------------------


def test_group_scores_match_a_numpy_triple_loop():
    q, p, _ = make_multi()
    a, c = q.detach().numpy(), p.detach().numpy()
    extra = np.concatenate([c[:2], c])  # the groups start at row 2: positive_offset
    want = np.array(
        [[numpy_maxsim(a[i], extra[2 + i * GROUP + g]) for g in range(GROUP)] for i in range(N_Q)]
    )
    got = group_scores(
        q, torch.cat([p[:2], p]), group_size=GROUP, temperature=0.5, positive_offset=2
    )
    real = want != EMPTY_SCORE
    assert np.abs(got.detach().numpy() * 0.5 - want)[real].max() <= 1e-12 * np.abs(want[real]).max()
    assert (got.detach().numpy()[~real] == EMPTY_SCORE / 0.5).all() and (~real).any()


def test_matryoshka_takes_no_multi_vector_reps():
    q, p, _ = make_multi()
    loss_fn = make_loss_fn(Objective(group_size=GROUP, matryoshka=Matryoshka(dims=(4, 2))))
    with pytest.raises(ValueError, match="matryoshka .* multi-vector"):
        loss_fn(q, p)


# -- GradCache over a token encoder ------------------------------------------------------------

N_ENGINE, ENGINE_GROUP = 7, 2  # chunk 3 leaves an uneven last chunk
PUNCTUATION = torch.tensor([5, 6, 7, 8])  # token ids a passage masks like punctuation


class TokenTower(nn.Module):
    """A toy multi-vector tower: embedding, linear, dropout, unit length per token; tokens the
    attention mask drops (and ids in ``masked``) are zero vectors. Output
    [n, width of the inputs, D]."""

    def __init__(self, dropout: float, masked: torch.Tensor | None = None) -> None:
        super().__init__()
        self.embed, self.linear = nn.Embedding(97, 8), nn.Linear(8, D)
        self.drop, self.masked = nn.Dropout(dropout), masked

    def forward(self, inputs: dict) -> torch.Tensor:
        ids = inputs["input_ids"]
        keep = inputs["attention_mask"].bool()
        if self.masked is not None:
            keep = keep & ~torch.isin(ids, self.masked)
        return unit(self.drop(self.linear(self.embed(ids)))) * keep.unsqueeze(-1)


def towers(dropout: float = 0.0) -> nn.ModuleDict:
    torch.manual_seed(0)
    model = nn.ModuleDict({"q": TokenTower(dropout), "p": TokenTower(dropout, PUNCTUATION)})
    return model.double().train()


def engine_batch():
    q_inputs = random_inputs(N_ENGINE, 9, seed=1)
    p_inputs = random_inputs(N_ENGINE * ENGINE_GROUP, 12, seed=2)
    p_ids = torch.arange(N_ENGINE * ENGINE_GROUP)
    p_ids[ENGINE_GROUP + 1] = p_ids[0]  # question 1's hard negative is question 0's positive
    for key in p_inputs:
        p_inputs[key][ENGINE_GROUP + 1] = p_inputs[key][0]
    teacher = 3.0 * torch.randn(
        N_ENGINE * ENGINE_GROUP, generator=torch.Generator().manual_seed(7), dtype=torch.float64
    )
    return q_inputs, p_inputs, {"p_ids": p_ids, "teacher_scores": teacher}


def engine_loss(kind: str):
    """``loss_fn(q, p, p_ids=, teacher_scores=)``: InfoNCE direct or tiled, or mixed with
    distillation (each in both directions, so both towers' rows are anchors)."""
    directions = ("query_to_passage", "passage_to_query")
    spec = InfoNCE(temperature=0.5, tile_size=3 if kind == "tiled" else None, directions=directions)
    distill = Distillation("distill_kl", weight=0.5) if kind == "distill" else None
    return make_loss_fn(Objective(group_size=ENGINE_GROUP, infonce=spec, distillation=distill))


def param_grads(model: nn.Module) -> dict[str, torch.Tensor]:
    return {n: p.grad.clone() for n, p in model.named_parameters() if p.grad is not None}


def grads_gap(got: dict, want: dict) -> float:
    assert got.keys() == want.keys() and want
    scale = max(w.abs().max().item() for w in want.values())
    return max((got[k] - want[k]).abs().max().item() for k in want) / scale


def full_batch(model, loss_fn, q_inputs, p_inputs, kwargs) -> tuple[float, dict]:
    model.zero_grad(set_to_none=True)
    loss = loss_fn(model["q"](q_inputs), model["p"](p_inputs), **kwargs)
    loss.backward()
    return loss.item(), param_grads(model)


def gradcache(model, loss_fn, q_inputs, p_inputs, kwargs, chunk, seed=0, **engine_kwargs):
    model.zero_grad(set_to_none=True)
    engine = GradCache(model["q"], model["p"], loss_fn, chunk, **engine_kwargs)
    torch.manual_seed(seed)
    loss = engine.step(q_inputs, p_inputs, **kwargs)
    return loss.item(), param_grads(model)


@pytest.mark.parametrize("chunk", [1, 3, N_ENGINE])
@pytest.mark.parametrize("keep_last_graph", [True, False])
@pytest.mark.parametrize("kind", ["direct", "tiled", "distill"])
def test_gradcache_equals_full_batch(chunk, keep_last_graph, kind):
    model, loss_fn = towers(), engine_loss(kind)
    q_inputs, p_inputs, kwargs = engine_batch()
    want_loss, want = full_batch(model, loss_fn, q_inputs, p_inputs, kwargs)
    got_loss, got = gradcache(
        model, loss_fn, q_inputs, p_inputs, kwargs, chunk, keep_last_graph=keep_last_graph
    )
    assert len(want) == 6  # every weight of both towers got a gradient
    assert abs(got_loss - want_loss) <= 1e-12 * abs(want_loss)
    assert grads_gap(got, want) <= 1e-10


def test_gradcache_grows_the_buffer_for_a_wider_later_chunk():
    """Rows in batch order: the first chunk is not the widest, the buffer grows with zeros."""
    model, loss_fn = towers(), engine_loss("tiled")
    q_inputs, p_inputs, kwargs = engine_batch()
    engine = GradCache(model["q"], model["p"], loss_fn, 3, length_order=False)
    q, p = engine.split(q_inputs, p_inputs)
    engine.forward_no_grad(p)
    engine.forward_last(p)
    widths = [c["input_ids"].shape[1] for c in p.chunks]
    assert p.widths == widths and widths[0] < max(widths) == p.reps.shape[1]
    with torch.no_grad():
        whole = model["p"](p_inputs)[:, : max(widths)]
    torch.testing.assert_close(p.reps, whole, rtol=0, atol=1e-15)
    _, want = full_batch(model, loss_fn, q_inputs, p_inputs, kwargs)
    _, got = gradcache(model, loss_fn, q_inputs, p_inputs, kwargs, 3, length_order=False)
    assert grads_gap(got, want) <= 1e-10


def chunked_reference(model, loss_fn, q_inputs, p_inputs, kwargs, chunk, keep_last, seed):
    """One backward through the chunks encoded with their graphs in the order the engine's
    first pass draws its dropout masks (graph-less chunks of each tower, then the kept last
    chunks), padded and put back in batch order: the gradient GradCache must reproduce."""
    model.zero_grad(set_to_none=True)
    cut = {key: cut_chunks(inputs, chunk) for key, inputs in (("q", q_inputs), ("p", p_inputs))}
    first = {key: len(c.parts) - (1 if keep_last else 0) for key, c in cut.items()}
    order = [(k, i) for k in "qp" for i in range(first[k])]
    order += [(k, len(cut[k].parts) - 1) for k in "qp" if keep_last]
    torch.manual_seed(seed)
    reps = {(k, i): model[k](cut[k].parts[i]) for k, i in order}
    batch = {}
    for k in "qp":
        parts = [reps[k, i] for i in range(len(cut[k].parts))]
        widest = max(r.shape[1] for r in parts)
        joined = torch.cat([F.pad(r, (0, 0, 0, widest - r.shape[1])) for r in parts])
        rows = torch.arange(joined.shape[0]) if cut[k].rows is None else torch.cat(cut[k].rows)
        batch[k] = joined[torch.argsort(rows)]
    loss = loss_fn(batch["q"], batch["p"], **kwargs)
    loss.backward()
    return loss.item(), param_grads(model)


@pytest.mark.parametrize("chunk", [2, 3])
@pytest.mark.parametrize("keep_last_graph", [True, False])
def test_gradcache_with_dropout_replays_the_masks(chunk, keep_last_graph):
    model, loss_fn = towers(dropout=0.3), engine_loss("tiled")
    q_inputs, p_inputs, kwargs = engine_batch()
    args = (model, loss_fn, q_inputs, p_inputs, kwargs, chunk)
    want_loss, want = chunked_reference(*args, keep_last_graph, seed=5)
    got_loss, got = gradcache(*args, seed=5, keep_last_graph=keep_last_graph)
    assert abs(got_loss - want_loss) <= 1e-12 * abs(want_loss)
    assert grads_gap(got, want) <= 1e-10
    # controls: other masks (another seed), and the re-forward without the replayed masks
    assert grads_gap(gradcache(*args, seed=6, keep_last_graph=keep_last_graph)[1], want) > 1e-3
    no_replay = gradcache(*args, seed=5, keep_last_graph=keep_last_graph, replay_rng=False)
    assert grads_gap(no_replay[1], want) > 1e-3


# -- two gloo ranks ----------------------------------------------------------------------------

WORLD = 2


def two_rank_batch():
    """A global batch (2 questions a rank, group 2) whose rank 1 rows are narrower: rank 0's
    reps are [2, 5, D] and [4, 6, D], rank 1's [2, 2, D] and [4, 3, D] once trimmed."""
    q, p, p_ids = make_multi(n_q=4, group=2, la=5, lc=6, seed=9, duplicates=False, empty=False)
    q, p = q.detach().clone(), p.detach().clone()
    q[0, -1], p[0, -1] = 1.0 / D**0.5, 1.0 / D**0.5  # rank 0 uses every column
    q[2:, 2:], p[4:, 3:] = 0.0, 0.0
    p_ids[5] = p_ids[0]  # a copy of rank 0's positive among rank 1's rows
    p[5] = p[0]
    p[5, 3:] = 0.0
    return q, p, p_ids


def two_rank_objective() -> Objective:
    directions = ("query_to_passage", "passage_to_query")
    return Objective(
        group_size=2, infonce=InfoNCE(temperature=0.5, tile_size=3, directions=directions)
    )


def two_rank_worker(rank: int, world: int, port: int, out_dir: str) -> None:
    """One rank: its trimmed rows' loss against every rank's (gathered, padded) rows."""
    from dpr_cache.runtime import distributed
    from tests.support.ranks import join

    join(rank, world, port)
    try:
        q, p, p_ids = two_rank_batch()
        q_width, p_width = (5, 6) if rank == 0 else (2, 3)
        q = q[2 * rank : 2 * rank + 2, :q_width].clone().requires_grad_()
        p = p[4 * rank : 4 * rank + 4, :p_width].clone().requires_grad_()
        loss_fn = make_loss_fn(two_rank_objective(), rank=rank, world_size=world)
        loss = loss_fn(q, p, p_ids=p_ids[4 * rank : 4 * rank + 4])
        loss.backward()
        torch.save({"loss": loss.detach(), "dq": q.grad, "dp": p.grad}, f"{out_dir}/rank{rank}.pt")
    finally:
        distributed.teardown()


def test_two_ranks_of_different_widths_give_the_single_process_gradient(tmp_path):
    from tests.support.ranks import spawn_ranks

    spawn_ranks(two_rank_worker, WORLD, str(tmp_path), timeout=120)
    ranks = [torch.load(tmp_path / f"rank{r}.pt") for r in range(WORLD)]
    q, p, p_ids = two_rank_batch()
    q.requires_grad_()
    p.requires_grad_()
    loss = make_loss_fn(two_rank_objective())(q, p, p_ids=p_ids)
    dq, dp = grad_of(loss, q, p)
    mean = sum(r["loss"] for r in ranks) / WORLD
    assert abs(mean.item() - loss.item()) <= 1e-12 * abs(loss.item())
    for rank, r in enumerate(ranks):  # DDP averages: each rank's gradient / W
        want_q, want_p = dq[2 * rank : 2 * rank + 2], dp[4 * rank : 4 * rank + 4]
        assert relative(r["dq"] / WORLD, want_q[:, : r["dq"].shape[1]]) <= 1e-12
        assert relative(r["dp"] / WORLD, want_p[:, : r["dp"].shape[1]]) <= 1e-12
        assert not want_q[:, r["dq"].shape[1] :].any() and not want_p[:, r["dp"].shape[1] :].any()
    # control: a rank's loss over its own rows alone is another gradient
    alone = make_loss_fn(two_rank_objective())(q[2:, :2], p[4:, :3], p_ids=p_ids[4:])
    assert relative(grad_of(alone, p)[0][4:, :3] / WORLD, ranks[1]["dp"] / WORLD) > 1e-3
