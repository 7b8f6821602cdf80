"""Training a decoder with LoRA (configs/toy_llm.yaml): a checkpoint holds the adapters alone
and resumes exactly, LoRA's dropout on; the trainer's settings are checked before it starts."""

from __future__ import annotations

import pytest
import torch

from dpr_cache.config import load_config
from dpr_cache.errors import InputError
from dpr_cache.runtime.distributed import DistEnv
from dpr_cache.train.checkpoint import STATE_FILE
from dpr_cache.train.trainer import batch_recipe, build_trainer, training_data
from tests.support.fixtures import REPO

CONFIG = REPO / "configs" / "toy_llm.yaml"


def _config(tmp_path, *extra: str):
    return load_config(
        CONFIG,
        [
            f"output_dir={tmp_path / 'run'}",
            f"data.cache_dir={tmp_path / 'cache'}",
            "train.batch_size=8",
            "train.chunk_size=3",  # 8 questions: chunks of 3, 3, 2
            "model.max_passage_length=48",
            "train.num_threads=1",
            *extra,
        ],
    )


def _adapters(trainer) -> dict[str, torch.Tensor]:
    return {n: p.detach().clone() for n, p in trainer.model.named_parameters() if p.requires_grad}


def test_a_lora_checkpoint_holds_the_adapters_and_resumes_exactly(tmp_path):
    config = _config(tmp_path)
    env = DistEnv()
    dataset, batches, _ = training_data(config, env)
    root = tmp_path / "run" / "checkpoints"

    def batch(trainer, step: int):
        recipe = batch_recipe(config, trainer.model, trainer.length_bucket)
        return recipe.batch(dataset, batches, trainer.model.tokenizer, step)

    torch.manual_seed(0)
    straight = build_trainer(config, env, total_steps=2)
    straight.step(batch(straight, 0))
    path = straight.checkpoint(root, 1, keep=2)
    straight.step(batch(straight, 1))
    want = _adapters(straight)

    state = torch.load(path / STATE_FILE, weights_only=False)
    assert state["weights"] == "trainable"
    assert state["model"] and all("lora_" in name for name in state["model"])
    named = {n.replace("passage_encoder.", "query_encoder.", 1) for n in state["model"]}
    assert named == set(want)  # the shared tower's adapters (under both of its names)

    torch.manual_seed(1)  # another init: the checkpoint must bring the adapters back
    resumed = build_trainer(config, env, total_steps=2)
    assert resumed.resume(root, 0) == 1
    resumed.step(batch(resumed, 1))
    got = _adapters(resumed)
    assert got.keys() == want.keys()
    assert all(torch.equal(got[n], want[n]) for n in want)  # bit-exact, dropout replayed

    torch.manual_seed(1)
    fresh = build_trainer(config, env, total_steps=2)  # control: no resume, other weights
    fresh.step(batch(fresh, 1))
    assert any(not torch.equal(_adapters(fresh)[n], want[n]) for n in want)


@pytest.mark.parametrize(
    ("setting", "fragment"),
    [
        ("model.dtype=fp16", "model.dtype: fp16 weights need a GPU"),
        ("model.max_passage_length=512", "model.max_passage_length: 512 tokens"),
        ("model.lora={target_modules: [qkv]}", "'qkv' names no linear layer"),
    ],
)
def test_bad_settings_stop_the_trainer_in_one_line(tmp_path, setting, fragment):
    with pytest.raises(InputError) as err:
        build_trainer(_config(tmp_path, setting), DistEnv(), total_steps=1)
    assert fragment in str(err.value) and "\n" not in str(err.value)
