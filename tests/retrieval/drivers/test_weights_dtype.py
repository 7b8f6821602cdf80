"""``model.dtype`` and ``model.attn_implementation`` reach every command that encodes: a config's
(``index``, ``eval``) load the towers as it says, and is recorded beside the shards; a
config-free command loads the weights in the dtype the model folder records."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch

from dpr_cache.config import load_config
from dpr_cache.model import loading
from dpr_cache.model.loading import load_settled
from dpr_cache.retrieval.drivers.eval import evaluate
from dpr_cache.retrieval.drivers.index import build_index
from tests.support.llm import decoder_model

CONFIG = "configs/toy_llm.yaml"


@pytest.fixture
def spied(monkeypatch) -> list[dict]:
    """Every model a command loads to encode: the dtype and attention asked, the weights'
    dtype and the attention its towers run."""
    loaded: list[dict] = []
    real = loading.load_biencoder

    def spy(path, **kw):
        model = real(path, **kw)
        tower = model.passage_encoder
        loaded.append(
            {
                "dtype": kw.get("dtype"),
                "weights": {p.dtype for p in tower.parameters()},
                "attention": tower.config._attn_implementation,
            }
        )
        return model

    monkeypatch.setattr(loading, "load_biencoder", spy)
    return loaded


def _model(tmp_path: Path, dtype: str | None = None) -> Path:
    """A saved tiny-Llama BiEncoder (no adapters) encoding as configs/toy_llm.yaml does,
    recording ``dtype``."""
    model = decoder_model(shared=True)
    model.weights_dtype, model.normalize = dtype, True
    model.query_prefix = load_config(CONFIG).model.query_prefix
    model.max_query_length, model.max_passage_length = 32, 64
    return model.save_pretrained(tmp_path / "model")


def _config(tmp_path: Path, *sets: str):
    return load_config(
        CONFIG,
        [
            f"output_dir={tmp_path / 'run'}",
            f"data.cache_dir={tmp_path / 'cache'}",
            "data.num_workers=0",
            "model.lora=null",
            "model.max_passage_length=64",
            *sets,
        ],
    )


def test_index_and_eval_load_the_weights_as_the_config_says(tmp_path, spied):
    model_dir = _model(tmp_path)
    config = _config(tmp_path, "model.dtype=bf16", "model.attn_implementation=eager")
    index_dir = build_index(config, model_dir, progress=False)
    assert spied[-1] == {"dtype": "bf16", "weights": {torch.bfloat16}, "attention": "eager"}
    meta = json.loads((index_dir / "meta.json").read_text())
    assert meta["encode"]["weights_dtype"] == "bf16"
    evaluate(config, model_dir, progress=False)
    assert spied[-1] == {"dtype": "bf16", "weights": {torch.bfloat16}, "attention": "eager"}


def test_shards_of_other_weights_dtype_are_not_reused(tmp_path, spied):
    model_dir = _model(tmp_path)
    fp32 = build_index(_config(tmp_path, "model.dtype=fp32"), model_dir, progress=False)
    first = json.loads((fp32 / "meta.json").read_text())
    assert first["encode"]["weights_dtype"] == "fp32" and spied[-1]["weights"] == {torch.float32}
    bf16 = build_index(_config(tmp_path, "model.dtype=bf16"), model_dir, progress=False)
    second = json.loads((bf16 / "meta.json").read_text())
    assert second["shard_key"] != first["shard_key"]
    assert second["timings"]["encoded_passages"] > 0  # encoded again, none of fp32's reused
    assert spied[-1]["weights"] == {torch.bfloat16}


def test_a_config_free_load_takes_the_folders_dtype(tmp_path, spied):
    model_dir = _model(tmp_path, dtype="bf16")
    load_settled(model_dir, {}, {}, query_only=True)
    assert spied[-1]["dtype"] is None and spied[-1]["weights"] == {torch.bfloat16}
    load_settled(model_dir, {}, {}, query_only=True, loading={"dtype": "fp32"})
    assert spied[-1]["weights"] == {torch.float32}  # control: asked, it wins
