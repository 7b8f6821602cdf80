"""Every retrieval metric the project reports, computed here only: eval, validation during
training, the mining report and the studies all call these.

Judgments are TREC qrels (``qid -> {pid: grade}``): BEIR's, or for QA data DPR's answer match
made into qrels (a retrieved passage holding an answer is relevant, grade 1; every question is
judged, so one with no answer-bearing passage counts as a miss). Metrics, in percent, with
trec_eval's definitions: ``top{k}`` (DPR's hit rate: a relevant passage among the first k),
``mrr@10`` (reciprocal rank of the first relevant within 10), ``recall@k`` (share of the
judged-relevant passages in the first k) and ``ndcg@10`` (graded gain, log2 discount, over the
ideal order of the judgments). ``top{k}`` and ``mrr@10`` depend only on the rank of the first
relevant passage, so they are also given per question from that rank (:func:`hit_metrics`).
"""

from __future__ import annotations

import logging
import math
from collections.abc import Mapping, Sequence
from pathlib import Path

import numpy as np

from dpr_cache.errors import InputError
from dpr_cache.runtime.atomic import write_text_atomic

__all__ = [
    "Qrels",
    "answer_qrels",
    "read_qrels",
    "write_qrels",
    "first_relevant_rank",
    "hit_metrics",
    "ranking_metrics",
    "judged_qrels",
]

Qrels = dict[str, dict[str, int]]
MRR_DEPTH = NDCG_DEPTH = 10


def answer_qrels(qids: Sequence[str], pids: Sequence[Sequence[str]], flags) -> Qrels:
    """DPR's answer match as qrels: each question's retrieved passages with their has_answer
    as grade 1 or 0 (so a question without any hit is still judged)."""
    return {
        qid: {pid: int(bool(flag)) for pid, flag in zip(q_pids, q_flags, strict=True)}
        for qid, q_pids, q_flags in zip(qids, pids, flags, strict=True)
    }


def read_qrels(path: str | Path) -> Qrels:
    """A TREC qrels file: ``qid 0 pid grade`` a line (BEIR's tsv with a header also reads)."""
    qrels: Qrels = {}
    for n, line in enumerate(Path(path).read_text(encoding="utf-8").splitlines(), start=1):
        fields = line.split()
        if not fields or (n == 1 and fields[0] in ("query-id", "qid")):
            continue
        if len(fields) == 3:  # BEIR: query-id corpus-id score
            fields = [fields[0], "0", fields[1], fields[2]]
        if len(fields) != 4:
            raise InputError(f"{path} line {n}: expected 'qid 0 pid grade', got {line[:60]!r}")
        try:
            qrels.setdefault(fields[0], {})[fields[2]] = int(float(fields[3]))
        except ValueError:
            raise InputError(f"{path} line {n}: grade {fields[3]!r} is not a number") from None
    return qrels


def write_qrels(path: str | Path, qrels: Qrels) -> None:
    """``qrels`` as a TREC qrels file."""
    lines = [f"{q} 0 {p} {g}\n" for q, docs in qrels.items() for p, g in docs.items()]
    write_text_atomic(path, "".join(lines))


def first_relevant_rank(grades: Sequence[int | bool]) -> float:
    """The 0-based rank of the first relevant (grade > 0) passage of a ranking; inf if none."""
    return next((float(i) for i, g in enumerate(grades) if g > 0), math.inf)


def hit_metrics(first_ranks: Sequence[float], ks: Sequence[int]) -> dict[str, np.ndarray]:
    """Per question, from the rank of its first relevant passage (inf: none), in percent:
    ``top{k}`` (100 when that rank is below k, else 0) and ``mrr@10``."""
    ranks = np.asarray(first_ranks, dtype=float)  # [n]
    for k in ks:
        if k < 1:
            raise ValueError(f"top-k values must be >= 1, got {k}")
    out = {f"top{k}": np.where(ranks < k, 100.0, 0.0) for k in ks}
    out["mrr@10"] = np.where(ranks < MRR_DEPTH, 100.0 / (ranks + 1), 0.0)
    return out


def ranking_metrics(
    run: Mapping[str, Sequence[str]], qrels: Qrels, ks: Sequence[int]
) -> dict[str, float]:
    """Mean over the judged questions of ``top{k}``, ``recall@{k}`` (each k), ``mrr@10`` and
    ``ndcg@10``, in percent. ``run`` maps a question id to its passage ids, best first; a judged
    question the run lacks counts as a miss."""
    graded = [[judged.get(pid, 0) for pid in run.get(qid, [])] for qid, judged in qrels.items()]
    per_question = hit_metrics([first_relevant_rank(g) for g in graded], ks)
    totals = {name: float(values.sum()) / 100.0 for name, values in per_question.items()}
    for k in ks:
        totals[f"recall@{k}"] = 0.0
    totals["ndcg@10"] = 0.0
    for grades, judged in zip(graded, qrels.values(), strict=True):
        relevant = sorted((g for g in judged.values() if g > 0), reverse=True)
        for k in ks:
            found = sum(1 for g in grades[:k] if g > 0)
            totals[f"recall@{k}"] += found / len(relevant) if relevant else 0.0
        dcg = sum(g / math.log2(i + 2) for i, g in enumerate(grades[:NDCG_DEPTH]) if g > 0)
        idcg = sum(g / math.log2(i + 2) for i, g in enumerate(relevant[:NDCG_DEPTH]))
        totals["ndcg@10"] += dcg / idcg if idcg else 0.0
    n = len(qrels)
    names = [f"top{k}" for k in ks] + ["mrr@10"] + [f"recall@{k}" for k in ks] + ["ndcg@10"]
    return {name: 100.0 * totals[name] / n if n else 0.0 for name in names}


def judged_qrels(qrels: Qrels, qids: Sequence[str], path: str) -> Qrels:
    """The qrels of the questions evaluated. As trec_eval, a question without judgments is left
    out of the means, and judgments of other questions are dropped; none in common is an error."""
    judged = {qid: qrels[qid] for qid in qids if qid in qrels}
    if not judged:
        raise InputError(
            f"{path}: judges none of the {len(qids)} questions (first qrels id "
            f"{next(iter(qrels), None)!r}, first question id {qids[0]!r})"
        )
    if len(judged) < len(qids) or len(judged) < len(qrels):
        logging.getLogger(__name__).warning(
            "%s: %d of %d questions judged (%d qrels questions not evaluated)",
            path,
            len(judged),
            len(qids),
            len(qrels) - len(judged),
        )
    return judged
