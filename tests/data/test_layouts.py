"""Each layout, written by the library that writes it, reads as the same training rows as its
DPR form; the layout is recognised from the columns, named, or its columns renamed."""

from __future__ import annotations

from pathlib import Path

import datasets
import pandas as pd
import pytest

from dpr_cache.data.layouts import iter_dpr_records
from dpr_cache.data.training import Reading, load_training_set
from dpr_cache.errors import InputError
from tests.support.layouts import (
    RECORDS,
    rows_of,
    st_as_dpr,
    st_rows,
    tevatron_as_dpr,
    tevatron_rows,
    write_beir_folder,
    write_jsonl,
)


def dpr_rows(tmp_path: Path, rows: list[dict]) -> list[dict]:
    return rows_of(load_training_set(write_jsonl(tmp_path / "dpr.jsonl", rows), tmp_path / "c"))


@pytest.mark.parametrize("container", ["parquet", "csv", "datasets", "jsonl"])
def test_sentence_transformers_columns_read_as_their_dpr_form(tmp_path, container):
    frame = pd.DataFrame(st_rows())
    path = tmp_path / f"st.{container}"
    if container == "parquet":
        frame.to_parquet(path)
    elif container == "csv":
        frame.to_csv(path, index=False)
    elif container == "datasets":
        datasets.Dataset.from_pandas(frame).save_to_disk(str(path))
    else:
        frame.to_json(path, orient="records", lines=True)
    got = rows_of(load_training_set(path, tmp_path / "c"))
    assert got == dpr_rows(tmp_path, st_as_dpr())
    assert got[0]["positive_ctxs"][0]["passage_id"].startswith("h:")  # an id from its text


@pytest.mark.parametrize("container", ["parquet", "jsonl", "datasets"])
def test_tevatron_reads_as_its_dpr_form(tmp_path, container):
    path = tmp_path / f"tev.{container}"
    if container == "parquet":
        pd.DataFrame(tevatron_rows()).to_parquet(path)
    elif container == "datasets":
        datasets.DatasetDict({"train": datasets.Dataset.from_list(tevatron_rows())}).save_to_disk(
            str(path)
        )
    else:
        write_jsonl(path, tevatron_rows())
    got = rows_of(load_training_set(path, tmp_path / "c"))
    assert got == dpr_rows(tmp_path, tevatron_as_dpr())
    assert got[0]["positive_ctxs"][0]["passage_id"] == RECORDS[0]["positive_ctxs"][0]["passage_id"]


def test_a_beir_folder_reads_as_its_dpr_form(tmp_path):
    write_beir_folder(tmp_path / "beir")
    got = rows_of(load_training_set(tmp_path / "beir", tmp_path / "c"))
    want = [
        {
            "question": r["question"],
            "answers": [],
            "positive_ctxs": r["positive_ctxs"][:1],
            "hard_negative_ctxs": r["hard_negative_ctxs"][:1],
        }
        for r in RECORDS[::-1]
    ]
    assert got == dpr_rows(tmp_path, want)


def test_a_beir_qrels_naming_a_passage_the_corpus_lacks_is_refused(tmp_path):
    write_beir_folder(tmp_path / "beir")
    with open(tmp_path / "beir" / "qrels" / "train.tsv", "a") as f:
        f.write("q0\tnowhere\t1\n")
    with pytest.raises(InputError, match=r"train\.tsv: corpus-id 'nowhere' is not in corpus"):
        load_training_set(tmp_path / "beir", tmp_path / "c")


def test_columns_renamed_and_a_layout_named(tmp_path):
    renamed = [{"q": r["anchor"], "doc": r["positive"], "hard": r["negative"]} for r in st_rows()]
    path = write_jsonl(tmp_path / "renamed.jsonl", renamed)
    with pytest.raises(InputError, match=r"renamed\.jsonl line 1: columns \(doc, hard, q\)"):
        load_training_set(path, tmp_path / "c")
    columns = (("q", "anchor"), ("doc", "positive"), ("hard", "negative"))
    got = rows_of(load_training_set(path, tmp_path / "c", reading=Reading(columns=columns)))
    assert got == dpr_rows(tmp_path, st_as_dpr())
    # sentence-transformers' own rule for unnamed columns: by position
    named = Reading(layout="sentence_transformers")
    assert rows_of(load_training_set(path, tmp_path / "c2", reading=named)) == got


def test_numbered_negatives_and_lists(tmp_path):
    rows = [
        {"query": "q1", "pos": "p1", "negative_2": "n2", "negative_1": "n1", "negatives": ["x"]},
    ]
    ((_, record),) = list(iter_dpr_records(write_jsonl(tmp_path / "n.jsonl", rows)))
    assert [c["text"] for c in record["hard_negative_ctxs"]] == ["x", "n1", "n2"]


def test_a_parquet_file_that_is_not_one(tmp_path):
    bad = tmp_path / "bad.parquet"
    bad.write_text("question,positive\n")
    with pytest.raises(InputError, match=r"bad\.parquet: not a Parquet file"):
        load_training_set(bad, tmp_path / "c")


def test_a_missing_column_names_file_row_and_column(tmp_path):
    frame = pd.DataFrame(st_rows())
    frame.loc[3, "positive"] = None
    frame.to_parquet(tmp_path / "st.parquet")
    with pytest.raises(InputError, match=r"st\.parquet row 3: column 'positive' must be a text"):
        load_training_set(tmp_path / "st.parquet", tmp_path / "c")
    renamed = Reading(columns=(("missing", "anchor"),))
    with pytest.raises(InputError, match=r"st\.parquet row 0: no column 'missing'"):
        load_training_set(tmp_path / "st.parquet", tmp_path / "c", reading=renamed)


def test_the_cache_follows_the_reading_and_the_files(tmp_path):
    path = write_jsonl(tmp_path / "st.jsonl", st_rows())
    stats: dict = {}
    load_training_set(path, tmp_path / "c", stats=stats)
    again: dict = {}
    load_training_set(path, tmp_path / "c", stats=again)
    assert again["from_cache"] and again["cache_file"] == stats["cache_file"]
    other: dict = {}
    reading = Reading(columns=(("negative", "negative_1"),))
    load_training_set(path, tmp_path / "c", stats=other, reading=reading)
    assert not other["from_cache"] and other["cache_file"] != stats["cache_file"]
