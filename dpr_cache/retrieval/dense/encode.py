"""Texts to vectors with a loaded BiEncoder, in inference mode: passages in length-sorted batches
(each padded to its longest), questions in order. Tokenization is :mod:`dpr_cache.data.tokenize`'s,
the same as training's; a corpus is tokenized in ``DataLoader`` workers, a chunk ahead of the
model, and written as store shards."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import numpy as np
import torch

from dpr_cache.data.tokenize import Features, encode_questions, pad, tokenize_passages
from dpr_cache.model.biencoder import BiEncoder
from dpr_cache.retrieval.dense.store import write_shard
from dpr_cache.runtime.device import autocast
from dpr_cache.runtime.processes import worker_init

__all__ = [
    "encode_passage_texts",
    "encode_tokenized",
    "encode_question_texts",
    "encode_corpus",
    "CHUNK_ROWS",
]

CHUNK_ROWS = 8192
"""Passages tokenized together (in a worker) and sorted by length into batches."""


def encode_tokenized(
    model: BiEncoder,
    feats: Features,
    *,
    max_length: int,
    batch_size: int,
    device: torch.device,
    precision: str = "fp32",
    sort_by_length: bool = True,
    on_batch: Callable[[int], Any] | None = None,
) -> np.ndarray:
    """Passage embeddings [n, dim] (float32, input order) of tokenized (title, text) pairs.

    ``sort_by_length``: batches of similar length (longest first), each padded to its longest;
    otherwise batches in input order padded to ``max_length``, as DPR does. ``precision``
    (fp32 | bf16 | fp16) is the autocast the encoder runs under.
    """
    n = len(feats["input_ids"])
    lengths = np.fromiter((len(s) for s in feats["input_ids"]), dtype=np.int64, count=n)
    order = np.argsort(-lengths, kind="stable") if sort_by_length else np.arange(n)
    out = np.empty((n, model.dim), dtype=np.float32)  # [n, dim]
    with torch.inference_mode(), autocast(device, precision):
        for start in range(0, n, batch_size):
            rows = order[start : start + batch_size]
            width = int(lengths[rows].max()) if sort_by_length else max_length
            inputs = pad(model.tokenizer, feats, rows, width=width)
            reps = model.encode_passage({k: v.to(device) for k, v in inputs.items()})
            out[rows] = reps.float().cpu().numpy()
            if on_batch is not None:
                on_batch(len(rows))
    return out


def encode_passage_texts(
    model: BiEncoder, titles: Sequence[str], texts: Sequence[str], *, max_length: int, **kwargs
) -> np.ndarray:
    """Passage embeddings [n, dim] of (title, text) pairs, after the model's passage prefix; see
    :func:`encode_tokenized`."""
    feats = tokenize_passages(model.tokenizer, titles, texts, max_length, model.passage_prefix)
    return encode_tokenized(model, feats, max_length=max_length, **kwargs)


def encode_question_texts(
    model: BiEncoder,
    questions: Sequence[str],
    *,
    max_length: int,
    device: torch.device,
    precision: str = "fp32",
    batch_size: int = 128,
) -> np.ndarray:
    """Question embeddings [n, dim] (float32) from the query tower, each question after the
    model's query prefix, in batches of ``batch_size``, under the autocast of ``precision``."""
    out = np.empty((len(questions), model.dim), dtype=np.float32)
    for start in range(0, len(questions), batch_size):
        inputs = encode_questions(
            model.tokenizer,
            questions[start : start + batch_size],
            max_length,
            prefix=model.query_prefix,
        )
        with torch.inference_mode(), autocast(device, precision):
            reps = model.encode_query({k: v.to(device) for k, v in inputs.items()})
        out[start : start + len(reps)] = reps.float().cpu().numpy()
    return out


class _TokenizedChunks(torch.utils.data.Dataset):
    """Item i: (start row, ids, tokenized pairs) of the i-th chunk of the rows to encode."""

    def __init__(self, dataset, chunks: list[tuple[int, int]], tokenizer, max_length: int, prefix):
        self.dataset, self.chunks = dataset, chunks
        self.tokenizer, self.max_length, self.prefix = tokenizer, max_length, prefix

    def __len__(self) -> int:
        return len(self.chunks)

    def __getitem__(self, i: int):
        start, stop = self.chunks[i]
        rows = self.dataset[start:stop]
        feats = tokenize_passages(
            self.tokenizer, rows["title"], rows["text"], self.max_length, self.prefix
        )
        return start, rows["id"], feats


def encode_corpus(
    model: BiEncoder,
    dataset,
    shards: Sequence[tuple[Path, int, int]],
    *,
    max_length: int,
    batch_size: int,
    device: torch.device,
    precision: str = "fp32",
    store_dtype: str = "float16",
    num_workers: int = 1,
    sort_by_length: bool = True,
    on_batch: Callable[[int], Any] | None = None,
) -> None:
    """Encode rows ``[start, start + rows)`` of a passages dataset (columns id, title, text) into
    each shard ``(path, start, rows)``; tokenization runs ``num_workers`` processes ahead."""
    chunks = [
        (s, min(s + CHUNK_ROWS, start + rows))
        for _, start, rows in shards
        for s in range(start, start + rows, CHUNK_ROWS)
    ]
    loader = torch.utils.data.DataLoader(
        _TokenizedChunks(dataset, chunks, model.tokenizer, max_length, model.passage_prefix),
        batch_size=None,
        num_workers=num_workers,
        worker_init_fn=worker_init() if num_workers else None,
        generator=torch.Generator().manual_seed(0),  # leave the global RNG alone
    )
    items = iter(loader)
    for path, start, rows in shards:
        embs = np.empty((rows, model.dim), np.float32)
        ids: list[str] = []
        done = 0
        while done < rows:
            chunk_start, chunk_ids, feats = next(items)
            assert chunk_start == start + done  # chunks arrive in order
            embs[done : done + len(chunk_ids)] = encode_tokenized(
                model,
                feats,
                max_length=max_length,
                batch_size=batch_size,
                device=device,
                precision=precision,
                sort_by_length=sort_by_length,
                on_batch=on_batch,
            )
            ids += chunk_ids
            done += len(chunk_ids)
        write_shard(path, embs, ids, store_dtype)
