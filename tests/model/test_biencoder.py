"""The bi-encoder against plain ``transformers``: pooling, saving and loading, load errors."""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest
import torch
from transformers import AutoModel, AutoTokenizer

from dpr_cache.errors import InputError
from dpr_cache.model.biencoder import BiEncoder
from dpr_cache.model.ddp import wrap_towers
from dpr_cache.model.loading import load_biencoder, model_fingerprint
from dpr_cache.model.pooling import pool
from dpr_cache.runtime.distributed import DistEnv
from tests.support.fixtures import TOY

TINY = TOY / "tiny-bert"


@pytest.fixture(scope="module")
def inputs() -> dict[str, torch.Tensor]:
    tok = AutoTokenizer.from_pretrained(TINY)
    return dict(
        tok(
            ["who won?", "a much longer question about the game"], padding=True, return_tensors="pt"
        )
    )


@pytest.mark.parametrize("pooling", ["cls", "mean"])
def test_vectors_equal_the_tower_run_through_transformers(inputs, pooling) -> None:
    model = BiEncoder.from_pretrained(TINY, pooling=pooling).eval()
    bert = AutoModel.from_pretrained(TINY).eval()
    with torch.no_grad():
        hidden = bert(**inputs).last_hidden_state
        mask = inputs["attention_mask"].unsqueeze(-1).float()
        want = hidden[:, 0] if pooling == "cls" else (hidden * mask).sum(1) / mask.sum(1)
        got_q, got_p = model.encode_query(inputs), model.encode_passage(inputs)
    torch.testing.assert_close(got_q, want)
    torch.testing.assert_close(got_p, want)  # separate towers start as copies
    if pooling == "mean":  # the control: padding must not count
        assert not torch.allclose(got_q[0], hidden[0].mean(0), atol=1e-4)


def test_pool_rejects_an_unknown_pooling() -> None:
    with pytest.raises(ValueError, match="pooling"):
        pool(torch.zeros(1, 2, 3), torch.ones(1, 2), "max")


def test_save_and_load_give_the_same_vectors(inputs, tmp_path: Path) -> None:
    model = BiEncoder.from_pretrained(TINY, pooling="mean").eval()
    with torch.no_grad():
        for p in model.passage_encoder.parameters():
            p.add_(0.01)  # towers now differ: a swap would show
    model.save_pretrained(tmp_path / "saved")
    back = BiEncoder.from_pretrained(tmp_path / "saved").eval()
    assert back.pooling == "mean" and not back.shared  # the saved pooling
    with torch.no_grad():
        torch.testing.assert_close(back.encode_query(inputs), model.encode_query(inputs))
        torch.testing.assert_close(back.encode_passage(inputs), model.encode_passage(inputs))
        assert not torch.allclose(back.encode_query(inputs), back.encode_passage(inputs))


def test_load_errors_name_the_source_in_one_line(tmp_path: Path) -> None:
    with pytest.raises(InputError, match=r"^model.name_or_path: .*missing: cannot load a model"):
        load_biencoder(tmp_path / "missing", source="model.name_or_path")
    (tmp_path / "empty").mkdir()
    with pytest.raises(InputError, match=r"^/.*empty: cannot load a model"):
        load_biencoder(tmp_path / "empty")
    no_tok = tmp_path / "no-tokenizer"
    AutoModel.from_pretrained(TINY).save_pretrained(no_tok)
    with pytest.raises(InputError, match="no tokenizer files"):
        load_biencoder(no_tok)
    with pytest.raises(
        InputError, match="not an installed package that ships a model \\(ModuleNotFoundError\\)"
    ):
        load_biencoder("python:no_such_package_here")


def test_fingerprint_follows_the_bytes(tmp_path: Path) -> None:
    copy = Path(shutil.copytree(TINY, tmp_path / "copy"))
    assert model_fingerprint(copy) == model_fingerprint(TINY)
    (copy / ".hidden").write_text("ignored")
    assert model_fingerprint(copy) == model_fingerprint(TINY)
    config = copy / "config.json"
    config.write_text(config.read_text() + " ")  # one byte more
    assert model_fingerprint(copy) != model_fingerprint(TINY)


def test_one_process_needs_no_ddp(inputs) -> None:
    model = BiEncoder.from_pretrained(TINY)
    towers = wrap_towers(model, DistEnv())
    assert towers.wrappers == [] and towers.no_sync is None
    with torch.no_grad():
        torch.testing.assert_close(towers.encode_q(inputs), model.encode_query(inputs))
