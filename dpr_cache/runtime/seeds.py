"""Independent random streams under one run seed. A stream is named by a purpose (``"order"``,
``"dropout"``) and integer keys (the seed, then e.g. the epoch or the rank); numpy's
``SeedSequence`` mixes the name, so no two names share a stream. ``seed + epoch`` would not do:
seed 2's epoch 0 would be seed 1's epoch 1."""

from __future__ import annotations

import zlib

import numpy as np

_MASK32 = (1 << 32) - 1
_MASK63 = (1 << 63) - 1
_MASK64 = (1 << 64) - 1


def stream_entropy(*keys: int) -> list[int]:
    """The keys as ``SeedSequence`` entropy, each masked to 63 bits (non-negative): what seeds
    the hard-negative draws of :mod:`dpr_cache.data.collate`."""
    return [int(k) & _MASK63 for k in keys]


def stream_seed(purpose: str, *keys: int) -> int:
    """A 64-bit seed for ``torch.manual_seed`` / ``torch.Generator.manual_seed``, one per
    (purpose, keys). The name is packed without ambiguity (the purpose's CRC-32, the number of
    keys, then two 32-bit words a key), so neither ``SeedSequence``'s zero padding nor its split
    of large keys can make two names meet. Torch's CPU generator keeps the low 32 bits; CUDA's
    all 64."""
    words = [zlib.crc32(purpose.encode()), len(keys)]
    for key in keys:
        key = int(key) & _MASK64
        words += [key >> 32, key & _MASK32]
    return int(np.random.SeedSequence(words).generate_state(1, np.uint64)[0])
