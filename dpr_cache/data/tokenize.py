"""The one tokenization of questions, of passages and of text pairs (the cross-encoder's
(question, passage)), for training, indexing, encode, eval and score.

Questions are encoded alone; passages as DPR encodes them, the pair ``(title, text)``, truncating
the text (``truncation="only_second"``). A pair whose title alone is longer than the limit cannot
be cut that way and falls back to ``longest_first`` on its own. Texts are tokenized unpadded
(:func:`tokenize_questions`, :func:`tokenize_passages`) and padded into tensors by :func:`pad`,
so that a batch can be cut or reordered before padding (length-sorted corpus encoding). A model's
prompts (``model.query_prefix``, ``model.passage_prefix``, as E5 and BGE models need) are added
here only: a question starts with the query prefix, a passage pair's first text with the passage
prefix.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import numpy as np
import torch
from torch import Tensor

__all__ = [
    "Features",
    "tokenize_questions",
    "tokenize_passages",
    "tokenize_text_pairs",
    "pad",
    "encode_questions",
    "encode_passages",
]

Features = dict[str, list[list[int]]]
"""Unpadded token ids and their companions (attention_mask, token_type_ids), a list a text."""


Prefix = str | Sequence[str]
"""A prompt for every text, or one a text (rows of several training sources)."""


def _prefixed(prefix: Prefix, texts: Sequence[str]) -> list[str]:
    if isinstance(prefix, str):
        return [prefix + t for t in texts]
    return [p + t for p, t in zip(prefix, texts, strict=True)]


def tokenize_questions(
    tokenizer: Any, questions: Sequence[str], max_length: int, prefix: Prefix = ""
) -> Features:
    """Questions alone, each after ``prefix`` (a model's query prompt, e.g. ``"query: "``),
    truncated to ``max_length`` tokens, unpadded."""
    texts = _prefixed(prefix, questions)
    return dict(tokenizer(texts, max_length=max_length, truncation=True, padding=False))


def tokenize_passages(
    tokenizer: Any,
    titles: Sequence[str],
    texts: Sequence[str],
    max_length: int,
    prefix: Prefix = "",
) -> Features:
    """``(title, text)`` pairs truncating the text, unpadded (see the module docstring);
    ``prefix`` (a model's passage prompt) goes before the pair's first text, the title, as
    sentence-transformers applies a prompt to a pair."""
    return tokenize_text_pairs(tokenizer, _prefixed(prefix, titles), texts, max_length)


def tokenize_text_pairs(
    tokenizer: Any, firsts: Sequence[str], seconds: Sequence[str], max_length: int
) -> Features:
    """``(first, second)`` pairs truncating the second, unpadded; a pair whose first text alone
    is over ``max_length`` falls back to ``longest_first`` (fast tokenizers raise rather than
    cut it), the pair on its own."""
    firsts, seconds = list(firsts), list(seconds)
    kwargs: dict[str, Any] = {"max_length": max_length, "padding": False}
    try:
        return dict(tokenizer(firsts, seconds, truncation="only_second", **kwargs))
    except Exception:  # fast tokenizers raise a bare Exception ("Truncation error: ...")
        pass
    rows = []
    for first, second in zip(firsts, seconds, strict=True):
        try:
            rows.append(tokenizer(first, second, truncation="only_second", **kwargs))
        except Exception:
            rows.append(tokenizer(first, second, truncation="longest_first", **kwargs))
    return {key: [row[key] for row in rows] for key in rows[0]}


def _pad_values(tokenizer: Any) -> dict[str, int]:
    pad_id = tokenizer.pad_token_id if tokenizer.pad_token_id is not None else 0
    return {"input_ids": pad_id, "token_type_ids": getattr(tokenizer, "pad_token_type_id", 0)}


def pad(
    tokenizer: Any,
    features: Features,
    rows: Sequence[int] | np.ndarray | None = None,
    *,
    width: int | None = None,
    pad_to_multiple_of: int | None = None,
) -> dict[str, Tensor]:
    """int64 tensors [len(rows), width] of the selected rows (default all), padded on the
    tokenizer's side: input_ids with its pad id, token_type_ids with its pad type, others 0.

    ``width`` defaults to the longest selected row, rounded up to ``pad_to_multiple_of``.
    """
    ids = features["input_ids"]
    rows = np.arange(len(ids)) if rows is None else np.asarray(rows, dtype=np.int64)
    lengths = [len(ids[r]) for r in rows]
    if width is None:
        width = max(lengths, default=0)
        if pad_to_multiple_of:
            width = -(-width // pad_to_multiple_of) * pad_to_multiple_of
    left = getattr(tokenizer, "padding_side", "right") == "left"
    values = _pad_values(tokenizer)
    out = {}
    for key, seqs in features.items():
        arr = np.full((len(rows), width), values.get(key, 0), dtype=np.int64)
        for i, r in enumerate(rows):
            seq = seqs[r]
            if left:
                arr[i, width - len(seq) :] = seq
            else:
                arr[i, : len(seq)] = seq
        out[key] = torch.from_numpy(arr)
    return out


def _usable_multiple(max_length: int, multiple: int | None) -> int | None:
    """``multiple`` if it divides ``max_length`` (padding must never pass the limit)."""
    return multiple if multiple and max_length % multiple == 0 else None


def encode_questions(
    tokenizer: Any,
    questions: Sequence[str],
    max_length: int,
    pad_to_multiple_of: int | None = None,
    prefix: Prefix = "",
) -> dict[str, Tensor]:
    """Questions as tensors, padded to the longest (or to a multiple of ``pad_to_multiple_of``)."""
    features = tokenize_questions(tokenizer, questions, max_length, prefix)
    return pad(
        tokenizer, features, pad_to_multiple_of=_usable_multiple(max_length, pad_to_multiple_of)
    )


def encode_passages(
    tokenizer: Any,
    titles: Sequence[str],
    texts: Sequence[str],
    max_length: int,
    pad_to_multiple_of: int | None = None,
    prefix: Prefix = "",
) -> dict[str, Tensor]:
    """``(title, text)`` pairs as tensors, padded to the longest (or a multiple)."""
    features = tokenize_passages(tokenizer, titles, texts, max_length, prefix)
    return pad(
        tokenizer, features, pad_to_multiple_of=_usable_multiple(max_length, pad_to_multiple_of)
    )
