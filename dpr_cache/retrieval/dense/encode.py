"""Texts to vectors with a loaded BiEncoder, in inference mode: passages in length-sorted batches
(each padded to its longest), questions in order. Tokenization is :mod:`dpr_cache.data.tokenize`'s,
the same as training's; a corpus is tokenized and padded into its batches in ``DataLoader``
workers, a chunk ahead of the model, and written as store shards.

The batches go to the device and the vectors come back as :mod:`dpr_cache.runtime.overlap`
moves them: on CUDA through pinned memory without a host wait per batch, so the next batch is
sent while the device encodes the one before; on the CPU by plain copies, the same bits."""

from __future__ import annotations

from collections.abc import Callable, Iterator, Sequence
from pathlib import Path
from typing import Any, NamedTuple

import numpy as np
import torch

from dpr_cache.config import default_of
from dpr_cache.data.tokenize import Features, encode_questions, pad, tokenize_passages
from dpr_cache.errors import InputError
from dpr_cache.model.biencoder import BiEncoder
from dpr_cache.retrieval.dense.store import write_shard
from dpr_cache.runtime.device import autocast
from dpr_cache.runtime.overlap import HostRows, Transfer, to_device
from dpr_cache.runtime.processes import worker_init

__all__ = [
    "encode_passage_texts",
    "encode_tokenized",
    "encode_question_texts",
    "encode_corpus",
    "encode_corpus_tokens",
    "question_tokens",
    "padded_batches",
    "CHUNK_ROWS",
]

CHUNK_ROWS = 8192
"""Passages tokenized together (in a worker) and sorted by length into batches."""

Batch = tuple[np.ndarray, dict[str, np.ndarray]]
"""A batch of passages: its rows (of the tokenized texts) and their padded inputs (int64)."""


def padded_batches(
    tokenizer, feats: Features, *, batch_size: int, max_length: int, sort_by_length: bool = True
) -> list[Batch]:
    """Tokenized (title, text) pairs cut into batches and padded: with ``sort_by_length``,
    batches of similar length (longest first), each padded to its longest; otherwise batches
    in input order padded to ``max_length``, as DPR does. The inputs are numpy arrays, so
    that a loader worker hands them over by value."""
    n = len(feats["input_ids"])
    lengths = np.fromiter((len(s) for s in feats["input_ids"]), dtype=np.int64, count=n)
    order = np.argsort(-lengths, kind="stable") if sort_by_length else np.arange(n)
    batches = []
    for start in range(0, n, batch_size):
        rows = order[start : start + batch_size]
        width = int(lengths[rows].max()) if sort_by_length else max_length
        inputs = pad(tokenizer, feats, rows, width=width)
        batches.append((rows, {key: value.numpy() for key, value in inputs.items()}))
    return batches


def _encode_batches(
    model: BiEncoder,
    batches: list[Batch],
    results: HostRows,
    *,
    device: torch.device,
    precision: str,
    offset: int = 0,
) -> None:
    """Each batch's passage vectors (float32) put into ``results`` at its rows + ``offset``."""
    with torch.inference_mode(), autocast(device, precision):
        for rows, inputs in batches:
            tensors = {key: torch.from_numpy(value) for key, value in inputs.items()}
            reps = model.encode_passage(to_device(tensors, device, results.transfer))
            results.put(rows + offset, reps.float())


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
    transfer: Transfer | None = None,
) -> np.ndarray:
    """Passage embeddings [n, dim] (float32, input order) of tokenized (title, text) pairs, in
    the batches of :func:`padded_batches`. ``precision`` (fp32 | bf16 | fp16) is the autocast
    the encoder runs under; ``on_batch(rows)`` follows each batch whose vectors are in;
    ``transfer`` (default: the device's, :func:`~dpr_cache.runtime.overlap.transfer_for`) how
    batches travel. A multi-vector model is an InputError: its passages are token vectors,
    which go into token shards (:func:`encode_corpus_tokens`), not one row each.
    """
    if model.multi is not None:
        raise InputError(
            "a multi-vector model's passages are token vectors: encoding them one vector a "
            "passage (as validation during training, train.eval_every, does) is not built yet "
            "for multi-vector models"
        )
    n = len(feats["input_ids"])
    out = np.empty((n, model.dim), dtype=np.float32)  # [n, dim]
    results = HostRows(out, device, on_rows=on_batch, transfer=transfer)
    batches = padded_batches(
        model.tokenizer,
        feats,
        batch_size=batch_size,
        max_length=max_length,
        sort_by_length=sort_by_length,
    )
    _encode_batches(model, batches, results, device=device, precision=precision)
    results.finish()
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
    batch_size: int = default_of("eval.batch_size"),
) -> np.ndarray:
    """Question embeddings [n, dim] (float32) from the query tower, each question after the
    model's query prefix, in batches of ``batch_size`` (default ``eval.batch_size``'s), under the
    autocast of ``precision``; a batch is tokenized while the device encodes the one before (on
    CUDA). A multi-vector model's are its token vectors [n, L, dim] (see
    :func:`question_tokens`)."""
    if model.multi is not None:
        return question_tokens(
            model,
            questions,
            max_length=max_length,
            device=device,
            precision=precision,
            batch_size=batch_size,
        )
    out = np.empty((len(questions), model.dim), dtype=np.float32)
    results = HostRows(out, device)
    for start in range(0, len(questions), batch_size):
        inputs = encode_questions(
            model.tokenizer,
            questions[start : start + batch_size],
            max_length,
            prefix=model.query_prefix,
        )
        with torch.inference_mode(), autocast(device, precision):
            reps = model.encode_query(to_device(inputs, device, results.transfer))
            results.put(np.arange(start, start + len(reps)), reps.float())
    results.finish()
    return out


def question_tokens(
    model: BiEncoder,
    questions: Sequence[str],
    *,
    max_length: int,
    device: torch.device,
    precision: str = "fp32",
    batch_size: int = default_of("eval.batch_size"),
) -> np.ndarray:
    """A multi-vector model's question token vectors [n, L, dim] (float32; L the longest
    question's tokens): each question after the model's query prefix, unit vectors for its
    tokens and the zero vector after them (padding), in batches of ``batch_size`` under the
    autocast of ``precision``."""
    parts = []
    for start in range(0, len(questions), batch_size):
        inputs = encode_questions(
            model.tokenizer,
            questions[start : start + batch_size],
            max_length,
            prefix=model.query_prefix,
        )
        with torch.inference_mode(), autocast(device, precision):
            reps = model.encode_query(to_device(inputs, device))
        parts.append(reps.float().cpu().numpy())
    width = max((p.shape[1] for p in parts), default=0)
    out = np.zeros((len(questions), width, model.dim), dtype=np.float32)
    start = 0
    for part in parts:
        out[start : start + len(part), : part.shape[1]] = part
        start += len(part)
    return out


class _Layout(NamedTuple):
    """How a worker tokenizes and pads a chunk's passages."""

    max_length: int
    prefix: str
    batch_size: int
    sort_by_length: bool


class _TokenizedChunks(torch.utils.data.Dataset):
    """Item i: (start row, ids, padded batches) of the i-th chunk of the rows to encode."""

    def __init__(self, dataset, chunks: list[tuple[int, int]], tokenizer, layout: _Layout):
        self.dataset, self.chunks, self.tokenizer, self.layout = dataset, chunks, tokenizer, layout

    def __len__(self) -> int:
        return len(self.chunks)

    def __getitem__(self, i: int):
        start, stop = self.chunks[i]
        rows = self.dataset[start:stop]
        layout = self.layout
        feats = tokenize_passages(
            self.tokenizer, rows["title"], rows["text"], layout.max_length, layout.prefix
        )
        batches = padded_batches(
            self.tokenizer,
            feats,
            batch_size=layout.batch_size,
            max_length=layout.max_length,
            sort_by_length=layout.sort_by_length,
        )
        return start, rows["id"], batches


def _as_given(item):
    """A loader item unchanged: its numpy batches travel by value, not turned into tensors
    shared through a file descriptor each."""
    return item


def encode_corpus(
    model: BiEncoder,
    dataset,
    shards: Sequence[tuple[Path, int, int]],
    *,
    max_length: int,
    batch_size: int,
    device: torch.device,
    precision: str = "fp32",
    store_dtype: str,
    num_workers: int,
    sort_by_length: bool = True,
    on_batch: Callable[[int], Any] | None = None,
    transfer: Transfer | None = None,
) -> None:
    """Encode rows ``[start, start + rows)`` of a passages dataset (columns id, title, text) into
    each shard ``(path, start, rows)``. Tokenizing and padding run ``num_workers`` processes
    ahead (0: inline); the vectors of a shard come back as :class:`HostRows` lets them (on
    CUDA the host waits on the device only when batches pile up, and at the shard's end);
    ``on_batch(rows)`` follows each batch whose vectors are in."""
    layout = _Layout(max_length, model.passage_prefix, batch_size, sort_by_length)
    items = _chunk_items(model, dataset, shards, layout, num_workers, CHUNK_ROWS)
    for path, start, rows in shards:
        embs = np.empty((rows, model.dim), np.float32)
        results = HostRows(embs, device, on_rows=on_batch, transfer=transfer)
        ids: list[str] = []
        done = 0
        while done < rows:
            chunk_start, chunk_ids, batches = next(items)
            assert chunk_start == start + done  # chunks arrive in order
            _encode_batches(
                model, batches, results, device=device, precision=precision, offset=done
            )
            ids += chunk_ids
            done += len(chunk_ids)
        results.finish()
        write_shard(path, embs, ids, store_dtype)


def _chunk_items(
    model: BiEncoder, dataset, shards, layout: _Layout, num_workers: int, chunk_rows: int
) -> Iterator[tuple[int, list[str], list[Batch]]]:
    """The chunks of ``chunk_rows`` passages of the shards ``(path, start, rows)`` in order,
    each ``(start row, ids, padded batches)``, tokenized ``num_workers`` processes ahead (0:
    inline)."""
    chunks = [
        (s, min(s + chunk_rows, start + rows))
        for _, start, rows in shards
        for s in range(start, start + rows, chunk_rows)
    ]
    loader = torch.utils.data.DataLoader(
        _TokenizedChunks(dataset, chunks, model.tokenizer, layout),
        batch_size=None,
        collate_fn=_as_given,
        num_workers=num_workers,
        worker_init_fn=worker_init() if num_workers else None,
        generator=torch.Generator().manual_seed(0),  # leave the global RNG alone
    )
    return iter(loader)


MULTI_CHUNK_BYTES = 256 * 2**20
"""About the most a chunk of a multi-vector corpus holds of token vectors before it is written:
its passages are fewer than :data:`CHUNK_ROWS` when their tokens are many and wide."""


def encode_corpus_tokens(
    model: BiEncoder,
    dataset,
    shards: Sequence[tuple[Path, int, int]],
    *,
    max_length: int,
    batch_size: int,
    device: torch.device,
    precision: str = "fp32",
    store_dtype: str,
    num_workers: int,
    sort_by_length: bool = True,
    on_batch: Callable[[int], Any] | None = None,
) -> None:
    """:func:`encode_corpus` for a multi-vector model: rows ``[start, start + rows)`` of a
    passages dataset into each token shard ``(path, start, rows)``
    (:func:`~dpr_cache.retrieval.dense.tokens.write_token_shard`: only each passage's scored
    tokens, streamed to disk a chunk at a time)."""
    from dpr_cache.retrieval.dense.tokens import write_token_shard

    itemsize = np.dtype(store_dtype).itemsize
    chunk_rows = MULTI_CHUNK_BYTES // max(max_length * model.dim * itemsize, 1)
    chunk_rows = max(batch_size, min(CHUNK_ROWS, chunk_rows))
    layout = _Layout(max_length, model.passage_prefix, batch_size, sort_by_length)
    items = _chunk_items(model, dataset, shards, layout, num_workers, chunk_rows)
    for path, start, rows in shards:

        def pieces(start: int = start, rows: int = rows):
            done = 0
            while done < rows:
                chunk_start, chunk_ids, batches = next(items)
                assert chunk_start == start + done  # chunks arrive in order
                tokens, lengths = _token_batches(
                    model, batches, len(chunk_ids), device, precision, store_dtype, on_batch
                )
                yield chunk_ids, tokens, lengths
                done += len(chunk_ids)

        write_token_shard(path, pieces(), store_dtype)


def _token_batches(
    model: BiEncoder,
    batches: list[Batch],
    n: int,
    device: torch.device,
    precision: str,
    store_dtype: str,
    on_batch: Callable[[int], Any] | None,
) -> tuple[np.ndarray, np.ndarray]:
    """A chunk's ``n`` passages encoded: their scored (non-zero) token vectors one passage
    after another in row order ([t, dim], ``store_dtype``) and each passage's count."""
    pieces: list[np.ndarray | None] = [None] * n
    dtype = torch.float16 if store_dtype == "float16" else torch.float32
    with torch.inference_mode(), autocast(device, precision):
        for rows, inputs in batches:
            tensors = {key: torch.from_numpy(value) for key, value in inputs.items()}
            reps = model.encode_passage(to_device(tensors, device)).float()  # [b, L, dim]
            keep = reps.ne(0).any(dim=-1)
            flat = reps[keep].to(dtype).cpu().numpy()
            counts = keep.sum(dim=1).cpu().numpy()
            parts = np.split(flat, np.cumsum(counts)[:-1])
            for row, part in zip(rows.tolist(), parts, strict=True):
                pieces[row] = part
            if on_batch is not None:
                on_batch(len(rows))
    lengths = np.array([len(p) for p in pieces], np.int64)
    return np.concatenate(pieces), lengths
