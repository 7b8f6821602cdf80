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
        ("train:\n  lr: -1\n", [], "train.lr takes a number > 0 (got -1)"),
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
        (
            "",
            ["train.loss=distill_kl", "train.teacher_temperature=-1"],
            "takes a number > 0 or null",
        ),
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
        "distill_kl",
        0.25,
        2.0,
    )
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


@pytest.mark.parametrize(
    ("item", "expected"),
    [
        (
            "train.chunk_size=abc",
            "--set: train.chunk_size takes an integer >= 1 or 'auto' (got 'abc')",
        ),
        ("train.lr=-1", "--set: train.lr takes a number > 0 (got -1)"),
        ("train.batch_size=many", "--set: train.batch_size takes an integer >= 1 (got 'many')"),
        (
            "model.pooling=max",
            "--set: model.pooling takes 'cls', 'mean', 'last' or null (got 'max')",
        ),
        ("model.dropout=2", "--set: model.dropout takes a number >= 0 and < 1 or null (got 2)"),
        ("model.shared=maybe", "--set: model.shared takes true or false (got 'maybe')"),
        (
            "data.train=5",
            "--set: data.train takes a path, or a list of paths and sources ({path, name, "
            "format, ...}), or null (got 5)",
        ),
        ("eval.top_k=abc", "--set: eval.top_k takes a non-empty list of integers >= 1 (got 'abc')"),
        (
            "eval.top_k=[1, x]",
            "--set: eval.top_k takes a non-empty list of integers >= 1 (item 2 is 'x')",
        ),
        (
            "eval.fusion_weight=x",
            "--set: eval.fusion_weight takes a number >= 0 or 'auto' (got 'x')",
        ),
        (
            "index.precision=fp8",
            "--set: index.precision takes 'auto', 'fp32', 'bf16' or 'fp16' (got 'fp8')",
        ),
    ],
)
def test_a_set_error_names_set_and_says_what_the_key_takes(item, expected):
    """One part a key, blamed on --set (not on the config file given with it), in words: never
    pydantic's union members one by one (``train.chunk_size.int: ...``)."""
    with pytest.raises(InputError) as err:
        load_config(REPO / "configs" / "toy.yaml", [item])
    assert str(err.value) == expected


def test_a_file_error_says_what_the_key_takes_too(tmp_path):
    path = write(tmp_path, "train:\n  chunk_size: abc\n  memory_budget: 4GB\n")
    with pytest.raises(InputError) as err:
        load_config(path, ["train.lr=1e-4"])
    assert str(err.value) == f"{path}: train.chunk_size takes an integer >= 1 or 'auto' (got 'abc')"


def test_every_key_says_what_it_takes_in_words():
    """No key falls through to a Python type's name (``<class 'str'>``, ``typing.Literal[...]``)."""
    from dpr_cache.config import Config, takes

    for section, field in Config.model_fields.items():
        keys = (
            [section]
            if section == "output_dir"
            else [f"{section}.{name}" for name in field.annotation.model_fields]
        )
        for key in keys:
            words = takes(key)
            assert words and not any(w in words for w in ("class", "typing", "[")), (key, words)


def test_a_flag_of_one_number_for_a_list_key_is_told_as_one_number():
    """search's --k gives eval.top_k one item: its error speaks of an integer, not a list; a
    flag of a plain key keeps pydantic's words (the control)."""
    from dpr_cache.config import check_flags

    with pytest.raises(InputError) as err:
        check_flags("eval", {"--k": ("top_k", [0]), "--fusion-depth": ("fusion_depth", 5)})
    assert str(err.value) == "--k: takes an integer >= 1 (got 0)"
    with pytest.raises(InputError, match="--fusion-depth: Input should be greater than or equal"):
        check_flags("eval", {"--k": ("top_k", [3]), "--fusion-depth": ("fusion_depth", 0)})


def test_compile_takes_on_and_off_unquoted(tmp_path):
    """YAML 1.1 reads a bare on / off as a boolean: train.compile takes them as its words."""
    path = tmp_path / "c.yaml"
    path.write_text("train:\n  compile: on\n")
    assert load_config(path).train.compile == "on"
    assert load_config(None, ["train.compile=off"]).train.compile == "off"
    assert load_config(None, ["train.compile=auto"]).train.compile == "auto"
    with pytest.raises(InputError, match="train.compile"):
        load_config(None, ["train.compile=maybe"])


@pytest.mark.parametrize(
    ("extra", "fragment"),
    [
        (["train.chunk_size=auto", "train.memory_budget=1GB"], "give the chunk"),
        (["train.compile=on"], "not supported under train.shard fsdp"),
        (["train.eval_every=2"], "validation encodes on rank 0 alone"),
        (["train.precision=fp16"], "use bf16"),
    ],
)
def test_what_sharding_refuses_is_one_line(extra, fragment):
    with pytest.raises(InputError, match=fragment):
        load_config(None, ["train.shard=fsdp", *extra])
    load_config(None, ["train.shard=none", *extra])  # control: unsharded, each is fine
