"""GradCache against plain full-batch autograd on the tiny decoders, in float64: last-token
pooling on either padding side, LoRA adapters on a frozen base or every weight trained,
gradient checkpointing, shared and separate towers, a chunk that does not divide the batch,
hard negatives; and LoRA's dropout replayed exactly (a finite-difference check, and its
control without replay)."""

from __future__ import annotations

import pytest
import torch

from dpr_cache.core.engine import GradCache
from dpr_cache.core.loss import contrastive_loss
from dpr_cache.model.fast_dropout import use_fast_dropout
from tests.support.finite_difference import directional_error
from tests.support.llm import decoder_model, float64_norms, lora_settings, toy_batch

N_Q, H, CHUNK = 7, 2, 3  # chunk 3 leaves an uneven last chunk of 7 questions and 21 passages


def grads(model) -> dict[str, torch.Tensor]:
    return {n: p.grad.clone() for n, p in model.named_parameters() if p.grad is not None}


def full_batch(model, q, p, p_ids):
    model.zero_grad(set_to_none=True)
    loss = contrastive_loss(model.encode_query(q), model.encode_passage(p), p_ids=p_ids)
    loss.backward()
    return loss.detach(), grads(model)


def gradcache(model, q, p, p_ids, chunk=CHUNK):
    model.zero_grad(set_to_none=True)
    engine = GradCache(model.encode_query, model.encode_passage, contrastive_loss, chunk)
    return engine.step(q, p, p_ids=p_ids), grads(model)


def max_relative_error(got: dict, want: dict) -> float:
    assert got.keys() == want.keys()
    scale = max(w.abs().max().item() for w in want.values())
    return max((got[k] - want[k]).abs().max().item() for k in want) / scale


CASES = [
    # kind, lora, padding side, shared, checkpointing
    ("llama", True, "left", False, False),
    ("llama", True, "right", False, False),
    ("llama", True, "left", True, True),
    ("llama", True, "right", True, False),
    ("llama", True, "right", False, True),
    ("llama", False, "left", False, False),
    ("llama", False, "right", True, True),
    ("qwen2", True, "right", False, False),
    ("qwen2", True, "left", True, True),
    ("qwen2", False, "right", False, True),
    ("qwen2", False, "left", True, False),
]


@pytest.mark.parametrize(("kind", "lora", "side", "shared", "checkpointing"), CASES)
def test_gradcache_equals_full_batch_on_a_decoder(kind, lora, side, shared, checkpointing):
    model = decoder_model(
        kind,
        lora=lora_settings() if lora else None,
        shared=shared,
        checkpointing=checkpointing,
        side=side,
    ).double()
    model.train()
    q, p, p_ids = toy_batch(model.tokenizer, N_Q, H)
    pads = p["attention_mask"][:, 0 if side == "left" else -1]
    assert (pads == 0).any()  # some rows are padded, on the side asked
    want_loss, want = full_batch(model, q, p, p_ids)
    got_loss, got = gradcache(model, q, p, p_ids)
    trainable = {n for n, t in model.named_parameters() if t.requires_grad}
    assert set(want) == trainable  # every trainable parameter got a gradient, nothing else
    if lora:
        assert trainable and all("lora_" in n for n in trainable)
    assert got_loss.item() == pytest.approx(want_loss.item(), rel=1e-12)
    assert max_relative_error(got, want) < 1e-10


def test_checkpointing_with_a_frozen_base_gives_the_same_gradient():
    """Checkpointed layers on a frozen base still pass the gradient to the adapters."""
    results = []
    for checkpointing in (False, True):
        model = decoder_model(lora=lora_settings(), checkpointing=checkpointing).double().train()
        q, p, p_ids = toy_batch(model.tokenizer, 4, 1)
        results.append(full_batch(model, q, p, p_ids)[1])
    assert max_relative_error(results[1], results[0]) < 1e-12


def directional_check(replay_rng: bool, fast: bool, chunk: int = 2) -> float:
    """|FD - analytic| / |analytic| for GradCache's loss with LoRA's dropout on (the base's
    off, so that LoRA's masks alone are replayed), float64; ``fast``: the CPU's fast dropout
    in place of LoRA's nn.Dropout."""
    model = decoder_model(lora=lora_settings(dropout=0.3)).double().train()
    if fast:
        assert use_fast_dropout([model.query_encoder, model.passage_encoder]) > 0
    q, p, p_ids = toy_batch(model.tokenizer, 6, 1)
    engine = GradCache(
        model.encode_query, model.encode_passage, contrastive_loss, chunk, replay_rng=replay_rng
    )

    def loss_at_seed() -> torch.Tensor:
        torch.manual_seed(1234)
        model.zero_grad(set_to_none=True)
        return engine.step(q, p, p_ids=p_ids)

    return directional_error(model, loss_at_seed)


@pytest.mark.parametrize("fast", [False, True])
def test_lora_dropout_gradient_matches_finite_difference(fast, monkeypatch):
    float64_norms(monkeypatch)
    assert directional_check(replay_rng=True, fast=fast) < 1e-6


def test_negative_control_lora_dropout_without_rng_replay_is_wrong(monkeypatch):
    float64_norms(monkeypatch)
    assert directional_check(replay_rng=False, fast=False) > 1e-2


def test_fast_dropout_swaps_loras_dropout_and_attends_causally():
    """LoRA's dropout modules become the fast ones; with dropout on, the fast attention path
    (grouped KV heads repeated, a causal mask where transformers gives none) matches SDPA's
    output when its dropout is 0 in eval."""
    from dpr_cache.model.fast_dropout import FastDropout

    model = decoder_model(lora=lora_settings(dropout=0.1), dropout=0.1, shared=True).double()
    q, _, _ = toy_batch(model.tokenizer, 4, 0)
    model.eval()
    want = model.encode_query(q)
    use_fast_dropout([model.query_encoder])
    assert any(isinstance(m, FastDropout) for n, m in model.named_modules() if "lora_dropout" in n)
    got = model.encode_query(q)  # eval: no dropout, the fast path's own attention is SDPA
    assert torch.allclose(got, want, atol=1e-12)
    from dpr_cache.model.fast_dropout import attention_with_fast_dropout

    attention = model.query_encoder.base_model.model.layers[0].self_attn
    gen = torch.Generator().manual_seed(0)
    shape_q, shape_kv = (2, 4, 5, 8), (2, 2, 5, 8)
    query = torch.randn(shape_q, generator=gen, dtype=torch.float64)
    key, value = (torch.randn(shape_kv, generator=gen, dtype=torch.float64) for _ in range(2))
    attention.train()
    out, _ = attention_with_fast_dropout(attention, query, key, value, None, dropout=1e-9)
    ref = torch.nn.functional.scaled_dot_product_attention(
        query, key.repeat_interleave(2, 1), value.repeat_interleave(2, 1), is_causal=True
    ).transpose(1, 2)
    assert torch.allclose(out, ref, atol=1e-6)  # dropout 1e-9 rounds to no element dropped
