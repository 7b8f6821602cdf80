"""Corpus index (sharded, resumable, FAISS) and evaluation files, with a tiny random BERT."""

from __future__ import annotations

import csv
import json
import shutil
from pathlib import Path

import numpy as np
import pytest
import torch

from dpr_cache.config import Config
from dpr_cache.data import encode_questions
from dpr_cache.errors import InputError
from dpr_cache.evaluate import evaluate, format_metrics_table, metrics_from_retrieval
from dpr_cache.index import (
    build_index,
    encode_passage_texts,
    load_index,
    load_shard_embeddings,
    search,
)
from dpr_cache.model import BiEncoder
from dpr_cache.tiny_bert import build_tiny_bert

N_PASSAGES = 50
SHARD = 16  # shards of 16, 16, 16, 2 passages
WORDS = "river stone castle music engine forest harbor winter garden bridge planet signal".split()


@pytest.fixture(scope="module")
def corpus(tmp_path_factory) -> dict[str, Path]:
    """passages.tsv, dev.qa.tsv, two tiny random BERT folders and a saved BiEncoder."""
    root = tmp_path_factory.mktemp("corpus")
    rng = np.random.default_rng(0)
    rows = []
    for i in range(N_PASSAGES):
        words = rng.choice(WORDS, size=int(rng.integers(3, 40))).tolist()
        rows.append((f"p{i}", " ".join(words + [f"code{i}"]), f"Title {WORDS[i % len(WORDS)]}"))
    with open(root / "passages.tsv", "w", encoding="utf-8", newline="") as f:
        writer = csv.writer(f, delimiter="\t", lineterminator="\n")
        writer.writerow(["id", "text", "title"])
        writer.writerows(rows)
    with open(root / "dev.qa.tsv", "w", encoding="utf-8") as f:
        for i in range(0, N_PASSAGES, 4):
            f.write(
                f"where is code{i} near the {WORDS[i % len(WORDS)]}?\t{json.dumps([f'code{i}'])}\n"
            )
    texts = [f"{t} {x}" for _, x, t in rows] + ["where is near the"]
    kw = dict(vocab_size=300, hidden=32, layers=1, heads=2, intermediate=64, max_positions=128)
    tiny = build_tiny_bert(texts, root / "tiny", seed=0, **kw)
    other = build_tiny_bert(texts, root / "other", seed=1, **kw)
    BiEncoder.from_pretrained(tiny).save_pretrained(root / "saved")
    return {"root": root, "tiny": tiny, "other": other, "saved": root / "saved"}


def make_config(corpus: dict[str, Path], out: Path, with_model: bool = True, **index) -> Config:
    if with_model and not (out / "model").exists():
        shutil.copytree(corpus["saved"], out / "model")
    return Config.model_validate(
        {
            "output_dir": str(out),
            "model": {"max_query_length": 16, "max_passage_length": 48},
            "data": {
                "passages": str(corpus["root"] / "passages.tsv"),
                "dev_qa": str(corpus["root"] / "dev.qa.tsv"),
                "cache_dir": str(corpus["root"] / "cache"),
            },
            "train": {"device": "cpu"},
            "index": {"shard_size": SHARD, "batch_size": 5, **index},
            "eval": {"top_k": [1, 5, 20], "batch_size": 4},
        }
    )


@pytest.fixture(scope="module")
def built(corpus, tmp_path_factory) -> Config:
    """A flat index and an evaluation of the saved BiEncoder."""
    config = make_config(corpus, tmp_path_factory.mktemp("run"))
    build_index(config, progress=False)
    evaluate(config, progress=False)
    return config


def test_files_follow_the_contract(built: Config) -> None:
    out = built.output_path
    for name in ("faiss.index", "passage_ids.txt", "meta.json"):
        assert (out / "index" / name).is_file()
    meta = json.loads((out / "index" / "meta.json").read_text())
    assert meta["n_passages"] == N_PASSAGES and meta["dim"] == 32
    assert meta["index_type"] == "flat" and meta["pooling"] == "cls"
    assert meta["model_dir"] == str((out / "model").resolve())
    assert meta["timings"]["encoded_passages"] == N_PASSAGES

    metrics = json.loads((out / "eval" / "metrics.json").read_text())
    assert set(metrics) == {"top1", "top5", "top20", "n_questions"}
    assert metrics["n_questions"] == 13
    assert metrics["top1"] <= metrics["top5"] <= metrics["top20"] <= 100.0

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
    assert metrics == metrics_from_retrieval(out / "eval" / "retrieval.json", [1, 5, 20])
    table = format_metrics_table(metrics)
    assert f"{metrics['top5']:.2f}" in table and "questions: 13" in table


def test_flat_search_equals_brute_force(built: Config) -> None:
    out = built.output_path
    _, ids, _ = load_index(out / "index")
    assert ids == [f"p{i}" for i in range(N_PASSAGES)]
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


def _shard_files(out: Path) -> dict[str, int]:
    return {p.name: p.stat().st_mtime_ns for p in (out / "index" / "shards").iterdir()}


def test_interrupted_run_resumes_missing_shard_only(corpus, tmp_path) -> None:
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
    assert meta["timings"]["encoded_passages"] == SHARD
    after = _shard_files(tmp_path)
    assert set(after) == set(before)
    assert {n for n in after if after[n] != before[n]} == {victim, victim[:-4] + ".ids.txt"}
    np.testing.assert_allclose(load_shard_embeddings(tmp_path / "index"), embs, atol=1e-6)
    assert (tmp_path / "index" / "faiss.index").is_file()


def test_ranks_share_the_shards(corpus, tmp_path) -> None:
    config = make_config(corpus, tmp_path)
    with pytest.raises(RuntimeError, match="other ranks"):  # rank 1's shards are not there yet
        build_index(config, rank=0, world_size=2, progress=False)
    build_index(config, rank=1, world_size=2, progress=False)
    assert not (tmp_path / "index" / "meta.json").exists()
    build_index(config, rank=0, world_size=2, progress=False)
    meta = json.loads((tmp_path / "index" / "meta.json").read_text())
    assert meta["timings"]["encoded_passages"] == 0  # rank 0 wrote shards 0 and 2 the first time
    assert load_shard_embeddings(tmp_path / "index").shape == (N_PASSAGES, 32)


@pytest.mark.parametrize("kind", ["hnsw", "ivfpq"])
def test_approximate_indexes_return_k_results(corpus, built: Config, tmp_path, kind) -> None:
    shutil.copytree(built.output_path / "index", tmp_path / "index")
    config = make_config(corpus, tmp_path, type=kind, pq_m=4)
    build_index(config, progress=False)
    index, ids, meta = load_index(tmp_path / "index")
    assert meta["index_type"] == kind and len(ids) == N_PASSAGES
    assert meta["timings"]["encoded_passages"] == 0  # the shards were reused
    scores, rows = search(index, load_shard_embeddings(tmp_path / "index")[:6], 5)
    assert rows.shape == (6, 5) and (rows >= 0).all()
    metrics = evaluate(config, progress=False)
    assert metrics["n_questions"] == 13


def test_pq_m_must_divide_the_dimension(corpus, tmp_path) -> None:
    config = make_config(corpus, tmp_path, type="ivfpq", pq_m=5)
    with pytest.raises(InputError, match="index.pq_m"):
        build_index(config, progress=False)


def test_eval_needs_an_index(corpus, tmp_path) -> None:
    with pytest.raises(InputError, match="run `dpr-cache index` first"):
        evaluate(make_config(corpus, tmp_path), progress=False)


def test_eval_refuses_another_model(corpus, built: Config) -> None:
    with pytest.raises(InputError, match="not the model"):
        evaluate(built, corpus["other"], progress=False)


def test_index_needs_a_model(corpus, tmp_path) -> None:
    with pytest.raises(InputError, match="dpr-cache train"):
        build_index(make_config(corpus, tmp_path, with_model=False), progress=False)


def test_plain_hf_folder_serves_both_towers(corpus, tmp_path) -> None:
    config = make_config(corpus, tmp_path, with_model=False)
    build_index(config, corpus["tiny"], progress=False)
    metrics = evaluate(config, corpus["tiny"], progress=False)
    assert metrics["n_questions"] == 13
