"""``dpr-cache eval``: retrieve passages for ``data.dev_qa`` questions from the built index,
judge them, and write what a user can check and reuse.

The questions are encoded once and searched together (the exact search scans the shards once for
all of them, in the memory ``index.memory_gb`` allows); only the retrieved passages are read from
the Arrow cache of ``data.passages``. Relevance is DPR's answer match, or ``data.qrels`` (TREC
qrels, e.g. a BEIR set's) when given. Writes into ``--out`` (default ``output_dir/eval``):
``retrieval.json`` (DPR's results file), ``retrieval.pyserini.json`` (the same for pyserini's
DPR evaluator), ``run.trec`` (trec_eval, ranx and ir-measures read it),
``metrics.json`` (``top{k}``, ``mrr@10``, ``recall@{k}``, ``ndcg@10`` in percent,
``n_questions``, and what was measured: model fingerprint, index, data files, command line),
``config.yaml`` (the resolved config) and ``timings.json`` (seconds per stage).
"""

from __future__ import annotations

import logging
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np
import torch

from dpr_cache.config import Config, save_config
from dpr_cache.data.passages import load_passages, passage_rows
from dpr_cache.data.qas import read_qas
from dpr_cache.errors import InputError
from dpr_cache.model.loading import load_encoder, model_fingerprint, resolve_model_dir
from dpr_cache.retrieval.build import index_dir_of, index_spec, memory_bytes_of
from dpr_cache.retrieval.encode import encode_question_texts
from dpr_cache.retrieval.index import OpenIndex, open_index, search_index
from dpr_cache.retrieval.metrics import Qrels, answer_qrels, ranking_metrics, read_qrels
from dpr_cache.retrieval.results import (
    CONFIG_FILE,
    METRICS_FILE,
    PYSERINI_FILE,
    RETRIEVAL_FILE,
    RUN_FILE,
    TIMINGS_FILE,
    format_metrics_table,
    rounded,
    write_pyserini_retrieval,
    write_retrieval,
    write_trec_run,
)
from dpr_cache.retrieval.search import Hits
from dpr_cache.runtime.atomic import write_json_atomic
from dpr_cache.runtime.device import resolve_device

__all__ = ["evaluate", "format_metrics_table", "check_overrides"]

log = logging.getLogger(__name__)


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
    for key in ("pooling", "normalize", "passage_prefix"):
        if key in built and getattr(model, key) != built[key]:
            raise InputError(
                f"model.{key}: {getattr(model, key)!r}, but the index was built with "
                f"{built[key]!r}: set it back or rerun `dpr-cache index`"
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
    if missing.any():  # DPR's own embeddings name passages "wiki:123" where the TSV says "123"
        bare = [pid.split(":", 1)[-1] for pid in ids[missing].tolist()]
        rows[missing] = passage_rows(dataset, bare)
        missing = valid & (rows < 0)
    if missing.any():
        first = ids[missing][0]
        raise InputError(f"{path}: has no passage {first!r} (an id of the index at {opened.path})")
    return rows


def question_ids(qas_path: Path, n: int) -> list[str]:
    """The questions' ids: ``X.ids.txt`` beside a qas file ``X.tsv`` (BEIR's query ids, one a
    line), else the row numbers from 0."""
    ids_file = qas_path.with_suffix(".ids.txt")
    if not ids_file.is_file():
        return [str(i) for i in range(n)]
    ids = ids_file.read_text(encoding="utf-8").splitlines()
    if len(ids) != n:
        raise InputError(f"{ids_file}: {len(ids)} ids for the {n} questions of {qas_path}")
    return ids


def judged_qrels(qrels: Qrels, qids: Sequence[str], path: str) -> Qrels:
    """The qrels of the questions evaluated. As trec_eval, a question without judgments is left
    out of the means, and judgments of other questions are dropped; none in common is an error."""
    judged = {qid: qrels[qid] for qid in qids if qid in qrels}
    if not judged:
        raise InputError(
            f"{path}: judges none of the {len(qids)} questions (first qrels id "
            f"{next(iter(qrels), None)!r}, first question id {qids[0]!r})"
        )
    if len(judged) < len(qids) or len(judged) < len(qrels):
        log.warning(
            "%s: %d of %d questions judged (%d qrels questions not evaluated)",
            path, len(judged), len(qids), len(qrels) - len(judged),
        )  # fmt: skip
    return judged


def check_overrides(overridden: Sequence[str], opened: OpenIndex, config: Config) -> None:
    """An ``index.*`` override that contradicts the index evaluated is an error; a ``train.*``
    one, which eval does not use, a warning."""
    for key in overridden:
        if key.startswith("train."):
            log.warning("%s: eval does not use it (the override is ignored)", key)
    built = {"index.type": opened.type, "index.store_dtype": opened.meta["store_dtype"]}
    for key, value in built.items():
        if key in overridden and getattr(config.index, key.split(".")[1]) != value:
            raise InputError(
                f"{key}: {getattr(config.index, key.split('.')[1])!r}, but the index at "
                f"{opened.path} is {value!r}: rebuild it with `dpr-cache index`"
            )


def evaluate(
    config: Config,
    model_dir: str | Path | None = None,
    *,
    out_dir: Path | None = None,
    progress: bool = True,
    device: str | torch.device | None = None,
    rank: int = 0,
    world_size: int = 1,
    overridden: Sequence[str] = (),
    command: str = "",
) -> dict[str, Any] | None:
    """Search, judge and write the evaluation files (see the module docstring); return the
    metrics (None on ranks other than 0, which only scan their share of the shards)."""
    stages: dict[str, float] = {}
    clock = time.perf_counter()

    def lap(name: str) -> None:
        nonlocal clock
        now = time.perf_counter()
        stages[name] = round(now - clock, 3)
        clock = now

    index_dir = index_dir_of(config.output_path)
    opened = open_index(index_dir, index_spec(config, opened_type(index_dir)))
    check_overrides(overridden, opened, config)
    model_dir = resolve_model_dir(model_dir, config.output_path / "model")
    if not config.data.dev_qa:
        raise InputError("data.dev_qa: not set (a DPR qas TSV of questions and answers)")
    qas_path = Path(config.data.dev_qa)
    qas = read_qas(qas_path)
    if not qas:
        raise InputError(f"{qas_path}: no questions")
    qids = question_ids(qas_path, len(qas))
    qrels = read_qrels(config.data.qrels) if config.data.qrels else None
    if not config.data.passages:
        raise InputError("data.passages: not set (the passages TSV the index was built from)")
    passages = Path(config.data.passages)
    dataset = load_passages(passages, config.cache_path)
    lap("open index, questions and passages")
    dev = resolve_device(device if device is not None else config.eval.device, key="eval.device")
    m = config.model
    model = load_encoder(
        model_dir, pooling=m.pooling, normalize=m.normalize,
        prefixes=(m.query_prefix, m.passage_prefix), query_only=True,
    ).to(dev)  # fmt: skip
    _check_model(model_dir, model, opened)
    for key in ("pooling", "normalize"):  # a saved model keeps its own: say so, do not ignore
        asked = getattr(config.model, key)
        if f"model.{key}" in overridden and asked is not None and asked != getattr(model, key):
            raise InputError(
                f"model.{key}: {asked!r}, but {model_dir} was saved with "
                f"{getattr(model, key)!r} (and its index encoded so)"
            )
    lap("load the model")
    q_embs = encode_question_texts(
        model, [q for q, _ in qas], max_length=config.model.max_query_length, device=dev,
        precision=config.eval.precision, batch_size=config.eval.batch_size,
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
    out = Path(out_dir) if out_dir is not None else config.output_path / "eval"
    pids, flags = write_retrieval(
        out / RETRIEVAL_FILE, qas, hits.scores, rows, dataset, config.eval.match, progress
    )
    lap("read passages, match answers, write retrieval.json")
    scores = [row[: len(p)] for row, p in zip(hits.scores, pids, strict=True)]
    write_trec_run(out / RUN_FILE, qids, pids, scores, "dpr-cache")
    write_pyserini_retrieval(out / PYSERINI_FILE, qids, qas, pids, scores, flags)
    if qrels is not None:
        judged = judged_qrels(qrels, qids, config.data.qrels)
    else:
        judged = answer_qrels(qids, pids, flags)
    metrics = rounded(
        ranking_metrics(dict(zip(qids, pids, strict=True)), judged, config.eval.top_k)
    )
    metrics["n_questions"] = len(qas)
    metrics["measured"] = {
        "relevance": f"qrels {config.data.qrels}" if qrels is not None
        else f"answers in the passage text (DPR's has_answer, {config.eval.match} match) of "
        f"the retrieved top {max(config.eval.top_k)} only: recall@k and ndcg@10 are relative to "
        "that pool",
        "judged_questions": len(judged),
        "unjudged_questions": len(qids) - len(judged),
        "model": {"dir": str(model_dir), "fingerprint": model_fingerprint(model_dir)},
        "index": {"dir": str(opened.path.resolve()), **{k: opened.meta[k] for k in
                  ("type", "rows", "dim", "store_dtype", "index_params")},
                  "shards": len(opened.meta["shards"])},
        "data": {"dev_qa": str(qas_path.resolve()), "passages": str(passages.resolve())},
        "command": command,
    }  # fmt: skip
    write_json_atomic(out / METRICS_FILE, metrics)
    write_json_atomic(out / TIMINGS_FILE, {"seconds": stages})
    save_config(config, out / CONFIG_FILE)
    return metrics


def opened_type(index_dir: Path) -> str | None:
    """The type recorded in an index folder's meta (None when there is none yet)."""
    import json

    meta = Path(index_dir) / "meta.json"
    return json.loads(meta.read_text()).get("type") if meta.is_file() else None
