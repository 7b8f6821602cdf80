"""Ranking metrics of a run against relevance judgments, with trec_eval's definitions.

Judgments are TREC qrels (``qid -> {pid: grade}``): BEIR's, or for QA data DPR's answer match
made into qrels (a retrieved passage holding an answer is relevant, grade 1; every question is
judged, so one with no answer-bearing passage counts as a miss). Metrics, in percent:
``top{k}`` (DPR's hit rate: a relevant passage among the first k), ``mrr@10`` (reciprocal rank of
the first relevant within 10), ``recall@k`` (share of the judged-relevant passages in the first
k) and ``ndcg@10`` (graded gain, log2 discount, over the ideal order of the judgments).
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence

__all__ = ["Qrels", "answer_qrels", "read_qrels", "write_qrels", "ranking_metrics"]

Qrels = dict[str, dict[str, int]]


def answer_qrels(qids: Sequence[str], pids: Sequence[Sequence[str]], flags) -> Qrels:
    """DPR's answer match as qrels: each question's retrieved passages with their has_answer
    as grade 1 or 0 (so a question without any hit is still judged)."""
    return {
        qid: {pid: int(bool(flag)) for pid, flag in zip(q_pids, q_flags, strict=True)}
        for qid, q_pids, q_flags in zip(qids, pids, flags, strict=True)
    }


def read_qrels(path) -> Qrels:
    """A TREC qrels file: ``qid 0 pid grade`` a line (BEIR's tsv with a header also reads)."""
    from pathlib import Path

    from dpr_cache.errors import InputError

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


def write_qrels(path, qrels: Qrels) -> None:
    """``qrels`` as a TREC qrels file."""
    from dpr_cache.runtime.atomic import write_text_atomic

    lines = [f"{q} 0 {p} {g}\n" for q, docs in qrels.items() for p, g in docs.items()]
    write_text_atomic(path, "".join(lines))


def ranking_metrics(
    run: Mapping[str, Sequence[str]], qrels: Qrels, ks: Sequence[int]
) -> dict[str, float]:
    """Mean over the judged questions of ``top{k}``, ``recall@{k}`` (each k), ``mrr@10`` and
    ``ndcg@10``, in percent. ``run`` maps a question id to its passage ids, best first."""
    totals: dict[str, float] = {}
    names = [f"top{k}" for k in ks] + ["mrr@10"] + [f"recall@{k}" for k in ks] + ["ndcg@10"]
    for name in names:
        totals[name] = 0.0
    for qid, judged in qrels.items():
        ranked = list(run.get(qid, []))
        grades = [judged.get(pid, 0) for pid in ranked]
        relevant = sum(1 for g in judged.values() if g > 0)
        for k in ks:
            found = sum(1 for g in grades[:k] if g > 0)
            totals[f"top{k}"] += found > 0
            totals[f"recall@{k}"] += found / relevant if relevant else 0.0
        first = next((i for i, g in enumerate(grades[:10]) if g > 0), None)
        totals["mrr@10"] += 1.0 / (first + 1) if first is not None else 0.0
        dcg = sum(g / math.log2(i + 2) for i, g in enumerate(grades[:10]) if g > 0)
        ideal = sorted((g for g in judged.values() if g > 0), reverse=True)[:10]
        idcg = sum(g / math.log2(i + 2) for i, g in enumerate(ideal))
        totals["ndcg@10"] += dcg / idcg if idcg else 0.0
    n = len(qrels)
    return {name: 100.0 * value / n if n else 0.0 for name, value in totals.items()}
