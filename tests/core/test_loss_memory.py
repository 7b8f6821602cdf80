"""The tiled loss's memory is O(B*d + tile^2), never O(B^2): peak RSS in a fresh process.

B=16384, d=768 fp32: inputs are 50 MB each, one untiled score matrix is 1 GiB. The tiled run
(forward and backward) must stay within a bound built from B*d and tile^2 terms only; the direct
run (negative control) must exceed B^2 * 4 bytes, so the measurement can tell the two apart.
"""

from __future__ import annotations

import sys

import pytest

from benchmarks.loss import measure_loss_memory

B, D, TILE = 16384, 768, 2048
FP32 = 4
MB = 2**20
SCORES = B * B * FP32  # one untiled [B, B] fp32 score matrix
# [B, d] buffers that can be alive at the backward's peak: dq and dp, the gathered positives
# p[pos] and the two gradients of their product, p's scatter-back gradient and the two sums into
# q.grad and p.grad (8); a few tile^2 blocks; and what the allocator and the thread pools keep
# (runs measured 222 to 514 MB). Still well below one score matrix (asserted below).
TILED_BOUND = 8 * B * D * FP32 + 8 * TILE * TILE * FP32 + 128 * MB

pytestmark = [
    pytest.mark.slow,
    pytest.mark.serial,  # another process's work beside it moves the allocator's peak
    pytest.mark.skipif(sys.platform != "linux", reason="ru_maxrss in KiB and /proc: Linux"),
]


@pytest.fixture(scope="module")
def peaks() -> dict[tuple[int, str], int]:
    """Peak memory over the inputs, each run in a fresh process: the tiled loss (forward and
    backward) and the direct loss (forward only: it already holds B^2 scores) at B/4 and B."""
    out = {}
    for batch in (B // 4, B):
        out[batch, "tiled"] = measure_loss_memory(batch, D, TILE)["peak_over_inputs"]
        out[batch, "direct"] = measure_loss_memory(batch, D, None, backward=False)[
            "peak_over_inputs"
        ]
    return out


def test_tiled_peak_is_o_bd_plus_tile_squared(peaks):
    peak = peaks[B, "tiled"]
    assert 0 <= peak < TILED_BOUND, (
        f"tiled loss peaked {peak / MB:.0f} MB above its inputs; "
        f"O(B*d + tile^2) bound {TILED_BOUND / MB:.0f} MB"
    )


def test_direct_peak_exceeds_the_score_matrix(peaks):
    """Negative control: the untiled loss holds the [B, B] scores, above the tiled bound."""
    peak = peaks[B, "direct"]
    assert peak > SCORES and peak > 2 * TILED_BOUND, (
        f"direct loss peaked only {peak / MB:.0f} MB above its inputs; "
        f"one score matrix is {SCORES / MB:.0f} MB"
    )


def test_growth_from_a_quarter_batch_is_linear_not_quadratic(peaks):
    """From B/4 to B a [B, B] term grows by 15/16 of a score matrix; the tiled loss grows by its
    [B, d] buffers only. Differences cancel what every process holds whatever B is."""
    tiled = peaks[B, "tiled"] - peaks[B // 4, "tiled"]
    direct = peaks[B, "direct"] - peaks[B // 4, "direct"]
    assert tiled < SCORES / 2 < 0.9 * SCORES * 15 / 16 < direct, (tiled / MB, direct / MB)
