"""Query and passage prefixes (E5's and BGE's prompts): prepended wherever the model encodes,
saved with it so that sentence-transformers applies them by default, read back from a
sentence-transformers folder's prompts, carried through training, indexing and eval."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest
import torch
import yaml

from dpr_cache.data.tokenize import tokenize_passages, tokenize_questions
from dpr_cache.model.biencoder import BiEncoder
from dpr_cache.model.loading import load_biencoder
from dpr_cache.retrieval.dense.encode import encode_passage_texts, encode_question_texts
from tests.support.cli import run_cli, toy_overrides
from tests.support.fixtures import TOY

st = pytest.importorskip("sentence_transformers")

TINY = TOY / "tiny-bert"
CPU = torch.device("cpu")
QUESTIONS = ["who won super bowl 50?", "which river runs through the amazon rainforest?"]
TITLES, TEXTS = ["Super Bowl 50", "Amazon rainforest"], ["The Broncos won. " * 5, "A forest."]
PROMPTS = ("query: ", "passage: ")


def test_the_tokens_start_with_the_prompts() -> None:
    tok = load_biencoder(TINY).tokenizer
    got = tokenize_questions(tok, QUESTIONS, 32, prefix="query: ")["input_ids"]
    assert got == [tok("query: " + q)["input_ids"] for q in QUESTIONS]
    pairs = tokenize_passages(tok, TITLES, TEXTS, 32, prefix="passage: ")["input_ids"]
    assert pairs[1] == tok("passage: " + TITLES[1], TEXTS[1])["input_ids"]  # before the title
    assert pairs != tokenize_passages(tok, TITLES, TEXTS, 32)["input_ids"]


def test_sentence_transformers_applies_the_saved_prompts(tmp_path: Path) -> None:
    model = BiEncoder.from_pretrained(TINY, pooling="mean")
    model.query_prefix, model.passage_prefix = PROMPTS
    model.max_query_length = model.max_passage_length = 32  # sentence-transformers cuts there too
    model.save_pretrained(tmp_path / "m")
    model.eval()
    ours_q = encode_question_texts(model, QUESTIONS, max_length=32, device=CPU)
    ours_p = encode_passage_texts(model, TITLES, TEXTS, max_length=32, batch_size=4, device=CPU)
    q_st = st.SentenceTransformer(str(tmp_path / "m" / "query_encoder"), device="cpu")
    p_st = st.SentenceTransformer(str(tmp_path / "m" / "passage_encoder"), device="cpu")
    np.testing.assert_allclose(q_st.encode(QUESTIONS), ours_q, atol=1e-5)
    pairs = [[t, x] for t, x in zip(TITLES, TEXTS, strict=True)]
    np.testing.assert_allclose(p_st.encode(pairs), ours_p, atol=1e-5)
    model.query_prefix = ""  # control: without the prompt our vectors are others
    plain = encode_question_texts(model, QUESTIONS, max_length=32, device=CPU)
    assert not np.allclose(q_st.encode(QUESTIONS), plain, atol=1e-3)
    back = BiEncoder.from_pretrained(tmp_path / "m")
    assert (back.query_prefix, back.passage_prefix) == PROMPTS
    tower = BiEncoder.from_pretrained(tmp_path / "m" / "query_encoder")  # an ST folder alone
    assert tower.query_prefix == "query: " and tower.passage_prefix == ""


def test_training_index_and_eval_carry_the_prompts(tmp_path: Path) -> None:
    prompts = {"model.query_prefix": "'query: '", "model.passage_prefix": "'passage: '"}
    args = ["--config", "configs/toy.yaml", *toy_overrides(tmp_path, **prompts), "-q"]
    run_cli("train", *args)
    run_cli("index", *args)
    run_cli("eval", *args)
    out = tmp_path / "run"
    saved = json.loads((out / "model" / "biencoder.json").read_text())
    assert (saved["query_prefix"], saved["passage_prefix"]) == PROMPTS
    assert yaml.safe_load((out / "config.yaml").read_text())["model"]["query_prefix"] == "query: "
    meta = json.loads((out / "index" / "meta.json").read_text())
    assert meta["model"]["passage_prefix"] == "passage: "
    other = run_cli("eval", *args, "--set", "model.passage_prefix=''", check=False)
    assert other.returncode == 2
    assert "model.passage_prefix: '', but the index was built with 'passage: '" in other.stderr
    plain = toy_overrides(tmp_path / "plain")
    run_cli("train", "--config", "configs/toy.yaml", *plain, "-q")
    digests = [
        [json.loads(line)["batch_digest"] for line in (root / "train_log.jsonl").open()]
        for root in (out, tmp_path / "plain" / "run")
    ]
    assert digests[0] != digests[1]  # the prompts are in the training batches' tokens
