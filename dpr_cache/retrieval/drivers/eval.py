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
from dataclasses import dataclass
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
    config_loading,
    query_tower,
    question_vectors,
)
from dpr_cache.retrieval.dense.search import Hits
from dpr_cache.retrieval.drivers.overrides import refuse_train_keys
from dpr_cache.retrieval.hybrid import Tuning, fused_search
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
    format_sets_table,
    pooled_metrics,
    rounded,
    write_pyserini_retrieval,
    write_retrieval,
    write_trec_run,
)
from dpr_cache.runtime import distributed
from dpr_cache.runtime.atomic import write_json_atomic
from dpr_cache.runtime.device import advises_on_out_of_memory, resolve_device
from dpr_cache.runtime.laps import Laps
from dpr_cache.runtime.lock import output_lock
from dpr_cache.runtime.memory import memory_limit

__all__ = [
    "eval_command",
    "evaluate",
    "format_metrics_table",
    "format_sets_table",
    "check_overrides",
]

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


@dataclass(frozen=True)
class _Inputs:
    """What an evaluation reads: the index and the passages it was built from, the model, the
    questions with their ids, and the qrels that judge them (None: their answers do)."""

    opened: OpenIndex
    corpus: Corpus
    model_dir: Path
    qas_path: Path
    qas: list[tuple[str, list[str]]]
    qids: list[str]
    qrels: dict[str, dict[str, int]] | None


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
        inputs = _open_inputs(config, model_dir, overridden)
        laps.lap("open index, questions and passages")
        dev = resolve_device(
            device if device is not None else config.eval.device, key="eval.device"
        )
        run = QuestionRun(dev, config.eval.precision, config.eval.batch_size)
        model = query_tower(
            inputs.model_dir,
            inputs.opened,
            dev,
            *config_encoding(config.model, config.index),
            loading=config_loading(config.model),
        )
        laps.lap("load the model")
        q_embs = question_vectors(model, [q for q, _ in inputs.qas], run)
        tuned = config.eval.fusion_weight == "auto"
        tune = _tune_questions(config, model, inputs, run) if tuned else None
        del model
        laps.lap("encode questions")
        found = _retrieve(config, inputs, q_embs, tune, rank, world_size)
        laps.lap(
            "search"
            if config.eval.fusion == "none"
            else f"search, BM25 and {config.eval.fusion} fusion"
        )
        if found is None:
            return None
        hits, fused = found
        pids, flags = write_retrieval(
            out / RETRIEVAL_FILE,
            inputs.qas,
            hits.scores,
            hits.rows,
            inputs.corpus.dataset,
            config.eval.match,
            progress,
        )
        laps.lap("read passages, match answers, write retrieval.json")
        scores = [row[: len(p)] for row, p in zip(hits.scores, pids, strict=True)]
        write_trec_run(out / RUN_FILE, inputs.qids, pids, scores, "dpr-cache")
        write_pyserini_retrieval(out / PYSERINI_FILE, inputs.qids, inputs.qas, pids, scores, flags)
        metrics, judged = _judge(config, inputs, pids, flags)
        metrics["measured"] = _measured(config, inputs, judged, dev, run, command)
        if fused is not None:
            metrics["measured"]["fusion"] = fused
            write_json_atomic(out / FUSION_FILE, fused)
        write_json_atomic(out / TIMINGS_FILE, {"seconds": laps.seconds()})
        save_config(config, out / CONFIG_FILE)
        write_json_atomic(out / METRICS_FILE, metrics)  # last: it marks the evaluation done
        return metrics


def _open_inputs(config: Config, model_dir, overridden: Sequence[str]) -> _Inputs:
    """The index (checked against the overrides), the model folder, the questions, their ids
    and qrels, and the passages; InputError naming the key of any that is missing."""
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
    qrels = read_qrels(config.data.qrels) if config.data.qrels else None
    if not config.data.passages:
        raise InputError("data.passages: not set (the passages TSV the index was built from)")
    passages = Path(config.data.passages)
    corpus = Corpus(opened, load_passages(passages, config.cache_path), passages)
    qids = question_ids(qas_path, len(qas))
    return _Inputs(opened, corpus, model_dir, qas_path, qas, qids, qrels)


def _retrieve(config: Config, inputs: _Inputs, q_embs, tune: Tuning | None, rank, world_size):
    """Each question's top ``max(eval.top_k)`` passage rows (dense, or fused with BM25) and
    the fusion's record (None when dense alone); None on ranks but 0."""
    spec, memory = config.eval, memory_limit(config.index.memory_gb)
    if spec.fusion == "none":
        hits = search_index(
            inputs.opened, q_embs, max(spec.top_k), memory, rank=rank, world_size=world_size
        )
        if hits is None:
            return None
        return Hits(hits.scores, inputs.corpus.rows_of(hits.rows)), None
    questions = [q for q, _ in inputs.qas]
    return fused_search(
        inputs.corpus,
        q_embs,
        questions,
        inputs.qids,
        spec,
        config.cache_path,
        memory,
        tune=tune,
        rank=rank,
        world_size=world_size,
    )


def _judge(config: Config, inputs: _Inputs, pids, flags) -> tuple[dict[str, Any], int]:
    """The ranking's metrics (percent, rounded, with the number of questions) and how many
    questions were judged: by the qrels when given, else by the answers found in the retrieved
    passages."""
    if inputs.qrels is not None:
        judged = judged_qrels(inputs.qrels, inputs.qids, config.data.qrels)
    else:
        judged = answer_qrels(inputs.qids, pids, flags)
    ranking = dict(zip(inputs.qids, pids, strict=True))
    metrics = rounded(ranking_metrics(ranking, judged, config.eval.top_k))
    metrics["n_questions"] = len(inputs.qas)
    return metrics, len(judged)


def _measured(
    config: Config, inputs: _Inputs, judged: int, dev, run: QuestionRun, command: str
) -> dict[str, Any]:
    """What was measured: how relevance was judged, the model, the device and precision the
    questions were encoded in, the index, the data files and the command line."""
    relevance = f"qrels {config.data.qrels}"
    if inputs.qrels is None:
        relevance = (
            f"answers in the passage text (DPR's has_answer, {config.eval.match} match) of "
            f"the retrieved top {max(config.eval.top_k)} only: recall@k and ndcg@10 are "
            "relative to that pool"
        )
    opened = inputs.opened
    return {
        "relevance": relevance,
        "judged_questions": judged,
        "unjudged_questions": len(inputs.qids) - judged,
        "model": {"dir": str(inputs.model_dir), "fingerprint": model_fingerprint(inputs.model_dir)},
        "questions_encoded": {"device": str(dev), "precision": run.precision},
        "index": {
            "dir": str(opened.path.resolve()),
            **{k: opened.meta[k] for k in ("type", "rows", "dim", "store_dtype", "index_params")},
            **{k: opened.meta[k] for k in ("vectors", "tokens") if opened.multi},
            "shards": len(opened.meta["shards"]),
        },
        "data": {
            "dev_qa": str(inputs.qas_path.resolve()),
            "passages": str(inputs.corpus.path.resolve()),
        },
        "command": command,
    }


@advises_on_out_of_memory("lower eval.batch_size")
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
    rank scans its share of the shards); the metrics on rank 0, None on the others. Several
    dev sets (``data.dev_qa`` a list): each evaluated into ``OUT/<its name>/``, and
    ``OUT/metrics.json`` pools them, with a row a set under ``sets``."""
    refuse_train_keys(overridden, "eval", config)
    env = distributed.setup(config.eval.device, "eval.device")
    out = Path(out_dir) if out_dir is not None else config.output_path / "eval"
    several = len(config.dev_sets) > 1
    try:
        found = {}
        for name, path in config.dev_sets:
            found[name] = evaluate(
                config.with_dev_set(path),
                model_dir,
                out_dir=out / name if several else out,
                progress=progress,
                rank=env.rank,
                world_size=env.world_size,
                overridden=overridden,
                command=command,
            )
        if not several or env.rank != 0:
            return next(iter(found.values()))
        pooled = pooled_metrics(found)
        write_json_atomic(out / METRICS_FILE, pooled)
        return pooled
    finally:
        distributed.teardown()


def _tune_questions(config: Config, model, inputs: _Inputs, run: QuestionRun) -> Tuning:
    """The held-out questions that pick an ``auto`` weight. Judged by ``data.qrels`` when set
    (some must be judged), else by their answers (every one needs some)."""
    tune_path = Path(config.eval.fusion_tune_qa)
    if tune_path.resolve() == Path(config.data.dev_qa).resolve():
        raise InputError(f"eval.fusion_tune_qa: {tune_path} is data.dev_qa: not held out")
    tune = read_qas(tune_path)
    if not tune:
        raise InputError(f"{tune_path}: no questions")
    qids = question_ids(tune_path, len(tune))
    qrels = inputs.qrels
    if qrels is not None:
        ids_file = tune_path.with_suffix(".ids.txt")
        if not ids_file.is_file():  # row numbers would be judged as the dev questions' ids
            raise InputError(
                f"{tune_path}: judged by data.qrels, its questions need ids "
                f"({ids_file}, one a line)"
            )
        if set(qids) & set(inputs.qids):
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
    vectors = question_vectors(model, [q for q, _ in tune], run)
    return Tuning(tune, qids, vectors, tune_path, qrels, config.data.qrels)
