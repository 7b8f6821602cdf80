"""Training sources: each one read in its own layout into its own Arrow cache, joined without a
copy, with what each brings to the batches drawn from it (its weight, prompts, hard
negatives)."""

from __future__ import annotations

import logging
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
from datasets import Dataset, concatenate_datasets

from dpr_cache.data.batches import SourceBatches, TrainBatches
from dpr_cache.data.ids import passage_hash, text_hash
from dpr_cache.data.training import Reading, check_teacher_scores, load_training_set
from dpr_cache.errors import InputError
from dpr_cache.runtime.atomic import write_atomic

log = logging.getLogger(__name__)

__all__ = ["Source", "Sources", "load_sources"]

BATCHINGS = ("proportional", "round_robin", "mixed")


@dataclass(frozen=True)
class Source:
    """One ``data.train`` entry: where it is, how it is read, and what it brings to a batch
    (None: the run's own setting)."""

    path: Path
    name: str
    reading: Reading = Reading()
    weight: float | None = None
    query_prefix: str | None = None
    passage_prefix: str | None = None
    hard_negatives: int | None = None


@dataclass
class Sources:
    """The joined dataset of every source and the rows each one holds."""

    dataset: Dataset
    sources: list[Source]
    sizes: list[int]
    offsets: list[int] = field(init=False)

    def __post_init__(self) -> None:
        self.offsets = np.cumsum([0, *self.sizes[:-1]]).tolist()

    def batches(self, batch_size: int, seed: int, batching: str) -> TrainBatches:
        """The steps' batches: one source a batch (``proportional``, ``round_robin``) or rows of
        every source (``mixed``)."""
        if batching == "mixed" or len(self.sources) == 1:
            names = ", ".join(str(s.path) for s in self.sources)
            return TrainBatches(
                len(self.dataset), batch_size, seed, source=names, offsets=self.offsets
            )
        weights = None
        if any(s.weight is not None for s in self.sources):
            weights = [1.0 if s.weight is None else s.weight for s in self.sources]
        names = [s.name for s in self.sources]
        return SourceBatches(
            self.sizes, batch_size, seed, batching=batching, weights=weights, names=names
        )


def load_sources(
    sources: list[Source], cache_dir: Path, *, scored_negatives: int | None = None
) -> Sources:
    """Every source streamed into its own Arrow cache (once; later runs memory-map it) and
    joined in the order given. With ``scored_negatives`` H, every record must bring a
    ``teacher_score`` on its positive and at least H hard negatives, all scored. Two sources
    that give one passage id to different texts are refused."""
    parts: list[Dataset] = []
    caches: list[Path] = []
    for source in sources:
        stats: dict[str, Any] = {}
        parts.append(load_training_set(source.path, cache_dir, stats=stats, reading=source.reading))
        caches.append(Path(stats["cache_file"]))
        if scored_negatives is not None:
            check_teacher_scores(stats, scored_negatives)
    if len(parts) > 1:
        check_shared_ids(sources, parts, caches)
    dataset = parts[0] if len(parts) == 1 else concatenate_datasets(parts)
    return Sources(dataset, list(sources), [len(p) for p in parts])


_CTX_COLUMNS = ("positive_ctxs", "hard_negative_ctxs", "negative_ctxs")


def _explicit_ids(dataset: Dataset, cache: Path) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Every passage with an id of its own (not one derived from its text): its id's hash, its
    text's hash and its first record, each id once, sorted by id; computed once a cache file
    (saved beside it as ``.ids.npz``)."""
    saved = cache.with_suffix(".ids.npz")
    if saved.exists():
        with np.load(saved) as z:
            return z["ids"], z["texts"], z["rows"]
    chunks = []
    for start in range(0, len(dataset), 4096):
        batch = dataset[start : start + 4096]
        found = [
            (passage_hash(ctx["passage_id"]), text_hash(ctx["title"], ctx["text"]), r)
            for column in _CTX_COLUMNS
            for r, ctxs in enumerate(batch[column], start=start)
            for ctx in ctxs
            if not ctx["passage_id"].startswith("h:")
        ]
        chunks.append(np.asarray(found, dtype=np.int64).reshape(-1, 3))
    table = np.concatenate(chunks) if chunks else np.zeros((0, 3), dtype=np.int64)
    table = table[np.lexsort((table[:, 2], table[:, 0]))]
    keep = np.ones(len(table), dtype=bool)
    keep[1:] = table[1:, 0] != table[:-1, 0]
    ids, texts, rows = (np.ascontiguousarray(table[keep, c]) for c in range(3))

    def save(tmp: Path) -> None:
        with open(tmp, "wb") as f:
            np.savez(f, ids=ids, texts=texts, rows=rows)

    write_atomic(saved, save)
    return ids, texts, rows


def check_shared_ids(sources: list[Source], parts: list[Dataset], caches: list[Path]) -> None:
    """InputError naming both records when two sources give one passage id to different
    texts (the false-negative mask, by id, would take one passage for the other)."""
    seen = [_explicit_ids(part, cache) for part, cache in zip(parts, caches, strict=True)]
    for a in range(len(parts)):
        for b in range(a + 1, len(parts)):
            shared, ia, ib = np.intersect1d(seen[a][0], seen[b][0], return_indices=True)
            differ = np.flatnonzero(seen[a][1][ia] != seen[b][1][ib])
            if len(differ):
                k = differ[0]
                row_a, row_b = int(seen[a][2][ia[k]]), int(seen[b][2][ib[k]])
                pid = _id_of(parts[a][row_a], int(shared[k]))
                raise InputError(
                    f"data.train: passage id {pid!r} has one text in {sources[a].path} record "
                    f"{row_a} and another in {sources[b].path} record {row_b}: give the sources "
                    "distinct ids (or none: an id is then derived from the text)"
                )


def _id_of(record: dict[str, Any], hashed: int) -> str:
    for column in _CTX_COLUMNS:
        for ctx in record[column]:
            if passage_hash(ctx["passage_id"]) == hashed:
                return ctx["passage_id"]
    return str(hashed)
