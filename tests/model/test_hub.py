"""Model names as transformers takes them: a hub name is read from the Hugging Face cache once
downloaded; one that cannot be had is a one-line error saying why (the cache is empty and
``HF_HUB_OFFLINE=1``, or the hub could not be reached), the headline command included; a path
that is not there is never looked up on the hub."""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest

from dpr_cache.model.hub import ModelNotFound, resolve_model_path
from tests.support.cli import run_cli, toy_overrides
from tests.support.fixtures import TOY

REVISION = "0123456789abcdef0123456789abcdef01234567"
UNREACHABLE = {"HF_HUB_OFFLINE": "0", "HF_ENDPOINT": "http://127.0.0.1:9"}  # nothing listens


def _hub_cache(root: Path) -> Path:
    """A Hugging Face cache holding the tiny BERT as the hub model ``dpr-cache-test/tiny-bert``,
    laid out as a download leaves it (``refs/main`` naming a snapshot)."""
    repo = root / "models--dpr-cache-test--tiny-bert"
    shutil.copytree(TOY / "tiny-bert", repo / "snapshots" / REVISION)
    (repo / "refs").mkdir()
    (repo / "refs" / "main").write_text(REVISION)
    return root


def test_a_cached_hub_model_trains_offline(tmp_path, monkeypatch) -> None:
    cache = _hub_cache(tmp_path / "hub")
    monkeypatch.setenv("HF_HUB_CACHE", str(cache))
    args = toy_overrides(
        tmp_path, **{"model.name_or_path": "dpr-cache-test/tiny-bert", "train.max_steps": 2}
    )
    run_cli("train", "--config", "configs/toy.yaml", *args, "-q")
    assert (tmp_path / "run" / "model" / "query_encoder" / "model.safetensors").is_file()
    other = [
        "--set",
        "model.name_or_path=dpr-cache-test/not-cached",
        "--set",
        f"output_dir={tmp_path / 'other'}",
    ]
    missing = run_cli("train", "--config", "configs/toy.yaml", *args, *other, check=False)
    assert missing.returncode == 2
    assert missing.stderr.strip() == (
        "error: model.name_or_path: dpr-cache-test/not-cached: no such local folder, and it is "
        "not in the Hugging Face cache and HF_HUB_OFFLINE=1 forbids a download: download it "
        "once with network access, or give a local model folder"
    )


def test_the_headline_command_says_when_the_hub_cannot_be_reached(tmp_path, monkeypatch) -> None:
    """configs/nq_bs512.yaml as printed but on the toy files: the model it names
    (bert-base-uncased) is fetched from the hub, which is unreachable here."""
    data = {
        "data.train": TOY / "train.jsonl",
        "data.passages": TOY / "passages.tsv",
        "data.dev_qa": TOY / "dev.qa.tsv",
        "train.batch_size": 16,
    }
    args = ["--config", "configs/nq_bs512.yaml", *toy_overrides(tmp_path, **data)]
    for key, value in UNREACHABLE.items():
        monkeypatch.setenv(key, value)  # for the child process only: this one read it at start
    done = run_cli("train", *args, check=False)
    assert done.returncode == 2, done.stderr[-2000:]
    [line] = done.stderr.strip().splitlines()
    assert line.startswith("error: model.name_or_path: bert-base-uncased: no such local folder")
    assert "the Hugging Face hub could not be reached" in line


def test_a_path_that_is_not_there_is_not_looked_up_on_the_hub(tmp_path, monkeypatch) -> None:
    monkeypatch.chdir(tmp_path)
    (tmp_path / "runs").mkdir()
    for name in ("runs/model", "runs/no/such/model", str(tmp_path / "nothing"), "./model"):
        assert resolve_model_path(name) == Path(name)  # a path: the loader says it is missing
    for name in ("no-such-org/no-such-model", "no-such-model"):  # control: hub-like names
        with pytest.raises(ModelNotFound, match="HF_HUB_OFFLINE=1"):
            resolve_model_path(name)


def test_either_offline_variable_is_named_as_offline(monkeypatch) -> None:
    from dpr_cache.model import hub

    monkeypatch.delenv("HF_HUB_OFFLINE")
    monkeypatch.setenv("TRANSFORMERS_OFFLINE", "1")
    assert hub._offline()
    monkeypatch.setenv("TRANSFORMERS_OFFLINE", "0")
    assert not hub._offline()
