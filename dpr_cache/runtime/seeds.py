"""Independent random streams under one run seed: each stream is named by integer keys (the seed,
then e.g. the epoch or the rank), and numpy's ``SeedSequence`` mixes them, so no two names share a
stream. ``seed + epoch`` would not do: seed 2's epoch 0 would be seed 1's epoch 1."""

from __future__ import annotations

import numpy as np

_MASK63 = (1 << 63) - 1


def stream_entropy(*keys: int) -> list[int]:
    """The keys as ``SeedSequence`` entropy (non-negative: each masked to 63 bits)."""
    return [int(k) & _MASK63 for k in keys]


def stream_seed(*keys: int) -> int:
    """A 64-bit integer seed for ``torch.Generator.manual_seed`` / ``torch.manual_seed``, distinct
    for distinct keys."""
    state = np.random.SeedSequence(stream_entropy(*keys)).generate_state(1, np.uint64)
    return int(state[0])
