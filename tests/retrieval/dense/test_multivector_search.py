"""Multi-vector (late interaction) retrieval's store and search: token shards round-trip (offsets,
ids, float16 rounding, atomic writes); the streamed exact MaxSim top k equals the brute-force
:func:`dpr_cache.core.similarity.scores` over the same stored token vectors under budgets that
plan one block and many (of passages and of questions), shard subsets merge into the whole,
single passages score alike; a store whose passages' token ranges are shifted (negative control)
does not; the budget's error names a --memory-gb that fits."""

from __future__ import annotations

import re
from pathlib import Path

import numpy as np
import pytest
import torch

from dpr_cache.core.similarity import EMPTY_SCORE, scores
from dpr_cache.errors import InputError
from dpr_cache.retrieval.dense import maxsim as maxsim_module
from dpr_cache.retrieval.dense.maxsim import (
    PAIR_BYTES,
    QueryTokens,
    block_scores,
    maxsim_search,
    plan_token_blocks,
    row_maxsim,
)
from dpr_cache.retrieval.dense.search import _FIXED_BYTES, merge_hits
from dpr_cache.retrieval.dense.tokens import TokenStore, offsets_path, write_token_shard
from dpr_cache.runtime import memory

DIM = 8
N_PASSAGES = 240
MAX_TOKENS = 20
SHARDS = ((0, 100), (100, 190), (190, 240))
K = 10


def _unit(rng: np.random.Generator, n: int) -> np.ndarray:
    x = rng.standard_normal((n, DIM)).astype(np.float32)
    return x / np.linalg.norm(x, axis=1, keepdims=True)


def _padded(lengths, rng: np.random.Generator) -> np.ndarray:
    """[n, max(lengths), DIM]: unit token vectors, the zero vector after each one's length."""
    out = np.zeros((len(lengths), max(max(lengths), 1), DIM), np.float32)
    for i, n in enumerate(lengths):
        out[i, :n] = _unit(rng, n)
    return out


def _write(root: Path, passages: np.ndarray, lengths, dtype: str, name: str = "t") -> list[Path]:
    """The passages as token shards of SHARDS' rows, each written in pieces of 30 passages."""
    paths = []
    for k, (a, b) in enumerate(SHARDS):
        pieces = []
        for s in range(a, b, 30):
            e = min(b, s + 30)
            tokens = np.concatenate([passages[i, : lengths[i]] for i in range(s, e)])
            pieces.append(([f"p{i}" for i in range(s, e)], tokens, np.array(lengths[s:e])))
        paths.append(root / f"{name}-{k:05d}.npy")
        write_token_shard(paths[-1], pieces, dtype)
    return paths


@pytest.fixture
def corpus(tmp_path: Path):
    """A float16 token store of 240 passages of 0..20 tokens (some empty) in three shards,
    the same passages as stored (float16 rounded, padded) for the reference, and 37 questions
    of 1..7 tokens."""
    rng = np.random.default_rng(0)
    lengths = rng.integers(0, MAX_TOKENS + 1, size=N_PASSAGES).tolist()
    lengths[5] = lengths[150] = 0
    passages = _padded(lengths, rng)
    store = TokenStore.open(_write(tmp_path, passages, lengths, "float16"))
    stored = passages.astype(np.float16).astype(np.float32)
    questions = _padded(rng.integers(1, 8, size=37).tolist(), rng)
    return store, stored, questions, lengths


@pytest.fixture(autouse=True)
def steady_rss(monkeypatch) -> int:
    """The resident memory the plans read, held at its value now."""
    held = memory.rss_bytes()
    monkeypatch.setattr(memory, "rss_bytes", lambda: held)
    return held


def _reference(questions: np.ndarray, stored: np.ndarray) -> np.ndarray:
    return scores(torch.from_numpy(questions), torch.from_numpy(stored)).numpy()


def _budget(store: TokenStore, questions: np.ndarray, free: int) -> int:
    """The memory budget that leaves ``free`` bytes to the blocks."""
    heaps = 2 * 12 * K * len(questions)
    return memory.rss_bytes() + _FIXED_BYTES + heaps + free


def _blocks(store: TokenStore, questions: np.ndarray, budget: int) -> tuple[int, int]:
    """How many store blocks and question blocks a search under ``budget`` scans."""
    tokens = QueryTokens.of(questions)
    plan = plan_token_blocks(budget, store, tokens, K)
    return sum(1 for _ in store.blocks(plan.block_tokens)), len(
        list(tokens.groups(plan.query_tokens))
    )


@pytest.mark.parametrize("free", [10**9, 60_000, 6_000])
def test_streamed_maxsim_equals_brute_force(corpus, monkeypatch, free) -> None:
    """One block of each (10**9), many store blocks (60 kB), many of both (6 kB)."""
    monkeypatch.setattr(maxsim_module, "MIN_BLOCK_TOKENS", 16)
    store, stored, questions, _ = corpus
    budget = _budget(store, questions, free)
    store_blocks, query_blocks = _blocks(store, questions, budget)
    assert {10**9: store_blocks == 3, 60_000: store_blocks > 10, 6_000: store_blocks > 100}[free]
    assert (query_blocks == 1) == (free > 6_000)
    hits = maxsim_search(store, questions, K, budget)
    reference = _reference(questions, stored)
    want = np.argsort(-reference, axis=1, kind="stable")[:, :K]
    np.testing.assert_array_equal(hits.rows, want)
    np.testing.assert_allclose(
        hits.scores, np.take_along_axis(reference, want, 1), rtol=1e-5, atol=1e-5
    )


def test_negative_control_shifted_token_ranges_are_caught(corpus, tmp_path) -> None:
    """The same tokens with each passage's range moved by one token (a wrong offsets file):
    the comparison of the test above fails."""
    store, stored, questions, lengths = corpus
    path = offsets_path(store.shards[0].path)
    offsets = np.load(path)
    offsets[1:-1] = np.minimum(offsets[1:-1] + 1, offsets[-1])
    np.save(path, np.maximum.accumulate(offsets))
    shifted = TokenStore.open([s.path for s in store.shards])
    hits = maxsim_search(shifted, questions, K, _budget(store, questions, 10**9))
    want = np.argsort(-_reference(questions, stored), axis=1, kind="stable")[:, :K]
    assert (hits.rows != want).any()


def test_shards_merge_into_the_whole_and_single_rows_score_alike(corpus) -> None:
    store, stored, questions, lengths = corpus
    budget = _budget(store, questions, 10**9)
    parts = [maxsim_search(store, questions, K, budget, shards=s) for s in ([0, 2], [1])]
    whole = maxsim_search(store, questions, K, budget)
    merged = merge_hits(parts, K)
    np.testing.assert_array_equal(merged.rows, whole.rows)
    np.testing.assert_array_equal(merged.scores, whole.scores)
    reference = _reference(questions, stored)
    rows = np.array([150, 3, 239, 5, 120, 3])  # out of order, repeated, across shards, empty
    got = row_maxsim(store, questions[4], rows)
    np.testing.assert_allclose(got, reference[4, rows], rtol=1e-5, atol=1e-5)
    assert got[0] == got[3] == EMPTY_SCORE


def test_a_question_without_tokens_finds_nothing_and_scores_as_the_reference(corpus) -> None:
    store, stored, questions, _ = corpus
    questions = questions.copy()
    questions[2] = 0.0
    hits = maxsim_search(store, questions, N_PASSAGES, _budget(store, questions, 10**9))
    assert (hits.rows[2] == -1).all() and np.isneginf(hits.scores[2]).all()
    reference = _reference(questions, stored)
    assert set(np.unique(reference[2]).tolist()) == {0.0, EMPTY_SCORE}  # every passage ties
    np.testing.assert_allclose(
        block_scores(QueryTokens.of(questions[2:3]), *store.take(np.arange(N_PASSAGES)))[0],
        reference[2],
    )
    for i in (0, 1, 3):  # the others rank every passage as the reference does
        np.testing.assert_allclose(
            np.sort(hits.scores[i]), np.sort(reference[i]), rtol=1e-5, atol=1e-5
        )


def test_token_shards_round_trip(corpus, tmp_path) -> None:
    """Blocks give back every passage's tokens and offsets in order, ids by row, any rows by
    offset; float32 shards hold the vectors exactly; a shard's files are standard .npy."""
    store, stored, _, lengths = corpus
    assert (store.rows, store.tokens, store.longest) == (N_PASSAGES, sum(lengths), MAX_TOKENS)
    seen = []
    for start, tokens, offsets in store.blocks(50):
        assert len(tokens) <= 50 and offsets[0] == 0 and offsets[-1] == len(tokens)
        for j in range(len(offsets) - 1):
            n = lengths[start + j]
            np.testing.assert_array_equal(
                tokens[offsets[j] : offsets[j + 1]], stored[start + j, :n]
            )
            seen.append(start + j)
    assert seen == list(range(N_PASSAGES))
    assert store.ids_of(np.array([[0, -1], [239, 100]])).tolist() == [["p0", ""], ["p239", "p100"]]
    np.testing.assert_array_equal(
        np.load(offsets_path(store.shards[1].path)), np.cumsum([0, *lengths[100:190]])
    )
    exact = _padded(lengths, np.random.default_rng(5))
    paths = _write(tmp_path, exact, lengths, "float32", name="f32")
    tokens, offsets = TokenStore.open(paths).take(np.array([200, 7]))
    np.testing.assert_array_equal(
        tokens, np.concatenate([exact[200, : lengths[200]], exact[7, : lengths[7]]])
    )
    assert offsets.tolist() == [0, lengths[200], lengths[200] + lengths[7]]
    assert np.load(paths[0]).shape == (sum(lengths[:100]), DIM)


def test_a_failed_write_leaves_nothing_and_bad_files_are_one_line(corpus, tmp_path) -> None:
    def failing():
        yield ["a"], np.ones((2, DIM), np.float32), np.array([2])
        raise RuntimeError("encoder died")

    with pytest.raises(RuntimeError, match="encoder died"):
        write_token_shard(tmp_path / "x-00000.npy", failing())
    assert not list(tmp_path.glob("x-00000*"))
    store = corpus[0]
    np.save(offsets_path(store.shards[2].path), np.array([0, 5, 3], np.int64))
    with pytest.raises(InputError, match=r"offsets\.npy: not the offsets of \d+ tokens"):
        TokenStore.open([s.path for s in store.shards])


def test_the_budget_error_names_a_budget_that_fits(corpus) -> None:
    store, _, questions, _ = corpus
    tokens = QueryTokens.of(questions)
    least = memory.rss_bytes() + _FIXED_BYTES + 2 * 12 * K * len(questions)
    with pytest.raises(InputError, match=r"give --memory-gb ([0-9.]+) or more$") as refused:
        maxsim_search(store, questions, K, least)
    given = float(re.search(r"give --memory-gb ([0-9.]+) or more$", str(refused.value))[1])
    plan = plan_token_blocks(int(given * 1e9), store, tokens, K)
    assert plan.block_tokens >= store.longest and plan.query_tokens >= tokens.longest
    assert PAIR_BYTES * plan.block_tokens * plan.query_tokens <= plan.free_bytes
    with pytest.raises(InputError, match=r"question token vectors of shape \(3, 4\)"):
        maxsim_search(store, np.zeros((3, 4), np.float32), K, int(given * 1e9))
