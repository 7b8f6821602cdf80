"""A training step's batch: tokenized questions, their passage groups (positive + hard negatives)
and passage ids."""

from __future__ import annotations

import hashlib
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Protocol

import numpy as np
import torch
from torch import Tensor

from dpr_cache.data.ids import passage_hash
from dpr_cache.data.tokenize import Prefix, encode_passages, encode_questions
from dpr_cache.runtime.overlap import to_device
from dpr_cache.runtime.seeds import stream_entropy

_FILL_TRIES = 20


class ExamplePool(Protocol):
    """Anything indexable by int giving examples with ``positive_ctxs`` (a list, a Dataset)."""

    def __len__(self) -> int: ...

    def __getitem__(self, i: int) -> Mapping[str, Any]: ...


@dataclass
class Batch:
    """One (local) training batch.

    Passage rows are grouped per question: row ``i * group_size`` is question i's positive and
    the next ``group_size - 1`` rows are its hard negatives. ``p_ids[j]`` is a 63-bit hash of row
    j's passage id, equal for two rows exactly when they hold the same passage.
    """

    q_inputs: dict[str, Tensor]
    p_inputs: dict[str, Tensor]
    p_ids: Tensor
    n_questions: int
    group_size: int
    teacher_scores: Tensor | None = None  # [passage rows] float64, when the loss needs them
    # the same rows tokenized for a guide model (train.guide): (questions, passages)
    guide_inputs: tuple[dict[str, Tensor], dict[str, Tensor]] | None = None
    text_duplicates: int = 0  # rows whose text another row holds under another id: masked
    source: int | None = None  # the training source every row comes from (None: several)

    def to(self, device: torch.device | str) -> Batch:
        """A copy with every tensor moved to ``device`` (to CUDA through pinned memory, queued
        without a host wait: :func:`~dpr_cache.runtime.overlap.to_device`)."""
        device = torch.device(device)
        rows = {"p_ids": self.p_ids}
        if self.teacher_scores is not None:
            rows["teacher_scores"] = self.teacher_scores
        moved = to_device(rows, device)
        guide = None
        if self.guide_inputs is not None:
            guide = tuple(to_device(inputs, device) for inputs in self.guide_inputs)
        return Batch(
            to_device(self.q_inputs, device),
            to_device(self.p_inputs, device),
            moved["p_ids"],
            self.n_questions,
            self.group_size,
            moved.get("teacher_scores"),
            guide,
            self.text_duplicates,
            self.source,
        )

    def loss_inputs(self) -> dict[str, Tensor]:
        """What the loss takes besides the reps: the passage ids, and the teacher's scores of
        the passage rows when the batch has them."""
        if self.teacher_scores is None:
            return {"p_ids": self.p_ids}
        return {"p_ids": self.p_ids, "teacher_scores": self.teacher_scores}

    def digest(self) -> str:
        """16 hex digits identifying the batch's contents: question tokens and passage ids, in
        order. Two runs whose logs agree on it trained on the same examples at that step."""
        h = hashlib.blake2b(digest_size=8)
        for tensor in (self.q_inputs["input_ids"], self.p_ids):
            h.update(tensor.detach().cpu().contiguous().numpy().tobytes())
        return h.hexdigest()


NEGATIVE_DRAW = "stream_entropy(seed, epoch, question index)"
"""How a question's hard negatives are drawn, recorded in checkpoints: once an epoch, from a
stream of the seed, the epoch and the question's dataset index (not the step: the same under
any batch size or number of ranks). A run resumes only under its own draw."""


def negatives_rng(seed: int, epoch: int, key: int) -> np.random.Generator:
    """The generator question ``key``'s hard negatives are drawn from in ``epoch`` of a run at
    ``seed`` (:data:`NEGATIVE_DRAW`), for :func:`choose_step_negatives`."""
    return np.random.default_rng(stream_entropy(seed, epoch, key))


def _shuffled(ctxs: Sequence[Mapping[str, Any]], rng: np.random.Generator) -> list:
    return [ctxs[int(j)] for j in rng.permutation(len(ctxs))]


def choose_step_negatives(
    example: Mapping[str, Any],
    hard_negatives: int,
    rng: np.random.Generator,
    pool: ExamplePool,
    own: int | None = None,
) -> list[Mapping[str, Any]]:
    """The ``hard_negatives`` negatives of one question, as DPR picks them, plus a fill.

    DPR's rule: shuffle ``hard_negative_ctxs`` and take the first H (a list longer than H gives
    H of its entries, drawn anew each epoch; the file's order, e.g. a miner's best first, does
    not matter); if the question has none, use its shuffled ``negative_ctxs`` instead. A fixed
    group size is needed for the loss, so if fewer than H remain, the rest is filled with
    positives of other questions drawn at random (from ``rng``) from ``pool``, avoiding passages
    already in the group where possible. ``own`` (a training source's ``hard_negatives``) caps
    how many of the H come from the question's own negatives.
    """
    if hard_negatives <= 0:
        return []
    hard = example.get("hard_negative_ctxs") or []
    take = hard_negatives if own is None else min(own, hard_negatives)
    chosen = _shuffled(hard or (example.get("negative_ctxs") or []), rng)[:take]
    seen = {example["positive_ctxs"][0]["passage_id"]} | {c["passage_id"] for c in chosen}
    while len(chosen) < hard_negatives:
        ctx = None
        for _ in range(_FILL_TRIES):
            ctx = pool[int(rng.integers(len(pool)))]["positive_ctxs"][0]
            if ctx["passage_id"] not in seen:
                break
        seen.add(ctx["passage_id"])
        chosen.append(ctx)
    return chosen


def build_batch(
    examples: list[Mapping[str, Any]],
    *,
    tokenizer: Any,
    hard_negatives: int,
    max_query_length: int,
    max_passage_length: int,
    seed: int,
    epoch: int,
    pool_for_padding: ExamplePool | None = None,
    indices: Sequence[int] | None = None,
    pad_to_multiple_of: int | None = None,
    query_prefix: Prefix = "",
    passage_prefix: Prefix = "",
    teacher_scores: bool = False,
    guide: Any = None,
    own_negatives: int | None = None,
) -> Batch:
    """Tokenize questions and their passage groups (positive + ``hard_negatives`` negatives).

    Each question's positive is its first ``positive_ctxs`` entry; negatives follow
    :func:`choose_step_negatives`, with randomness drawn from ``(seed, epoch, key)`` where
    ``key`` is the question's dataset index (``indices[i]``, default its position i):
    :data:`NEGATIVE_DRAW`. Pass the dataset indices and the whole training set as
    ``pool_for_padding``: a rank then builds exactly its slice of the global batch. Without a
    pool, the fill draws from the positives of this batch. The prefixes are the model's prompts
    (see :mod:`dpr_cache.data.tokenize`). With ``teacher_scores``, each passage row's
    ``teacher_score`` goes with the batch (a row without one raises ValueError: the training
    files are checked for them when they are loaded). ``guide`` (a
    :class:`~dpr_cache.model.guide.GuideText`): the rows tokenized for the guide model too.
    """
    if indices is not None and len(indices) != len(examples):
        raise ValueError("indices must match examples in length")
    keys = list(indices) if indices is not None else list(range(len(examples)))
    pool: ExamplePool = examples if pool_for_padding is None else pool_for_padding
    if hasattr(pool, "select_columns"):  # a datasets.Dataset: decode only the column we need
        pool = pool.select_columns(["positive_ctxs"])
    titles: list[str] = []
    texts: list[str] = []
    pids: list[int] = []
    scores: list[float] = []
    for example, key in zip(examples, keys, strict=True):
        group = [example["positive_ctxs"][0]]
        group += choose_step_negatives(
            example, hard_negatives, negatives_rng(seed, epoch, key), pool, own_negatives
        )
        for ctx in group:
            titles.append(ctx["title"])
            texts.append(ctx["text"])
            pids.append(passage_hash(ctx["passage_id"]))
        if teacher_scores:
            scores += _teacher_scores(example, group, key)
    questions = [example["question"] for example in examples]
    pids, duplicates = _one_id_a_text(titles, texts, pids)
    if not isinstance(passage_prefix, str):
        passage_prefix = [p for p in passage_prefix for _ in range(1 + max(hard_negatives, 0))]
    guide_inputs = None
    if guide is not None:
        guide_inputs = (
            encode_questions(
                guide.tokenizer, questions, max_query_length, None, guide.query_prefix
            ),
            encode_passages(
                guide.tokenizer, titles, texts, max_passage_length, None, guide.passage_prefix
            ),
        )
    return Batch(
        q_inputs=encode_questions(
            tokenizer, questions, max_query_length, pad_to_multiple_of, query_prefix
        ),
        p_inputs=encode_passages(
            tokenizer, titles, texts, max_passage_length, pad_to_multiple_of, passage_prefix
        ),
        p_ids=torch.tensor(pids, dtype=torch.long),
        n_questions=len(examples),
        group_size=1 + max(hard_negatives, 0),
        teacher_scores=torch.tensor(scores, dtype=torch.float64) if teacher_scores else None,
        guide_inputs=guide_inputs,
        text_duplicates=duplicates,
    )


def _one_id_a_text(titles: list[str], texts: list[str], pids: list[int]) -> tuple[list[int], int]:
    """The rows' passage ids with every text under its first row's id, and how many rows that
    changed (a passage two sources give different ids)."""
    first: dict[tuple[str, str], int] = {}
    out, changed = [], 0
    for pair, pid in zip(zip(titles, texts, strict=True), pids, strict=True):
        kept = first.setdefault(pair, pid)
        changed += kept != pid
        out.append(kept)
    return out, changed


def _teacher_scores(example: Mapping[str, Any], group: list, key: int) -> list[float]:
    """The teacher's score of each passage of a question's group; the group's ctxs must be the
    question's own (a fill from other questions has no score for this one)."""
    own = [example["positive_ctxs"][0], *(example.get("hard_negative_ctxs") or [])]
    out = []
    for ctx in group:
        score = ctx.get("teacher_score")
        if score is None or not any(ctx is c or ctx == c for c in own):
            raise ValueError(
                f"question {key}: a passage of its group has no teacher score for it "
                f"({ctx.get('passage_id')!r})"
            )
        out.append(float(score))
    return out
