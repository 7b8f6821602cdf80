"""Encoding as the device's pipeline runs it (a corpus tokenized and padded into its batches in
loader workers; each batch's vectors queued back into their rows, as on CUDA, here without
pinning) gives the same bits as a plain loop written here with the tokenizer's own padding: each
batch padded, encoded and copied back before the next. The batches are reported as they land."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from dpr_cache.data.passages import load_passages
from dpr_cache.model.loading import load_encoder
from dpr_cache.retrieval.dense import encode
from dpr_cache.retrieval.dense.encode import encode_passage_texts, encode_question_texts
from dpr_cache.runtime.overlap import Transfer
from tests.support.fixtures import TOY

CPU = torch.device("cpu")
QUEUED = Transfer(pin=False, non_blocking=True)  # CUDA's queued path, without pinning
LENGTH, BATCH, CHUNK = 64, 16, 40


@pytest.fixture(scope="module")
def model():
    return load_encoder(TOY / "tiny-bert").eval()


@pytest.fixture(scope="module")
def dataset(tmp_path_factory):
    return load_passages(TOY / "passages.tsv", tmp_path_factory.mktemp("cache"))


def _plain(model, titles, texts, *, sort: bool) -> np.ndarray:
    """The reference: batches longest first (or in order, padded to LENGTH), each padded by the
    tokenizer itself, encoded and copied back before the next."""
    tok = model.tokenizer
    cut = {"truncation": "only_second", "max_length": LENGTH}
    lengths = np.array([len(ids) for ids in tok(titles, texts, **cut)["input_ids"]])
    order = np.argsort(-lengths, kind="stable") if sort else np.arange(len(titles))
    out = np.empty((len(titles), model.dim), np.float32)
    for start in range(0, len(order), BATCH):
        rows = order[start : start + BATCH]
        padding = "longest" if sort else "max_length"
        inputs = tok(
            [titles[r] for r in rows],
            [texts[r] for r in rows],
            padding=padding,
            return_tensors="pt",
            **cut,
        )
        with torch.inference_mode():
            out[rows] = model.encode_passage(dict(inputs)).numpy()
    return out


@pytest.mark.parametrize("workers", [0, 1])
@pytest.mark.parametrize("transfer", [QUEUED, None], ids=["queued", "plain"])
def test_corpus_shards_equal_a_plain_loop(
    model, dataset, tmp_path, monkeypatch, workers, transfer
) -> None:
    """Two shards of 150 and 123 passages in chunks of 40 (each sorted on its own), so that a
    shard's vectors come from several chunks."""
    monkeypatch.setattr(encode, "CHUNK_ROWS", CHUNK)
    n = len(dataset)
    shards = [(tmp_path / "a.npy", 0, 150), (tmp_path / "b.npy", 150, n - 150)]
    landed: list[int] = []
    encode.encode_corpus(
        model,
        dataset,
        shards,
        max_length=LENGTH,
        batch_size=BATCH,
        device=CPU,
        store_dtype="float32",
        num_workers=workers,
        on_batch=landed.append,
        transfer=transfer,
    )
    sizes = []
    for path, start, rows in shards:
        want = []
        for chunk in range(start, start + rows, CHUNK):
            part = dataset[chunk : min(chunk + CHUNK, start + rows)]
            want.append(_plain(model, part["title"], part["text"], sort=True))
            sizes += [min(BATCH, len(part["id"]) - s) for s in range(0, len(part["id"]), BATCH)]
        want = np.concatenate(want)
        got = np.load(path)
        assert np.array_equal(got, want), np.abs(got - want).max()
        assert not np.array_equal(got[::-1], want)  # control: rows out of place are seen
        ids = path.with_name(path.stem + ".ids.txt").read_text().split()
        assert ids == dataset[start : start + rows]["id"]
    assert landed == sizes  # every batch reported once, in order, when its vectors are in


@pytest.mark.parametrize("sort", [True, False])
def test_texts_and_questions_equal_a_plain_loop(model, dataset, sort) -> None:
    part = dataset[:70]
    want = _plain(model, part["title"], part["text"], sort=sort)
    for transfer in (QUEUED, None):
        got = encode_passage_texts(
            model,
            part["title"],
            part["text"],
            max_length=LENGTH,
            batch_size=BATCH,
            device=CPU,
            sort_by_length=sort,
            transfer=transfer,
        )
        assert np.array_equal(got, want)
    questions = [f"who wrote {title}?" for title in part["title"]]
    got = encode_question_texts(model, questions, max_length=32, device=CPU, batch_size=BATCH)
    want = np.empty_like(got)
    for start in range(0, len(questions), BATCH):
        inputs = model.tokenizer(
            questions[start : start + BATCH],
            padding="longest",
            truncation=True,
            max_length=32,
            return_tensors="pt",
        )
        with torch.inference_mode():
            want[start : start + BATCH] = model.encode_query(dict(inputs)).numpy()
    assert np.array_equal(got, want)
    assert not np.array_equal(got[1:], want[:-1])  # control
