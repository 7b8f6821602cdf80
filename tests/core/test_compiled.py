"""Compiled towers under GradCache: the gradient equals the eager engine's in float64, with
dropout replayed; without the replay it does not (negative control)."""

from __future__ import annotations

import copy

import pytest
import torch

from dpr_cache.core.engine import GradCache
from dpr_cache.core.loss import contrastive_loss
from dpr_cache.model.biencoder import BiEncoder
from dpr_cache.model.compiled import compile_towers, compiles
from tests.support.fixtures import bert_config, random_inputs

pytestmark = pytest.mark.filterwarnings("ignore")


def _grads(model) -> list[torch.Tensor]:
    return [p.grad.clone() for p in model.parameters() if p.grad is not None]


def _step(model, q, p, *, seed: int, **engine_kwargs) -> list[torch.Tensor]:
    """One GradCache step of 2-row chunks all 8 columns wide (one shape: one graph a grad mode)
    under RNG state ``seed``."""
    engine = GradCache(
        model.encode_query,
        model.encode_passage,
        contrastive_loss,
        2,
        length_bucket=8,
        **engine_kwargs,
    )
    model.zero_grad(set_to_none=True)
    torch.manual_seed(seed)
    engine.step(q, p)
    return _grads(model)


def _gap(want: list[torch.Tensor], got: list[torch.Tensor]) -> float:
    scale = max(g.abs().max() for g in want)
    return max(float((a - b).abs().max() / scale) for a, b in zip(want, got, strict=True))


def test_compiled_gradcache_equals_eager_with_dropout_replayed(float64):
    torch.manual_seed(0)
    eager = BiEncoder.from_config(bert_config(0.2), shared=True).double().train()
    compiled = copy.deepcopy(eager)
    assert compile_towers([compiled.query_encoder, compiled.passage_encoder]) == 1
    q, p = random_inputs(4, 8, seed=1), random_inputs(8, 8, seed=2)  # 1 hard negative
    want = _step(eager, q, p, seed=5)
    assert _gap(want, _step(compiled, q, p, seed=5)) <= 1e-10
    # the same masks as eager, not merely some masks: another RNG state moves the gradient
    assert _gap(want, _step(compiled, q, p, seed=6)) > 1e-3
    # negative control: the re-forward without the replayed RNG draws other masks
    assert _gap(want, _step(compiled, q, p, seed=5, replay_rng=False)) > 1e-3


def test_compiled_without_dropout_equals_the_full_batch(float64):
    torch.manual_seed(0)
    model = BiEncoder.from_config(bert_config(0.0), shared=True).double().train()
    q, p = random_inputs(4, 8, seed=3), random_inputs(8, 8, seed=4)
    model.zero_grad(set_to_none=True)
    contrastive_loss(model.encode_query(q), model.encode_passage(p)).backward()
    want = _grads(model)
    compile_towers([model.query_encoder])
    assert _gap(want, _step(model, q, p, seed=0)) <= 1e-10


def test_compile_setting():
    assert compiles("on") and not compiles("off") and not compiles("auto")
    with pytest.raises(ValueError, match="compile mode"):
        compile_towers([], "fastest")
