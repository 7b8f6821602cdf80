"""The toy training records in the layouts people keep data in (sentence-transformers columns,
tevatron's, a BEIR folder), and each one's DPR form written by hand."""

from __future__ import annotations

import json
from pathlib import Path

from tests.support.fixtures import TOY

RECORDS = [json.loads(line) for line in (TOY / "train.jsonl").read_text().splitlines()][:40]


def rows_of(dataset) -> list[dict]:
    return [dataset[i] for i in range(len(dataset))]


def write_jsonl(path: Path, rows: list[dict]) -> Path:
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    return path


def st_rows() -> list[dict]:
    """The toy records as sentence-transformers triplets (a passage is one text, no title)."""
    return [
        {
            "anchor": r["question"],
            "positive": r["positive_ctxs"][0]["text"],
            "negative": r["hard_negative_ctxs"][0]["text"],
        }
        for r in RECORDS
    ]


def st_as_dpr() -> list[dict]:
    """The same triplets in DPR's layout, by hand."""
    return [
        {
            "question": row["anchor"],
            "answers": [],
            "positive_ctxs": [{"title": "", "text": row["positive"]}],
            "hard_negative_ctxs": [{"title": "", "text": row["negative"]}],
        }
        for row in st_rows()
    ]


def tevatron_rows() -> list[dict]:
    def passages(ctxs):
        return [{"docid": c["passage_id"], "title": c["title"], "text": c["text"]} for c in ctxs]

    return [
        {
            "query_id": str(i),
            "query": r["question"],
            "positive_passages": passages(r["positive_ctxs"][:1]),
            "negative_passages": passages(r["hard_negative_ctxs"]),
        }
        for i, r in enumerate(RECORDS)
    ]


def tevatron_as_dpr() -> list[dict]:
    return [
        {
            "question": r["question"],
            "answers": [],
            "positive_ctxs": r["positive_ctxs"][:1],
            "hard_negative_ctxs": r["hard_negative_ctxs"],
        }
        for r in RECORDS
    ]


def write_beir_folder(folder: Path) -> None:
    """The toy records as BEIR lays a dataset out: corpus, queries, qrels/train.tsv with its
    header; the first hard negative judged 0."""
    corpus, queries, qrels = {}, [], ["query-id\tcorpus-id\tscore"]
    for i, r in enumerate(RECORDS):
        pos, neg = r["positive_ctxs"][0], r["hard_negative_ctxs"][0]
        for ctx in (pos, neg):
            corpus[ctx["passage_id"]] = {"_id": ctx["passage_id"], "title": ctx["title"]}
            corpus[ctx["passage_id"]]["text"] = ctx["text"]
        queries.append({"_id": f"q{i}", "text": r["question"], "metadata": {}})
        qrels += [f"q{i}\t{pos['passage_id']}\t1", f"q{i}\t{neg['passage_id']}\t0"]
    (folder / "qrels").mkdir(parents=True)
    write_jsonl(folder / "corpus.jsonl", list(corpus.values()))
    write_jsonl(folder / "queries.jsonl", queries[::-1])  # BEIR's order is the queries file's
    (folder / "qrels" / "train.tsv").write_text("\n".join(qrels) + "\n")
