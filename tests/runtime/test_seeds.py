"""Seeds of independent random streams: distinct names give distinct streams."""

from __future__ import annotations

import itertools

import numpy as np
import torch

from dpr_cache.runtime.seeds import stream_entropy, stream_seed


def test_shifted_keys_name_different_streams_where_sums_collide() -> None:
    names = list(itertools.product(range(4), range(4)))
    seeds = [stream_seed("order", *name) for name in names]
    assert len(set(seeds)) == len(names)
    assert len({a + b for a, b in names}) < len(names)  # negative control: ``seed + key`` collides


def test_no_two_names_meet_through_padding_splitting_or_purpose() -> None:
    names = [
        ("order", (1, 1)),
        ("order", (1, 1, 0)),
        ("order", (1,)),
        ("order", (1, 0)),
        ("order", (1, 2**32)),
        ("order", (1, 0, 1)),
        ("dropout", (1, 1)),
        ("order", (1, -1)),
    ]
    seeds = [stream_seed(purpose, *keys) for purpose, keys in names]
    for (a, sa), (b, sb) in itertools.combinations(zip(names, seeds, strict=True), 2):
        assert sa != sb, (a, b)
    # negative control: plain SeedSequence entropy lets zero padding and large keys meet
    state = [np.random.SeedSequence(e).generate_state(1)[0] for e in ([1, 1], [1, 1, 0])]
    assert state[0] == state[1]


def test_stream_seed_is_deterministic_and_accepted_by_torch() -> None:
    seed = stream_seed("order", 7, 3)
    assert seed == stream_seed("order", 7, 3) and 0 <= seed < 2**64
    a = torch.randperm(50, generator=torch.Generator().manual_seed(seed))
    b = torch.randperm(50, generator=torch.Generator().manual_seed(seed))
    assert a.tolist() == b.tolist()


def test_entropy_masks_negative_keys_and_matches_numpy_lists() -> None:
    assert stream_entropy(-1, 5) == [(1 << 63) - 1, 5]
    draw = np.random.default_rng(stream_entropy(3, 4, 5)).integers(0, 10**9, 4)
    assert draw.tolist() == np.random.default_rng([3, 4, 5]).integers(0, 10**9, 4).tolist()
