"""BEIR folders in and out: ``corpus.jsonl`` (``_id``, ``title``, ``text``), ``queries.jsonl``
(``_id``, ``text``) and ``qrels/<split>.tsv`` (``query-id``, ``corpus-id``, ``score``).

In: the project's formats, so any model is evaluated on any BEIR set: ``passages.tsv`` (DPR's
wiki layout), ``questions.tsv`` (a qas file, answers empty: the qrels judge),
``questions.ids.txt`` (the BEIR query ids, a line each) and ``qrels.trec`` (TREC qrels). Out: DPR
files (a passages TSV and a training-format JSONL whose ``positive_ctxs`` are the judged passages)
as a BEIR folder. Both stream line by line.
"""

from __future__ import annotations

import csv
import json
from pathlib import Path

from dpr_cache.data.files import open_text
from dpr_cache.data.passages import read_passages
from dpr_cache.data.qas import qas_line
from dpr_cache.data.training import iter_training_examples
from dpr_cache.errors import InputError
from dpr_cache.runtime.atomic import write_many_atomic

__all__ = ["read_beir", "read_qrels", "write_beir"]

_CLEAN = str.maketrans({"\t": " ", "\n": " ", "\r": " "})


def _jsonl(path: Path):
    with open_text(path) as f:
        for n, line in enumerate(f, start=1):
            if line.strip():
                try:
                    yield n, json.loads(line)
                except ValueError:
                    raise InputError(f"{path} line {n}: not valid JSON") from None


def read_qrels(path: Path) -> dict[str, list[tuple[str, int]]]:
    """A BEIR qrels file (``query-id``, ``corpus-id``, ``score``; a header line or none): each
    query's judged passages and grades, in the file's order."""
    qrels: dict[str, list[tuple[str, int]]] = {}
    with open_text(path) as f:
        for n, row in enumerate(csv.reader(f, delimiter="\t"), start=1):
            if n == 1 and row and row[0] == "query-id":
                continue
            if len(row) != 3:
                raise InputError(f"{path} line {n}: expected query-id, corpus-id, score")
            try:
                qrels.setdefault(row[0], []).append((row[1], int(float(row[2]))))
            except ValueError:
                raise InputError(f"{path} line {n}: score {row[2]!r} is not a number") from None
    return qrels


def read_beir(folder: Path, out: Path, split: str = "test") -> dict[str, int]:
    """Write ``out/{passages.tsv, questions.tsv, questions.ids.txt, qrels.trec}`` from a BEIR
    folder; the questions are those the split's qrels judge, in the qrels' order."""
    folder, out = Path(folder), Path(out)
    qrels = read_qrels(folder / "qrels" / f"{split}.tsv")
    queries: dict[str, str] = {}
    for _, obj in _jsonl(folder / "queries.jsonl"):
        if str(obj.get("_id")) in qrels:
            queries[str(obj["_id"])] = str(obj.get("text", "")).translate(_CLEAN)
    missing = [q for q in qrels if q not in queries]
    if missing:
        raise InputError(f"{folder / 'queries.jsonl'}: no text for judged query {missing[0]!r}")
    counts = {"passages": 0, "questions": len(qrels), "judgments": sum(map(len, qrels.values()))}
    names = ["passages.tsv", "questions.tsv", "questions.ids.txt", "qrels.trec"]

    def write(tmps: list[Path]) -> None:
        with open(tmps[0], "w", encoding="utf-8", newline="") as f:
            passages = csv.writer(f, delimiter="\t", lineterminator="\n")
            passages.writerow(["id", "text", "title"])
            for n, obj in _jsonl(folder / "corpus.jsonl"):
                if "_id" not in obj:
                    raise InputError(f"{folder / 'corpus.jsonl'} line {n}: no '_id'")
                text = str(obj.get("text", "")).translate(_CLEAN)
                passages.writerow([obj["_id"], text, str(obj.get("title", "")).translate(_CLEAN)])
                counts["passages"] += 1
        tmps[1].write_text("".join(qas_line(queries[q], []) for q in qrels), encoding="utf-8")
        tmps[2].write_text("".join(f"{q}\n" for q in qrels), encoding="utf-8")
        lines = [f"{q} 0 {p} {g}\n" for q, docs in qrels.items() for p, g in docs]
        tmps[3].write_text("".join(lines), encoding="utf-8")

    write_many_atomic([out / name for name in names], write)
    return counts


def write_beir(passages: Path, questions: Path, out: Path, split: str = "test") -> dict[str, int]:
    """A BEIR folder from DPR files: every passage of the TSV, and each question of a DPR
    training-format file (its row number as query id) judged relevant to its positive
    passages."""
    out = Path(out)
    names = ["corpus.jsonl", "queries.jsonl", f"qrels/{split}.tsv"]
    counts = {"passages": 0, "questions": 0}

    def write(tmps: list[Path]) -> None:
        with open(tmps[0], "w", encoding="utf-8") as f:
            for pid, text, title in read_passages(passages):
                f.write(json.dumps({"_id": pid, "title": title, "text": text}) + "\n")
                counts["passages"] += 1
        with open(tmps[1], "w", encoding="utf-8") as fq, open(tmps[2], "w", encoding="utf-8") as fr:
            fr.write("query-id\tcorpus-id\tscore\n")
            for i, example in enumerate(iter_training_examples(questions)):
                qid = str(i)
                fq.write(json.dumps({"_id": qid, "text": example["question"]}) + "\n")
                for ctx in example["positive_ctxs"]:
                    fr.write(f"{qid}\t{ctx['passage_id']}\t1\n")
                counts["questions"] += 1

    write_many_atomic([out / name for name in names], write)
    return counts
