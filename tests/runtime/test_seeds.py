"""Seeds of independent random streams: distinct names give distinct streams."""

from __future__ import annotations

import itertools

import numpy as np
import torch

from dpr_cache.runtime.seeds import stream_entropy, stream_seed


def test_streams_of_shifted_keys_differ_where_sums_collide() -> None:
    names = list(itertools.product(range(4), range(4)))
    seeds = [stream_seed(*name) for name in names]
    assert len(set(seeds)) == len(names)
    sums = [a + b for a, b in names]  # negative control: ``seed + key`` collides
    assert len(set(sums)) < len(names)
    assert stream_seed(1, 1) != stream_seed(2, 0) != stream_seed(1, 1, 0)


def test_stream_seed_is_deterministic_and_fits_torch() -> None:
    assert stream_seed(7, 3) == stream_seed(7, 3)
    a = torch.randperm(50, generator=torch.Generator().manual_seed(stream_seed(7, 3)))
    b = torch.randperm(50, generator=torch.Generator().manual_seed(stream_seed(7, 3)))
    assert a.tolist() == b.tolist() and 0 <= stream_seed(7, 3) < 2**64


def test_entropy_masks_negative_keys_and_matches_numpy_lists() -> None:
    assert stream_entropy(-1, 5) == [(1 << 63) - 1, 5]
    draw = np.random.default_rng(stream_entropy(3, 4, 5)).integers(0, 10**9, 4)
    assert draw.tolist() == np.random.default_rng([3, 4, 5]).integers(0, 10**9, 4).tolist()
