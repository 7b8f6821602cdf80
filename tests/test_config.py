"""Config: typed YAML, key=value overrides, errors that name the key and the file."""

from __future__ import annotations

import pytest
import yaml

from dpr_cache.config import load_config, parse_bytes, save_config
from dpr_cache.errors import InputError
from tests.support.fixtures import REPO


def write(tmp_path, text: str):
    path = tmp_path / "run.yaml"
    path.write_text(text)
    return path


def test_shipped_configs_load():
    for path in sorted((REPO / "configs").glob("*.yaml")):
        load_config(path)


def test_overrides_are_typed(tmp_path):
    cfg = load_config(
        write(tmp_path, "train:\n  lr: 1.0e-4\n"),
        ["train.lr=3e-5", "train.batch_size=8", "model.shared=true", "eval.top_k=[1, 3]"],
    )
    assert cfg.train.lr == pytest.approx(3e-5)
    assert cfg.train.batch_size == 8 and cfg.model.shared is True and cfg.eval.top_k == [1, 3]


@pytest.mark.parametrize(
    ("text", "overrides", "message"),
    [
        ("train:\n  lrr: 1\n", [], "unknown key 'train.lrr'"),
        ("colour: red\n", [], "unknown key 'colour'"),
        ("train:\n  lr: -1\n", [], "train.lr: Input should be greater than 0"),
        ("train:\n  batch_size: many\n", [], "train.batch_size"),
        ("", ["train.precision=fp8"], "train.precision"),
        ("", ["train.chunk_size=0"], "train.chunk_size"),
        ("", ["train.chunk_size=auto"], "memory_budget"),
        ("", ["train.memory_budget=lots"], "not a size"),
        ("", ["trainlr"], "not KEY=VALUE"),
        ("train: [1, 2\n", [], "not valid YAML"),
        ("", ["train.loss=distill"], "train.loss"),
        ("", ["train.distill_weight=0.5"], "train.distill_weight is set but train.loss is"),
        ("", ["train.teacher_temperature=2"], "train.teacher_temperature is set but"),
        ("", ["train.loss=margin_mse", "train.teacher_temperature=2"], "raw margins"),
        ("", ["train.loss=distill_kl", "train.teacher_temperature=0"], "teacher_temperature"),
        ("", ["train.loss=distill_kl", "train.teacher_temperature=-1"], "greater than 0"),
        ("", ["train.loss=distill_kl", "train.distill_weight=1"], "train.distill_weight"),
        ("", ["train.loss=distill_kl", "train.distill_weight=-0.1"], "train.distill_weight"),
        ("", ["train.loss=margin_mse", "train.hard_negatives=0"], "train.hard_negatives"),
    ],
)
def test_errors_name_the_key_and_file(tmp_path, text, overrides, message):
    """A key's error names where it was given: the file, or --set (a rule joining keys, as
    chunk_size auto with no memory budget, names the file)."""
    path = write(tmp_path, text)
    with pytest.raises(InputError) as err:
        load_config(path, overrides)
    assert message in str(err.value)
    if overrides:
        assert str(err.value).startswith(("--set: ", f"{path}: ")), str(err.value)
    else:
        assert str(err.value).startswith(f"{path}: "), str(err.value)
    assert "\n" not in str(err.value)


def test_an_unknown_key_given_with_set_is_blamed_on_set(tmp_path):
    path = write(tmp_path, "train:\n  lrr: 1\n")
    with pytest.raises(InputError) as err:
        load_config(path, ["eval.topk=[1]"])
    assert str(err.value) == (
        f"{path}: unknown key 'train.lrr' (did you mean 'train.lr'?); "
        "--set: unknown key 'eval.topk' (did you mean 'eval.top_k'?)"
    )


@pytest.mark.parametrize(
    ("typed", "expected"),
    [
        ("query: ", "query: "),  # the shell's text for model.query_prefix="query: "
        ("'query: '", "query: "),  # a quoted YAML string: unquoted
        ("passage: a, b", "passage: a, b"),
        ("123", "123"),
        ("true", "true"),
        ("[x]", "[x]"),
        ("", None),
        ("null", None),
    ],
)
def test_a_string_key_takes_the_text_as_typed(typed, expected):
    cfg = load_config(None, [f"model.query_prefix={typed}"])
    assert cfg.model.query_prefix == expected


def test_other_keys_still_read_yaml():
    """Negative control: a key typed otherwise still reads its value as YAML."""
    cfg = load_config(None, ["eval.top_k=[1, 3]", "data.train=[a.jsonl, b.jsonl]"])
    assert cfg.eval.top_k == [1, 3] and cfg.data.train == ["a.jsonl", "b.jsonl"]
    with pytest.raises(InputError, match="--set: model.max_query_length"):
        load_config(None, ["model.max_query_length=query: "])


def test_missing_file(tmp_path):
    with pytest.raises(InputError, match="no such config file"):
        load_config(tmp_path / "nope.yaml")


def test_resolved_config_round_trips(tmp_path):
    cfg = load_config(REPO / "configs" / "toy.yaml", ["train.seed=7"])
    path = save_config(cfg, tmp_path / "config.yaml")
    again = load_config(path)
    assert again == cfg
    assert yaml.safe_load(path.read_text())["train"]["seed"] == 7


def test_distillation_keys_load_and_round_trip(tmp_path):
    sets = ["train.loss=distill_kl", "train.distill_weight=0.25", "train.teacher_temperature=2"]
    cfg = load_config(REPO / "configs" / "toy.yaml", sets)
    assert (cfg.train.loss, cfg.train.distill_weight, cfg.train.teacher_temperature) == (
        "distill_kl", 0.25, 2.0,
    )  # fmt: skip
    assert load_config(save_config(cfg, tmp_path / "config.yaml")) == cfg
    plain = load_config(REPO / "configs" / "toy.yaml")
    assert plain.train.loss == "contrastive" and plain.train.distill_weight is None
    assert load_config(save_config(plain, tmp_path / "plain.yaml")) == plain


def test_parse_bytes():
    assert parse_bytes("4GB") == 4 * 10**9
    assert parse_bytes("512MiB") == 512 * 2**20
    assert parse_bytes(1024) == 1024


def test_an_unknown_key_suggests_the_closest_one():
    with pytest.raises(InputError, match=r"unknown key 'train.lrr' \(did you mean 'train.lr'\?\)"):
        load_config(None, ["train.lrr=1"])
    with pytest.raises(InputError, match=r"unknown key 'trian' \(did you mean 'train'\?\)"):
        load_config(None, ["trian.lr=1"])
    with pytest.raises(InputError, match=r"unknown key 'zzz'$"):  # nothing close: no guess
        load_config(None, ["zzz=1"])


def test_changed_settings_names_each_key_a_saved_config_differs_in(tmp_path):
    from dpr_cache.config import changed_settings

    saved = save_config(load_config("configs/toy.yaml"), tmp_path / "config.yaml")
    assert changed_settings(saved, load_config("configs/toy.yaml")) == []  # control: none
    now = load_config("configs/toy.yaml", ["train.lr=0.125", "model.shared=true"])
    before = yaml.safe_load(saved.read_text())
    assert changed_settings(saved, now) == [
        ("model.shared", before["model"]["shared"], True),
        ("train.lr", before["train"]["lr"], 0.125),
    ]


@pytest.mark.parametrize("text", ["a: [unclosed\n", "- a list\n"])
def test_changed_settings_of_a_file_that_is_no_config_is_one_line(tmp_path, text):
    from dpr_cache.config import changed_settings

    saved = tmp_path / "config.yaml"
    saved.write_text(text)
    with pytest.raises(InputError, match=r"config\.yaml: (ScannerError|ParserError|not a config)"):
        changed_settings(saved, load_config("configs/toy.yaml"))
