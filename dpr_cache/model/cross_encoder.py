"""A Hugging Face cross-encoder as a teacher: one relevance score for each (question, passage)
pair, read from a sequence-classification model folder.

The pair is encoded as ``(question, passage)``, the passage being ``title + " " + text`` (the text
alone when there is no title), with only the passage truncated (``truncation="only_second"``); a
pair whose question alone is over the limit falls back to ``longest_first``. The score is the
model's logit:

- one label: that logit (what sentence-transformers' ``CrossEncoder`` ranks by, before its
  sigmoid);
- two labels: the logit of label 1 (relevant) minus the logit of label 0 (not relevant). That is
  the log-odds whose sigmoid is the softmax probability of label 1, so it ranks pairs as the
  two-label rerankers do (softmax or log-softmax of label 1), in the units of a one-label logit,
  and it does not flatten towards 0 among confident positives as a log-probability does;
- any other number of labels is refused.

Pairs are scored a group at a time (the caller streams a file in groups, so memory is bounded by
the group): tokenized once, sorted by token length (longest first) into batches, each padded to
its longest, run in inference mode under the autocast of the precision asked for
(:mod:`dpr_cache.runtime.device`), and returned in input order. A caller may tokenize a group
ahead (:func:`tokenize_pairs`) while the model scores the one before.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, NamedTuple

import numpy as np
import torch
from safetensors import SafetensorError
from torch import Tensor
from transformers import AutoConfig, AutoModelForSequenceClassification, PreTrainedModel

from dpr_cache.data.tokenize import pad, tokenize_text_pairs
from dpr_cache.errors import InputError
from dpr_cache.model.hub import ModelNotFound, resolve_model_path
from dpr_cache.model.towers import load_tokenizer
from dpr_cache.runtime.device import autocast, resolve_device
from dpr_cache.runtime.overlap import HostRows, Transfer, to_device

__all__ = [
    "Pair",
    "CrossEncoder",
    "NonFiniteScore",
    "load_cross_encoder",
    "passage_text",
    "tokenize_pairs",
    "relevance",
    "score_pairs",
    "DEFAULT_MAX_LENGTH",
    "PAIRS_A_FORWARD",
]

DEFAULT_MAX_LENGTH = 512
"""The token limit of a pair when the tokenizer records none (capped by the model's positions)."""
PAIRS_A_FORWARD = 64
"""Pairs a forward when no batch size is given (``score --batch-size``'s default)."""

_UNSET_LIMIT = 1_000_000  # tokenizers without a limit report a huge model_max_length


class Pair(NamedTuple):
    """A question and a passage (its title may be None or empty)."""

    question: str
    title: str | None
    text: str


class NonFiniteScore(InputError):
    """The cross-encoder scored a pair inf or NaN; ``index`` is the pair's place in the group."""

    def __init__(self, message: str, index: int) -> None:
        super().__init__(message)
        self.index = index


@dataclass(frozen=True)
class CrossEncoder:
    """A loaded cross-encoder: the model (eval mode, float32 weights, on ``device``), its
    tokenizer, its folder and the token limit of a pair."""

    path: Path
    model: PreTrainedModel
    tokenizer: Any
    max_length: int
    device: torch.device

    @property
    def num_labels(self) -> int:
        return self.model.config.num_labels


def passage_text(title: str | None, text: str) -> str:
    """The passage side of a pair: ``title + " " + text``, or ``text`` when the title is blank."""
    return f"{title} {text}" if title and title.strip() else text


def load_cross_encoder(
    path: str | Path, *, max_length: int | None = None, device: str | torch.device = "auto"
) -> CrossEncoder:
    """The cross-encoder in ``path`` (a folder, or a name :func:`resolve_model_path` finds).

    ``max_length`` defaults to the tokenizer's limit, else :data:`DEFAULT_MAX_LENGTH` capped by
    the model's positions. Raises InputError, one line naming the folder, for a folder that is not
    a ``*ForSequenceClassification`` model with a trained head of 1 or 2 labels and a tokenizer.
    """
    try:
        folder = resolve_model_path(path)
    except ModelNotFound as e:
        raise InputError(f"cross-encoder: {e}") from None
    config = _cross_encoder_config(folder)
    try:
        tokenizer = load_tokenizer(folder)
        model, info = AutoModelForSequenceClassification.from_pretrained(
            folder, config=config, dtype=torch.float32, output_loading_info=True
        )
    except (OSError, ValueError, SafetensorError) as e:  # unreadable weights or tokenizer files
        msg = " ".join(str(e).split())[:200]
        raise InputError(f"{folder}: cannot load the cross-encoder ({msg})") from None
    if tokenizer is None:
        raise InputError(f"{folder}: no tokenizer files in the cross-encoder folder")
    limit = _model_limit(config, tokenizer)
    if max_length is None:
        max_length = limit or DEFAULT_MAX_LENGTH
    elif max_length < 1 or (limit is not None and max_length > limit):
        raise InputError(f"{folder}: max length {max_length} is outside 1..{limit} for this model")
    if info["missing_keys"]:
        missing = ", ".join(sorted(info["missing_keys"])[:3])
        raise InputError(f"{folder}: not a cross-encoder: no trained classifier head ({missing})")
    device = resolve_device(device)
    return CrossEncoder(folder, model.to(device).eval(), tokenizer, max_length, device)


def _cross_encoder_config(folder: Path):
    """The folder's config if it names a sequence classifier of 1 or 2 labels; else InputError."""
    if not folder.exists():
        raise InputError(f"{folder}: no such cross-encoder folder")
    if not (folder / "config.json").is_file():
        kind = "a bi-encoder folder" if (folder / "query_encoder").is_dir() else "no config.json"
        raise InputError(f"{folder}: not a cross-encoder folder ({kind})")
    try:
        config = AutoConfig.from_pretrained(folder)
    except (OSError, ValueError) as e:
        msg = " ".join(str(e).split())[:200]
        raise InputError(f"{folder}: cannot read the cross-encoder's config ({msg})") from None
    names = list(getattr(config, "architectures", None) or [])
    if not any(name.endswith("ForSequenceClassification") for name in names):
        named = ", ".join(names) if names else "no architecture"
        raise InputError(
            f"{folder}: not a cross-encoder: its config.json names {named}, "
            "not a *ForSequenceClassification model"
        )
    if config.num_labels not in (1, 2):
        raise InputError(
            f"{folder}: a cross-encoder of {config.num_labels} labels: a teacher needs 1 (its "
            "logit) or 2 (label 1's logit minus label 0's)"
        )
    return config


def _model_limit(config, tokenizer) -> int | None:
    """The longest pair the model takes: the tokenizer's limit, else min(512, positions)."""
    if 0 < tokenizer.model_max_length < _UNSET_LIMIT:
        return int(tokenizer.model_max_length)
    positions = getattr(config, "max_position_embeddings", None)
    return min(DEFAULT_MAX_LENGTH, positions) if positions else None


def tokenize_pairs(
    tokenizer: Any, pairs: Sequence[Pair], max_length: int
) -> dict[str, list[list[int]]]:
    """Unpadded token ids (and masks, token types) of each ``(question, passage_text)`` pair,
    truncating the passage; a pair whose question alone is too long falls back to
    ``longest_first``."""
    questions = [p.question for p in pairs]
    passages = [passage_text(p.title, p.text) for p in pairs]
    return tokenize_text_pairs(tokenizer, questions, passages, max_length)


def relevance(logits: Tensor) -> Tensor:
    """Scores [n] (float32) from logits [n, 1] (the logit) or [n, 2] (label 1's minus label 0's)."""
    logits = logits.float()
    if logits.shape[-1] == 1:
        return logits[:, 0]
    if logits.shape[-1] == 2:
        return logits[:, 1] - logits[:, 0]
    raise ValueError(f"a cross-encoder score needs 1 or 2 logits a pair, got {logits.shape[-1]}")


def score_pairs(
    encoder: CrossEncoder,
    pairs: Iterable[Pair],
    *,
    batch_size: int = PAIRS_A_FORWARD,
    precision: str = "fp32",
    features: dict[str, list[list[int]]] | None = None,
    transfer: Transfer | None = None,
) -> np.ndarray:
    """Scores [n] (float32, input order) of one group of pairs; see the module docstring.

    ``precision`` (fp32 | bf16 | fp16) is the autocast the model runs under. ``features``: the
    pairs as :func:`tokenize_pairs` gave them, when tokenized already (None: tokenized here).
    The batches travel as ``transfer`` says (default: the device's,
    :func:`~dpr_cache.runtime.overlap.transfer_for`: on CUDA the host pads and sends the next
    batch while the model runs). Raises :class:`NonFiniteScore` for a score that is inf or
    NaN, naming the folder, the pair's index in the group and its question.
    """
    if batch_size < 1:
        raise ValueError(f"batch_size must be at least 1, got {batch_size}")
    pairs = list(pairs)
    scores = np.empty(len(pairs), dtype=np.float32)
    if not pairs:
        return scores
    if features is None:
        features = tokenize_pairs(encoder.tokenizer, pairs, encoder.max_length)
    lengths = np.array([len(ids) for ids in features["input_ids"]], dtype=np.int64)
    if len(lengths) != len(pairs):
        raise ValueError(f"features of {len(lengths)} pairs given for {len(pairs)} pairs")
    order = np.argsort(-lengths, kind="stable")
    results = HostRows(scores, encoder.device, transfer=transfer)
    with torch.inference_mode(), autocast(encoder.device, precision):
        for start in range(0, len(pairs), batch_size):
            rows = order[start : start + batch_size]
            batch = to_device(
                pad(encoder.tokenizer, features, rows), encoder.device, results.transfer
            )
            results.put(rows, relevance(encoder.model(**batch).logits))
    results.finish()
    _check_finite(encoder, pairs, scores, precision)
    return scores


def _check_finite(
    encoder: CrossEncoder, pairs: list[Pair], scores: np.ndarray, precision: str
) -> None:
    bad = np.flatnonzero(~np.isfinite(scores))
    if bad.size:
        i = int(bad[0])
        hint = " (fp16 may overflow: try bf16 or fp32)" if precision == "fp16" else ""
        raise NonFiniteScore(
            f"{encoder.path}: the cross-encoder scored pair {i} of the group "
            f"(question {pairs[i].question[:80]!r}) {scores[i]} under {precision}{hint}; "
            f"{bad.size} of {len(pairs)} scores are not finite",
            i,
        )
