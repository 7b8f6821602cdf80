"""A LoRA run's model merged into its base (``dpr-cache export --format merged``), read by the
real libraries: sentence-transformers (last-token pooling, the multi-line instruction prompt,
normalization, (title, text) pairs) and transformers' ``AutoModel`` give dpr-cache's vectors;
and sentence-transformers' own uncached MultipleNegativesRankingLoss gives the gradient that
dpr-cache's GradCache gives, on the same peft adapter."""

from __future__ import annotations

import json

import numpy as np
import pytest
import torch
from transformers import AutoModel, AutoTokenizer

from dpr_cache.core.engine import GradCache
from dpr_cache.core.loss import contrastive_loss
from dpr_cache.model.biencoder import BiEncoder
from dpr_cache.model.export import export_merged
from dpr_cache.model.pooling import pool
from dpr_cache.retrieval.dense.encode import encode_passage_texts, encode_question_texts
from tests.support.llm import decoder_model, lora_settings, toy_batch, toy_texts

st = pytest.importorskip("sentence_transformers")

CPU = torch.device("cpu")
INSTRUCT = "Instruct: Given a question, retrieve passages that answer it\nQuery: "


def _gap(a: np.ndarray, b: np.ndarray) -> float:
    """The largest 1 - cos between matching rows."""
    cos = (a * b).sum(1) / np.linalg.norm(a, axis=1) / np.linalg.norm(b, axis=1)
    return float((1 - cos).max())


@pytest.fixture(scope="module", params=[("llama", False), ("qwen2", True)], ids=str)
def exported(request, tmp_path_factory):
    """A trained-like LoRA model (kind, shared), saved as a run saves it, and its export."""
    kind, shared = request.param
    root = tmp_path_factory.mktemp(kind)
    model = decoder_model(kind, lora=lora_settings(), shared=shared)
    model.query_prefix, model.normalize = INSTRUCT, True
    model.max_query_length, model.max_passage_length = 48, 40
    model.save_pretrained(root / "model")
    export_merged(root / "model", root / "merged")
    return BiEncoder.from_pretrained(root / "model", shared=shared).eval(), root / "merged"


def test_the_merged_folder_is_plain_and_records_its_encoding(exported):
    _, merged = exported
    tower = merged / "query_encoder"
    names = {p.name for p in tower.iterdir()}
    assert {"config.json", "model.safetensors", "modules.json"} <= names
    assert "adapter_config.json" not in names  # merged: no peft needed
    meta = json.loads((merged / "biencoder.json").read_text())
    assert meta["pooling"] == "last" and meta["query_prefix"] == INSTRUCT and meta["normalize"]


def test_sentence_transformers_gives_our_vectors(exported):
    model, merged = exported
    questions, pairs = toy_texts(5)
    ours_q = encode_question_texts(model, questions, max_length=48, device=CPU)
    ours_p = encode_passage_texts(
        model, [t for t, _ in pairs], [x for _, x in pairs], max_length=40, batch_size=8, device=CPU
    )
    q_st = st.SentenceTransformer(str(merged / "query_encoder"), device="cpu")
    p_st = st.SentenceTransformer(str(merged / "passage_encoder"), device="cpu")
    assert _gap(q_st.encode(questions), ours_q) <= 1e-6  # its prompt, pooling, EOS, norm
    assert _gap(p_st.encode([list(pair) for pair in pairs]), ours_p) <= 1e-6
    no_prompt = q_st.encode(questions, prompt="")  # control: the instruction matters
    assert _gap(no_prompt, ours_q) > 1e-4


def test_transformers_automodel_gives_our_vectors(exported):
    model, merged = exported
    questions, _ = toy_texts(5)
    ours = encode_question_texts(model, questions, max_length=48, device=CPU)
    tower = AutoModel.from_pretrained(merged / "query_encoder").eval()
    tokenizer = AutoTokenizer.from_pretrained(merged / "query_encoder")
    texts = [INSTRUCT + q for q in questions]
    inputs = tokenizer(texts, padding=True, truncation=True, max_length=48, return_tensors="pt")
    with torch.no_grad():
        hidden = tower(**inputs).last_hidden_state
    theirs = torch.nn.functional.normalize(pool(hidden, inputs["attention_mask"], "last"), dim=-1)
    assert _gap(theirs.numpy(), ours) <= 1e-6


def test_sentence_transformers_mnrl_gives_gradcaches_gradient():
    """On the same peft adapter over the tiny Llama, last-token pooling, dot product, scale 1:
    sentence-transformers' uncached MNRL (questions -> positives and a hard negative each) and
    dpr-cache's GradCache at chunk 2 fill the same adapter gradients (fp32)."""
    from sentence_transformers.sentence_transformer.losses import MultipleNegativesRankingLoss
    from sentence_transformers.sentence_transformer.modules import Pooling, Transformer
    from sentence_transformers.util import dot_score

    model = decoder_model(lora=lora_settings(), shared=True).train()
    q, p, _ = toy_batch(model.tokenizer, 6, 1)
    engine = GradCache(model.encode_query, model.encode_passage, contrastive_loss, 2)
    model.zero_grad(set_to_none=True)
    ours_loss = engine.step(q, p)
    ours = {n: t.grad.clone() for n, t in model.named_parameters() if t.grad is not None}

    transformer = Transformer(str(model.query_encoder.config._name_or_path))
    transformer.model = model.query_encoder  # the very PeftModel GradCache trained
    pooling = Pooling(model.dim, pooling_mode="lasttoken")
    peer = st.SentenceTransformer(modules=[transformer, pooling], device="cpu").train()
    loss = MultipleNegativesRankingLoss(peer, scale=1.0, similarity_fct=dot_score)
    features = [dict(q), {k: v[0::2] for k, v in p.items()}, {k: v[1::2] for k, v in p.items()}]
    model.zero_grad(set_to_none=True)
    theirs_loss = loss(features, None)
    theirs_loss.backward()
    theirs = {n: t.grad.clone() for n, t in model.named_parameters() if t.grad is not None}
    assert ours.keys() == theirs.keys() and ours
    scale = max(g.abs().max().item() for g in theirs.values())
    gap = max((ours[n] - theirs[n]).abs().max().item() for n in ours) / scale
    assert gap <= 1e-5, gap
    assert ours_loss.item() == pytest.approx(theirs_loss.item(), rel=1e-6)
