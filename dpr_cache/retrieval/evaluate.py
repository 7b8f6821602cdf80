"""Retrieve passages for ``data.dev_qa`` questions from the built index and score the answers.

The questions are encoded once, searched together (the exact search scans the shards once for all
of them, in the memory ``index.memory_gb`` allows), and only the retrieved passages are read from
the Arrow cache of ``data.passages``. Writes ``output_dir/eval/retrieval.json`` (DPR's results
file: one entry a question, ``ctxs`` best first), ``metrics.json`` (top-k hit rates in percent,
``n_questions``), ``config.yaml`` (the resolved config the evaluation ran with) and
``timings.json`` (seconds per stage).
"""

from __future__ import annotations

import json
import logging
import time
from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import Any

import numpy as np
import torch
from tqdm.auto import tqdm

from dpr_cache.config import Config, save_config
from dpr_cache.data.answers import has_answer, top_k_hits
from dpr_cache.data.passages import load_passages, passage_columns, passage_rows
from dpr_cache.data.qas import read_qas
from dpr_cache.errors import InputError
from dpr_cache.model.loading import load_encoder, model_fingerprint, resolve_model_dir
from dpr_cache.retrieval.encode import encode_question_texts
from dpr_cache.retrieval.index import index_dir_of, index_spec, memory_bytes_of
from dpr_cache.retrieval.index_dir import OpenIndex, open_index, search_index
from dpr_cache.retrieval.search import Hits
from dpr_cache.runtime.atomic import write_atomic, write_json_atomic
from dpr_cache.runtime.device import resolve_device

__all__ = ["evaluate", "format_metrics_table", "metrics_from_retrieval", "write_retrieval"]

log = logging.getLogger(__name__)

RETRIEVAL_FILE = "retrieval.json"
METRICS_FILE = "metrics.json"
CONFIG_FILE = "config.yaml"
TIMINGS_FILE = "timings.json"
_WRITE_BATCH = 64  # questions whose passages are read from the Arrow cache together


def _rounded(metrics: dict[str, float]) -> dict[str, Any]:
    return {k: (int(v) if k == "n_questions" else round(v, 2)) for k, v in metrics.items()}


def metrics_from_retrieval(path: str | Path, ks: Sequence[int]) -> dict[str, Any]:
    """Top-k hit rates recomputed from a DPR results file's ``has_answer`` flags."""
    entries = json.loads(Path(path).read_text(encoding="utf-8"))
    hits = [[bool(ctx["has_answer"]) for ctx in entry["ctxs"]] for entry in entries]
    return _rounded(top_k_hits(hits, ks))


def format_metrics_table(metrics: dict[str, Any]) -> str:
    """A small text table: one line per k with its hit rate, then the question count."""
    ks = sorted(int(key[3:]) for key in metrics if key.startswith("top"))
    lines = ["    k | hit rate %", "------+-----------"]
    lines += [f"{k:>5} | {metrics[f'top{k}']:>10.2f}" for k in ks]
    lines.append(f"questions: {metrics.get('n_questions', 0)}")
    return "\n".join(lines)


def _check_model(model_dir: Path, model, opened: OpenIndex) -> None:
    """The model must be the one that encoded the index (fingerprint and pooling); an index of
    precomputed embeddings records none, so only the dimension can be checked."""
    built = opened.meta.get("model")
    if built is None:
        if model.dim != opened.store.dim:
            raise InputError(
                f"{model_dir}: {model.dim}-d vectors, but the index at {opened.path} holds "
                f"{opened.store.dim}-d ones"
            )
        log.warning("%s: precomputed embeddings; their model cannot be checked", opened.path)
        return
    if model_fingerprint(model_dir) != built["fingerprint"]:
        raise InputError(
            f"{model_dir}: not the model the index at {opened.path} was built with "
            f"({built['dir']}): pass that --model, or rerun `dpr-cache index`"
        )
    if model.pooling != built["pooling"]:
        raise InputError(
            f"model.pooling: {model.pooling!r}, but the index was built with "
            f"{built['pooling']!r}: set it back or rerun `dpr-cache index`"
        )


def _passage_rows_of(opened: OpenIndex, dataset, path: Path, hits: Hits) -> np.ndarray:
    """Rows of the passages dataset for the hits: the store rows themselves when the index was
    encoded from this very file, else looked up by passage id."""
    built = opened.meta.get("passages")
    if built is not None:
        if len(dataset) != opened.store.rows or path.stat().st_size != built["size"]:
            raise InputError(
                f"{path}: not the passages file the index at {opened.path} was built from "
                f"({built['path']}): rerun `dpr-cache index`"
            )
        return hits.rows
    ids = opened.store.ids_of(hits.rows)
    rows = np.full(hits.rows.shape, -1, np.int64)
    valid = hits.rows >= 0
    rows[valid] = passage_rows(dataset, ids[valid].tolist())
    missing = valid & (rows < 0)
    if missing.any():
        first = ids[missing][0]
        raise InputError(f"{path}: has no passage {first!r} (an id of the index at {opened.path})")
    return rows


def _entries(questions, scores, rows, dataset, match: str) -> Iterator[dict[str, Any]]:
    """DPR results entries for a batch of questions, their scores and passage rows."""
    valid = np.unique(rows[rows >= 0])
    found = passage_columns(dataset, valid.tolist())
    where = {int(r): i for i, r in enumerate(valid)}
    for (question, answers), q_scores, q_rows in zip(questions, scores, rows, strict=True):
        ctxs = []
        for score, row in zip(q_scores, q_rows, strict=True):
            if row < 0:
                continue
            i = where[int(row)]
            text = found["text"][i]
            ctxs.append(
                {
                    "id": found["id"][i],
                    "title": found["title"][i],
                    "text": text,
                    "score": float(score),
                    "has_answer": has_answer(answers, text, match),
                }
            )
        yield {"question": question, "answers": answers, "ctxs": ctxs}


def write_retrieval(
    path: Path, qas, scores: np.ndarray, rows: np.ndarray, dataset, match: str, progress: bool
) -> list[list[bool]]:
    """DPR's results file for the questions' hits; returns each question's answer flags."""
    flags: list[list[bool]] = []

    def write(tmp: Path) -> None:
        with (
            open(tmp, "w", encoding="utf-8") as f,
            tqdm(total=len(qas), unit="q", desc="answers", disable=not progress) as bar,
        ):
            f.write("[")
            for start in range(0, len(qas), _WRITE_BATCH):
                part = slice(start, start + _WRITE_BATCH)
                for entry in _entries(qas[part], scores[part], rows[part], dataset, match):
                    f.write(",\n" if flags else "\n")
                    f.write(json.dumps(entry, ensure_ascii=False))
                    flags.append([ctx["has_answer"] for ctx in entry["ctxs"]])
                bar.update(len(qas[part]))
            f.write("\n]\n")

    write_atomic(path, write)
    return flags


def evaluate(
    config: Config,
    model_dir: str | Path | None = None,
    *,
    progress: bool = True,
    device: str | torch.device | None = None,
    rank: int = 0,
    world_size: int = 1,
) -> dict[str, Any] | None:
    """``dpr-cache eval``: search the index with the query tower, write retrieval.json,
    metrics.json and the resolved config; return ``{"top{k}": percent, ..., "n_questions": n}``
    (None on ranks other than 0, which only scan their share of the shards)."""
    stages: dict[str, float] = {}
    clock = time.perf_counter()

    def lap(name: str) -> None:
        nonlocal clock
        now = time.perf_counter()
        stages[name] = round(now - clock, 3)
        clock = now

    opened = open_index(index_dir_of(config.output_path), index_spec(config))
    model_dir = resolve_model_dir(model_dir, config.output_path / "model")
    if not config.data.dev_qa:
        raise InputError("data.dev_qa: not set (a DPR qas TSV of questions and answers)")
    qas = read_qas(Path(config.data.dev_qa))
    if not qas:
        raise InputError(f"{config.data.dev_qa}: no questions")
    if not config.data.passages:
        raise InputError("data.passages: not set (the passages TSV the index was built from)")
    passages = Path(config.data.passages)
    dataset = load_passages(passages, config.cache_path)
    lap("open index, questions and passages")
    dev = resolve_device(device if device is not None else config.train.device)
    model = load_encoder(model_dir, pooling=config.model.pooling, query_only=True).to(dev)
    _check_model(model_dir, model, opened)
    lap("load the model")
    q_embs = encode_question_texts(
        model, [q for q, _ in qas], max_length=config.model.max_query_length, device=dev,
        precision=config.train.precision, batch_size=config.eval.batch_size,
    )  # fmt: skip
    del model
    lap("encode questions")
    hits = search_index(
        opened, q_embs, max(config.eval.top_k), memory_bytes_of(config.index.memory_gb),
        rank=rank, world_size=world_size,
    )  # fmt: skip
    lap("search")
    if hits is None:
        return None
    rows = _passage_rows_of(opened, dataset, passages, hits)
    lap("map hits to passages")
    out_dir = config.output_path / "eval"
    flags = write_retrieval(
        out_dir / RETRIEVAL_FILE, qas, hits.scores, rows, dataset, config.eval.match, progress
    )
    lap("read passages, match answers, write retrieval.json")
    metrics = _rounded(top_k_hits(flags, config.eval.top_k))
    write_json_atomic(out_dir / METRICS_FILE, metrics)
    write_json_atomic(out_dir / TIMINGS_FILE, {"seconds": stages})
    save_config(config, out_dir / CONFIG_FILE)
    return metrics
