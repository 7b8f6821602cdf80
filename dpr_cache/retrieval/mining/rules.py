"""Hard negatives: which ranked passages may be one, rule by rule, and how deep a miner looks.

A candidate is dropped, and counted under the first rule that drops it, when it is the question's
positive (``positive_id``: the same passage id; ``positive_text``: the same text), is judged
relevant (``judged``: the qrels say so), holds an answer (``answer``: DPR's ``has_answer`` on the
passage text, string or regex match) or scores within a margin of the positive (``margin``: a
likely false negative; absolute, ``score >= positive - margin``, or relative,
``score >= positive - relative_margin * |positive|``: sentence-transformers' miner's rules, the
relative one also sensible for a positive scoring below 0) or scores, by a teacher
(:mod:`dpr_cache.retrieval.teacher`), within a margin of the question's positive or above it
(``teacher``: absolute, ``teacher >= teacher's positive - teacher_margin``, or relative,
``teacher >= teacher's positive - (1 - teacher_relative) * |teacher's positive|``: with 0.95,
NV-Retriever's 95%-of-positive rule; either drops when both are given).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from dpr_cache.config import check_flags, default_of, takes
from dpr_cache.data.answers import has_answer
from dpr_cache.errors import InputError

__all__ = [
    "RULES",
    "NegativeRules",
    "MineSpec",
    "check_spec",
    "drop_reason",
    "near_teacher_positive",
]

RULES = ("positive_id", "positive_text", "judged", "answer", "margin", "teacher")


@dataclass(frozen=True)
class NegativeRules:
    """Which candidates cannot be hard negatives: answer matching (``match``: string | regex, None:
    answers not looked at), the margins below the positive's score (None: no margin) and the
    teacher's (None: no teacher rule)."""

    match: str | None = default_of("eval.match")
    margin: float | None = None
    relative_margin: float | None = None
    teacher_margin: float | None = None
    teacher_relative: float | None = None

    @classmethod
    def from_flag(cls, match: str, **margins: float | None) -> NegativeRules:
        """The rules as ``mine``'s flags give them: ``match`` is eval.match's values or
        ``none`` (answers not looked at); an InputError naming ``--match`` otherwise."""
        if match == "none":
            return cls(None, **margins)
        try:
            check_flags("eval", {"--match": ("match", match)})
        except InputError:
            raise InputError(
                f"--match: {match!r} is not one of {takes('eval.match')} or 'none'"
            ) from None
        return cls(match, **margins)

    @property
    def by_teacher(self) -> bool:
        return self.teacher_margin is not None or self.teacher_relative is not None


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
    teacher: tuple[float, float] | None = None,
) -> str | None:
    """The first rule of :data:`RULES` that drops this candidate, or None (a hard negative).
    ``holds_answer``: the answer check done already (None: done here, when ``rules.match``);
    ``teacher``: the teacher's scores of the candidate and of the positive (None: no rule)."""
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
    if teacher is not None and near_teacher_positive(*teacher, rules):
        return "teacher"
    return None


def near_teacher_positive(score: float, positive: float, rules: NegativeRules) -> bool:
    """The teacher scores the candidate within its margin of the positive, or above it."""
    if rules.teacher_margin is not None and score >= positive - rules.teacher_margin:
        return True
    relative = rules.teacher_relative
    return relative is not None and score >= positive - (1 - relative) * abs(positive)


@dataclass(frozen=True)
class MineSpec:
    """How deep to look, what to keep, and which candidates may not be negatives."""

    negatives: int = 30  # kept per question, at most
    depth: int = 100  # candidates ranked per question, after the skipped ones
    skip: int = 0  # the ranker's top ranks left out (likely unlabelled positives)
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
    if spec.rules.teacher_margin is not None and spec.rules.teacher_margin < 0:
        raise InputError(f"mine: --teacher-margin {spec.rules.teacher_margin} must be >= 0")
    relative = spec.rules.teacher_relative
    if relative is not None and not 0 < relative <= 1:
        raise InputError(f"mine: --teacher-relative {relative} must be in (0, 1]")
