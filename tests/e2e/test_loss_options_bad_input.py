"""The loss options' bad input through the real CLI: one ``error:`` line naming the key and the
value, exit 2, and nothing written in the run's folder (no config, checkpoint or model)."""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.e2e.test_bad_input import expect_error
from tests.support.cli import run_cli, toy_overrides
from tests.support.fixtures import TOY


def _train(tmp_path: Path, *sets: str):
    args = toy_overrides(tmp_path)
    for item in sets:
        args += ["--set", item]
    return run_cli("train", "--config", "configs/toy.yaml", *args, "-q", check=False)


def _nothing_written(tmp_path: Path) -> None:
    run = tmp_path / "run"
    written = [p.name for p in run.iterdir()] if run.is_dir() else []
    assert not {"config.yaml", "checkpoints", "model", "train_log.jsonl"} & set(written), written


@pytest.fixture(scope="module")
def untokenized(tmp_path_factory) -> Path:
    """A model folder with its weights and config but no tokenizer files."""
    import shutil

    out = tmp_path_factory.mktemp("guide") / "no-tokenizer"
    out.mkdir()
    for name in ("config.json", "model.safetensors"):
        shutil.copy(TOY / "tiny-bert" / name, out / name)
    return out


@pytest.mark.parametrize(
    ("sets", "fragments"),
    [
        (
            ["train.directions=[query_to_passage,query_to_doc]"],
            ["train.directions", "query_to_doc"],
        ),
        (
            ["train.partition=per_direction", "train.directions=[passage_to_passage]"],
            ["train.partition: per_direction", "passage_to_passage"],
        ),
        (["train.matryoshka_dims=[16,64]"], ["train.matryoshka_dims", "descending", "[16, 64]"]),
        (["train.matryoshka_dims=[128,32]"], ["train.matryoshka_dims: 128", "width (64)"]),
        (["train.chunk_tokens=16"], ["train.chunk_tokens: 16", "model.max_query_length (32)"]),
        (["train.guide=/nowhere/guide"], ["train.guide", "/nowhere/guide"]),
        (["train.hardness=all"], ["train.hardness_strength", "all"]),
    ],
    ids=["direction", "per-direction", "dims-order", "dims-width", "tokens", "guide", "hardness"],
)
def test_a_bad_loss_option_is_one_line_and_writes_nothing(tmp_path, sets, fragments):
    expect_error(_train(tmp_path, *sets), *fragments)
    _nothing_written(tmp_path)


def test_a_guide_without_a_tokenizer_is_one_line(tmp_path, untokenized):
    expect_error(_train(tmp_path, f"train.guide={untokenized}"), "train.guide", "tokenizer")
    _nothing_written(tmp_path)
