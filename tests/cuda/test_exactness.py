"""GradCache on CUDA: float64 against full-batch autograd, each chunk's dropout replayed bit for
bit from its CUDA RNG state, the finite-difference check with dropout on, and mixed precision
(bf16, fp16 with a GradScaler) against the full batch under the same autocast."""

from __future__ import annotations

import pytest

from benchmarks.gpu import exact

CASES = exact.exact_cases(["tiny", "base"])


@pytest.mark.parametrize("case", CASES, ids=[c.name for c in CASES])
def test_fp64_gradcache_equals_full_batch(case, cuda):
    row = exact.fp64_exactness(case, cuda)
    assert row["relative_error"] <= exact.FP64_BOUND, row


@pytest.mark.parametrize("precision", ["fp32", "bf16", "fp16"])
@pytest.mark.parametrize("size", ["tiny", "base"])
def test_replayed_reforward_is_bitwise_equal_and_the_control_is_not(size, precision, cuda):
    row = exact.replay_bitwise(size, cuda, precision)
    assert row["replayed"]["bitwise_equal"] == row["replayed"]["chunks"], row
    assert row["control_without_replay"]["bitwise_equal"] == 0, row


def test_dropout_gradient_matches_finite_difference(cuda):
    row = exact.dropout_finite_difference("tiny", cuda)
    assert row["error"] <= exact.FD_BOUND, row
    assert row["control_error"] > 1e-2, row


@pytest.mark.parametrize("precision", ["bf16", "fp16"])
@pytest.mark.parametrize("size", ["small", "base"])
def test_mixed_precision_within_its_bound_with_fp32_cache_and_loss(size, precision, cuda):
    row = exact.mixed_precision(size, cuda, precision)
    assert row["dtypes"] == {k: "torch.float32" for k in ("reps", "loss", "cache")}, row
    assert row["ok"], row
