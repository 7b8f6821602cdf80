"""``index`` of a multi-vector model (a tiny random BERT given a projection of 8 dims and a
skiplist) on the retrieval tests' corpus: its token shards hold each passage's scored tokens as
the towers compute them through plain ``transformers`` (the skiplist's tokens left out), a rerun
encodes only a missing shard and drops another key's files, and what it is not built for
(another index type, a width, a model of the other kind) is refused before anything is
written."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import numpy as np
import pytest
import torch
from safetensors.torch import load_file
from transformers import AutoModel

from dpr_cache.data.passages import load_passages
from dpr_cache.data.tokenize import tokenize_passages
from dpr_cache.errors import InputError
from dpr_cache.model.biencoder import BiEncoder
from dpr_cache.model.multivector import MultiVector
from dpr_cache.retrieval.dense.index import open_index
from dpr_cache.retrieval.dense.tokens import TokenStore, offsets_path
from dpr_cache.retrieval.drivers.eval import evaluate
from dpr_cache.retrieval.drivers.index import build_index

SKIP = "river"


@pytest.fixture(scope="module")
def multi_model(corpus, tmp_path_factory) -> Path:
    """The tiny BERT as a multi-vector model of 8-d tokens whose passages skip ``river``."""
    model = BiEncoder.from_pretrained(corpus["tiny"], vectors="multi", multi_dim=8)
    model.multi = MultiVector(8, (SKIP,))
    out = tmp_path_factory.mktemp("multi") / "model"
    model.save_pretrained(out)
    return out


@pytest.fixture(scope="module")
def indexed(corpus, multi_model, make_config, tmp_path_factory):
    out = tmp_path_factory.mktemp("run")
    shutil.copytree(multi_model, out / "model")
    config = make_config(corpus, out, with_model=False)
    build_index(config, progress=False)
    return config


def _reference_tokens(corpus, model_dir: Path, rows: list[int]) -> list[np.ndarray]:
    """Each passage's scored tokens by plain ``transformers``: the passage tower's last hidden
    state through the saved projection, unit length, the skiplist's tokens left out."""
    tower = model_dir / "passage_encoder"
    bert = AutoModel.from_pretrained(tower).eval()
    weight = load_file(str(tower / "1_Dense" / "model.safetensors"))["linear.weight"]
    model = BiEncoder.from_pretrained(model_dir)
    skip = model.tokenizer.convert_tokens_to_ids(SKIP)
    dataset = load_passages(corpus["root"] / "passages.tsv", corpus["root"] / "cache")
    out = []
    for row in rows:
        passage = dataset[row]
        feats = tokenize_passages(model.tokenizer, [passage["title"]], [passage["text"]], 48)
        inputs = {key: torch.tensor([value[0]]) for key, value in feats.items()}
        ids = inputs["input_ids"]
        with torch.no_grad():
            hidden = bert(**inputs).last_hidden_state
        tokens = torch.nn.functional.normalize(hidden[0] @ weight.T, dim=-1)
        out.append(tokens[ids[0] != skip].numpy())
    return out


def test_shards_hold_each_passages_scored_tokens(corpus, multi_model, indexed) -> None:
    index_dir = indexed.output_path / "index"
    meta = json.loads((index_dir / "meta.json").read_text())
    assert (meta["vectors"], meta["type"], meta["dim"], meta["rows"]) == ("multi", "flat", 8, 50)
    assert [s["rows"] for s in meta["shards"]] == [16, 16, 16, 2]
    assert meta["model"]["vectors"] == "multi" and meta["model"]["skiplist"] == [SKIP]
    store = open_index(index_dir).store
    assert isinstance(store, TokenStore) and meta["tokens"] == store.tokens
    rows = [0, 17, 33, 49]
    tokens, offsets = store.take(np.array(rows))
    want = _reference_tokens(corpus, multi_model, rows)
    assert np.diff(offsets).tolist() == [len(w) for w in want]
    np.testing.assert_allclose(tokens, np.concatenate(want), atol=2e-3)  # stored as float16
    texts = load_passages(corpus["root"] / "passages.tsv", corpus["root"] / "cache")
    assert any(SKIP in texts[r]["text"].split() for r in rows)  # the skiplist was exercised


def test_a_rerun_encodes_only_the_missing_shard(indexed) -> None:
    shards = indexed.output_path / "index" / "shards"
    npys = sorted(p for p in shards.glob("*.npy") if not p.name.endswith(".offsets.npy"))
    before = {p: p.stat().st_mtime_ns for p in npys}
    kept = np.load(npys[2])
    npys[2].unlink()
    stale = shards / f"{'0' * 16}-00000.offsets.npy"
    np.save(stale, np.zeros(3, np.int64))
    build_index(indexed, progress=False)
    assert [p.stat().st_mtime_ns == before[p] for p in npys] == [True, True, False, True]
    np.testing.assert_array_equal(np.load(npys[2]), kept)
    assert offsets_path(npys[2]).is_file() and not stale.exists()


@pytest.mark.parametrize(
    "index, message",
    [
        ({"type": "hnsw"}, "index.type: 'hnsw': a multi-vector model's index is flat"),
        ({"dim": 4}, "index.dim (--dim): 4, but a multi-vector model's token vectors are one"),
    ],
)
def test_what_a_multi_vector_index_is_not_is_refused(
    corpus, multi_model, make_config, tmp_path, index, message
) -> None:
    shutil.copytree(multi_model, tmp_path / "model")
    config = make_config(corpus, tmp_path, with_model=False, **index)
    with pytest.raises(InputError) as refused:
        build_index(config, progress=False)
    assert str(refused.value).startswith(message)
    assert not (tmp_path / "index").exists()


def test_models_of_the_other_kind_are_refused(corpus, multi_model, indexed, built, tmp_path):
    """A multi-vector model against one vector a passage, and the reverse."""
    for config, model in ((built, multi_model), (indexed, corpus["saved"])):
        with pytest.raises(InputError, match="but the index at .* holds") as refused:
            evaluate(config, model, out_dir=tmp_path / "eval", progress=False)
        assert "\n" not in str(refused.value)
        assert not (tmp_path / "eval" / "metrics.json").exists()
