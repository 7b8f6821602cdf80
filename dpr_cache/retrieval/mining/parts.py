"""A mining run's records on either side of its resumable parts
(:mod:`dpr_cache.runtime.resumable`): the training file's questions read light, and each part's
records written again whole, their mined negatives in place."""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path
from typing import IO, Any

from dpr_cache.data.layouts import iter_dpr_records
from dpr_cache.data.qas import record_question_id
from dpr_cache.data.training import clean_example
from dpr_cache.errors import InputError
from dpr_cache.runtime.resumable import in_parts

__all__ = ["records", "write_records"]


def records(train: Path, size: int) -> Iterator[list[tuple[str, str, dict[str, Any]]]]:
    """The training file's questions in parts of ``size``: (where, question id, what mining
    needs: question, answers, positive_ctxs). A record's other contexts are not kept: NQ's
    hold 100 passages a question, and :func:`write_records` reads them again."""
    return in_parts(_light(train), size, f"{train}: no questions")


def _light(train: Path) -> Iterator[tuple[str, str, dict[str, Any]]]:
    """Each record of ``train`` as :func:`records` gives it."""
    for n, (where, obj) in enumerate(iter_dpr_records(train)):
        example = clean_example(obj, f"{train} {where}")
        light = {key: example[key] for key in ("question", "answers", "positive_ctxs")}
        yield where, record_question_id(obj, n), light


def write_records(
    f: IO[str],
    raw: Iterator[tuple[str, Any]],
    mined: list[list[dict]],
    keep_bm25: bool,
    train: Path,
) -> int:
    """Write the next ``len(mined)`` records of ``raw`` (the training file read again, record
    by record) to ``f`` with their mined ``hard_negative_ctxs`` (with ``keep_bm25``, the file's
    own after them, less those mined again); the count of the file's own kept."""
    kept = written = 0
    # mined first: zip stops there, never reading a record of the next part
    for negatives, (where, obj) in zip(mined, raw, strict=False):
        if keep_bm25:
            own = clean_example(obj, f"{train} {where}")["hard_negative_ctxs"]
            seen = {c["passage_id"] for c in negatives}
            pairs = zip(obj.get("hard_negative_ctxs") or [], own, strict=True)
            extra = [r for r, clean in pairs if clean["passage_id"] not in seen]
            kept += len(extra)
            negatives = negatives + extra
        obj["hard_negative_ctxs"] = negatives
        f.write(json.dumps(obj, ensure_ascii=False) + "\n")
        written += 1
    if written < len(mined):
        raise InputError(f"{train}: changed while it was mined (it ended early on rereading)")
    return kept
