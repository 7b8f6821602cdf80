"""Corpus index (sharded, resumable, FAISS) and evaluation files, with a tiny random BERT.

References are independent of the code under test: numpy brute-force search, answers recounted
from the passage texts, and a tower run through plain ``transformers``.
"""

from __future__ import annotations

import csv
import json
import re
import shutil
from pathlib import Path

import numpy as np
import pytest
import torch
from transformers import AutoModel, AutoTokenizer

from dpr_cache.config import Config, IndexConfig
from dpr_cache.data.tokenize import encode_questions
from dpr_cache.errors import InputError
from dpr_cache.model.biencoder import BiEncoder
from dpr_cache.retrieval.dense import index as dense_index
from dpr_cache.retrieval.dense.encode import encode_passage_texts, encode_question_texts
from dpr_cache.retrieval.dense.faiss_index import check_index_spec, hnsw_bytes
from dpr_cache.retrieval.dense.index import finish_index, open_index, search_index
from dpr_cache.retrieval.dense.shards import shard_key
from dpr_cache.retrieval.dense.store import EmbeddingStore, write_shard
from dpr_cache.retrieval.drivers import eval as eval_command
from dpr_cache.retrieval.drivers.eval import evaluate, format_metrics_table
from dpr_cache.retrieval.drivers.index import build_index
from dpr_cache.runtime import memory
from tests.support.fixtures import index_vectors

BUDGET = 32 * 10**9  # memory budgets here only size the blocks (capped by the shards)


def test_files_follow_the_contract(corpus, built: Config) -> None:
    out = built.output_path
    index_dir = out / "index"
    meta = json.loads((index_dir / "meta.json").read_text())
    assert meta["rows"] == corpus["n_passages"] and meta["dim"] == 32
    assert meta["type"] == "flat" and meta["store_dtype"] == "float16"
    assert meta["model"]["pooling"] == "cls"
    assert meta["model"]["dir"] == str((out / "model").resolve())
    assert meta["timings"]["encoded_passages"] == corpus["n_passages"]
    assert [s["rows"] for s in meta["shards"]] == [16, 16, 16, 2]
    assert all((index_dir / s["path"]).is_file() for s in meta["shards"])
    assert not (index_dir / "faiss.index").exists()  # a flat index is its shards

    metrics = json.loads((out / "eval" / "metrics.json").read_text())
    ks = (1, 5, 20)
    assert set(metrics) == {f"top{k}" for k in ks} | {f"recall@{k}" for k in ks} | {
        "mrr@10",
        "ndcg@10",
        "n_questions",
        "measured",
    }
    assert metrics["n_questions"] == 13

    results = json.loads((out / "eval" / "retrieval.json").read_text())
    assert len(results) == 13
    for entry in results:
        assert set(entry) == {"question", "answers", "ctxs"}
        assert len(entry["ctxs"]) == 20
        for ctx in entry["ctxs"]:
            assert set(ctx) == {"id", "title", "text", "score", "has_answer"}
            assert ctx["has_answer"] == (entry["answers"][0] in ctx["text"].split())
        scores = [ctx["score"] for ctx in entry["ctxs"]]
        assert scores == sorted(scores, reverse=True)
    # top-k recounted from the texts: the answer "codeN" is a word of the passage text
    for k in (1, 5, 20):
        found = sum(
            any(e["answers"][0] in c["text"].split() for c in e["ctxs"][:k]) for e in results
        )
        assert metrics[f"top{k}"] == round(100 * found / len(results), 2), k
    table = format_metrics_table(metrics)
    assert f"{metrics['top5']:.2f}" in table and "questions: 13" in table


def test_flat_search_equals_brute_force(corpus, built: Config) -> None:
    out = built.output_path
    p_embs, ids = index_vectors(out / "index")  # the stored float16 vectors, as float32
    assert ids == [f"p{i}" for i in range(corpus["n_passages"])]
    results = json.loads((out / "eval" / "retrieval.json").read_text())
    model = BiEncoder.from_pretrained(out / "model").eval()
    with torch.inference_mode():
        inputs = encode_questions(model.tokenizer, [e["question"] for e in results], 16)
        q_embs = model.encode_query(inputs).numpy()
    brute = q_embs @ p_embs.T
    for entry, row in zip(results, brute, strict=True):
        order = np.argsort(-row, kind="stable")[:20]
        got_scores = np.array([ctx["score"] for ctx in entry["ctxs"]])
        np.testing.assert_allclose(got_scores, row[order], rtol=1e-5, atol=1e-4)
        got_rows = [ids.index(ctx["id"]) for ctx in entry["ctxs"]]
        np.testing.assert_allclose(row[got_rows], got_scores, rtol=1e-5, atol=1e-4)
        above = np.abs(np.diff(row[order], prepend=np.inf))  # separated from both neighbours:
        below = np.abs(np.diff(row[order], append=-np.inf))  # no tie, so the rank is defined
        clear = (above > 1e-3) & (below > 1e-3)
        assert [r for r, c in zip(got_rows, clear, strict=True) if c] == [
            r for r, c in zip(order.tolist(), clear, strict=True) if c
        ]
    hits = search_index(open_index(out / "index"), q_embs, 3, BUDGET)
    assert hits.scores.shape == hits.rows.shape == (len(results), 3)


def test_sorted_and_fixed_order_encodings_agree(corpus) -> None:
    model = BiEncoder.from_pretrained(corpus["tiny"], shared=True).eval()
    with open(corpus["root"] / "passages.tsv", encoding="utf-8", newline="") as f:
        rows = list(csv.DictReader(f, delimiter="\t"))
    titles, texts = [r["title"] for r in rows], [r["text"] for r in rows]
    kw = dict(max_length=48, device=torch.device("cpu"))
    fast = encode_passage_texts(model, titles, texts, batch_size=7, sort_by_length=True, **kw)
    fixed = encode_passage_texts(model, titles, texts, batch_size=7, sort_by_length=False, **kw)
    alone = encode_passage_texts(model, titles, texts, batch_size=1, **kw)
    np.testing.assert_allclose(fast, fixed, rtol=1e-5, atol=1e-5)
    np.testing.assert_allclose(fast, alone, rtol=1e-5, atol=1e-5)


def test_question_vectors_equal_the_query_tower_run_directly(corpus) -> None:
    model = BiEncoder.from_pretrained(corpus["saved"]).eval()
    assert model.pooling == "cls"  # as saved
    questions = ["where is code4 near the river?", "code8"]
    cpu = torch.device("cpu")
    got = encode_question_texts(model, questions, max_length=16, device=cpu, precision="fp32")
    bert = AutoModel.from_pretrained(corpus["saved"] / "query_encoder").eval()
    tok = AutoTokenizer.from_pretrained(corpus["tiny"])
    with torch.inference_mode():
        inputs = tok(questions, max_length=16, truncation=True, padding=True, return_tensors="pt")
        want = bert(**inputs).last_hidden_state[:, 0].numpy()
    assert got.dtype == np.float32
    np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-6)
    half = encode_question_texts(model, questions, max_length=16, device=cpu, precision="bf16")
    assert half.dtype == np.float32 and not np.allclose(half, want, rtol=1e-5, atol=1e-6)
    np.testing.assert_allclose(half, want, rtol=0.05, atol=0.05)  # bf16, as asked


def test_shard_key_is_stable() -> None:
    """The key of fixed inputs is pinned (a new key re-encodes every corpus: change it on
    purpose), and each input it hashes changes it."""
    signature = {"path": "/x/p.tsv", "size": 10, "mtime_ns": 5}
    kw = dict(shard_size=50_000, max_length=256, pooling="cls", precision="fp32", normalize=False)
    key = shard_key("f" * 64, signature, store_dtype="float16", **kw)
    assert key == "3e40c7d068620353"
    assert shard_key("e" * 64, signature, store_dtype="float16", **kw) != key
    assert shard_key("f" * 64, signature, store_dtype="float32", **kw) != key
    assert shard_key("f" * 64, signature, store_dtype="float16", **{**kw, "normalize": True}) != key
    prompt = {**kw, "passage_prefix": "passage: "}
    assert shard_key("f" * 64, signature, store_dtype="float16", **prompt) != key


def _shard_files(out: Path) -> dict[str, int]:
    return {p.name: p.stat().st_mtime_ns for p in (out / "index" / "shards").iterdir()}


def test_interrupted_run_resumes_missing_shard_only(corpus, make_config, tmp_path) -> None:
    config = make_config(corpus, tmp_path)
    build_index(config, progress=False)
    before = _shard_files(tmp_path)
    embs, _ = index_vectors(tmp_path / "index")
    assert len(before) == 2 * 4  # 4 shards: embeddings + ids each
    (tmp_path / "index" / "meta.json").unlink()
    victim = next(name for name in sorted(before) if name.endswith("-00002.npy"))
    (tmp_path / "index" / "shards" / victim).unlink()

    build_index(config, progress=False)
    meta = json.loads((tmp_path / "index" / "meta.json").read_text())
    assert meta["timings"]["encoded_passages"] == corpus["shard"]
    after = _shard_files(tmp_path)
    assert set(after) == set(before)
    assert {n for n in after if after[n] != before[n]} == {victim, victim[:-4] + ".ids.txt"}
    np.testing.assert_allclose(index_vectors(tmp_path / "index")[0], embs, atol=1e-6)


def test_ranks_share_the_shards(corpus, make_config, tmp_path) -> None:
    config = make_config(corpus, tmp_path)
    with pytest.raises(RuntimeError, match="other ranks"):  # rank 1's shards are not there yet
        build_index(config, rank=0, world_size=2, progress=False)
    build_index(config, rank=1, world_size=2, progress=False)
    assert not (tmp_path / "index" / "meta.json").exists()
    build_index(config, rank=0, world_size=2, progress=False)
    meta = json.loads((tmp_path / "index" / "meta.json").read_text())
    assert meta["timings"]["encoded_passages"] == 0  # rank 0 wrote shards 0 and 2 the first time
    assert index_vectors(tmp_path / "index")[0].shape == (corpus["n_passages"], 32)


def _exact_top(p_embs: np.ndarray, q_embs: np.ndarray, k: int) -> np.ndarray:
    """Rows of the k highest inner products per query, by brute force in numpy [n_q, k]."""
    return np.argsort(-(q_embs @ p_embs.T), axis=1, kind="stable")[:, :k]


def _recall(rows: np.ndarray, exact: np.ndarray) -> float:
    k = exact.shape[1]
    return float(np.mean([len(set(a) & set(b)) / k for a, b in zip(rows, exact, strict=True)]))


@pytest.mark.parametrize(("kind", "least_recall"), [("hnsw", 0.95), ("ivf", 0.95), ("ivfpq", 0.6)])
def test_approximate_indexes_find_the_exact_neighbours(tmp_path, kind, least_recall) -> None:
    """recall@10 against brute force on clustered vectors (4,000 x 32 in 2 shards, 40 clusters,
    built block by block): near-exact for HNSW and IVF-Flat, most of it for IVF-PQ (16
    sub-quantizers); the negative control, the same results with shuffled rows, finds nothing."""
    rng = np.random.default_rng(0)
    centers = rng.standard_normal((40, 32)).astype(np.float32)

    def sample(n: int) -> np.ndarray:
        noise = 0.3 * rng.standard_normal((n, 32)).astype(np.float32)
        return centers[rng.integers(40, size=n)] + noise

    p_embs, q_embs = sample(4000), sample(100)
    for i, part in enumerate((p_embs[:2500], p_embs[2500:])):
        write_shard(tmp_path / f"s{i}.npy", part, [str(j) for j in range(len(part))], "float32")
    store = EmbeddingStore.from_glob(str(tmp_path / "s*.npy"))
    spec = IndexConfig(type=kind, pq_m=16, memory_gb=BUDGET / 1e9)
    meta = finish_index(tmp_path / "index", store, spec)
    assert meta["type"] == kind and meta["rows"] == 4000
    hits = search_index(open_index(tmp_path / "index", spec), q_embs, 10, BUDGET)
    exact = _exact_top(p_embs, q_embs, 10)
    shuffled = rng.permutation(len(p_embs))[hits.rows]
    assert _recall(hits.rows, exact) >= least_recall
    assert _recall(shuffled, exact) < 0.05


@pytest.mark.parametrize("kind", ["hnsw", "ivfpq"])
def test_approximate_indexes_reuse_the_shards_and_evaluate(
    corpus, make_config, built: Config, tmp_path, kind
) -> None:
    shutil.copytree(built.output_path / "index", tmp_path / "index")
    config = make_config(corpus, tmp_path, type=kind, pq_m=4)
    build_index(config, progress=False)
    opened = open_index(tmp_path / "index")
    assert opened.type == kind and opened.store.rows == corpus["n_passages"]
    assert opened.meta["timings"]["encoded_passages"] == 0  # the shards were reused
    p_embs, _ = index_vectors(tmp_path / "index")
    rows = search_index(opened, p_embs[:6], 5, BUDGET).rows
    assert rows.shape == (6, 5) and ((rows >= 0) & (rows < corpus["n_passages"])).all()
    assert all(len(set(r)) == 5 for r in rows.tolist())  # five distinct passages each
    assert evaluate(config, progress=False)["n_questions"] == 13


def test_pq_m_must_divide_the_dimension(corpus, make_config, tmp_path) -> None:
    config = make_config(corpus, tmp_path, type="ivfpq", pq_m=5)
    with pytest.raises(InputError, match="index.pq_m"):
        build_index(config, progress=False)


def test_eval_needs_an_index(corpus, make_config, tmp_path) -> None:
    with pytest.raises(InputError, match="run `dpr-cache index` first"):
        evaluate(make_config(corpus, tmp_path), progress=False)


def test_eval_refuses_another_model(corpus, built: Config) -> None:
    with pytest.raises(InputError, match="not the model"):
        evaluate(built, corpus["other"], progress=False)


GPU_HELD = 5_330_000_000  # what an eval process on one GPU machine held more than here


def test_eval_by_default_searches_over_what_a_gpu_process_holds(
    corpus, built: Config, tmp_path, monkeypatch
) -> None:
    """An eval process that comes to hold 5.33 GB more than this one as it encodes its questions
    (as one GPU machine's did) evaluates as before under the default budget, resolved after the
    encoding; a whole-process 4 GB stops it in one line."""
    real, encode, encoded = memory.rss_bytes, eval_command.question_vectors, []
    monkeypatch.setattr(memory, "rss_bytes", lambda: real() + (GPU_HELD if encoded else 0))
    monkeypatch.setattr(
        eval_command, "question_vectors", lambda *a: encoded.append(1) or encode(*a)
    )
    want = json.loads((built.output_path / "eval" / "metrics.json").read_text())
    metrics = evaluate(built, out_dir=tmp_path / "default", progress=False)
    assert built.index.memory_gb is None and encoded
    assert {k: metrics[k] for k in want if k != "measured"} == {
        k: v for k, v in want.items() if k != "measured"
    }
    four = built.model_copy(update={"index": built.index.model_copy(update={"memory_gb": 4.0})})
    with pytest.raises(
        InputError, match=r"a memory budget of 4\.00 GB is too small; this process already"
    ):
        evaluate(four, out_dir=tmp_path / "four", progress=False)


@pytest.mark.parametrize("kind", ["flat", "ivf"])
def test_index_builds_by_default_over_what_a_gpu_process_holds(
    corpus, make_config, built: Config, tmp_path, monkeypatch, kind
) -> None:
    """Every type builds under the default budget in a process that holds 5.33 GB more than
    this one; a whole-process 4 GB refuses it in one line."""
    real = memory.rss_bytes
    monkeypatch.setattr(memory, "rss_bytes", lambda: real() + GPU_HELD)
    for memory_gb in (None, 4.0):
        shutil.copytree(built.output_path / "index", tmp_path / f"{memory_gb}" / "index")
        config = make_config(corpus, tmp_path / f"{memory_gb}", type=kind, memory_gb=memory_gb)
        if memory_gb is not None:
            with pytest.raises(
                InputError, match=r"a memory budget of 4\.00 GB is too small; this process"
            ):
                build_index(config, progress=False)
            continue
        build_index(config, progress=False)
        opened = open_index(tmp_path / "None" / "index")
        assert opened.type == kind and opened.store.rows == corpus["n_passages"]


def test_index_needs_a_model(corpus, make_config, tmp_path) -> None:
    with pytest.raises(InputError, match="dpr-cache train"):
        build_index(make_config(corpus, tmp_path, with_model=False), progress=False)


def test_plain_hf_folder_serves_both_towers(corpus, make_config, tmp_path) -> None:
    """A plain Hugging Face folder indexes and searches like the same tower run through
    ``transformers`` directly: [CLS] of the (title, text) pair and of the question, brute force."""
    config = make_config(corpus, tmp_path, with_model=False, store_dtype="float32")
    build_index(config, corpus["tiny"], progress=False)
    metrics = evaluate(config, corpus["tiny"], progress=False)
    assert metrics["n_questions"] == 13

    tok = AutoTokenizer.from_pretrained(corpus["tiny"])
    bert = AutoModel.from_pretrained(corpus["tiny"]).eval()
    with open(corpus["root"] / "passages.tsv", encoding="utf-8", newline="") as f:
        rows = list(csv.DictReader(f, delimiter="\t"))
    results = json.loads((tmp_path / "eval" / "retrieval.json").read_text())
    with torch.inference_mode():
        p_in = tok(
            [r["title"] for r in rows],
            [r["text"] for r in rows],
            truncation="only_second",
            max_length=48,
            padding=True,
            return_tensors="pt",
        )
        p_embs = bert(**p_in).last_hidden_state[:, 0].numpy()
        q_in = tok(
            [e["question"] for e in results],
            truncation=True,
            max_length=16,
            padding=True,
            return_tensors="pt",
        )
        q_embs = bert(**q_in).last_hidden_state[:, 0].numpy()
    scores = q_embs @ p_embs.T
    for entry, row in zip(results, scores, strict=True):
        got = [int(ctx["id"][1:]) for ctx in entry["ctxs"]]
        np.testing.assert_allclose(
            [c["score"] for c in entry["ctxs"]], row[got], rtol=1e-4, atol=1e-4
        )
        np.testing.assert_allclose(row[got], np.sort(row)[::-1][:20], rtol=1e-4, atol=1e-4)


@pytest.mark.parametrize("kind", ["flat", "ivf", "hnsw"])
def test_a_budget_too_small_to_build_names_the_one_that_fits(
    tmp_path: Path, monkeypatch, kind
) -> None:
    """The --memory-gb a refused build names is enough to build that type, counting what IVF
    copies and what HNSW's graph holds beside the blocks (1 GB here, about what 2M rows of 32
    take to build), and 0.1 GB less is not."""
    if kind == "hnsw":
        monkeypatch.setattr(dense_index, "hnsw_bytes", lambda *args, **kwargs: 10**9)
    vectors = np.random.default_rng(0).standard_normal((2000, 32)).astype(np.float32)
    write_shard(tmp_path / "s0.npy", vectors, [str(j) for j in range(2000)], "float32")
    store = EmbeddingStore.from_glob(str(tmp_path / "s*.npy"))
    held = memory.rss_bytes() + GPU_HELD
    monkeypatch.setattr(memory, "rss_bytes", lambda: held)

    def spec(memory_gb: float) -> IndexConfig:
        return IndexConfig(type=kind, memory_gb=memory_gb)

    with pytest.raises(InputError, match=r"a memory budget of 4\.00 GB is too small") as refused:
        finish_index(tmp_path / "refused", store, spec(4.0))
    given = float(re.search(r"give --memory-gb ([0-9.]+) or more$", str(refused.value))[1])
    with pytest.raises(InputError, match=f"give --memory-gb {given:.1f} or more$"):
        finish_index(tmp_path / "short", store, spec(given - 0.1))
    assert finish_index(tmp_path / "index", store, spec(given))["rows"] == 2000


def test_hnsw_is_refused_when_its_build_peak_is_over_the_budget() -> None:
    """The budget covers the build's peak, not only the finished graph (FAISS's storage grows by
    doubling while rows are added)."""
    rows, dim, spec = 4_000_000, 768, IndexConfig(type="hnsw")
    finished = hnsw_bytes(rows, dim, spec.hnsw_m)
    assert abs(finished / 1e9 - 13.38) < 0.01  # the 4M x 768 index measured at 13.38 GB on disk
    check_index_spec(spec, rows, dim, (finished * 1.3 + 1) / 1e9)
    with pytest.raises(InputError, match=r"to build .13.4 GB to search.*over --memory-gb 13\.3"):
        check_index_spec(spec, rows, dim, (finished + 1) / 1e9)
    with pytest.raises(InputError, match="over the 4 GB an unset --memory-gb lets the process"):
        check_index_spec(spec, rows, dim, None)  # unset: the headroom bounds the index
    check_index_spec(spec, 700_000, dim, None)  # 3.0 GB to build: within the headroom
