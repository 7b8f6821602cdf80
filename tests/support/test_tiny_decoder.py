"""The tiny offline decoders: deterministic BPE merges, Hugging Face loading as a causal LM's
base, each family's template and padding, and the committed folders equal to a rebuild."""

from __future__ import annotations

import json
import sys
from collections import Counter
from pathlib import Path

import pytest
import torch
import transformers

from tests.support.fixtures import REPO, TOY
from tests.support.tiny_decoder import build_tiny_decoder, learn_bpe_merges

SENTENCES = [
    "Super Bowl 50 was an American football game.",
    "The Denver Broncos defeated the Carolina Panthers.",
    "The Normans gave their name to Normandy.",
] * 2


def test_merges_take_the_most_frequent_pair_and_break_ties_by_the_pair():
    merges = learn_bpe_merges(Counter({"abab": 10, "cd": 5, "ef": 5}), 4)
    assert merges[0] == ("a", "b")  # 20 occurrences
    assert merges[1:3] == [("ab", "ab"), ("c", "d")]  # 10; then 5 each: (c, d) before (e, f)
    assert merges[3] == ("e", "f")


@pytest.mark.parametrize("kind", ["llama", "qwen2"])
def test_same_texts_and_seed_give_identical_files(kind, tmp_path: Path):
    one = build_tiny_decoder(SENTENCES, tmp_path / "one", kind=kind, vocab_size=300)
    again = build_tiny_decoder(SENTENCES, tmp_path / "again", kind=kind, vocab_size=300)
    names = sorted(p.name for p in one.iterdir())
    assert "model.safetensors" in names and names == sorted(p.name for p in again.iterdir())
    for name in names:
        assert (one / name).read_bytes() == (again / name).read_bytes(), name


@pytest.mark.parametrize(("kind", "side"), [("llama", "left"), ("qwen2", "right")])
def test_committed_decoder_loads_as_a_base_model(kind, side):
    folder = TOY / f"tiny-{kind}"
    tok = transformers.AutoTokenizer.from_pretrained(folder)
    model = transformers.AutoModel.from_pretrained(folder).eval()
    assert type(model).__name__ == f"{'Llama' if kind == 'llama' else 'Qwen2'}Model"
    assert tok.padding_side == side and model.config.vocab_size == len(tok)
    ids = tok("Super Bowl 50 was an American football game.")["input_ids"]
    assert ids[-1] != tok.eos_token_id  # no EOS of its own: dpr-cache appends it
    assert (ids[0] == tok.bos_token_id) == (kind == "llama")
    with torch.no_grad():
        hidden = model(input_ids=torch.tensor([ids])).last_hidden_state
    assert hidden.shape == (1, len(ids), 32) and torch.isfinite(hidden).all()
    size = sum(p.stat().st_size for p in folder.iterdir())
    assert size < 1_000_000


@pytest.mark.parametrize("kind", ["llama", "qwen2"])
def test_committed_decoder_is_what_the_builder_writes(kind, tmp_path: Path):
    """The committed folder equals a rebuild from the toy corpus, file by file, but for the
    transformers version stamped in config.json."""
    sys.path.insert(0, str(REPO / "scripts"))
    try:
        from build_tiny_decoders import toy_texts
    finally:
        sys.path.remove(str(REPO / "scripts"))
    rebuilt = build_tiny_decoder(toy_texts(TOY), tmp_path / kind, kind=kind)
    committed = TOY / f"tiny-{kind}"
    names = sorted(p.name for p in committed.iterdir())
    assert names == sorted(p.name for p in rebuilt.iterdir())
    for name in names:
        if name in ("config.json", "generation_config.json"):
            mine, theirs = (json.loads((d / name).read_text()) for d in (committed, rebuilt))
            mine.pop("transformers_version", None)
            theirs.pop("transformers_version", None)
            assert mine == theirs, name
        else:
            assert (committed / name).read_bytes() == (rebuilt / name).read_bytes(), name
