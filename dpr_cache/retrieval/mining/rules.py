"""Hard negatives: which retrieved passages may be one, rule by rule (shared by the BM25 miner
here and the model's miner, :mod:`dpr_cache.retrieval.mining.miner`), and BM25's negatives for a DPR
training file, mined as DPR mined them.

A candidate is dropped, and counted under the first rule that drops it, when it is the question's
positive (``positive_id``: the same passage id; ``positive_text``: the same text), is judged
relevant (``judged``: the qrels say so), holds an answer (``answer``: DPR's ``has_answer`` on the
passage text, string or regex match) or scores within a margin of the positive (``margin``: a
likely false negative; absolute, ``score >= positive - margin``, or relative,
``score >= positive - relative_margin * |positive|``: sentence-transformers' miner's rules, the
relative one also sensible for a positive scoring below 0).

BM25's negatives: for each question, the passages BM25 ranks highest that no rule drops become its
``hard_negative_ctxs`` (``passage_id``, ``title``, ``text``, ``score``), best first; a passage that
shares no word with the question (score 0) is not retrieved. Every other key of each record is
written back unchanged. The same ranking gives the BM25 top-k hit rate of the training questions,
a check on the index.
"""

from __future__ import annotations

import json
import math
from collections import Counter
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from tqdm.auto import tqdm

from dpr_cache.data.answers import has_answer
from dpr_cache.data.passages import load_passages, passage_columns
from dpr_cache.data.training import clean_example, iter_raw
from dpr_cache.errors import InputError
from dpr_cache.retrieval.lexical import Bm25Index
from dpr_cache.retrieval.metrics import hit_metrics
from dpr_cache.runtime.atomic import write_atomic

__all__ = [
    "RULES", "NegativeRules", "MineSpec", "check_spec", "drop_reason", "mine_negatives",
    "MiningReport",
]  # fmt: skip

RULES = ("positive_id", "positive_text", "judged", "answer", "margin")
HIT_KS = (1, 5, 20, 100)


@dataclass(frozen=True)
class NegativeRules:
    """Which candidates cannot be hard negatives: answer matching (``match``: string | regex, None:
    answers not looked at) and the margins below the positive's score (None: no margin)."""

    match: str | None = "string"
    margin: float | None = None
    relative_margin: float | None = None


def drop_reason(
    example: Mapping[str, Any],
    pid: str,
    text: str,
    score: float,
    rules: NegativeRules,
    *,
    positive_score: float | None = None,
    judged: frozenset[str] = frozenset(),
    holds_answer: bool | None = None,
) -> str | None:
    """The first rule of :data:`RULES` that drops this candidate, or None (a hard negative).
    ``holds_answer``: the answer check done already (None: done here, when ``rules.match``)."""
    positives = example["positive_ctxs"]
    if pid in {ctx["passage_id"] for ctx in positives}:
        return "positive_id"
    if text in {ctx["text"] for ctx in positives}:
        return "positive_text"
    if pid in judged:
        return "judged"
    if rules.match is not None:
        if holds_answer is None:
            holds_answer = has_answer(example["answers"], text, rules.match)
        if holds_answer:
            return "answer"
    if positive_score is not None:
        if rules.margin is not None and score >= positive_score - rules.margin:
            return "margin"
        if rules.relative_margin is not None and score >= positive_score - (
            rules.relative_margin * abs(positive_score)
        ):
            return "margin"
    return None


@dataclass(frozen=True)
class MineSpec:
    """How deep to look, what to keep, and which candidates may not be negatives."""

    negatives: int = 30  # kept per question, at most
    depth: int = 100  # candidates ranked per question, after the skipped ones
    skip: int = 0  # the model's top ranks left out (likely unlabelled positives)
    keep_bm25: bool = False  # the file's own hard negatives stay, after the mined ones
    rules: NegativeRules = field(default_factory=NegativeRules)
    batch: int = 2048  # questions per part (one search pass over the index each)


def check_spec(spec: MineSpec) -> None:
    """InputError for settings that are out of range or contradict each other."""
    if spec.negatives < 1 or spec.depth < 1 or spec.skip < 0 or spec.batch < 1:
        raise InputError("mine: --negatives, --depth and --batch must be >= 1, --skip >= 0")
    if spec.negatives > spec.depth:
        raise InputError(
            f"mine: --negatives {spec.negatives} is more than the --depth {spec.depth} "
            "candidates a question is given"
        )
    margins = (spec.rules.margin, spec.rules.relative_margin)
    if spec.rules.margin is not None and spec.rules.margin < 0:
        raise InputError(f"mine: --margin {spec.rules.margin} must be >= 0")
    if spec.rules.relative_margin is not None and not 0 <= spec.rules.relative_margin < 1:
        raise InputError(f"mine: --relative-margin {spec.rules.relative_margin} must be in [0, 1)")
    if all(m is not None for m in margins):
        raise InputError("mine: give --margin or --relative-margin, not both")


@dataclass
class MiningReport:
    """What a BM25 mining run wrote, the BM25 hit rates it saw and what each rule dropped."""

    out: Path
    questions: int = 0
    negatives: int = 0
    short: int = 0  # questions with fewer than n negatives in the ranked depth
    first_hits: list[int | None] = field(default_factory=list, repr=False)
    ks: tuple[int, ...] = HIT_KS
    dropped: Counter = field(default_factory=Counter)

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
    example: dict[str, Any], rows, scores, found: dict[str, list], where: dict[int, int], n: int
) -> tuple[list[dict[str, Any]], int | None, Counter]:
    """The first ``n`` ranked passages no rule drops, the rank (0-based) of the first
    answer-bearing passage (None if none is ranked) and what each rule dropped."""
    negatives: list[dict[str, Any]] = []
    first_hit, dropped = None, Counter()
    for rank, (row, score) in enumerate(zip(rows.tolist(), scores.tolist(), strict=True)):
        if len(negatives) >= n and first_hit is not None:
            break
        i = where[row]
        pid, text = found["id"][i], found["text"][i]
        answer = has_answer(example["answers"], text)
        if answer and first_hit is None:
            first_hit = rank
        if len(negatives) >= n:
            continue
        reason = drop_reason(example, pid, text, score, NegativeRules(), holds_answer=answer)
        if reason is not None:
            dropped[reason] += 1
            continue
        negatives.append(
            {"passage_id": pid, "title": found["title"][i], "text": text,
             "score": round(float(score), 4)}
        )  # fmt: skip
    return negatives, first_hit, dropped


def mine_negatives(
    train: Path,
    passages: Path,
    out: Path,
    *,
    cache_dir: Path,
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
    index = Bm25Index.open(passages, cache_dir)
    dataset = load_passages(passages, cache_dir)
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
                    _write_batch(f, pending, index, dataset, n, depth, report)
                    bar.update(len(pending))
                    pending = []
            _write_batch(f, pending, index, dataset, n, depth, report)
            bar.update(len(pending))
        if report.questions == 0:
            raise InputError(f"{train}: no questions")

    write_atomic(out, write)
    return report


def _write_batch(f, pending, index: Bm25Index, dataset, n, depth, report: MiningReport) -> None:
    ranked = index.search([example["question"] for _, example in pending], depth)
    rows = sorted({int(r) for q_rows, _ in ranked for r in q_rows})
    found = passage_columns(dataset, rows)  # only the ranked passages are read
    where = {row: i for i, row in enumerate(rows)}
    for (obj, example), (q_rows, scores) in zip(pending, ranked, strict=True):
        negatives, first_hit, dropped = select_bm25_negatives(
            example, q_rows, scores, found, where, n
        )
        obj["hard_negative_ctxs"] = negatives
        f.write(json.dumps(obj, ensure_ascii=False) + "\n")
        report.questions += 1
        report.negatives += len(negatives)
        report.short += len(negatives) < n
        report.first_hits.append(first_hit)
        report.dropped.update(dropped)
