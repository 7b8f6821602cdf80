"""Fast dropout: the rate and scale of its masks, its gradient, its attention against SDPA, the
swap into a tower (nothing saved changes), and GradCache's exact gradient with it (float64)."""

from __future__ import annotations

import functools
import json
import math

import pytest
import torch
from torch import nn

from dpr_cache.core.engine import GradCache
from dpr_cache.core.loss import contrastive_loss
from dpr_cache.model.biencoder import BiEncoder
from dpr_cache.model.fast_dropout import (
    ATTENTION_NAME,
    FastDropout,
    attention_with_fast_dropout,
    fast_dropout,
    keep_mask,
    use_fast_dropout,
)
from tests.support.finite_difference import directional_error
from tests.support.fixtures import TOY, bert_config, random_inputs


def test_mask_keeps_one_minus_p_and_replays_from_the_rng_state():
    n = 1_000_000
    for p in (0.1, 0.5):
        torch.manual_seed(0)
        kept = keep_mask((n,), p, torch.device("cpu")).float()
        sd = math.sqrt(p * (1 - p) / n)
        assert abs(kept.mean().item() - (1 - p)) < 5 * sd
        # neighbours (the four values of one draw) are independent: P(both kept) = (1-p)^2
        pairs = (kept[0::2] * kept[1::2]).mean().item()
        assert abs(pairs - (1 - p) ** 2) < 5 * math.sqrt((1 - p) ** 2 / (n / 2))
    state = torch.get_rng_state()
    a = keep_mask((3, 7, 5), 0.3, torch.device("cpu"))
    b = keep_mask((3, 7, 5), 0.3, torch.device("cpu"))
    torch.set_rng_state(state)
    assert torch.equal(keep_mask((3, 7, 5), 0.3, torch.device("cpu")), a)  # replayed exactly
    assert not torch.equal(a, b)  # the next draw is another mask


def test_dropout_scales_what_it_keeps_and_its_gradient_is_the_mask():
    x = torch.randn(64, 33, dtype=torch.float64, requires_grad=True)
    torch.manual_seed(3)
    y = fast_dropout(x, 0.25)
    torch.manual_seed(3)
    keep = keep_mask(x.shape, 0.25, x.device)
    assert torch.allclose(y, torch.where(keep, x / 0.75, 0), rtol=1e-15, atol=0)
    weights = torch.randn_like(x)
    (y * weights).sum().backward()
    assert torch.allclose(x.grad, torch.where(keep, weights / 0.75, 0))
    assert fast_dropout(x, 0.25, training=False) is x and fast_dropout(x, 0.0) is x

    def f(t: torch.Tensor) -> torch.Tensor:  # the same mask at every evaluation
        torch.manual_seed(5)
        return fast_dropout(t, 0.4)

    assert torch.autograd.gradcheck(
        f, (torch.randn(6, 5, dtype=torch.float64, requires_grad=True),)
    )


def test_attention_without_dropout_is_sdpa_on_padded_rows():
    """At p = 1e-6 (rounds to 0: every element kept) the explicit path computes what SDPA does,
    bool and additive masks alike; with dropout it differs (the control)."""
    from transformers.integrations.sdpa_attention import sdpa_attention_forward

    gen = torch.Generator().manual_seed(0)
    q, k, v = (torch.randn(3, 2, 5, 4, generator=gen, dtype=torch.float64) for _ in range(3))
    lengths = torch.tensor([5, 3, 1])
    keys = torch.arange(5)[None, :] < lengths[:, None]  # [3, 5]
    bool_mask = keys[:, None, None, :].expand(3, 1, 5, 5)
    additive = torch.zeros(3, 1, 5, 5, dtype=torch.float64).masked_fill(~bool_mask, -1e9)
    module = nn.Module()
    module.is_causal = False
    want, _ = sdpa_attention_forward(module, q, k, v, bool_mask, dropout=0.0)
    for mask in (bool_mask, additive):
        got, _ = attention_with_fast_dropout(module, q, k, v, mask, dropout=1e-6)
        assert torch.allclose(got, want, atol=1e-12)
    dropped, _ = attention_with_fast_dropout(module, q, k, v, bool_mask, dropout=0.3)
    assert not torch.allclose(dropped, want, atol=1e-3)


def test_swap_changes_no_output_in_eval_mode_and_nothing_saved(tmp_path):
    model = BiEncoder.from_pretrained(str(TOY / "tiny-bert"), shared=True, pooling="mean").eval()
    inputs = random_inputs(4, 12, vocab=90, seed=1)
    before = model.encode_query(inputs)
    plain = {n: type(m) for n, m in model.named_modules() if isinstance(m, nn.Dropout)}
    plain_attention_p = model.query_encoder.config.attention_probs_dropout_prob
    assert use_fast_dropout([model.query_encoder, model.passage_encoder]) == len(plain) > 0
    assert all(
        isinstance(m, FastDropout) and not m.training
        for m in model.modules()
        if isinstance(m, nn.Dropout)
    )
    assert model.query_encoder.config._attn_implementation == ATTENTION_NAME
    assert torch.equal(model.encode_query(inputs), before)
    model.train()
    torch.manual_seed(0)
    first = model.encode_query(inputs)
    torch.manual_seed(0)
    assert torch.equal(model.encode_query(inputs), first)  # the same RNG state: the same masks
    assert not torch.equal(model.encode_query(inputs), first)  # dropout is on
    model.save_pretrained(tmp_path / "saved")
    for path in (tmp_path / "saved").rglob("*.json"):
        assert ATTENTION_NAME not in path.read_text(), path
    config = json.loads((tmp_path / "saved" / "query_encoder" / "config.json").read_text())
    assert config["attention_probs_dropout_prob"] == plain_attention_p > 0


def _directional_error(replay_rng: bool) -> float:
    """|FD - analytic| / |analytic| of GradCache's loss, fast dropout on, float64, ragged rows
    chunked longest first with uneven last chunks."""
    torch.manual_seed(0)
    model = BiEncoder.from_config(bert_config(0.3), shared=False).double().train()
    assert use_fast_dropout([model.query_encoder, model.passage_encoder]) > 0
    q, p = random_inputs(6, 9, seed=1), random_inputs(12, 12, seed=2)
    engine = GradCache(
        model.encode_query,
        model.encode_passage,
        functools.partial(contrastive_loss),
        4,
        replay_rng=replay_rng,
    )

    def loss() -> torch.Tensor:
        torch.manual_seed(1234)
        model.zero_grad(set_to_none=True)
        return engine.step(q, p)

    return directional_error(model, loss)


def test_gradcache_gradient_is_exact_with_fast_dropout():
    assert _directional_error(replay_rng=True) < 1e-6


def test_negative_control_without_replay_the_gradient_is_wrong():
    assert _directional_error(replay_rng=False) > 1e-2


@pytest.mark.parametrize("p", [0.0, 1.0])
def test_edge_rates(p):
    x = torch.randn(4, 4)
    y = fast_dropout(x, p)
    assert torch.equal(y, x if p == 0.0 else torch.zeros_like(x))


def test_backward_keeps_only_the_boolean_mask_and_scales_the_kept_gradient():
    """Autograd's own nodes (no Python backward): what the graph saves is the mask alone, one
    byte an element, and the gradient is the upstream one, masked and scaled."""
    x = torch.randn(6, 50, dtype=torch.float64, requires_grad=True)
    saved = []
    with torch.autograd.graph.saved_tensors_hooks(lambda t: saved.append(t) or t, lambda t: t):
        torch.manual_seed(3)
        y = fast_dropout(x, 0.25)
    assert [t.dtype for t in saved] == [torch.bool]
    upstream = torch.randn_like(x)
    y.backward(upstream)
    keep = saved[0]
    assert torch.equal(x.grad, torch.where(keep, upstream, 0) * (1 / 0.75))
    assert 0 < int(keep.sum()) < keep.numel()  # some dropped, some kept
