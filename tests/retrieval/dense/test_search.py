"""The streamed exact search against FAISS's in-RAM IndexFlatIP over the same vectors, with the
memory budget forcing many store blocks and query blocks; merging and the budget's limits."""

from __future__ import annotations

import re
from pathlib import Path

import faiss
import numpy as np
import pytest

from dpr_cache.errors import InputError
from dpr_cache.retrieval.dense import search as search_module
from dpr_cache.retrieval.dense.search import (
    Hits,
    exact_search,
    merge_hits,
    plan_blocks,
)
from dpr_cache.retrieval.dense.store import EmbeddingStore, write_shard
from dpr_cache.runtime import memory
from dpr_cache.runtime.memory import memory_limit

DIM = 16


@pytest.fixture
def store(tmp_path: Path) -> tuple[EmbeddingStore, np.ndarray]:
    """3,000 float16 vectors in shards of 1,100, 900 and 1,000 rows; returns them as float32."""
    rng = np.random.default_rng(0)
    vectors = rng.standard_normal((3000, DIM)).astype(np.float32)
    start = 0
    for i, n in enumerate((1100, 900, 1000)):
        ids = [f"p{j}" for j in range(start, start + n)]
        write_shard(tmp_path / f"s{i}.npy", vectors[start : start + n], ids)
        start += n
    return EmbeddingStore.from_glob(str(tmp_path / "s*.npy")), vectors.astype(np.float16)


def _reference(vectors: np.ndarray, queries: np.ndarray, k: int):
    index = faiss.IndexFlatIP(vectors.shape[1])
    index.add(vectors.astype(np.float32))
    return index.search(queries, k)


@pytest.fixture(autouse=True)
def steady_rss(monkeypatch) -> int:
    """The process's resident memory as the search reads it, held at its value now: a block of
    these 16-d rows is a few hundred bytes, under what the process's memory moves by from one
    search to the next."""
    held = memory.rss_bytes()
    monkeypatch.setattr(memory, "rss_bytes", lambda: held)
    return held


def _budget_for(block_rows: int, store: EmbeddingStore) -> int:
    """A memory budget whose plan holds about ``block_rows`` store rows at a time."""
    row_bytes = store.dim * (store.dtype.itemsize + 4)
    return (
        memory.rss_bytes() + search_module._FIXED_BYTES + int(block_rows * row_bytes / 0.8) + 4096
    )


def test_equals_faiss_in_ram_over_many_blocks(store, monkeypatch) -> None:
    store, vectors = store
    monkeypatch.setattr(search_module, "MIN_BLOCK_ROWS", 64)
    queries = np.random.default_rng(1).standard_normal((300, DIM)).astype(np.float32)
    budget = _budget_for(256, store)
    plan = plan_blocks(budget, DIM, 2, len(queries), 50)
    assert plan.block_rows < 400 and plan.query_rows < len(queries)  # many of both
    hits = exact_search(store, queries, 50, budget)
    want_scores, want_rows = _reference(vectors, queries, 50)
    np.testing.assert_allclose(hits.scores, want_scores, rtol=1e-5, atol=1e-5)
    gaps = np.abs(np.diff(want_scores, axis=1)) > 1e-4  # positions without a near-tie
    clear = np.concatenate([gaps[:, :1], gaps[:, 1:] & gaps[:, :-1], gaps[:, -1:]], axis=1)
    assert (hits.rows[clear] == want_rows[clear]).all()
    assert clear.mean() > 0.9


def test_negative_control_the_stored_precision_matters(store) -> None:
    """Scores come from the stored float16 vectors: against the float32 originals they differ."""
    store, vectors = store
    queries = np.random.default_rng(1).standard_normal((20, DIM)).astype(np.float32)
    hits = exact_search(store, queries, 5, _budget_for(4096, store))
    originals = np.random.default_rng(0).standard_normal((3000, DIM)).astype(np.float32)
    exact_fp32, _ = _reference(originals, queries, 5)
    assert np.abs(hits.scores - exact_fp32).max() > 1e-4


def test_k_larger_than_the_store_and_a_shard_subset(store) -> None:
    store, vectors = store
    queries = vectors[:3].astype(np.float32)
    hits = exact_search(store, queries, 5000, _budget_for(4096, store))
    assert hits.rows.shape == (3, 3000) and sorted(hits.rows[0].tolist()) == list(range(3000))
    part = exact_search(store, queries, 10, _budget_for(4096, store), shards=[1])
    assert ((part.rows >= 1100) & (part.rows < 2000)).all()


def test_merging_the_shards_partial_results_gives_the_whole(store) -> None:
    store, _ = store
    queries = np.random.default_rng(2).standard_normal((40, DIM)).astype(np.float32)
    budget = _budget_for(4096, store)
    parts = [exact_search(store, queries, 20, budget, shards=[i]) for i in range(3)]
    merged = merge_hits(parts, 20)
    whole = exact_search(store, queries, 20, budget)
    np.testing.assert_array_equal(merged.scores, whole.scores)
    np.testing.assert_array_equal(merged.rows, whole.rows)
    short = merge_hits([Hits(p.scores[:, :5], p.rows[:, :5]) for p in parts], 20)
    assert (short.rows[:, 15:] == -1).all()  # fewer candidates than k: -1 rows


def test_budget_and_query_errors_are_one_line(store) -> None:
    store, _ = store
    with pytest.raises(
        InputError, match=r"a memory budget of 0\.10 GB is too small; this process already"
    ):
        exact_search(store, np.zeros((2, DIM), np.float32), 5, 10**8)
    with pytest.raises(InputError, match=r"query vectors of shape \(2, 7\) against 16-d"):
        exact_search(store, np.zeros((2, 7), np.float32), 5, _budget_for(4096, store))


def test_an_unset_budget_is_headroom_over_what_the_process_holds(store, monkeypatch) -> None:
    """A process that holds 5.33 GB before its search (what a GPU process's host memory came to
    on one machine) is refused under a whole-process 4 GB, and searches exactly under the
    default, whose blocks get the 4 GB headroom over what it holds."""
    store, vectors = store
    held = 5_330_000_000
    monkeypatch.setattr(memory, "rss_bytes", lambda: held)
    assert memory_limit(2.5) == 2_500_000_000
    assert memory_limit(None) == held + 4 * 10**9
    queries = np.random.default_rng(3).standard_normal((30, DIM)).astype(np.float32)
    with pytest.raises(
        InputError, match=r"a memory budget of 4\.00 GB is too small; this process already "
    ) as refused:
        exact_search(store, queries, 10, memory_limit(4.0))
    given = float(re.search(r"give --memory-gb ([0-9.]+) or more$", str(refused.value))[1])
    assert plan_blocks(memory_limit(given), DIM, 2, len(queries), 10).block_rows >= 1024
    with pytest.raises(InputError, match="too small"):
        plan_blocks(memory_limit(given - 0.1), DIM, 2, len(queries), 10)
    plan = plan_blocks(memory_limit(None), DIM, 2, len(queries), 10)
    assert plan.free_bytes == 4 * 10**9 - search_module._FIXED_BYTES
    hits = exact_search(store, queries, 10, memory_limit(None))
    want_scores, _ = _reference(vectors, queries, 10)
    np.testing.assert_allclose(hits.scores, want_scores, rtol=1e-5, atol=1e-5)
