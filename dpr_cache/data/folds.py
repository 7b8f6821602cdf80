"""Cross-fitting folds of a training file: its questions split by article, so that a model
trained on the other folds can score a fold's questions it has never seen.

A question's article is its first positive passage's title (SQuAD's and NQ's questions on one
article share its passages, so a split by question would leak them). Articles go to folds
largest first, each to the fold with the fewest questions so far (ties: the lower fold), in an
order that ``seed`` fixes among articles of one size: the folds hold about equal numbers of
questions. For each fold ``k`` (from 1), ``out/fold-k/`` holds:

    train.jsonl        the other folds' records: what fold k's model trains on
    held.jsonl         fold k's records: what that model mines and scores
    held.qa.tsv        fold k's questions as a qas file (+ held.qa.ids.txt, their ids): what
                       the fusion weight of a hybrid teacher built on that model is tuned on

and ``out/folds.json`` the assignment (articles and question counts a fold). The file is read
twice, a record at a time: memory holds one count per article, never the records.
"""

from __future__ import annotations

import hashlib
import json
from pathlib import Path
from typing import Any

from dpr_cache.data.layouts import iter_dpr_records
from dpr_cache.data.qas import qas_line, record_question_id
from dpr_cache.data.training import clean_example
from dpr_cache.errors import InputError
from dpr_cache.runtime.atomic import write_json_atomic, write_many_atomic

__all__ = ["article", "assign_folds", "split_folds"]

FILES = ("train.jsonl", "held.jsonl", "held.qa.tsv", "held.qa.ids.txt")


def article(record: Any, where: str, path: Path) -> str:
    """A record's article: its first positive passage's title (the record checked as training
    reads it: a question, answers as a list)."""
    clean_example(record, f"{path} {where}")
    positives = record.get("positive_ctxs")
    if not isinstance(positives, list) or not positives or not isinstance(positives[0], dict):
        raise InputError(f"{path} {where}: no positive_ctxs to take the article from")
    title = positives[0].get("title")
    if not isinstance(title, str) or not title.strip():
        raise InputError(f"{path} {where}: its first positive passage has no title")
    return title


def assign_folds(
    counts: dict[str, int], folds: int, seed: int = 0, source: str = "the training file"
) -> dict[str, int]:
    """Each article's fold (0-based): largest first, to the fold with the fewest questions."""
    if folds < 2:
        raise ValueError(f"folds must be at least 2, got {folds}")
    if len(counts) < folds:
        raise InputError(f"{source}: {len(counts)} article(s) cannot make {folds} folds")

    def order(title: str) -> tuple[int, str]:
        salt = hashlib.sha256(f"{seed}\0{title}".encode()).hexdigest()
        return (-counts[title], salt)

    sizes = [0] * folds
    fold_of: dict[str, int] = {}
    for title in sorted(counts, key=order):
        k = min(range(folds), key=lambda i: (sizes[i], i))
        fold_of[title] = k
        sizes[k] += counts[title]
    return fold_of


def split_folds(train: Path, out: Path, folds: int = 2, seed: int = 0) -> dict[str, Any]:
    """Write ``out/fold-k/{train,held}.jsonl`` and ``held.qa.tsv`` for k = 1 .. ``folds`` and
    ``out/folds.json``; return what folds.json holds."""
    train, out = Path(train), Path(out)
    counts: dict[str, int] = {}
    for where, record in iter_dpr_records(train):
        title = article(record, where, train)
        counts[title] = counts.get(title, 0) + 1
    fold_of = assign_folds(counts, folds, seed, str(train))
    paths = [out / f"fold-{k + 1}" / name for k in range(folds) for name in FILES]

    def write(tmps: list[Path]) -> None:
        handles = [open(p, "w", encoding="utf-8", newline="\n") for p in tmps]
        try:
            for n, (where, record) in enumerate(iter_dpr_records(train)):
                home = fold_of[article(record, where, train)]
                line = json.dumps(record, ensure_ascii=False) + "\n"
                for k in range(folds):
                    files = handles[k * len(FILES) : (k + 1) * len(FILES)]
                    if k != home:
                        files[0].write(line)
                        continue
                    files[1].write(line)
                    question = " ".join(str(record.get("question", "")).split())
                    files[2].write(qas_line(question, record.get("answers") or []))
                    files[3].write(record_question_id(record, n) + "\n")
        finally:
            for h in handles:
                h.close()

    write_many_atomic(paths, write)
    summary = {
        "train": str(train),
        "folds": folds,
        "seed": seed,
        "by": "the first positive passage's title",
        "questions": [sum(c for t, c in counts.items() if fold_of[t] == k) for k in range(folds)],
        "articles": [sorted(t for t in counts if fold_of[t] == k) for k in range(folds)],
    }
    write_json_atomic(out / "folds.json", summary)
    return summary
