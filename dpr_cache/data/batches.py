"""Which questions go in each training step: seeded per-epoch shuffles, split across ranks;
with several sources, one source a batch (chosen by weight or in turn) or rows of all mixed."""

from __future__ import annotations

import bisect
from collections.abc import Sequence

import numpy as np
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

    def __init__(
        self,
        n: int,
        batch_size: int,
        seed: int,
        *,
        source: str = "the training set",
        offsets: Sequence[int] = (0,),
    ):
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
        self.offsets = list(offsets)  # where each source's rows start (rows of all, mixed)
        self._epoch = -1
        self._perm: list[int] = []

    def source_of(self, step: int) -> int | None:
        """The source every row of a step's batch comes from; None: rows of every source."""
        return None if len(self.offsets) > 1 else 0

    def draw_epoch(self, step: int) -> int:
        """The epoch that seeds the hard-negative draws of a step's questions."""
        return self.epoch_of(step)

    def rows_of(self, source: int) -> range:
        """The dataset rows of one source."""
        ends = [*self.offsets[1:], self.n]
        return range(int(self.offsets[source]), int(ends[source]))

    def sources_of(self, indices: Sequence[int]) -> list[int]:
        """The source of each dataset row."""
        return [bisect.bisect_right(self.offsets, i) - 1 for i in indices]

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


SOURCE_ORDER = 'stream_seed("sources", seed, epoch), stream_seed("order", seed, epoch, source)'
"""How one-source batches are drawn, recorded in checkpoints beside :data:`EPOCH_ORDER`."""


class SourceBatches(TrainBatches):
    """Global batches each drawn whole from one source (its in-batch negatives from one domain).

    Source ``i`` holds rows ``offsets[i] .. offsets[i] + sizes[i] - 1`` of the joined dataset and
    has ``sizes[i] // batch_size`` batches an epoch of its own (its rows reshuffled each of its
    epochs by ``stream_seed("order", seed, its epoch, i)``; a partial batch dropped). An epoch of
    the run has as many steps as all sources have batches:

    - ``proportional``: source ``i`` takes ``weights[i] / sum(weights)`` of an epoch's steps
      (largest remainders; the weights default to the sources' batch counts, so each source is
      seen once an epoch, as sentence-transformers' PROPORTIONAL sampler does), in an order
      shuffled each epoch by ``stream_seed("sources", seed, epoch)``;
    - ``round_robin``: the sources in turn, in the order listed, for as many rounds as the
      smallest source has batches (sentence-transformers' ROUND_ROBIN).

    A source's batches run on from one epoch into the next (a source drawn more often than it
    has batches begins its next epoch of its own), and everything is a function of the step: a
    resumed run, and every rank, finds the same batch.
    """

    def __init__(
        self,
        sizes: Sequence[int],
        batch_size: int,
        seed: int,
        *,
        batching: str,
        weights: Sequence[float] | None = None,
        names: Sequence[str] | None = None,
    ):
        names = list(names or [f"source {i}" for i in range(len(sizes))])
        per_source = [n // batch_size for n in sizes]
        for name, n, count in zip(names, sizes, per_source, strict=True):
            if count == 0:
                raise InputError(
                    f"data.train: source {name} has {n} questions, fewer than "
                    f"train.batch_size={batch_size}, and under data.batching {batching} every "
                    "batch comes from one source: lower the batch size or use mixed"
                )
        if batching == "round_robin":
            counts = [min(per_source)] * len(sizes)
        else:
            counts = _shares(weights or per_source, sum(per_source))
        super().__init__(sum(sizes), batch_size, seed, offsets=np.cumsum([0, *sizes[:-1]]))
        self.batching, self.sizes, self.names = batching, list(sizes), names
        self.per_source, self.counts = per_source, counts
        self.steps_per_epoch = sum(counts)
        self._order_epoch, self._order, self._rank = -1, np.zeros(0, int), np.zeros(0, int)
        self._perms: dict[int, tuple[int, list[int]]] = {}

    def _epoch_order(self, epoch: int) -> tuple[np.ndarray, np.ndarray]:
        """An epoch's source a step, and how many batches of that source came before it."""
        if epoch != self._order_epoch:
            sources = np.repeat(np.arange(len(self.counts)), self.counts)
            if self.batching == "round_robin":
                sources = np.tile(np.arange(len(self.counts)), self.counts[0])
            else:
                rng = np.random.default_rng(stream_seed("sources", self.seed, epoch))
                sources = rng.permutation(sources)
            rank = np.zeros(len(sources), dtype=np.int64)
            for i in range(len(self.counts)):
                mine = sources == i
                rank[mine] = np.arange(int(mine.sum()))
            self._order_epoch, self._order, self._rank = epoch, sources, rank
        return self._order, self._rank

    def _place(self, step: int) -> tuple[int, int, int]:
        """(source, its own epoch, its batch in that epoch) of a global step."""
        epoch, j = divmod(step, self.steps_per_epoch)
        order, rank = self._epoch_order(epoch)
        source = int(order[j])
        seen = epoch * self.counts[source] + int(rank[j])
        own_epoch, batch = divmod(seen, self.per_source[source])
        return source, own_epoch, batch

    def source_of(self, step: int) -> int:
        return self._place(step)[0]

    def batches_seen(self, step: int) -> int:
        """How many batches the source of ``step`` has given up to it, that one included."""
        epoch, j = divmod(step, self.steps_per_epoch)
        order, rank = self._epoch_order(epoch)
        return epoch * self.counts[int(order[j])] + int(rank[j]) + 1

    def draw_epoch(self, step: int) -> int:
        return self._place(step)[1]

    def batch_indices(self, step: int) -> list[int]:
        if step < 0:
            raise ValueError(f"step must be >= 0, got {step}")
        source, own_epoch, batch = self._place(step)
        cached = self._perms.get(source)
        if cached is None or cached[0] != own_epoch:
            seed = stream_seed("order", self.seed, own_epoch, source)
            gen = torch.Generator().manual_seed(seed)
            perm = torch.randperm(self.sizes[source], generator=gen).tolist()
            self._perms[source] = cached = (own_epoch, perm)
        start, offset = batch * self.batch_size, int(self.offsets[source])
        return [offset + i for i in cached[1][start : start + self.batch_size]]


def _shares(weights: Sequence[float], steps: int) -> list[int]:
    """``steps`` split in proportion to ``weights`` by largest remainders."""
    total = float(sum(weights))
    exact = [w / total * steps for w in weights]
    counts = [int(x) for x in exact]
    by_remainder = sorted(range(len(exact)), key=lambda i: (counts[i] - exact[i], i))
    for i in by_remainder[: steps - sum(counts)]:
        counts[i] += 1
    return counts
