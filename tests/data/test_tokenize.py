"""One tokenization for every command: training batches and corpus encoding give the same ids for
a passage, both equal to the tokenizer's own pair encoding, and long titles fall back per pair."""

from __future__ import annotations

import json

import pytest
import torch
from transformers import AutoTokenizer

from dpr_cache.data.collate import build_batch
from dpr_cache.data.tokenize import encode_passages, encode_questions, pad, tokenize_passages
from tests.support.fixtures import TOY


@pytest.fixture(scope="module")
def tok():
    return AutoTokenizer.from_pretrained(TOY / "tiny-bert")


@pytest.fixture(scope="module")
def examples() -> list[dict]:
    with open(TOY / "train.jsonl", encoding="utf-8") as f:
        return [json.loads(line) for line in f][:24]


def _rows(inputs: dict[str, torch.Tensor]) -> list[list[int]]:
    """Each row's ids without its padding."""
    pairs = zip(inputs["input_ids"], inputs["attention_mask"], strict=True)
    return [ids[mask.bool()].tolist() for ids, mask in pairs]


def _step_batch(tok, examples):
    """The training batch of ``examples``: one hard negative, passages cut at 48 tokens."""
    return build_batch(
        examples,
        tokenizer=tok,
        hard_negatives=1,
        max_query_length=32,
        max_passage_length=48,
        seed=0,
        epoch=0,
    )


def test_training_and_indexing_give_identical_ids(tok, examples) -> None:
    """A passage in a training batch and the same passage encoded for the index: same ids."""
    batch = _step_batch(tok, examples)
    ctxs = [e["positive_ctxs"][0] for e in examples]  # each group's first row
    indexed = tokenize_passages(tok, [c["title"] for c in ctxs], [c["text"] for c in ctxs], 48)
    trained = _rows(batch.p_inputs)[:: batch.group_size]
    assert trained == indexed["input_ids"]
    # and both equal the tokenizer's own DPR-style pair encoding (the independent reference)
    ref = tok(
        [c["title"] for c in ctxs],
        [c["text"] for c in ctxs],
        truncation="only_second",
        max_length=48,
    )["input_ids"]
    assert indexed["input_ids"] == ref
    assert max(len(r) for r in ref) == 48  # the limit was reached, so truncation was exercised


def test_a_training_batch_equals_the_tokenizers_padded_batch(tok, examples) -> None:
    """Every tensor of a step's passages, padding included, as the tokenizer pads them."""
    batch = _step_batch(tok, examples)
    ids = batch.p_inputs["input_ids"].tolist()
    ctxs = []
    for e in examples:  # recover the chosen contexts by their encodings
        group = [e["positive_ctxs"][0], *e["hard_negative_ctxs"]]
        ctxs += [group[0]]
        for c in group[1:]:
            enc = tok(c["title"], c["text"], truncation="only_second", max_length=48)["input_ids"]
            if enc == [t for t in ids[len(ctxs)] if t != tok.pad_token_id]:
                ctxs.append(c)
                break
    assert len(ctxs) == len(ids)
    want = tok(
        [c["title"] for c in ctxs],
        [c["text"] for c in ctxs],
        truncation="only_second",
        max_length=48,
        padding=True,
        return_tensors="pt",
    )
    for key in want:
        assert torch.equal(batch.p_inputs[key], want[key]), key


def test_questions_match_the_tokenizer_padded_batch(tok, examples) -> None:
    questions = [e["question"] for e in examples]
    want = tok(questions, max_length=12, truncation=True, padding=True, return_tensors="pt")
    got = encode_questions(tok, questions, 12)
    assert got.keys() == want.keys()
    for key in want:
        assert torch.equal(got[key], want[key]), key
    want8 = tok(
        questions,
        max_length=12,
        truncation=True,
        padding=True,
        pad_to_multiple_of=4,
        return_tensors="pt",
    )
    assert torch.equal(encode_questions(tok, questions, 12, 4)["input_ids"], want8["input_ids"])


def test_a_title_longer_than_the_limit_falls_back_for_its_own_pair_only(tok) -> None:
    titles = ["short", " ".join(["longtitle"] * 40), "also short"]
    texts = ["a text " * 20] * 3
    ids = tokenize_passages(tok, titles, texts, 16)["input_ids"]
    assert [len(r) for r in ids] == [16, 16, 16]
    for i in (0, 2):  # its neighbours keep DPR's rule: the title whole, the text cut
        assert (
            ids[i] == tok(titles[i], texts[i], truncation="only_second", max_length=16)["input_ids"]
        )
    assert (
        ids[1] == tok(titles[1], texts[1], truncation="longest_first", max_length=16)["input_ids"]
    )
    with pytest.raises(Exception, match="(?i)truncat"):  # only_second cannot cut this pair
        tok(titles[1], texts[1], truncation="only_second", max_length=16)
    padded = encode_passages(tok, titles, texts, 16)
    assert padded["input_ids"].shape == (3, 16)


def test_pad_selects_rows_and_pads_on_the_tokenizers_side(tok) -> None:
    feats = tokenize_passages(tok, ["a", "b c"], ["one", "two three four"], 32)
    out = pad(tok, feats, [1, 0], width=10)
    assert out["input_ids"].shape == (2, 10)
    assert out["input_ids"][0, : len(feats["input_ids"][1])].tolist() == feats["input_ids"][1]
    assert out["attention_mask"].sum(1).tolist() == [
        len(feats["input_ids"][1]),
        len(feats["input_ids"][0]),
    ]
    assert (out["input_ids"][1, len(feats["input_ids"][0]) :] == tok.pad_token_id).all()
