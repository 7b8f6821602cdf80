"""``dpr-cache mine``: hard negatives mined by a model (DPR's second round).

For every question of a training file (DPR JSON or JSON Lines), the model's query tower searches
an index its passage tower encoded (the bounded search ``eval`` uses: flat or IVF, the shards
split over the ranks under ``torchrun``), and the passages it ranks highest in the window
``[skip, skip + depth)`` that no rule drops (:mod:`dpr_cache.retrieval.negatives`: the positive,
judged relevant, holding an answer, within a margin of the positive) become the record's
``hard_negative_ctxs`` (``passage_id``, ``title``, ``text``, ``score``), best first; with
``keep_bm25`` the file's own hard negatives follow them. Every other key is kept. The records go
to ``OUT`` as JSON Lines, with what mined them and what each rule dropped beside it
(``<OUT stem>.summary.json``).

Resumable: the questions go in parts of ``batch``, each written whole into ``OUT.parts/``; a rerun
with the same model, index, file and settings keeps the finished parts. A question's id (for the
qrels) is its record's ``id``, ``qid``, ``_id`` or ``query_id``, else its place in the file from 0.
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
import shutil
import time
from collections import Counter
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import torch
from tqdm.auto import tqdm

from dpr_cache.data.passages import load_passages, passage_columns, passage_rows
from dpr_cache.data.training import clean_example, iter_raw
from dpr_cache.errors import InputError
from dpr_cache.model.loading import load_encoder, model_fingerprint
from dpr_cache.retrieval.encode import encode_question_texts
from dpr_cache.retrieval.index import (
    OpenIndex,
    check_model,
    encoded_from,
    query_encoding,
    search_index,
)
from dpr_cache.retrieval.metrics import read_qrels
from dpr_cache.retrieval.negatives import RULES, MineSpec, check_spec, drop_reason
from dpr_cache.retrieval.shards import DEFAULT_QUERY_LENGTH
from dpr_cache.runtime import distributed
from dpr_cache.runtime.atomic import write_atomic, write_json_atomic
from dpr_cache.runtime.lock import output_lock

__all__ = ["MineSpec", "check_spec", "mine", "summary_path", "QID_KEYS"]

QID_KEYS = ("id", "qid", "_id", "query_id")


def summary_path(out: Path) -> Path:
    """Where a mined file's summary goes: ``<OUT stem>.summary.json`` beside it."""
    return Path(out).with_suffix(".summary.json")


def mine(
    model_dir: Path,
    opened: OpenIndex,
    train: Path,
    out: Path,
    spec: MineSpec,
    *,
    passages: Path | None,
    qrels: Path | None,
    cache_dir: Path,
    memory_bytes: int,
    device: torch.device,
    rank: int = 0,
    world_size: int = 1,
    progress: bool = True,
    command: str = "",
) -> dict[str, Any] | None:
    """Mine ``train`` into ``out`` (see the module docstring); rank 0 returns the summary."""
    check_spec(spec)
    train, out = Path(train), Path(out)
    if out.resolve() == train.resolve():
        raise InputError(f"{out}: the output must not overwrite the training file")
    with output_lock(out, is_file=True):
        return _mine(model_dir, opened, train, out, spec, passages, qrels, cache_dir,
                     memory_bytes, device, rank, world_size, progress, command)  # fmt: skip


def _mine(model_dir, opened, train, out, spec, passages, qrels, cache_dir, memory_bytes, device,
          rank, world_size, progress, command):  # fmt: skip
    started = time.perf_counter()
    model = load_encoder(model_dir, query_only=True, **query_encoding(opened)).to(device)
    check_model(model_dir, model, opened)
    if passages is None:
        if "passages" not in opened.meta:
            raise InputError(f"{opened.path}: records no passages file: give --passages TSV")
        passages = Path(opened.meta["passages"]["path"])
    dataset = load_passages(Path(passages), cache_dir)
    if not encoded_from(opened, dataset, Path(passages)):
        raise InputError(
            f"{opened.path}: holds precomputed vectors; mine needs an index `dpr-cache index` "
            "encoded from the passages"
        )
    judged = read_qrels(qrels) if qrels is not None else None
    mining = _Mining(model, opened, dataset, spec, judged, memory_bytes, device, rank, world_size)
    parts = _parts_dir(out, model_dir, opened, train, spec, qrels, rank)
    bar = tqdm(unit="q", desc="mine", disable=not (progress and rank == 0), dynamic_ncols=True)
    n_parts = 0
    with bar:
        for batch in _records(train, spec.batch):
            part = parts / f"part-{n_parts:06d}.jsonl"
            if not part.is_file():
                lines, counts = mining.part(batch, train)
                if rank == 0:
                    write_json_atomic(part.with_suffix(".json"), counts)
                    write_atomic(part, lambda tmp, text="".join(lines): tmp.write_text(text))
            n_parts += 1
            bar.update(len(batch))
    distributed.barrier()
    if rank != 0:
        return None
    summary = _join(parts, out, n_parts)
    summary.update(
        train=str(train), out=str(out), settings=_settings(spec), command=command,
        seconds=round(time.perf_counter() - started, 1),
        mined_by={"model": str(model_dir), "fingerprint": model_fingerprint(model_dir),
                  "index": str(opened.path), "type": opened.type, "rows": opened.store.rows,
                  "shard_key": opened.meta.get("shard_key"), "passages": str(passages),
                  "qrels": str(qrels) if qrels else None},
    )  # fmt: skip
    write_json_atomic(summary_path(out), summary)
    shutil.rmtree(parts, ignore_errors=True)
    return summary


def _settings(spec: MineSpec) -> dict[str, Any]:
    return dataclasses.asdict(spec)


def _records(train: Path, size: int):
    """The training file's records in parts of ``size``: (number, where, raw object, example)."""
    batch, n = [], -1
    for n, (where, obj) in enumerate(iter_raw(train)):
        batch.append((n, where, obj, clean_example(obj, f"{train} {where}")))
        if len(batch) == size:
            yield batch
            batch = []
    if n < 0:
        raise InputError(f"{train}: no questions")
    if batch:
        yield batch


def _parts_dir(out, model_dir, opened, train, spec, qrels, rank) -> Path:
    """``OUT.parts/``, emptied unless its parts were mined with these very inputs."""
    parts = out.with_name(out.name + ".parts")
    ident = [model_fingerprint(model_dir), opened.meta.get("shard_key"), opened.type,
             str(train.resolve()), train.stat().st_size, train.stat().st_mtime_ns,
             _settings(spec), str(qrels)]  # fmt: skip
    key = hashlib.sha256(json.dumps(ident, sort_keys=True, default=str).encode()).hexdigest()
    if rank == 0:
        stamp = parts / "inputs.sha256"
        if not (stamp.is_file() and stamp.read_text() == key):
            shutil.rmtree(parts, ignore_errors=True)
            parts.mkdir(parents=True)
            stamp.write_text(key)
    distributed.barrier()
    return parts


def _join(parts: Path, out: Path, n_parts: int) -> dict[str, Any]:
    """Write the parts' records to ``out`` in order; the summed counts."""
    totals: Counter = Counter()

    def write(tmp: Path) -> None:
        with open(tmp, "w", encoding="utf-8") as f:
            for k in range(n_parts):
                part = parts / f"part-{k:06d}.jsonl"
                f.write(part.read_text(encoding="utf-8"))
                totals.update(json.loads(part.with_suffix(".json").read_text()))

    write_atomic(out, write)
    dropped = {rule: totals.pop(f"dropped_{rule}", 0) for rule in RULES}
    return {**dict(totals), "dropped": dropped}


@dataclass
class _Mining:
    """What mines one part: the model, the index and its passages, the rules."""

    model: Any
    opened: OpenIndex
    dataset: Any
    spec: MineSpec
    qrels: dict | None
    memory_bytes: int
    device: torch.device
    rank: int
    world_size: int

    def part(self, batch: list, train: Path) -> tuple[list[str], dict[str, int]]:
        """The records of ``batch`` with their mined negatives (JSON lines) and the counts."""
        spec, examples = self.spec, [b[3] for b in batch]
        if spec.rules.match is not None:
            for _, where, _, example in batch:
                if not example["answers"]:
                    raise InputError(
                        f"{train} {where}: question {example['question'][:60]!r} has no answers "
                        "to match (--match none, or --qrels, mines without them)"
                    )
        length = self.model.max_query_length or DEFAULT_QUERY_LENGTH
        queries = encode_question_texts(
            self.model, [e["question"] for e in examples], max_length=length, device=self.device
        )
        pos_rows = self._positive_rows(batch, train)
        hits = search_index(
            self.opened, queries, spec.skip + spec.depth, self.memory_bytes, rank=self.rank,
            world_size=self.world_size,
        )  # fmt: skip
        if hits is None:
            return [], {}
        pos_scores = _positive_scores(self.opened, queries, pos_rows)
        rows = sorted({int(r) for r in hits.rows[:, spec.skip :].ravel() if r >= 0})
        found = passage_columns(self.dataset, rows)
        where = {row: i for i, row in enumerate(rows)}
        counts: Counter = Counter(questions=len(batch))
        lines = []
        for q, (n, _, obj, example) in enumerate(batch):
            judged = frozenset(
                p for p, g in (self.qrels or {}).get(_qid(obj, n), {}).items() if g > 0
            )
            mined = self._negatives(example, hits.rows[q], hits.scores[q], pos_scores[q],
                                    found, where, judged, counts)  # fmt: skip
            if spec.keep_bm25:  # the file's own, as written, less those mined again
                seen = {c["passage_id"] for c in mined}
                own = zip(obj.get("hard_negative_ctxs") or [], example["hard_negative_ctxs"],
                          strict=True)  # fmt: skip
                kept = [raw for raw, clean in own if clean["passage_id"] not in seen]
                counts["kept_bm25"] += len(kept)
                mined += kept
            obj["hard_negative_ctxs"] = mined
            lines.append(json.dumps(obj, ensure_ascii=False) + "\n")
        return lines, dict(counts)

    def _positive_rows(self, batch: list, train: Path) -> np.ndarray:
        """The index row of each question's first positive (-1: none); InputError when a
        positive is not among the index's passages."""
        ids = [b[3]["positive_ctxs"][0]["passage_id"] if b[3]["positive_ctxs"] else None
               for b in batch]  # fmt: skip
        asked = [(i, pid) for i, pid in enumerate(ids) if pid is not None]
        rows = np.full(len(batch), -1, np.int64)
        found = passage_rows(self.dataset, [pid for _, pid in asked]) if asked else []
        for (i, pid), row in zip(asked, found, strict=True):
            if row < 0:
                raise InputError(
                    f"{train} {batch[i][1]}: positive passage {pid!r} is not among the passages "
                    f"the index at {self.opened.path} holds"
                )
            rows[i] = row
        return rows

    def _negatives(self, example, rows, scores, pos_score, found, where, judged, counts):
        spec, out = self.spec, []
        counts["skipped_top"] += int((rows[: spec.skip] >= 0).sum())
        for row, score in zip(rows[spec.skip :].tolist(), scores[spec.skip :].tolist(),
                              strict=True):  # fmt: skip
            if row < 0 or len(out) == spec.negatives:
                break
            counts["candidates"] += 1
            i = where[row]
            pid, text = found["id"][i], found["text"][i]
            reason = drop_reason(
                example, pid, text, score, spec.rules,
                positive_score=None if np.isnan(pos_score) else float(pos_score), judged=judged,
            )  # fmt: skip
            if reason is not None:
                counts[f"dropped_{reason}"] += 1
                continue
            out.append({"passage_id": pid, "title": found["title"][i], "text": text,
                        "score": round(float(score), 4)})  # fmt: skip
        counts["negatives"] += len(out)
        counts["short"] += len(out) < spec.negatives
        return out


def _positive_scores(opened: OpenIndex, queries: np.ndarray, rows: np.ndarray) -> np.ndarray:
    """Each question's score with its positive's stored vector (NaN: no positive) [n]."""
    out = np.full(len(rows), np.nan, np.float32)
    has = rows >= 0
    if has.any():
        vectors = opened.store.take(rows[has])  # [m, d] float32
        out[has] = (queries[has] * vectors).sum(axis=1)
    return out


def _qid(obj: dict, n: int) -> str:
    return next((str(obj[k]) for k in QID_KEYS if obj.get(k) not in (None, "")), str(n))
