"""Synthetic data at NQ's size, in NQ's structure, for the scale benchmark (nothing real can be
downloaded here): clustered unit vectors as store shards, a passages TSV of DPR's wiki layout,
qas questions whose answers occur in known passages, and training JSON of DPR's shape."""

from __future__ import annotations

import csv
import json
from pathlib import Path

import numpy as np

from dpr_cache.retrieval.dense.store import write_shard
from dpr_cache.runtime.atomic import write_atomic

__all__ = [
    "write_vectors",
    "write_queries",
    "write_passages_tsv",
    "write_qas",
    "write_train_json",
    "write_mine_train",
]

WORDS = (
    "river stone castle music engine forest harbor winter garden bridge planet signal season "
    "village mountain island empire theory voltage protein treaty painter novel cathedral "
    "railway desert glacier orbit senate harvest comet dynasty canal ferment lantern meadow"
).split()


def _unit(rows: np.ndarray) -> np.ndarray:
    return rows / np.linalg.norm(rows, axis=1, keepdims=True)


def _centers(dim: int, n: int = 4096) -> np.ndarray:
    return _unit(np.random.default_rng(12345).standard_normal((n, dim)).astype(np.float32))


def write_vectors(folder: Path, rows: int, dim: int, shard_rows: int) -> list[Path]:
    """Clustered unit vectors (4,096 centers, unit noise of weight 0.6) in float16 shards
    ``part-00000.npy`` ...; ids are the row numbers from 1 (as DPR's passage ids). Shards that
    exist are kept, so a cut run resumes."""
    centers = _centers(dim)
    paths = []
    for k, start in enumerate(range(0, rows, shard_rows)):
        path = Path(folder) / f"part-{k:05d}.npy"
        paths.append(path)
        if path.is_file():
            continue
        n = min(shard_rows, rows - start)
        rng = np.random.default_rng(k)
        noise = _unit(rng.standard_normal((n, dim)).astype(np.float32))
        vectors = _unit(centers[rng.integers(len(centers), size=n)] + 0.6 * noise)
        write_shard(path, vectors, [str(start + i + 1) for i in range(n)], "float16")
    return paths


def write_queries(path: Path, n: int, dim: int) -> Path:
    """``n`` random unit queries from the vectors' distribution (float32, ids their rows)."""
    rng = np.random.default_rng(777)
    centers = _centers(dim)
    noise = _unit(rng.standard_normal((n, dim)).astype(np.float32))
    queries = _unit(centers[rng.integers(len(centers), size=n)] + 0.6 * noise)
    write_shard(path, queries, [str(i) for i in range(n)], "float32")
    return path


def _text(rng: np.random.Generator, n_words: int, pid: int) -> str:
    words = rng.choice(WORDS, size=n_words).tolist()
    words[n_words // 2] = f"answer{pid}"  # every passage holds a findable answer of its own
    return " ".join(words)


def write_passages_tsv(path: Path, rows: int, words: int = 100, block: int = 100_000) -> Path:
    """DPR's wiki TSV (``id<TAB>text<TAB>title``), ids 1..rows, ~``words`` words a passage."""

    def write(tmp: Path) -> None:
        rng = np.random.default_rng(0)
        with open(tmp, "w", encoding="utf-8", newline="") as f:
            out = csv.writer(f, delimiter="\t", lineterminator="\n")
            out.writerow(["id", "text", "title"])
            for start in range(0, rows, block):
                for pid in range(start + 1, min(rows, start + block) + 1):
                    out.writerow([pid, _text(rng, words, pid), f"Title {pid % 997}"])

    write_atomic(path, write)
    return path


def write_qas(path: Path, n: int, rows: int) -> Path:
    """``n`` questions, question i asking for the answer of passage ``1 + i * rows // n``."""
    step = max(1, rows // n)
    lines = [
        f'what is answer{1 + i * step} of the river?\t["answer{1 + i * step}"]\n' for i in range(n)
    ]
    write_atomic(path, lambda tmp: tmp.write_text("".join(lines), encoding="utf-8"))
    return path


def write_train_json(path: Path, target_bytes: int, contexts: int = 100) -> int:
    """A DPR training JSON array of about ``target_bytes``: each question with 1 positive,
    ``contexts // 2`` hard negatives and the rest negatives (~100-word passages). Returns the
    number of questions."""
    count = 0

    def write(tmp: Path) -> None:
        nonlocal count
        rng = np.random.default_rng(1)
        with open(tmp, "w", encoding="utf-8") as f:
            f.write("[")
            written = 1
            while written < target_bytes:
                ctxs = [
                    {
                        "title": f"Title {j}",
                        "text": _text(rng, 100, count * 1000 + j),
                        "score": 1.0,
                        "title_score": 0,
                        "passage_id": str(count * 1000 + j),
                    }
                    for j in range(contexts)
                ]
                obj = {
                    "dataset": "synthetic_nq",
                    "question": f"what is answer{count * 1000} of the river?",
                    "answers": [f"answer{count * 1000}"],
                    "positive_ctxs": ctxs[:1],
                    "negative_ctxs": ctxs[1 + contexts // 2 :],
                    "hard_negative_ctxs": ctxs[1 : 1 + contexts // 2],
                }
                text = ("," if count else "") + json.dumps(obj)
                f.write(text)
                written += len(text)
                count += 1
            f.write("]")

    write_atomic(path, write)
    return count


def write_mine_train(path: Path, n: int, passages_tsv: Path, contexts: int = 100) -> Path:
    """A DPR training JSON array of ``n`` questions in NQ's shape (1 positive, ``contexts // 2``
    hard negatives, the rest negatives) whose positives are rows of ``passages_tsv`` (as written
    there: id, title, text), so that a model's index over that file can mine them."""
    with open(passages_tsv, encoding="utf-8", newline="") as f:
        corpus = list(csv.reader(f, delimiter="\t"))[1:]  # [id, text, title]; a small file

    def write(tmp: Path) -> None:
        rng = np.random.default_rng(2)
        with open(tmp, "w", encoding="utf-8") as f:
            f.write("[")
            for i in range(n):
                pid, text, title = corpus[(i * 7919) % len(corpus)]
                ctxs = [
                    {
                        "title": f"Title {j}",
                        "text": _text(rng, 100, 10**9 + i * 1000 + j),
                        "score": 1.0,
                        "title_score": 0,
                        "passage_id": f"x{i}-{j}",
                    }
                    for j in range(1, contexts)
                ]
                obj = {
                    "dataset": "synthetic_nq",
                    "question": f"what is answer{pid} of the river?",
                    "answers": [f"answer{pid}"],
                    "positive_ctxs": [
                        {
                            "title": title,
                            "text": text,
                            "score": 1.0,
                            "title_score": 0,
                            "passage_id": pid,
                        }
                    ],
                    "negative_ctxs": ctxs[contexts // 2 :],
                    "hard_negative_ctxs": ctxs[: contexts // 2],
                }
                f.write(("," if i else "") + json.dumps(obj))
            f.write("]")

    write_atomic(path, write)
    return path
