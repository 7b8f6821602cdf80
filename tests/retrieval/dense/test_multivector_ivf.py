"""The fast path of a multi-vector index (``index.type: ivf``) on synthetic topical token
vectors: its recall@100 against the exact streamed MaxSim (measured 0.993 with 64 lists, 16 probed),
the scores of what it returns exact (the brute-force MaxSim of those passages), less recall with
fewer lists probed and fewer token hits (a negative control: the recall measured is the
candidates', not a tautology); its files, and the index types a multi-vector index is not."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from dpr_cache.config import IndexConfig
from dpr_cache.errors import InputError
from dpr_cache.retrieval.dense import token_ivf
from dpr_cache.retrieval.dense.index import finish_index, open_index, search_index
from dpr_cache.retrieval.dense.maxsim import maxsim_search, row_maxsim
from dpr_cache.retrieval.dense.tokens import TokenStore, write_token_shard

DIM, TOPICS, PASSAGES, QUESTIONS, K = 16, 128, 1500, 30, 100
BUDGET = 8 * 10**9


def _unit(x: np.ndarray) -> np.ndarray:
    return (x / np.linalg.norm(x, axis=-1, keepdims=True)).astype(np.float32)


@pytest.fixture(scope="module")
def topical(tmp_path_factory) -> tuple[TokenStore, np.ndarray, Path]:
    """1,500 passages of 5..29 tokens near 4 of 128 topics each, in two shards, and 30
    questions of noisy tokens of a passage each."""
    root = tmp_path_factory.mktemp("topical")
    rng = np.random.default_rng(0)
    centers = _unit(rng.standard_normal((TOPICS, DIM)))
    lengths = rng.integers(5, 30, size=PASSAGES)
    passages = []
    for n in lengths:
        topics = rng.choice(TOPICS, size=4, replace=False)
        near = centers[rng.choice(topics, size=n)]
        passages.append(_unit(near + 0.3 * rng.standard_normal(near.shape)))
    paths = []
    for k, (a, b) in enumerate([(0, 700), (700, PASSAGES)]):
        paths.append(root / "shards" / f"t-{k:05d}.npy")
        piece = ([f"p{i}" for i in range(a, b)], np.concatenate(passages[a:b]), lengths[a:b])
        write_token_shard(paths[-1], [piece])
    questions = np.zeros((QUESTIONS, 12, DIM), np.float32)
    for i in range(QUESTIONS):
        source = passages[rng.integers(PASSAGES)]
        picked = source[rng.choice(len(source), size=min(12, len(source)), replace=False)]
        questions[i, : len(picked)] = _unit(picked + 0.3 * rng.standard_normal(picked.shape))
    return TokenStore.open(paths), questions, root


def _recall(found: np.ndarray, exact: np.ndarray) -> float:
    return float(np.mean([len(set(f) & set(e)) / K for f, e in zip(found, exact, strict=True)]))


def test_recall_at_100_against_the_exact_search(topical, monkeypatch) -> None:
    store, questions, root = topical
    exact = maxsim_search(store, questions, K, BUDGET)
    spec = IndexConfig(type="ivf", ivf_nlist=64, ivf_nprobe=16)
    meta = finish_index(root / "ivf", store, spec)
    assert meta["type"] == "ivf" and meta["vectors"] == "multi"
    assert meta["index_params"]["nlist"] == 64 and (root / "ivf" / "faiss.ivfdata").is_file()
    opened = open_index(root / "ivf", spec)
    fast = search_index(opened, questions, K, BUDGET)
    recall = _recall(fast.rows, exact.rows)
    assert recall >= 0.95, recall  # measured 0.993
    assert (fast.rows[:, 0] == exact.rows[:, 0]).all()
    for i in (0, 7, 29):  # what it returns is scored exactly
        np.testing.assert_allclose(
            fast.scores[i], row_maxsim(store, questions[i], fast.rows[i]), rtol=1e-6
        )
    monkeypatch.setattr(token_ivf, "MIN_TOKEN_HITS", 8)
    monkeypatch.setattr(token_ivf, "TOKEN_HITS_PER_K", 0)
    narrow = open_index(root / "ivf", spec.model_copy(update={"ivf_nprobe": 1}))
    low = _recall(search_index(narrow, questions, K, BUDGET).rows, exact.rows)
    assert low < recall - 0.2  # measured 0.19


@pytest.mark.parametrize("kind", ["ivfpq", "hnsw"])
def test_other_types_are_refused(topical, kind) -> None:
    store, _, root = topical
    with pytest.raises(InputError, match=f"index.type: '{kind}': a multi-vector model's index"):
        finish_index(root / kind, store, IndexConfig(type=kind))
    assert not (root / kind).exists()
