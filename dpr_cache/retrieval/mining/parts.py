"""The resumable parts of a mining run: the training file's records read in parts, the
folder ``OUT.parts/`` that keeps the finished ones (emptied when the inputs change), and the parts
joined into ``OUT`` with their counts summed."""

from __future__ import annotations

import dataclasses
import hashlib
import json
import shutil
from collections import Counter
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from dpr_cache.data.qas import record_question_id
from dpr_cache.data.training import clean_example, iter_raw
from dpr_cache.errors import InputError
from dpr_cache.retrieval.mining.rules import RULES, MineSpec
from dpr_cache.runtime import distributed
from dpr_cache.runtime.atomic import write_atomic

__all__ = ["records", "write_part", "parts_dir", "join_parts", "settings_of"]


def settings_of(spec: MineSpec) -> dict[str, Any]:
    return dataclasses.asdict(spec)


def records(train: Path, size: int) -> Iterator[list[tuple[str, str, dict[str, Any]]]]:
    """The training file's questions in parts of ``size``: (where, question id, what mining
    needs: question, answers, positive_ctxs). A record's other contexts are not kept: NQ's
    hold 100 passages a question, and :func:`write_part` reads them again."""
    batch, n = [], -1
    for n, (where, obj) in enumerate(iter_raw(train)):
        example = clean_example(obj, f"{train} {where}")
        light = {key: example[key] for key in ("question", "answers", "positive_ctxs")}
        batch.append((where, record_question_id(obj, n), light))
        if len(batch) == size:
            yield batch
            batch = []
    if n < 0:
        raise InputError(f"{train}: no questions")
    if batch:
        yield batch


def write_part(
    part: Path, raw: Iterator[tuple[str, Any]], mined: list[list[dict]], keep_bm25: bool, train
) -> int:
    """Write the next ``len(mined)`` records of ``raw`` (the training file read again, record
    by record) to ``part`` with their mined ``hard_negative_ctxs`` (with ``keep_bm25``, the
    file's own after them, less those mined again); the count of the file's own kept."""
    kept = written = 0

    def write(tmp: Path) -> None:
        nonlocal kept, written
        with open(tmp, "w", encoding="utf-8") as f:
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

    write_atomic(part, write)
    return kept


def parts_dir(
    out: Path, ranker: list[Any], train: Path, spec: MineSpec, qrels: Path | None, rank: int
) -> Path:
    """``OUT.parts/``, emptied unless its parts were mined with these very inputs (``ranker``:
    what the ranking depends on)."""
    parts = out.with_name(out.name + ".parts")
    judged = [str(qrels), qrels.stat().st_size, qrels.stat().st_mtime_ns] if qrels else None
    data = [str(train.resolve()), train.stat().st_size, train.stat().st_mtime_ns]
    ident = [*ranker, *data, settings_of(spec), judged]
    key = hashlib.sha256(json.dumps(ident, sort_keys=True, default=str).encode()).hexdigest()
    if rank == 0:
        stamp = parts / "inputs.sha256"
        if not (stamp.is_file() and stamp.read_text() == key):
            shutil.rmtree(parts, ignore_errors=True)
            parts.mkdir(parents=True)
            stamp.write_text(key)
    distributed.barrier()
    return parts


def join_parts(parts: Path, out: Path, n_parts: int) -> dict[str, Any]:
    """Write the parts' records to ``out`` in order; the summed counts."""
    totals: Counter = Counter()

    def write(tmp: Path) -> None:
        with open(tmp, "wb") as f:
            for k in range(n_parts):
                part = parts / f"part-{k:06d}.jsonl"
                with open(part, "rb") as src:  # copied in blocks, never a whole part in memory
                    shutil.copyfileobj(src, f)
                totals.update(json.loads(part.with_suffix(".json").read_text()))

    write_atomic(out, write)
    dropped = {rule: totals.pop(f"dropped_{rule}", 0) for rule in RULES}
    return {**dict(totals), "dropped": dropped}
