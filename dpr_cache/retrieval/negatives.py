"""BM25 hard negatives for a DPR training file, mined as DPR mined them.

For each question, the passages BM25 ranks highest (see :mod:`dpr_cache.retrieval.bm25`) that do not
hold an answer (DPR's ``has_answer`` on the passage text) and are not the question's positive
become its ``hard_negative_ctxs`` (``passage_id``, ``title``, ``text``, ``score``), best first.
Every other key of each record is written back unchanged. The same ranking gives the BM25 top-k
hit rate of the training questions, a check on the index.
"""

from __future__ import annotations

import json
import math
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
from tqdm.auto import tqdm

from dpr_cache.data.answers import has_answer
from dpr_cache.data.training import clean_example, iter_raw
from dpr_cache.errors import InputError
from dpr_cache.retrieval.bm25 import Bm25Corpus
from dpr_cache.retrieval.metrics import hit_metrics
from dpr_cache.runtime.atomic import write_atomic

HIT_KS = (1, 5, 20, 100)


@dataclass
class MiningReport:
    """What a mining run wrote and the BM25 hit rates it saw."""

    out: Path
    questions: int = 0
    negatives: int = 0
    short: int = 0  # questions with fewer than n negatives in the ranked depth
    first_hits: list[int | None] = field(default_factory=list, repr=False)
    ks: tuple[int, ...] = HIT_KS

    def hit_rates(self) -> dict[str, float]:
        """Percentage of questions with an answer-bearing passage in BM25's top k, per k."""
        ranks = [math.inf if r is None else r for r in self.first_hits]
        hits = hit_metrics(ranks, self.ks)
        return {f"top{k}": float(hits[f"top{k}"].mean()) if ranks else 0.0 for k in self.ks}

    def summary(self) -> str:
        """One line: hit rates, then negatives per question."""
        rates = " / ".join(f"{v:.1f}" for v in self.hit_rates().values())
        ks = "/".join(str(k) for k in self.ks)
        mean = self.negatives / max(self.questions, 1)
        return (
            f"BM25 top-{ks} hit rate on {self.questions} training questions: {rates}; "
            f"{mean:.1f} hard negatives a question ({self.short} with fewer than asked)"
        )


def select_bm25_negatives(
    example: dict[str, Any],
    rows: np.ndarray,
    scores: np.ndarray,
    corpus: Bm25Corpus,
    n: int,
) -> tuple[list[dict[str, Any]], int | None]:
    """The first ``n`` ranked passages without an answer that are not a positive, and the rank
    (0-based) of the first answer-bearing passage (None if none is ranked). Passages that score
    0 (no word in common with the question) count as not retrieved."""
    answers = example["answers"]
    pos_ids = {ctx["passage_id"] for ctx in example["positive_ctxs"]}
    pos_texts = {ctx["text"] for ctx in example["positive_ctxs"]}
    negatives: list[dict[str, Any]] = []
    first_hit = None
    for rank, (row, score) in enumerate(zip(rows.tolist(), scores.tolist(), strict=True)):
        if score <= 0.0 or (len(negatives) >= n and first_hit is not None):
            break  # a passage sharing no word with the question is not retrieved (Lucene)
        text = corpus.texts[row]
        if has_answer(answers, text):
            first_hit = rank if first_hit is None else first_hit
            continue
        if len(negatives) >= n or corpus.ids[row] in pos_ids or text in pos_texts:
            continue
        negatives.append(
            {
                "passage_id": corpus.ids[row],
                "title": corpus.titles[row],
                "text": text,
                "score": round(float(score), 4),
            }
        )
    return negatives, first_hit


def mine_negatives(
    train: Path,
    passages: Path,
    out: Path,
    *,
    n: int = 30,
    batch: int = 256,
    depth: int = 100,
    progress: bool = True,
) -> MiningReport:
    """Write ``train`` to ``out`` (JSON Lines) with BM25 ``hard_negative_ctxs`` from ``passages``.

    ``depth`` passages are ranked per question; negatives and hit rates come from them.
    Raises InputError on bad input (the message names the file and record).
    """
    train, passages, out = Path(train), Path(passages), Path(out)
    if n < 1 or batch < 1 or depth < 1:
        raise InputError(f"--n, --batch and --depth must be >= 1, got {n}, {batch}, {depth}")
    if out.resolve() == train.resolve():
        raise InputError(f"{out}: the output must not overwrite the training file")
    corpus = Bm25Corpus.from_tsv(passages)
    report = MiningReport(out=out, ks=tuple(k for k in HIT_KS if k <= depth) or (depth,))

    def write(tmp: Path) -> None:
        with (
            open(tmp, "w", encoding="utf-8") as f,
            tqdm(unit="q", desc="mine negatives", disable=not progress, dynamic_ncols=True) as bar,
        ):
            pending: list[tuple[dict, dict]] = []
            for where, obj in iter_raw(train):
                pending.append((obj, clean_example(obj, f"{train} {where}")))
                if len(pending) == batch:
                    _write_batch(f, pending, corpus, n, depth, report)
                    bar.update(len(pending))
                    pending = []
            _write_batch(f, pending, corpus, n, depth, report)
            bar.update(len(pending))
        if report.questions == 0:
            raise InputError(f"{train}: no questions")

    write_atomic(out, write)
    return report


def _write_batch(f, pending, corpus: Bm25Corpus, n: int, depth: int, report: MiningReport) -> None:
    ranked = corpus.search([example["question"] for _, example in pending], depth)
    for (obj, example), (rows, scores) in zip(pending, ranked, strict=True):
        negatives, first_hit = select_bm25_negatives(example, rows, scores, corpus, n)
        obj["hard_negative_ctxs"] = negatives
        f.write(json.dumps(obj, ensure_ascii=False) + "\n")
        report.questions += 1
        report.negatives += len(negatives)
        report.short += len(negatives) < n
        report.first_hits.append(first_hit)
