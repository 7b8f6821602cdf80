"""Which questions go in each training step: seeded per-epoch shuffles, split across ranks."""

from __future__ import annotations

import torch

from dpr_cache.errors import InputError
from dpr_cache.runtime.seeds import stream_seed

EPOCH_ORDER = 'stream_seed("order", seed, epoch)'
"""How epoch orders are drawn, recorded in checkpoints: a run resumes only under its own order."""


class TrainBatches:
    """Global batches of ``batch_size`` question indices over a dataset of ``n`` questions.

    Epoch ``e`` uses the permutation ``torch.randperm(n)`` drawn from a generator seeded with
    ``stream_seed("order", seed, e)`` (:data:`EPOCH_ORDER`), so no two seeds share an epoch's
    order; the last incomplete batch is dropped, so ``steps_per_epoch = n // batch_size``.
    Steps are global: step ``s`` is batch ``s % steps_per_epoch`` of epoch
    ``s // steps_per_epoch``, so a resumed run picks up exactly where it stopped.
    """

    def __init__(self, n: int, batch_size: int, seed: int, *, source: str = "the training set"):
        if batch_size <= 0:
            raise InputError(f"train.batch_size must be positive, got {batch_size}")
        if batch_size > n:
            raise InputError(
                f"train.batch_size={batch_size} is larger than {source} ({n} questions)"
            )
        self.n = n
        self.batch_size = batch_size
        self.seed = seed
        self.steps_per_epoch = n // batch_size
        self._epoch = -1
        self._perm: list[int] = []

    def epoch_of(self, step: int) -> int:
        """The epoch a global step falls in."""
        return step // self.steps_per_epoch

    def permutation(self, epoch: int) -> list[int]:
        """The question order of an epoch."""
        if epoch != self._epoch:
            gen = torch.Generator().manual_seed(stream_seed("order", self.seed, epoch))
            self._perm = torch.randperm(self.n, generator=gen).tolist()
            self._epoch = epoch
        return self._perm

    def batch_indices(self, step: int) -> list[int]:
        """The dataset indices of the global batch at a global step (0-based)."""
        if step < 0:
            raise ValueError(f"step must be >= 0, got {step}")
        perm = self.permutation(self.epoch_of(step))
        start = (step % self.steps_per_epoch) * self.batch_size
        return perm[start : start + self.batch_size]

    @staticmethod
    def rank_slice(indices: list[int], rank: int, world_size: int) -> list[int]:
        """The contiguous part of a global batch that rank ``rank`` of ``world_size`` encodes."""
        if len(indices) % world_size:
            raise InputError(
                f"train.batch_size={len(indices)} is not divisible by the {world_size} ranks"
            )
        if not 0 <= rank < world_size:
            raise ValueError(f"rank {rank} out of range for world size {world_size}")
        b = len(indices) // world_size
        return indices[rank * b : (rank + 1) * b]
