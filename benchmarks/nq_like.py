"""Synthetic data in NQ's structure and size for the scale and mine benchmarks: clustered unit
vectors, a DPR wiki TSV, qas questions answered in known passages, DPR training JSON."""

from __future__ import annotations

import csv
import itertools
import json
import math
from collections.abc import Iterable, Iterator
from pathlib import Path

import numpy as np

from dpr_cache.retrieval.dense.store import write_shard
from dpr_cache.runtime.atomic import write_atomic

WORDS = (
    "river stone castle music engine forest harbor winter garden bridge planet signal season "
    "village mountain island empire theory voltage protein treaty painter novel cathedral "
    "railway desert glacier orbit senate harvest comet dynasty canal ferment lantern meadow"
).split()


def unit(rows: np.ndarray) -> np.ndarray:
    return rows / np.linalg.norm(rows, axis=-1, keepdims=True)


def _clustered(seed: int, n: int, dim: int) -> np.ndarray:
    """``n`` unit vectors about 4,096 fixed centers (unit noise of weight 0.6)."""
    centers = unit(np.random.default_rng(12345).standard_normal((4096, dim)).astype(np.float32))
    rng = np.random.default_rng(seed)
    noise = unit(rng.standard_normal((n, dim)).astype(np.float32))
    return unit(centers[rng.integers(len(centers), size=n)] + 0.6 * noise)


def write_vectors(folder: Path, rows: int, dim: int, shard_rows: int) -> list[Path]:
    """Float16 shards ``part-00000.npy`` ..., ids the rows from 1; existing shards are kept."""
    paths = []
    for k, start in enumerate(range(0, rows, shard_rows)):
        paths.append(Path(folder) / f"part-{k:05d}.npy")
        if not paths[-1].is_file():
            n = min(shard_rows, rows - start)
            ids = [str(start + i + 1) for i in range(n)]
            write_shard(paths[-1], _clustered(k, n, dim), ids, "float16")
    return paths


def write_queries(path: Path, n: int, dim: int) -> Path:
    write_shard(path, _clustered(777, n, dim), [str(i) for i in range(n)], "float32")
    return path


def _text(rng: np.random.Generator, n_words: int, pid: int) -> str:
    words = rng.choice(WORDS, size=n_words).tolist()
    words[n_words // 2] = f"answer{pid}"  # every passage holds a findable answer of its own
    return " ".join(words)


def write_passages_tsv(path: Path, rows: int, words: int = 100) -> Path:
    """DPR's wiki TSV (``id<TAB>text<TAB>title``), ids 1..rows, ~``words`` words a passage."""

    def write(tmp: Path) -> None:
        rng = np.random.default_rng(0)
        with open(tmp, "w", encoding="utf-8", newline="") as f:
            out = csv.writer(f, delimiter="\t", lineterminator="\n")
            out.writerow(["id", "text", "title"])
            out.writerows([p, _text(rng, words, p), f"Title {p % 997}"] for p in range(1, rows + 1))

    write_atomic(path, write)
    return path


def write_qas(path: Path, n: int, rows: int) -> Path:
    """``n`` questions, question i asking for the answer of passage ``1 + i * rows // n``."""
    pids = [1 + i * max(1, rows // n) for i in range(n)]
    lines = [f'what is answer{p} of the river?\t["answer{p}"]\n' for p in pids]
    write_atomic(path, lambda tmp: tmp.write_text("".join(lines), encoding="utf-8"))
    return path


def _ctx(title: str, text: str, pid: str) -> dict:
    return {"title": title, "text": text, "score": 1.0, "title_score": 0, "passage_id": pid}


def _record(answer: object, positive: dict, others: list[dict], hard: int) -> dict:
    """A DPR training record: the first ``hard`` of ``others`` its hard negatives."""
    question = f"what is answer{answer} of the river?"
    record = {"dataset": "synthetic_nq", "question": question, "answers": [f"answer{answer}"]}
    negatives = {"negative_ctxs": others[hard:], "hard_negative_ctxs": others[:hard]}
    return record | {"positive_ctxs": [positive], **negatives}


def _write_array(path: Path, records: Iterable[dict], limit: float = math.inf) -> int:
    """A JSON array of ``records`` stopped at ``limit`` bytes: how many it holds."""
    count = 0

    def write(tmp: Path) -> None:
        nonlocal count
        with open(tmp, "w", encoding="utf-8") as f:
            written = f.write("[")
            for record in records:
                if written >= limit:
                    break
                written += f.write(("," if count else "") + json.dumps(record))
                count += 1
            f.write("]")

    write_atomic(path, write)
    return count


def write_train_json(path: Path, target_bytes: int, contexts: int = 100) -> int:
    """About ``target_bytes`` of DPR training JSON (1 positive, ``contexts // 2`` hard negatives,
    the rest negatives): its number of questions."""
    rng = np.random.default_rng(1)

    def records() -> Iterator[dict]:
        for count in itertools.count():
            ids = [count * 1000 + j for j in range(contexts)]
            ctxs = [_ctx(f"Title {j}", _text(rng, 100, i), str(i)) for j, i in enumerate(ids)]
            yield _record(ids[0], ctxs[0], ctxs[1:], contexts // 2)

    return _write_array(path, records(), target_bytes)


def write_mine_train(path: Path, n: int, passages_tsv: Path, contexts: int = 100) -> Path:
    """``n`` questions of DPR training JSON whose positives are rows of ``passages_tsv``, so
    that an index over that file can mine them."""
    with open(passages_tsv, encoding="utf-8", newline="") as f:
        corpus = list(csv.reader(f, delimiter="\t"))[1:]  # [id, text, title]; a small file
    rng = np.random.default_rng(2)

    def records() -> Iterator[dict]:
        for i in range(n):
            pid, text, title = corpus[(i * 7919) % len(corpus)]
            ids = [(10**9 + i * 1000 + j, f"x{i}-{j}") for j in range(1, contexts)]
            others = [_ctx(f"Title {j}", _text(rng, 100, t), p) for j, (t, p) in enumerate(ids, 1)]
            yield _record(pid, _ctx(title, text, pid), others, contexts // 2)

    _write_array(path, records())
    return path
