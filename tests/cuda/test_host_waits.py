"""The host waits a GradCache step makes on CUDA do not grow with its chunks: the chunking is
planned from one read of each tower's mask, SDPA builds its padding mask without reading it,
and the loss is checked once. Counted with CUDA's synchronization warnings."""

from __future__ import annotations

import pytest
import torch

from benchmarks.gpu import exact, perf
from dpr_cache.core.engine import GradCache
from dpr_cache.core.loss import contrastive_loss
from dpr_cache.model.attention import use_sdpa_without_wait

STEP_WAITS = 3
"""Each tower's mask read once, the loss's finiteness once."""


def _waits(model, q, p, ids, chunk: int) -> dict:
    """The host waits of one step: their count and the lines that made the most."""
    engine = GradCache(model.encode_query, model.encode_passage, contrastive_loss, chunk)
    torch.cuda.synchronize()
    return perf.count_syncs(lambda: engine.step(q, p, p_ids=ids), q["input_ids"].device, "fp32")


@pytest.mark.parametrize("chunk", [2, 8])
def test_a_step_waits_for_the_device_a_fixed_number_of_times(cuda, chunk):
    model = exact.make_model("small", cuda, torch.float32, dropout=0.1)
    q, p, ids = exact.make_batch("small", 16, 1, cuda)
    waits = _waits(model, q, p, ids, chunk)
    assert waits["count"] <= STEP_WAITS, waits


def test_plain_sdpa_waits_once_a_chunk_forward(cuda):
    """The negative control: with transformers' own SDPA the mask's read-back comes back."""
    model = exact.make_model("small", cuda, torch.float32, dropout=0.1)
    for tower in (model.query_encoder, model.passage_encoder):
        tower.set_attn_implementation("sdpa")
    q, p, ids = exact.make_batch("small", 16, 1, cuda)
    plain = _waits(model, q, p, ids, 2)
    assert plain["count"] > STEP_WAITS + 8, plain
    use_sdpa_without_wait([model.query_encoder, model.passage_encoder])
    waits = _waits(model, q, p, ids, 2)
    assert waits["count"] <= STEP_WAITS, waits
