"""``dpr-cache mine``: hard negatives mined by a model (DPR's second round).

For every question of a training file (DPR JSON or JSON Lines), the model's query tower searches
an index its passage tower encoded (the bounded search ``eval`` uses: flat or IVF, the shards
split over the ranks under ``torchrun``), and the passages it ranks highest in the window
``[skip, skip + depth)`` that no rule drops (:mod:`dpr_cache.retrieval.mining.rules`: the positive,
judged relevant, holding an answer, within a margin of the positive) become the record's
``hard_negative_ctxs`` (``passage_id``, ``title``, ``text``, ``score``), best first; with
``keep_bm25`` the file's own hard negatives follow them. Every other key is kept. The records go
to ``OUT`` as JSON Lines, with what mined them, what each rule dropped and the seconds each stage
took beside it (``<OUT stem>.summary.json``).

Resumable: the questions go in parts of ``batch``, each written whole into ``OUT.parts/``; a rerun
with the same model, index, file and settings keeps the finished parts. A question's id (for the
qrels) is its record's ``id``, ``qid``, ``_id`` or ``query_id``, else its place in the file from 0.
"""

from __future__ import annotations

import itertools
import shutil
from collections import Counter
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import torch
from tqdm.auto import tqdm

from dpr_cache.data.passages import load_passages, passage_columns, passage_rows
from dpr_cache.data.training import iter_raw
from dpr_cache.errors import InputError
from dpr_cache.model.loading import load_encoder, model_fingerprint
from dpr_cache.retrieval.dense.encode import encode_question_texts
from dpr_cache.retrieval.dense.faiss_index import search_knobs
from dpr_cache.retrieval.dense.index import (
    OpenIndex,
    check_model,
    encoded_from,
    query_encoding,
    search_index,
)
from dpr_cache.retrieval.dense.shards import DEFAULT_QUERY_LENGTH
from dpr_cache.retrieval.metrics import read_qrels
from dpr_cache.retrieval.mining.parts import (
    QID_KEYS,
    join_parts,
    parts_dir,
    records,
    settings_of,
    write_part,
)
from dpr_cache.retrieval.mining.rules import MineSpec, check_spec, drop_reason
from dpr_cache.runtime import distributed
from dpr_cache.runtime.atomic import write_json_atomic
from dpr_cache.runtime.laps import Laps
from dpr_cache.runtime.lock import output_lock

__all__ = ["MineSpec", "check_spec", "mine", "summary_path", "QID_KEYS"]


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
    laps = Laps()
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
    mining = _Mining(model, opened, dataset, spec, judged, memory_bytes, device, rank, world_size,
                     laps)  # fmt: skip
    parts = parts_dir(out, model_dir, opened, train, spec, qrels, rank)
    laps.lap("load the model, index and passages")
    bar = tqdm(unit="q", desc="mine", disable=not (progress and rank == 0), dynamic_ncols=True)
    n_parts = 0
    with bar:
        raw = iter_raw(train)  # the whole records again, streamed beside the parts (rank 0)
        for batch in records(train, spec.batch):
            laps.lap("read the training file")
            part = parts / f"part-{n_parts:06d}.jsonl"  # done once its counts (.json) follow it
            if not distributed.rank0_says(part.with_suffix(".json").is_file()):
                mined, counts = mining.part(batch, train)
                if rank == 0:
                    counts["kept_bm25"] = write_part(part, raw, mined, spec.keep_bm25, train)
                    write_json_atomic(part.with_suffix(".json"), counts)
                laps.lap("write the part")
            elif rank == 0:
                for _ in itertools.islice(raw, len(batch)):  # past the finished part's records
                    pass
            n_parts += 1
            bar.update(len(batch))
    distributed.barrier()
    if rank != 0:
        return None
    summary = join_parts(parts, out, n_parts)
    laps.lap("join the parts into OUT")
    stages = laps.seconds()
    summary.update(
        train=str(train), out=str(out), settings=settings_of(spec), command=command,
        seconds=round(sum(stages.values()), 1), seconds_by_stage=stages,
        mined_by={"model": str(model_dir), "fingerprint": model_fingerprint(model_dir),
                  "index": str(opened.path), "type": opened.type, "rows": opened.store.rows,
                  "shard_key": opened.meta.get("shard_key"), "search": search_knobs(opened.faiss),
                  "passages": str(passages),
                  "qrels": str(qrels) if qrels else None},
    )  # fmt: skip
    write_json_atomic(summary_path(out), summary)
    shutil.rmtree(parts, ignore_errors=True)
    return summary


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
    laps: Laps

    def part(self, batch: list, train: Path) -> tuple[list[list[dict]], dict[str, int]]:
        """Each question's mined negatives (empty on ranks but 0) and the counts."""
        spec, examples = self.spec, [b[2] for b in batch]
        if spec.rules.match is not None:
            for where, _, example in batch:
                if not example["answers"]:
                    raise InputError(
                        f"{train} {where}: question {example['question'][:60]!r} has no answers "
                        "to match (--match none, or --qrels, mines without them)"
                    )
        length = self.model.max_query_length or DEFAULT_QUERY_LENGTH
        queries = encode_question_texts(
            self.model, [e["question"] for e in examples], max_length=length, device=self.device
        )
        self.laps.lap("encode questions")
        pos_rows = self._positive_rows(batch, train)
        self.laps.lap("find the positives")
        hits = search_index(
            self.opened, queries, spec.skip + spec.depth, self.memory_bytes, rank=self.rank,
            world_size=self.world_size,
        )  # fmt: skip
        self.laps.lap("search")
        if hits is None:
            return [], {}
        pos_scores = _positive_scores(self.opened, queries, pos_rows)
        rows = sorted({int(r) for r in hits.rows[:, spec.skip :].ravel() if r >= 0})
        found = passage_columns(self.dataset, rows)
        self.laps.lap("read the candidates")
        where = {row: i for i, row in enumerate(rows)}
        counts: Counter = Counter(questions=len(batch))
        mined = []
        for q, (_, qid, example) in enumerate(batch):
            judged = frozenset(p for p, g in (self.qrels or {}).get(qid, {}).items() if g > 0)
            mined.append(self._negatives(example, hits.rows[q], hits.scores[q], pos_scores[q],
                                         found, where, judged, counts))  # fmt: skip
        self.laps.lap("apply the rules")
        return mined, dict(counts)

    def _positive_rows(self, batch: list, train: Path) -> np.ndarray:
        """The index row of each question's first positive (-1: none); InputError when a
        positive is not among the index's passages."""
        ids = [b[2]["positive_ctxs"][0]["passage_id"] if b[2]["positive_ctxs"] else None
               for b in batch]  # fmt: skip
        asked = [(i, pid) for i, pid in enumerate(ids) if pid is not None]
        rows = np.full(len(batch), -1, np.int64)
        found = passage_rows(self.dataset, [pid for _, pid in asked]) if asked else []
        for (i, pid), row in zip(asked, found, strict=True):
            if row < 0:
                raise InputError(
                    f"{train} {batch[i][0]}: positive passage {pid!r} is not among the passages "
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
