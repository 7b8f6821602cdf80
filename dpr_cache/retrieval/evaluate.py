"""Retrieve passages for ``data.dev_qa`` questions from the built index and score the answers.

Writes ``output_dir/eval/retrieval.json`` (DPR's results file: one entry a question, ``ctxs`` best
first), ``output_dir/eval/metrics.json`` (top-k hit rates in percent, ``n_questions``) and
``output_dir/eval/config.yaml`` (the resolved config the evaluation ran with).
"""

from __future__ import annotations

import json
from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import Any

import numpy as np
import torch
from tqdm.auto import tqdm

from dpr_cache.config import Config, save_config
from dpr_cache.data.answers import has_answer, top_k_hits
from dpr_cache.data.passages import load_passages
from dpr_cache.data.qas import read_qas
from dpr_cache.errors import InputError
from dpr_cache.model.loading import load_encoder, model_fingerprint, resolve_model_dir
from dpr_cache.retrieval.encode import encode_question_texts
from dpr_cache.retrieval.faiss_index import configure_search, load_index, search
from dpr_cache.retrieval.index import index_dir_of, index_spec
from dpr_cache.runtime.atomic import write_atomic, write_json_atomic
from dpr_cache.runtime.device import inference_precision, resolve_device

__all__ = ["evaluate", "format_metrics_table", "metrics_from_retrieval"]

RETRIEVAL_FILE = "retrieval.json"
METRICS_FILE = "metrics.json"
CONFIG_FILE = "config.yaml"


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


def _check_same_model(model_dir: Path, meta: dict, index_dir: Path) -> None:
    if model_fingerprint(model_dir) != meta.get("fingerprint"):
        raise InputError(
            f"{model_dir}: not the model the index at {index_dir} was built with "
            f"({meta.get('model_dir')}): pass that --model, or rerun `dpr-cache index`"
        )


def _open_passages(path: Path, cache_dir: Path, meta: dict, index_dir: Path):
    """The passages dataset the index rows point into; InputError if it is not that file."""
    dataset = load_passages(path, cache_dir)
    built = meta.get("passages", {})
    if len(dataset) != meta.get("n_passages") or path.stat().st_size != built.get("size"):
        raise InputError(
            f"{path}: not the passages file the index at {index_dir} was built from "
            f"({built.get('path')}): rerun `dpr-cache index`"
        )
    return dataset


def _entries(
    questions: list[tuple[str, list[str]]],
    scores: np.ndarray,
    rows: np.ndarray,
    dataset,
    match: str,
) -> Iterator[dict[str, Any]]:
    """DPR results entries for a batch of questions and their search results."""
    valid = np.unique(rows[rows >= 0])
    found = dataset[valid.tolist()] if len(valid) else {"id": [], "title": [], "text": []}
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


def evaluate(
    config: Config,
    model_dir: str | Path | None = None,
    *,
    progress: bool = True,
    device: str | torch.device | None = None,
) -> dict[str, Any]:
    """``dpr-cache eval``: search the index with the query tower, write retrieval.json,
    metrics.json and the resolved config; return ``{"top{k}": percent, ..., "n_questions": n}``."""
    index_dir = index_dir_of(config.output_path)
    index, _, meta = load_index(index_dir, with_ids=False)
    model_dir = resolve_model_dir(model_dir, config.output_path / "model")
    _check_same_model(model_dir, meta, index_dir)
    if not config.data.dev_qa:
        raise InputError("data.dev_qa: not set (a DPR qas TSV of questions and answers)")
    qas = read_qas(Path(config.data.dev_qa))
    if not qas:
        raise InputError(f"{config.data.dev_qa}: no questions")
    if not config.data.passages:
        raise InputError("data.passages: not set (the passages TSV the index was built from)")
    dataset = _open_passages(Path(config.data.passages), config.cache_path, meta, index_dir)
    dev = resolve_device(device if device is not None else config.train.device)
    model = load_encoder(model_dir, pooling=config.model.pooling, query_only=True).to(dev)
    if model.pooling != meta.get("pooling"):
        raise InputError(
            f"model.pooling: {model.pooling!r}, but the index was built with "
            f"{meta.get('pooling')!r}: set it back or rerun `dpr-cache index`"
        )
    configure_search(index, index_spec(config))
    out_dir = config.output_path / "eval"
    hits = write_retrieval(
        out_dir / RETRIEVAL_FILE, qas, model, index, dataset,
        k=max(config.eval.top_k), match=config.eval.match, batch_size=config.eval.batch_size,
        max_length=config.model.max_query_length, device=dev,
        precision=inference_precision(dev, config.train.precision), progress=progress,
    )  # fmt: skip
    metrics = _rounded(top_k_hits(hits, config.eval.top_k))
    write_json_atomic(out_dir / METRICS_FILE, metrics)
    save_config(config, out_dir / CONFIG_FILE)
    return metrics


def write_retrieval(
    path: Path,
    qas: list[tuple[str, list[str]]],
    model,
    index,
    dataset,
    *,
    k: int,
    match: str,
    batch_size: int,
    max_length: int,
    device: torch.device,
    precision: str = "fp32",
    progress: bool = True,
) -> list[list[bool]]:
    """Search the top ``k`` of every question, write DPR's results file at ``path``; return
    each question's answer flags, best first."""
    hits: list[list[bool]] = []

    def write(tmp: Path) -> None:
        with (
            open(tmp, "w", encoding="utf-8") as f,
            tqdm(total=len(qas), unit="q", desc="eval", disable=not progress) as bar,
        ):
            f.write("[")
            for start in range(0, len(qas), batch_size):
                batch = qas[start : start + batch_size]
                reps = encode_question_texts(
                    model, [q for q, _ in batch], max_length=max_length, device=device,
                    precision=precision,
                )  # fmt: skip
                scores, rows = search(index, reps, k)
                for entry in _entries(batch, scores, rows, dataset, match):
                    f.write(",\n" if hits else "\n")
                    f.write(json.dumps(entry, ensure_ascii=False))
                    hits.append([ctx["has_answer"] for ctx in entry["ctxs"]])
                bar.update(len(batch))
            f.write("\n]\n")

    write_atomic(path, write)
    return hits
