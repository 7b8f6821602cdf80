"""``dpr-cache eval``: retrieve passages for ``data.dev_qa`` questions from the built index,
judge them, and write what a user can check and reuse.

The questions are encoded once and searched together (the exact search scans the shards once for
all of them, in the memory ``index.memory_gb`` allows); only the retrieved passages are read from
the Arrow cache of ``data.passages``. Relevance is DPR's answer match, or ``data.qrels`` (TREC
qrels, e.g. a BEIR set's) when given. Writes into ``--out`` (default ``output_dir/eval``):
``retrieval.json`` (DPR's results file), ``retrieval.pyserini.json`` (the same for pyserini's
DPR evaluator), ``run.trec`` (trec_eval, ranx and ir-measures read it),
``metrics.json`` (``top{k}``, ``mrr@10``, ``recall@{k}``, ``ndcg@10`` in percent,
``n_questions``, and what was measured: model fingerprint, the device and precision the
questions were encoded in (``eval.precision: auto`` as resolved), index, data files, command
line),
``config.yaml`` (the resolved config) and ``timings.json`` (seconds per stage).
"""

from __future__ import annotations

import logging
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import torch

from dpr_cache.config import Config, save_config
from dpr_cache.data.passages import load_passages
from dpr_cache.data.qas import question_ids, read_qas
from dpr_cache.errors import InputError
from dpr_cache.model.loading import model_fingerprint, resolve_model_dir
from dpr_cache.retrieval.dense.index import (
    Corpus,
    OpenIndex,
    index_dir_of,
    open_index,
    opened_as,
    search_index,
)
from dpr_cache.retrieval.dense.questions import (
    QuestionRun,
    config_encoding,
    query_tower,
    question_vectors,
)
from dpr_cache.retrieval.hybrid import dense_rankings, hybrid_search, open_sparse, tune_weight
from dpr_cache.retrieval.metrics import answer_qrels, judged_qrels, ranking_metrics, read_qrels
from dpr_cache.retrieval.results import (
    CONFIG_FILE,
    FUSION_FILE,
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
from dpr_cache.runtime import distributed
from dpr_cache.runtime.atomic import write_json_atomic
from dpr_cache.runtime.device import resolve_device
from dpr_cache.runtime.laps import Laps
from dpr_cache.runtime.lock import output_lock
from dpr_cache.runtime.memory import memory_limit

__all__ = ["eval_command", "evaluate", "format_metrics_table", "check_overrides"]

log = logging.getLogger(__name__)


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
    metrics (None on ranks other than 0, which only scan their share of the shards). Raises
    InputError when another command holds the output folder."""
    out = Path(out_dir) if out_dir is not None else config.output_path / "eval"
    with output_lock(out):
        laps = Laps()
        index_dir = index_dir_of(config.output_path)
        opened = open_index(index_dir, opened_as(config.index, index_dir))
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
        corpus = Corpus(opened, load_passages(passages, config.cache_path), passages)
        laps.lap("open index, questions and passages")
        dev = resolve_device(
            device if device is not None else config.eval.device, key="eval.device"
        )
        run = QuestionRun(dev, config.eval.precision, config.eval.batch_size)
        model = query_tower(model_dir, opened, dev, *config_encoding(config.model))
        laps.lap("load the model")
        q_embs = question_vectors(model, [q for q, _ in qas], run)
        fusion = config.eval.fusion
        tuned = config.eval.fusion_weight == "auto"
        tune = _tune_questions(config, model, qrels, qids, run) if tuned else None
        del model
        laps.lap("encode questions")
        k, memory = max(config.eval.top_k), memory_limit(config.index.memory_gb)
        if fusion == "none":
            hits = search_index(opened, q_embs, k, memory, rank=rank, world_size=world_size)
            laps.lap("search")
            if hits is None:
                return None
            rows = corpus.rows_of(hits.rows)
        else:
            hits, fused = _hybrid(
                config, corpus, q_embs, qas, qids, tune, qrels, memory, rank, world_size
            )
            laps.lap(f"search, BM25 and {fusion} fusion")
            if hits is None:
                return None
            rows = hits.rows  # passage rows already
        laps.lap("map hits to passages")
        pids, flags = write_retrieval(
            out / RETRIEVAL_FILE,
            qas,
            hits.scores,
            rows,
            corpus.dataset,
            config.eval.match,
            progress,
        )
        laps.lap("read passages, match answers, write retrieval.json")
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
        relevance = f"qrels {config.data.qrels}"
        if qrels is None:
            relevance = (
                f"answers in the passage text (DPR's has_answer, {config.eval.match} match) of "
                f"the retrieved top {max(config.eval.top_k)} only: recall@k and ndcg@10 are "
                "relative to that pool"
            )
        metrics["measured"] = {
            "relevance": relevance,
            "judged_questions": len(judged),
            "unjudged_questions": len(qids) - len(judged),
            "model": {"dir": str(model_dir), "fingerprint": model_fingerprint(model_dir)},
            "questions_encoded": {"device": str(dev), "precision": run.precision},
            "index": {
                "dir": str(opened.path.resolve()),
                **{
                    k: opened.meta[k]
                    for k in ("type", "rows", "dim", "store_dtype", "index_params")
                },
                "shards": len(opened.meta["shards"]),
            },
            "data": {"dev_qa": str(qas_path.resolve()), "passages": str(passages.resolve())},
            "command": command,
        }
        if fusion != "none":
            metrics["measured"]["fusion"] = fused
            write_json_atomic(out / FUSION_FILE, fused)
        write_json_atomic(out / TIMINGS_FILE, {"seconds": laps.seconds()})
        save_config(config, out / CONFIG_FILE)
        write_json_atomic(out / METRICS_FILE, metrics)  # last: it marks the evaluation done
        return metrics


def eval_command(
    config: Config,
    model_dir: str | Path | None = None,
    *,
    out_dir: Path | None = None,
    progress: bool = True,
    overridden: Sequence[str] = (),
    command: str = "",
) -> dict[str, Any] | None:
    """``dpr-cache eval``: :func:`evaluate` on this process's rank (under ``torchrun`` each
    rank scans its share of the shards); the metrics on rank 0, None on the others."""
    env = distributed.setup(config.eval.device, "eval.device")
    try:
        return evaluate(
            config,
            model_dir,
            out_dir=out_dir,
            progress=progress,
            rank=env.rank,
            world_size=env.world_size,
            overridden=overridden,
            command=command,
        )
    finally:
        distributed.teardown()


def _tune_questions(config: Config, model, qrels: dict | None, dev_qids, run: QuestionRun):
    """The held-out questions that pick an ``auto`` weight: (qas, ids, vectors). Judged by
    ``data.qrels`` when set (some must be judged), else by their answers (every one needs
    some)."""
    tune_path = Path(config.eval.fusion_tune_qa)
    if tune_path.resolve() == Path(config.data.dev_qa).resolve():
        raise InputError(f"eval.fusion_tune_qa: {tune_path} is data.dev_qa: not held out")
    tune = read_qas(tune_path)
    if not tune:
        raise InputError(f"{tune_path}: no questions")
    qids = question_ids(tune_path, len(tune))
    if qrels is not None:
        ids_file = tune_path.with_suffix(".ids.txt")
        if not ids_file.is_file():  # row numbers would be judged as the dev questions' ids
            raise InputError(
                f"{tune_path}: judged by data.qrels, its questions need ids "
                f"({ids_file}, one a line)"
            )
        if set(qids) & set(dev_qids):
            raise InputError(f"{ids_file}: shares question ids with data.dev_qa: not held out")
        if not any(q in qrels for q in qids):
            raise InputError(f"{tune_path}: none of its questions is judged in {config.data.qrels}")
    if qrels is None:
        for n, (question, answers) in enumerate(tune, start=1):
            if not answers:
                raise InputError(
                    f"{tune_path} line {n}: question {question[:60]!r} has no answers to "
                    "judge the weight by (give them, or set data.qrels)"
                )
    return tune, qids, question_vectors(model, [q for q, _ in tune], run)


def _hybrid(config, corpus: Corpus, q_embs, qas, qids, tune, qrels, memory: int, rank, world_size):
    """The fused hits of the dev questions and what fused them (the weight tuned first on the
    held-out questions ``tune`` when asked); (None, None) on ranks but 0. Every collective
    search runs first; BM25 is opened after them, on rank 0 alone."""
    e = config.eval
    depth = max(e.fusion_depth, max(e.top_k))

    def dense(queries):
        return dense_rankings(corpus, queries, depth, memory, rank=rank, world_size=world_size)

    tune_dense = dense(tune[2]) if tune is not None else None
    dev_dense = dense(q_embs)
    if dev_dense is None:
        return None, None
    sparse = open_sparse(corpus, config.cache_path, e.bm25_run, e)
    record = {"method": e.fusion, "depth": e.fusion_depth, "bm25": sparse.source}
    if e.fusion == "linear":
        record["weight"] = None if e.fusion_weight == "auto" else e.fusion_weight
    else:
        record["rrf_k"] = e.fusion_rrf_k
    if tune is not None:
        tune_qas, tune_qids, tune_embs = tune
        weight, grid = tune_weight(
            corpus,
            tune_embs,
            tune_qas,
            sparse,
            e,
            e.fusion_tune_metric,
            tune_dense,
            e.match,
            qids=tune_qids,
            qrels=qrels,
        )
        e = e.model_copy(update={"fusion_weight": weight})
        record.update(
            weight=weight,
            tuned_on=str(Path(e.fusion_tune_qa).resolve()),
            tune_metric=e.fusion_tune_metric,
            grid=grid,
            judged_by=f"qrels {config.data.qrels}"
            if qrels is not None
            else f"answers ({e.match} match)",
        )
    hits = hybrid_search(
        corpus,
        q_embs,
        [q for q, _ in qas],
        qids,
        sparse,
        e,
        max(e.top_k),
        dev_dense,
    )
    return hits, record
