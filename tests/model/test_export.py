"""``dpr-cache export`` as one plain function, :func:`dpr_cache.model.export.export`: each of
its formats written whole into its folder, another format a one-line error naming the known
ones, and the CLI's ``--format`` help listing exactly those."""

from __future__ import annotations

from pathlib import Path

import pytest

from dpr_cache.errors import InputError
from dpr_cache.model.biencoder import BiEncoder
from dpr_cache.model.export import FORMATS, export
from tests.support.fixtures import TOY
from tests.support.llm import decoder_model, lora_settings


def test_each_format_writes_its_folders(tmp_path: Path):
    bert = BiEncoder.from_pretrained(TOY / "tiny-bert").save_pretrained(tmp_path / "bert")
    export(bert, tmp_path / "hf", "dpr-hf")
    assert {p.name for p in (tmp_path / "hf").iterdir()} == {"question_encoder", "ctx_encoder"}
    llm = decoder_model(lora=lora_settings(), shared=True).save_pretrained(tmp_path / "llm")
    export(llm, tmp_path / "merged", "merged")
    tower = tmp_path / "merged" / "query_encoder"
    assert (tower / "model.safetensors").is_file() and not (tower / "adapter_config.json").exists()
    export(llm, tmp_path / "merged", "merged")  # an earlier export of its own is replaced


def test_another_format_is_one_line_naming_the_known_ones(tmp_path: Path):
    with pytest.raises(InputError) as err:
        export(TOY / "tiny-bert", tmp_path / "out", "onnx")
    message = str(err.value)
    assert "\n" not in message and message.startswith("--format: 'onnx' is not a known format")
    assert all(name in message for name in FORMATS)
    assert not (tmp_path / "out").exists()  # nothing written


def test_an_output_holding_the_model_is_refused(tmp_path: Path):
    llm = decoder_model(lora=lora_settings(), shared=True).save_pretrained(tmp_path / "llm")
    with pytest.raises(InputError):
        export(llm, tmp_path, "merged")


def test_the_cli_help_lists_the_formats():
    from typer.testing import CliRunner

    from dpr_cache.cli import app

    result = CliRunner().invoke(app, ["export", "--help"], env={"COLUMNS": "400"})
    assert result.exit_code == 0
    for name, what in FORMATS.items():
        assert f"{name}: {what}" in " ".join(result.output.split())
