"""GradCache against plain full-batch autograd, in float64 on a tiny random BERT."""

from __future__ import annotations

import functools

import pytest
import torch

from dpr_cache.core.accumulate import Accumulate, FullBatch
from dpr_cache.core.engine import GradCache
from dpr_cache.core.loss import contrastive_loss
from dpr_cache.model.biencoder import BiEncoder
from tests.support.finite_difference import directional_error
from tests.support.fixtures import bert_config, random_inputs

N_Q = 7  # questions; chunk 3 leaves an uneven last chunk


def make_model(shared=False, checkpointing=False, dropout=0.0, seed=0) -> BiEncoder:
    torch.manual_seed(seed)
    model = BiEncoder.from_config(
        bert_config(dropout), shared=shared, gradient_checkpointing=checkpointing
    )
    if not shared:  # separate towers that start different, so a mix-up would show
        with torch.no_grad():
            for param in model.passage_encoder.parameters():
                param.add_(0.02 * torch.randn_like(param))
    return model.double().train()


def make_batch(hard_negatives: int, n_q: int = N_Q, seed: int = 1):
    group = 1 + hard_negatives
    q_inputs = random_inputs(n_q, 9, seed=seed)
    p_inputs = random_inputs(n_q * group, 12, seed=seed + 1)
    p_ids = torch.arange(n_q * group)
    if group > 1:
        p_ids[group + 1] = p_ids[0]  # question 1's hard negative is question 0's positive
        p_inputs["input_ids"][group + 1] = p_inputs["input_ids"][0]
        p_inputs["attention_mask"][group + 1] = p_inputs["attention_mask"][0]
    return q_inputs, p_inputs, p_ids


def grads(model) -> dict[str, torch.Tensor]:
    return {n: p.grad.clone() for n, p in model.named_parameters() if p.grad is not None}


def full_batch_grads(model, q_inputs, p_inputs, **loss_kwargs):
    """The reference: one forward over the whole batch, one backward, nothing clever."""
    model.zero_grad(set_to_none=True)
    loss = contrastive_loss(
        model.encode_query(q_inputs), model.encode_passage(p_inputs), **loss_kwargs
    )
    loss.backward()
    return loss.detach(), grads(model)


def gradcache_grads(model, q_inputs, p_inputs, chunk, loss_kwargs, **engine_kwargs):
    model.zero_grad(set_to_none=True)
    loss_fn = functools.partial(contrastive_loss, **loss_kwargs.pop("static", {}))
    engine = GradCache(model.encode_query, model.encode_passage, loss_fn, chunk, **engine_kwargs)
    loss = engine.step(q_inputs, p_inputs, **loss_kwargs)
    return loss, grads(model)


def max_relative_error(got: dict, want: dict) -> float:
    assert got.keys() == want.keys()
    scale = max(w.abs().max().item() for w in want.values())
    return max((got[k] - want[k]).abs().max().item() for k in want) / scale


@pytest.mark.parametrize("chunk", [1, 3, N_Q])
@pytest.mark.parametrize("hard_negatives", [0, 2])
@pytest.mark.parametrize("shared", [False, True])
@pytest.mark.parametrize("checkpointing", [False, True])
@pytest.mark.parametrize("tile", [None, 4])
def test_gradcache_equals_full_batch(chunk, hard_negatives, shared, checkpointing, tile):
    model = make_model(shared=shared, checkpointing=checkpointing)
    q_inputs, p_inputs, p_ids = make_batch(hard_negatives)
    want_loss, want = full_batch_grads(model, q_inputs, p_inputs, p_ids=p_ids)
    got_loss, got = gradcache_grads(
        model, q_inputs, p_inputs, chunk, {"p_ids": p_ids, "static": {"tile_size": tile}}
    )
    trainable = [p for p in model.parameters() if p.requires_grad]  # (the pooler is frozen)
    assert len(want) == len(trainable)  # every trainable parameter got a gradient
    assert got_loss.item() == pytest.approx(want_loss.item(), rel=1e-12)
    assert max_relative_error(got, want) < 1e-10


@pytest.mark.parametrize("keep_last_graph", [False, True])
def test_separate_chunk_sizes_and_no_kept_graph(keep_last_graph):
    model = make_model()
    q_inputs, p_inputs, p_ids = make_batch(1)
    _, want = full_batch_grads(model, q_inputs, p_inputs, p_ids=p_ids)
    _, got = gradcache_grads(
        model,
        q_inputs,
        p_inputs,
        2,
        {"p_ids": p_ids},
        p_chunk_size=5,
        keep_last_graph=keep_last_graph,
    )
    assert max_relative_error(got, want) < 1e-10


def test_gradcache_accumulates_like_backward():
    """.step adds to existing .grad, as backward() does."""
    model = make_model()
    q_inputs, p_inputs, p_ids = make_batch(0)
    _, once = full_batch_grads(model, q_inputs, p_inputs)
    engine = GradCache(model.encode_query, model.encode_passage, contrastive_loss, 3)
    model.zero_grad(set_to_none=True)
    engine.step(q_inputs, p_inputs)
    engine.step(q_inputs, p_inputs)
    twice = grads(model)
    assert max_relative_error(twice, {k: 2 * v for k, v in once.items()}) < 1e-10


def directional_check(replay_rng: bool, chunk: int = 2) -> float:
    """|FD - analytic| / |analytic| for GradCache's reported loss, dropout on, float64, rows
    chunked longest first (the default; the inputs are ragged)."""
    model = make_model(dropout=0.3)
    q_inputs, p_inputs, p_ids = make_batch(1, n_q=6)
    engine = GradCache(
        model.encode_query, model.encode_passage, contrastive_loss, chunk, replay_rng=replay_rng
    )

    def loss_at_seed() -> torch.Tensor:
        torch.manual_seed(1234)
        model.zero_grad(set_to_none=True)
        return engine.step(q_inputs, p_inputs, p_ids=p_ids)

    return directional_error(model, loss_at_seed)


@pytest.mark.parametrize("chunk", [2, 4])  # 4: uneven last chunks (6 questions, 12 passages)
def test_dropout_gradient_matches_finite_difference(chunk):
    assert directional_check(replay_rng=True, chunk=chunk) < 1e-6


def test_negative_control_without_rng_replay_the_gradient_is_wrong():
    assert directional_check(replay_rng=False) > 1e-2


def test_grad_scaler_scales_the_surrogate_not_the_cache():
    model = make_model()
    q_inputs, p_inputs, p_ids = make_batch(1)
    want_loss, want = full_batch_grads(model, q_inputs, p_inputs, p_ids=p_ids)
    scaler = torch.amp.GradScaler("cpu", init_scale=1024.0)
    loss, got = gradcache_grads(model, q_inputs, p_inputs, 3, {"p_ids": p_ids}, scaler=scaler)
    assert max_relative_error({k: v / 1024.0 for k, v in got.items()}, want) < 1e-10
    assert max_relative_error(got, want) > 1000  # control: the gradients themselves are scaled
    assert abs(loss.item() - want_loss.item()) < 1e-12  # the reported loss is not


def test_bf16_autocast_close_to_full_batch_under_autocast():
    """Under autocast the engine's cache and loss stay fp32; GradCache tracks the full batch."""
    model = make_model().float()
    q_inputs, p_inputs, p_ids = make_batch(1)

    def reference():
        model.zero_grad(set_to_none=True)
        with torch.autocast("cpu", dtype=torch.bfloat16):
            q_reps, p_reps = model.encode_query(q_inputs), model.encode_passage(p_inputs)
        contrastive_loss(q_reps.float(), p_reps.float(), p_ids=p_ids).backward()
        return grads(model)

    want = reference()
    model.zero_grad(set_to_none=True)
    engine = GradCache(model.encode_query, model.encode_passage, contrastive_loss, 3)
    with torch.autocast("cpu", dtype=torch.bfloat16):
        engine.step(q_inputs, p_inputs, p_ids=p_ids)
    got = grads(model)
    assert all(v.dtype == torch.float32 for v in got.values())
    assert max_relative_error(got, want) < 3e-2


def test_accumulate_matches_big_batch_for_a_separable_loss():
    """Normalised so a per-question loss gives the big-batch gradient, uneven last piece too."""

    def separable(q_reps, p_reps, **_):
        group = p_reps.shape[0] // q_reps.shape[0]
        return ((q_reps - p_reps[::group]) ** 2).sum(-1).mean()

    model = make_model()
    q_inputs, p_inputs, _ = make_batch(1)
    model.zero_grad(set_to_none=True)
    FullBatch(model.encode_query, model.encode_passage, separable).step(q_inputs, p_inputs)
    want = grads(model)
    model.zero_grad(set_to_none=True)
    Accumulate(model.encode_query, model.encode_passage, separable, 3).step(q_inputs, p_inputs)
    assert max_relative_error(grads(model), want) < 1e-10


def test_accumulate_differs_from_big_batch_for_the_contrastive_loss():
    model = make_model()
    q_inputs, p_inputs, p_ids = make_batch(1)
    _, want = full_batch_grads(model, q_inputs, p_inputs, p_ids=p_ids)
    model.zero_grad(set_to_none=True)
    Accumulate(model.encode_query, model.encode_passage, contrastive_loss, 3).step(
        q_inputs, p_inputs, p_ids=p_ids
    )
    assert max_relative_error(grads(model), want) > 1e-2


@pytest.mark.parametrize(
    ("mutate", "message"),
    [
        (lambda q, p: (q, {k: v[:-1] for k, v in p.items()}), "multiple of question rows"),
        (lambda q, p: ({**q, "attention_mask": q["attention_mask"][:-1]}, p), "different batch"),
    ],
)
def test_bad_inputs_raise_and_leave_grad_untouched(mutate, message):
    model = make_model()
    q_inputs, p_inputs, _ = make_batch(1)
    _, before = full_batch_grads(model, q_inputs, p_inputs)
    engine = GradCache(model.encode_query, model.encode_passage, contrastive_loss, 3)
    with pytest.raises(ValueError, match=message):
        engine.step(*mutate(q_inputs, p_inputs))
    assert max_relative_error(grads(model), before) == 0.0


def test_non_finite_loss_raises_and_leaves_grad_untouched():
    model = make_model()
    q_inputs, p_inputs, _ = make_batch(1)
    _, before = full_batch_grads(model, q_inputs, p_inputs)
    engine = GradCache(
        model.encode_query,
        model.encode_passage,
        lambda q, p: contrastive_loss(q, p) * float("nan"),
        3,
    )
    with pytest.raises(FloatingPointError, match="non-finite loss"):
        engine.step(q_inputs, p_inputs)
    assert max_relative_error(grads(model), before) == 0.0


@pytest.mark.parametrize("size", [0, -2, 1.5])
def test_bad_chunk_size(size):
    with pytest.raises(ValueError, match="chunk_size"):
        GradCache(lambda x: x, lambda x: x, contrastive_loss, size)
