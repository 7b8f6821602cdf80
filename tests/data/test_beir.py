"""BEIR folders in and out: the shipped sample reads into the project's formats, and DPR files
written as BEIR read back to the same passages, questions and judgments."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from dpr_cache.data.beir import read_beir, write_beir
from dpr_cache.data.passages import read_passages
from dpr_cache.data.qas import read_qas
from dpr_cache.errors import InputError
from dpr_cache.retrieval.metrics import read_qrels
from tests.support.fixtures import REPO, TOY

SAMPLE = REPO / "data" / "beir-sample"


def test_the_sample_reads_into_our_formats(tmp_path: Path) -> None:
    counts = read_beir(SAMPLE, tmp_path)
    assert counts == {"passages": 273, "questions": 20, "judgments": 20}
    corpus = [json.loads(line) for line in (SAMPLE / "corpus.jsonl").read_text().splitlines()]
    passages = list(read_passages(tmp_path / "passages.tsv"))
    assert [(p["_id"], p["text"], p["title"]) for p in corpus] == passages
    ids = (tmp_path / "questions.ids.txt").read_text().splitlines()
    queries = {
        q["_id"]: q["text"]
        for q in map(json.loads, (SAMPLE / "queries.jsonl").read_text().splitlines())
    }
    assert [q for q, answers in read_qas(tmp_path / "questions.tsv")] == [queries[i] for i in ids]
    assert all(answers == [] for _, answers in read_qas(tmp_path / "questions.tsv"))
    qrels = read_qrels(tmp_path / "qrels.trec")
    assert list(qrels) == ids and qrels == read_qrels(SAMPLE / "qrels" / "test.tsv")


def test_dpr_files_round_trip_through_beir(tmp_path: Path) -> None:
    head = tmp_path / "train.jsonl"
    head.write_text("".join((TOY / "train.jsonl").read_text().splitlines(keepends=True)[:20]))
    write_beir(TOY / "passages.tsv", head, tmp_path / "beir")
    read_beir(tmp_path / "beir", tmp_path / "back")
    assert list(read_passages(tmp_path / "back" / "passages.tsv")) == list(
        read_passages(TOY / "passages.tsv")
    )
    examples = [json.loads(line) for line in head.read_text().splitlines()]
    qrels = read_qrels(tmp_path / "back" / "qrels.trec")
    assert qrels == {
        str(i): {e["positive_ctxs"][0]["passage_id"]: 1} for i, e in enumerate(examples)
    }


def test_bad_folders_are_one_line_errors(tmp_path: Path) -> None:
    with pytest.raises(InputError, match=r"qrels/test\.tsv: no such file"):
        read_beir(tmp_path, tmp_path / "out")
    (tmp_path / "qrels").mkdir()
    (tmp_path / "qrels" / "test.tsv").write_text("query-id\tcorpus-id\tscore\nq1\td1\t1\n")
    (tmp_path / "queries.jsonl").write_text('{"_id": "q2", "text": "other"}\n')
    with pytest.raises(InputError, match="no text for judged query 'q1'"):
        read_beir(tmp_path, tmp_path / "out")
    assert not (tmp_path / "out").exists()  # nothing half-written
