"""The engine's speed and memory savings: padding trimmed per chunk, the memory release hook."""

from __future__ import annotations

import functools

import pytest
import torch

from dpr_cache import cpu_memory
from dpr_cache.engine import RELEASE_EVERY, GradCache, trim_padding
from dpr_cache.loss import contrastive_loss
from dpr_cache.model import BiEncoder
from tests.conftest import bert_config, random_inputs


def test_trim_padding_drops_only_columns_no_row_attends_to():
    mask = torch.tensor([[1, 1, 0, 0, 0], [1, 1, 1, 0, 0]])
    chunk = {"input_ids": mask * 7, "attention_mask": mask, "extra": torch.arange(2)}
    out = trim_padding(chunk)
    assert out["input_ids"].shape == (2, 3) and out["attention_mask"].shape == (2, 3)
    assert out["extra"] is chunk["extra"]
    full = {"input_ids": torch.ones(2, 4, dtype=torch.long)}
    assert trim_padding(full) is full  # no attention_mask: unchanged
    assert trim_padding({"attention_mask": torch.ones(2, 4)})["attention_mask"].shape == (2, 4)


@pytest.mark.parametrize(("chunk", "calls"), [(4, 0), (1, 2)])
def test_release_hook_runs_after_many_chunks_and_gradients_stay_exact(float64, chunk, calls):
    """6 rows: chunk 4 leaves 2 graph-less chunks (no call); chunk 1 leaves 10 graph-less and
    10 re-forwarded chunks (one call after the first pass, one in the re-forward loop)."""
    assert RELEASE_EVERY == 8
    torch.manual_seed(0)
    model = BiEncoder.from_config(bert_config(), shared=True).double().train()
    q, p = random_inputs(6, 9, seed=1), random_inputs(6, 12, seed=2)
    model.zero_grad()
    contrastive_loss(model.encode_query(q), model.encode_passage(p)).backward()
    ref = [x.grad.clone() for x in model.parameters() if x.grad is not None]
    seen = []
    engine = GradCache(
        model.encode_query,
        model.encode_passage,
        functools.partial(contrastive_loss),
        chunk,
        release_memory=lambda: seen.append(cpu_memory.trim()),
    )
    model.zero_grad()
    engine.step(q, p)
    got = [x.grad for x in model.parameters() if x.grad is not None]
    assert len(seen) == calls
    for a, b in zip(ref, got, strict=True):
        assert (a - b).norm() <= 1e-10 * a.norm() + 1e-14
