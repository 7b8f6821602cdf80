"""SDPA attention whose padding mask is built without reading the device: the same outputs as
transformers' SDPA, no look at the mask's contents, nothing saved."""

from __future__ import annotations

import copy

import torch

from dpr_cache.model.attention import SDPA_NAME, use_sdpa_without_wait
from dpr_cache.model.biencoder import BiEncoder
from tests.support.fixtures import bert_config, random_inputs


def _pair() -> tuple[BiEncoder, BiEncoder]:
    torch.manual_seed(0)
    plain = BiEncoder.from_config(bert_config(), shared=True, pooling="mean").eval()
    plain.query_encoder.set_attn_implementation("sdpa")
    ours = copy.deepcopy(plain)
    assert use_sdpa_without_wait([ours.query_encoder, ours.passage_encoder]) == 1
    return plain, ours


def test_same_outputs_as_sdpa_padded_or_not():
    plain, ours = _pair()
    assert ours.query_encoder.config._attn_implementation == SDPA_NAME
    padded = random_inputs(5, 11, seed=3)
    assert padded["attention_mask"].eq(0).any()
    assert torch.equal(ours.encode_query(padded), plain.encode_query(padded))
    full = {k: v[:, :4] for k, v in padded.items()}  # every row attends to all 4 columns
    assert full["attention_mask"].eq(1).all()
    torch.testing.assert_close(ours.encode_query(full), plain.encode_query(full))


def test_the_mask_contents_are_never_read(monkeypatch):
    """transformers decides its skip by reading the padding mask (``.all()``: a host wait on
    CUDA); under our name that check is never reached. Negative control: plain SDPA reaches it."""
    from transformers import masking_utils

    calls = []
    real = masking_utils._ignore_bidirectional_mask_sdpa

    def counted(*args, **kwargs):
        calls.append(1)
        return real(*args, **kwargs)

    monkeypatch.setattr(masking_utils, "_ignore_bidirectional_mask_sdpa", counted)
    plain, ours = _pair()
    inputs = random_inputs(4, 9, seed=1)
    ours.encode_query(inputs)
    assert calls == []
    plain.encode_query(inputs)
    assert calls


def test_other_implementations_are_left_alone_and_nothing_is_saved(tmp_path):
    torch.manual_seed(0)
    eager = BiEncoder.from_config(bert_config(), shared=False)
    for tower in (eager.query_encoder, eager.passage_encoder):
        tower.set_attn_implementation("eager")
    assert use_sdpa_without_wait([eager.query_encoder, eager.passage_encoder]) == 0
    assert eager.query_encoder.config._attn_implementation == "eager"
    _, ours = _pair()
    ours.save_pretrained(tmp_path / "saved")
    for path in (tmp_path / "saved").rglob("*.json"):
        assert SDPA_NAME not in path.read_text(), path
    reloaded = BiEncoder.from_pretrained(tmp_path / "saved").eval()
    inputs = random_inputs(3, 7, seed=2)
    torch.testing.assert_close(reloaded.encode_query(inputs), ours.encode_query(inputs))
