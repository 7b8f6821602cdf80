"""The tiny offline BERT: vocabulary learning, Hugging Face loading, pair encoding, determinism;
the tiny cross-encoder built on its tokenizer: loading, determinism, the committed copy."""

from __future__ import annotations

import json
from collections import Counter
from pathlib import Path

import pytest

from tests.support.tiny_bert import (
    SPECIAL_TOKENS,
    build_tiny_bert,
    build_tiny_cross_encoder,
    learn_wordpiece_vocab,
)

torch = pytest.importorskip("torch")
transformers = pytest.importorskip("transformers")

TOY_BERT = Path(__file__).resolve().parents[2] / "data" / "toy" / "tiny-bert"
TOY_CROSS_ENCODER = TOY_BERT.parent / "tiny-cross-encoder"
SENTENCES = [
    "Super Bowl 50 was an American football game.",
    "The Denver Broncos defeated the Carolina Panthers.",
    "Beyoncé was born in Houston, Texas.",
    "The Normans were the people who gave their name to Normandy.",
] * 2


@pytest.fixture(scope="module")
def built(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return build_tiny_bert(SENTENCES, tmp_path_factory.mktemp("tiny") / "bert", vocab_size=120)


def test_vocab_starts_with_specials_and_merges_frequent_pairs() -> None:
    vocab = learn_wordpiece_vocab(Counter({"abab": 10, "ab": 5, "c": 1}), vocab_size=12)
    assert vocab[:5] == SPECIAL_TOKENS
    assert {"a", "b", "c", "##a", "##b", "##c"} <= set(vocab)
    assert vocab[11] == "ab"  # the most frequent pair (a, ##b) is merged first
    assert len(vocab) == 12


def test_loads_with_auto_classes(built: Path) -> None:
    tok = transformers.AutoTokenizer.from_pretrained(built)
    model = transformers.AutoModel.from_pretrained(built)
    assert model.config.hidden_size == 64 and model.config.num_hidden_layers == 2
    assert model.config.vocab_size == len(tok) <= 120
    assert tok.convert_tokens_to_ids(SPECIAL_TOKENS) == [0, 1, 2, 3, 4]
    assert tok.tokenize("BEYONCÉ Broncos") == tok.tokenize("beyonce broncos")  # lower, no accents


def test_pair_encoding_marks_the_second_segment(built: Path) -> None:
    tok = transformers.AutoTokenizer.from_pretrained(built)
    enc = tok(
        ["Super Bowl 50", "Normans"],
        ["The Denver Broncos defeated the Carolina Panthers. " * 10, "Normandy"],
        truncation="only_second",
        max_length=24,
        padding=True,
        return_tensors="pt",
    )
    ids, types = enc["input_ids"], enc["token_type_ids"]
    assert ids.shape == (2, 24)
    sep = tok.sep_token_id
    for row in range(2):
        seps = (ids[row] == sep).nonzero().flatten().tolist()
        assert ids[row, 0] == tok.cls_token_id and len(seps) == 2
        assert types[row, : seps[0] + 1].eq(0).all()  # [CLS] title [SEP]
        assert types[row, seps[0] + 1 : seps[1] + 1].eq(1).all()  # text [SEP]
    title_len = len(tok.tokenize("Super Bowl 50"))
    assert ids[0, 1 : 1 + title_len].tolist() == tok.convert_tokens_to_ids(
        tok.tokenize("Super Bowl 50")
    )  # the title survives; only the text is truncated


def test_same_texts_and_seed_give_identical_files(built: Path, tmp_path: Path) -> None:
    again = build_tiny_bert(SENTENCES, tmp_path / "again", vocab_size=120)
    names = sorted(p.name for p in built.iterdir())
    assert names == sorted(p.name for p in again.iterdir())
    assert "model.safetensors" in names
    for name in names:
        assert (built / name).read_bytes() == (again / name).read_bytes(), name


def test_seed_changes_weights_but_not_vocab(built: Path, tmp_path: Path) -> None:
    other = build_tiny_bert(SENTENCES, tmp_path / "other", vocab_size=120, seed=1)
    assert (built / "tokenizer.json").read_bytes() == (other / "tokenizer.json").read_bytes()
    assert (built / "model.safetensors").read_bytes() != (other / "model.safetensors").read_bytes()


@pytest.mark.skipif(not TOY_BERT.is_dir(), reason="data/toy/tiny-bert not built")
def test_committed_tiny_bert_encodes_to_64_dims() -> None:
    tok = transformers.AutoTokenizer.from_pretrained(TOY_BERT)
    model = transformers.AutoModel.from_pretrained(TOY_BERT).eval()
    enc = tok(
        ["Super Bowl 50"],
        ["Super Bowl 50 was an American football game."],
        truncation="only_second",
        max_length=256,
        return_tensors="pt",
    )
    with torch.no_grad():
        hidden = model(**enc).last_hidden_state
    assert hidden.shape == (1, enc["input_ids"].shape[1], 64)
    assert torch.isfinite(hidden).all()
    assert model.config.max_position_embeddings == 256
    assert tok.unk_token_id not in enc["input_ids"][0].tolist()


def test_cross_encoder_loads_with_the_bert_tokenizer(built: Path, tmp_path: Path) -> None:
    cross = build_tiny_cross_encoder(built, tmp_path / "ce", num_labels=2)
    model = transformers.AutoModelForSequenceClassification.from_pretrained(cross)
    assert type(model).__name__ == "BertForSequenceClassification"
    assert model.config.num_labels == 2 and model.config.hidden_size == 8
    assert (cross / "tokenizer.json").read_bytes() == (built / "tokenizer.json").read_bytes()
    tok = transformers.AutoTokenizer.from_pretrained(cross)
    assert model.config.vocab_size == len(tok)
    assert model.config.max_position_embeddings == tok.model_max_length


def test_cross_encoder_same_seed_identical_other_seed_not(built: Path, tmp_path: Path) -> None:
    one = build_tiny_cross_encoder(built, tmp_path / "one")
    again = build_tiny_cross_encoder(built, tmp_path / "again")
    other = build_tiny_cross_encoder(built, tmp_path / "other", seed=1)
    names = sorted(p.name for p in one.iterdir())
    assert names == sorted(p.name for p in again.iterdir())
    assert "model.safetensors" in names
    for name in names:
        assert (one / name).read_bytes() == (again / name).read_bytes(), name
    assert (one / "model.safetensors").read_bytes() != (other / "model.safetensors").read_bytes()


@pytest.mark.skipif(not TOY_CROSS_ENCODER.is_dir(), reason="data/toy/tiny-cross-encoder not built")
def test_committed_cross_encoder_is_what_the_builder_writes(tmp_path: Path) -> None:
    """The committed folder equals a rebuild from the committed tiny BERT, file by file, but for
    the transformers version stamped in config.json."""
    rebuilt = build_tiny_cross_encoder(TOY_BERT, tmp_path / "ce")
    names = sorted(p.name for p in TOY_CROSS_ENCODER.iterdir())
    assert names == sorted(p.name for p in rebuilt.iterdir())
    for name in names:
        if name == "config.json":
            assert _unstamped(TOY_CROSS_ENCODER / name) == _unstamped(rebuilt / name)
        else:
            assert (TOY_CROSS_ENCODER / name).read_bytes() == (rebuilt / name).read_bytes(), name
    size = sum(p.stat().st_size for p in TOY_CROSS_ENCODER.iterdir())
    assert size < 200_000  # a small folder in git: the weights ~80 kB, the tokenizer ~43 kB


def _unstamped(config_file: Path) -> dict:
    """A config.json without the transformers version that saved it."""
    config = json.loads(config_file.read_text())
    config.pop("transformers_version")
    return config
