"""Corpus index (sharded, resumable, FAISS) and evaluation files, with a tiny random BERT.

References are independent of the code under test: numpy brute-force search, answers recounted
from the passage texts, and a tower run through plain ``transformers``.
"""

from __future__ import annotations

import csv
import json
import shutil
from pathlib import Path

import numpy as np
import pytest
import torch
from transformers import AutoModel, AutoTokenizer

from dpr_cache.config import Config
from dpr_cache.data.tokenize import encode_questions
from dpr_cache.errors import InputError
from dpr_cache.model.biencoder import BiEncoder
from dpr_cache.retrieval.encode import encode_passage_texts, encode_question_texts
from dpr_cache.retrieval.evaluate import evaluate, format_metrics_table, metrics_from_retrieval
from dpr_cache.retrieval.faiss_index import (
    IndexSpec,
    configure_search,
    load_index,
    new_index,
    search,
)
from dpr_cache.retrieval.index import build_index
from dpr_cache.retrieval.shards import load_shard_embeddings, shard_key


def test_files_follow_the_contract(corpus, built: Config) -> None:
    out = built.output_path
    for name in ("faiss.index", "passage_ids.txt", "meta.json"):
        assert (out / "index" / name).is_file()
    meta = json.loads((out / "index" / "meta.json").read_text())
    assert meta["n_passages"] == corpus["n_passages"] and meta["dim"] == 32
    assert meta["index_type"] == "flat" and meta["pooling"] == "cls"
    assert meta["model_dir"] == str((out / "model").resolve())
    assert meta["timings"]["encoded_passages"] == corpus["n_passages"]

    metrics = json.loads((out / "eval" / "metrics.json").read_text())
    assert set(metrics) == {"top1", "top5", "top20", "n_questions"}
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
    assert metrics == metrics_from_retrieval(out / "eval" / "retrieval.json", [1, 5, 20])
    table = format_metrics_table(metrics)
    assert f"{metrics['top5']:.2f}" in table and "questions: 13" in table


def test_flat_search_equals_brute_force(corpus, built: Config) -> None:
    out = built.output_path
    _, ids, _ = load_index(out / "index")
    assert ids == [f"p{i}" for i in range(corpus["n_passages"])]
    p_embs = load_shard_embeddings(out / "index")
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
        gaps = np.diff(row[order], prepend=np.inf)  # ranks separated from the one above
        clear = np.abs(gaps) > 1e-3
        assert [r for r, c in zip(got_rows, clear, strict=True) if c] == [
            r for r, c in zip(order.tolist(), clear, strict=True) if c
        ]
    scores, rows = search(load_index(out / "index")[0], q_embs, 3)
    assert scores.shape == rows.shape == (len(results), 3)


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
    got = encode_question_texts(model, questions, max_length=16, device=torch.device("cpu"),
                                precision="bf16")  # fmt: skip
    bert = AutoModel.from_pretrained(corpus["saved"] / "query_encoder").eval()
    tok = AutoTokenizer.from_pretrained(corpus["tiny"])
    with torch.inference_mode():
        inputs = tok(questions, max_length=16, truncation=True, padding=True, return_tensors="pt")
        want = bert(**inputs).last_hidden_state[:, 0].numpy()
    assert got.dtype == np.float32  # bf16 asked for, but the CPU encodes in fp32
    np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-6)


def test_shard_key_is_stable() -> None:
    """Shards written by earlier versions stay valid: the key of fixed inputs is pinned."""
    signature = {"path": "/x/p.tsv", "size": 10, "mtime_ns": 5}
    key = shard_key("f" * 64, signature, shard_size=50_000, max_length=256, pooling="cls",
                    precision="fp32")  # fmt: skip
    assert key == "65b4927c4733dc26"
    assert shard_key("e" * 64, signature, shard_size=50_000, max_length=256, pooling="cls",
                     precision="fp32") != key  # fmt: skip


def _shard_files(out: Path) -> dict[str, int]:
    return {p.name: p.stat().st_mtime_ns for p in (out / "index" / "shards").iterdir()}


def test_interrupted_run_resumes_missing_shard_only(corpus, make_config, tmp_path) -> None:
    config = make_config(corpus, tmp_path)
    build_index(config, progress=False)
    before = _shard_files(tmp_path)
    embs = load_shard_embeddings(tmp_path / "index")
    assert len(before) == 2 * 4  # 4 shards: embeddings + ids each
    (tmp_path / "index" / "faiss.index").unlink()
    victim = next(name for name in sorted(before) if name.endswith("-00002.npy"))
    (tmp_path / "index" / "shards" / victim).unlink()

    build_index(config, progress=False)
    meta = json.loads((tmp_path / "index" / "meta.json").read_text())
    assert meta["timings"]["encoded_passages"] == corpus["shard"]
    after = _shard_files(tmp_path)
    assert set(after) == set(before)
    assert {n for n in after if after[n] != before[n]} == {victim, victim[:-4] + ".ids.txt"}
    np.testing.assert_allclose(load_shard_embeddings(tmp_path / "index"), embs, atol=1e-6)
    assert (tmp_path / "index" / "faiss.index").is_file()


def test_ranks_share_the_shards(corpus, make_config, tmp_path) -> None:
    config = make_config(corpus, tmp_path)
    with pytest.raises(RuntimeError, match="other ranks"):  # rank 1's shards are not there yet
        build_index(config, rank=0, world_size=2, progress=False)
    build_index(config, rank=1, world_size=2, progress=False)
    assert not (tmp_path / "index" / "meta.json").exists()
    build_index(config, rank=0, world_size=2, progress=False)
    meta = json.loads((tmp_path / "index" / "meta.json").read_text())
    assert meta["timings"]["encoded_passages"] == 0  # rank 0 wrote shards 0 and 2 the first time
    assert load_shard_embeddings(tmp_path / "index").shape == (corpus["n_passages"], 32)


def _exact_top(p_embs: np.ndarray, q_embs: np.ndarray, k: int) -> np.ndarray:
    """Rows of the k highest inner products per query, by brute force in numpy [n_q, k]."""
    return np.argsort(-(q_embs @ p_embs.T), axis=1, kind="stable")[:, :k]


def _recall(rows: np.ndarray, exact: np.ndarray) -> float:
    k = exact.shape[1]
    return float(np.mean([len(set(a) & set(b)) / k for a, b in zip(rows, exact, strict=True)]))


@pytest.mark.parametrize(("kind", "least_recall"), [("hnsw", 0.95), ("ivfpq", 0.6)])
def test_approximate_indexes_find_the_exact_neighbours(kind, least_recall) -> None:
    """recall@10 against brute force on clustered vectors (4,000 x 32, 40 clusters): near-exact
    for HNSW, most of it for IVF-PQ (16 sub-quantizers); the negative control, the same index
    read with shuffled row ids, finds next to nothing."""
    rng = np.random.default_rng(0)
    centers = rng.standard_normal((40, 32)).astype(np.float32)

    def sample(n: int) -> np.ndarray:
        noise = 0.3 * rng.standard_normal((n, 32)).astype(np.float32)
        return centers[rng.integers(40, size=n)] + noise

    p_embs, q_embs = sample(4000), sample(100)
    spec = IndexSpec(type=kind, pq_m=16)
    index, _ = new_index(spec, [p_embs[:2500], p_embs[2500:]], 2500, len(p_embs), 32)
    index.add(p_embs)
    configure_search(index, spec)
    _, rows = search(index, q_embs, 10)
    exact = _exact_top(p_embs, q_embs, 10)
    shuffled = rng.permutation(len(p_embs))[rows]
    assert _recall(rows, exact) >= least_recall
    assert _recall(shuffled, exact) < 0.05


@pytest.mark.parametrize("kind", ["hnsw", "ivfpq"])
def test_approximate_indexes_reuse_the_shards_and_evaluate(
    corpus, make_config, built: Config, tmp_path, kind
) -> None:
    shutil.copytree(built.output_path / "index", tmp_path / "index")
    config = make_config(corpus, tmp_path, type=kind, pq_m=4)
    build_index(config, progress=False)
    index, ids, meta = load_index(tmp_path / "index")
    assert meta["index_type"] == kind and len(ids) == corpus["n_passages"]
    assert meta["timings"]["encoded_passages"] == 0  # the shards were reused
    p_embs = load_shard_embeddings(tmp_path / "index")
    _, rows = search(index, p_embs[:6], 5)
    assert rows.shape == (6, 5) and ((rows >= 0) & (rows < len(ids))).all()
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


def test_index_needs_a_model(corpus, make_config, tmp_path) -> None:
    with pytest.raises(InputError, match="dpr-cache train"):
        build_index(make_config(corpus, tmp_path, with_model=False), progress=False)


def test_plain_hf_folder_serves_both_towers(corpus, make_config, tmp_path) -> None:
    """A plain Hugging Face folder indexes and searches like the same tower run through
    ``transformers`` directly: [CLS] of the (title, text) pair and of the question, brute force."""
    config = make_config(corpus, tmp_path, with_model=False)
    build_index(config, corpus["tiny"], progress=False)
    metrics = evaluate(config, corpus["tiny"], progress=False)
    assert metrics["n_questions"] == 13

    tok = AutoTokenizer.from_pretrained(corpus["tiny"])
    bert = AutoModel.from_pretrained(corpus["tiny"]).eval()
    with open(corpus["root"] / "passages.tsv", encoding="utf-8", newline="") as f:
        rows = list(csv.DictReader(f, delimiter="\t"))
    results = json.loads((tmp_path / "eval" / "retrieval.json").read_text())
    with torch.inference_mode():
        p_in = tok([r["title"] for r in rows], [r["text"] for r in rows], truncation="only_second",
                   max_length=48, padding=True, return_tensors="pt")  # fmt: skip
        p_embs = bert(**p_in).last_hidden_state[:, 0].numpy()
        q_in = tok([e["question"] for e in results], truncation=True, max_length=16,
                   padding=True, return_tensors="pt")  # fmt: skip
        q_embs = bert(**q_in).last_hidden_state[:, 0].numpy()
    scores = q_embs @ p_embs.T
    for entry, row in zip(results, scores, strict=True):
        got = [int(ctx["id"][1:]) for ctx in entry["ctxs"]]
        np.testing.assert_allclose(
            [c["score"] for c in entry["ctxs"]], row[got], rtol=1e-4, atol=1e-4
        )
        np.testing.assert_allclose(row[got], np.sort(row)[::-1][:20], rtol=1e-4, atol=1e-4)
