"""The pipeline commands that read a run config: train, index, eval, verify."""

from __future__ import annotations

import shlex
import sys
from pathlib import Path
from typing import Annotated

import typer

from dpr_cache.cli.app import (
    Command,
    app,
    check_config_files,
    check_matches,
    guarded,
    load,
    overridden,
    rank_and_world,
)
from dpr_cache.cli.options import ConfigMemoryOpt, ConfigOpt, DimOpt, ModelOpt, QuietOpt, SetOpt
from dpr_cache.errors import InputError


@app.command(cls=Command)
@guarded
def train(
    config: ConfigOpt,
    set_: SetOpt = None,
    resume: Annotated[
        bool, typer.Option("--resume", help="Continue from the last checkpoint.")
    ] = False,
    quiet: QuietOpt = False,
) -> None:
    """Train a DPR bi-encoder (gradcache | full | accumulate); writes output_dir/model.

    --resume continues from the last checkpoint (with none, it says so and starts; on a finished
    run, it says so and ends). Example: dpr-cache train -c configs/toy.yaml --resume
    """
    from dpr_cache.runtime.lock import output_lock
    from dpr_cache.train.resume import check_start, finished_resume
    from dpr_cache.train.settle import settle_model

    cfg = settle_model(load(config, set_))  # every refusal before the trainer's imports
    main = rank_and_world()[0] == 0
    finished = finished_resume(cfg) if resume else None
    if finished is not None:  # nothing to do, nothing touched (not even the lock)
        if main:
            print(finished.finished_line(cfg.output_path))
        return
    with output_lock(cfg.output_path):
        start = check_start(cfg, resume)
        if start.note and main:
            print(start.note, file=sys.stderr)
        if start.finished is not None:
            if main:
                print(start.finished_line(cfg.output_path))
            return
        from dpr_cache.train.loop import train as run

        model_dir = run(cfg, resume=resume, progress=not quiet, start=start)
    if main:
        print(f"model saved to {model_dir}")


_QAS = "a DPR qas TSV of questions and answers"
_INDEXED = "the passages TSV the index was built from"


def _required(value: str | list[str] | None, key: str, what: str) -> Path | list[Path]:
    """The file (or files) a config key names; InputError when the key is not set."""
    if not value:
        raise InputError(f"{key}: not set ({what})")
    return [Path(v) for v in value] if isinstance(value, list) else Path(value)


TypeOpt = Annotated[
    str | None, typer.Option("--type", help="flat | ivf | ivfpq | hnsw (default index.type).")
]


@app.command(cls=Command)
@guarded
def index(
    config: Annotated[Path | None, typer.Option("--config", "-c", help="YAML run config.")] = None,
    set_: SetOpt = None,
    model: ModelOpt = None,
    embeddings: Annotated[
        str | None,
        typer.Option(help="Precomputed shards: a glob of .npy (ours) or DPR's .pkl files."),
    ] = None,
    out: Annotated[Path | None, typer.Option(help="Index folder (with --embeddings).")] = None,
    memory_gb: ConfigMemoryOpt = None,
    type_: TypeOpt = None,
    nlist: Annotated[int | None, typer.Option(help="IVF lists (default index.ivf_nlist).")] = None,
    pq_m: Annotated[int | None, typer.Option(help="PQ sub-vectors (default index.pq_m).")] = None,
    dim: DimOpt = None,
    quiet: QuietOpt = False,
) -> None:
    """Index data.passages (--config) or precomputed shards (--embeddings GLOB --out DIR).

    flat searches the shards exactly in bounded memory; ivf and ivfpq build on-disk inverted
    lists; hnsw needs its whole graph in RAM. DPR's embedding pickles are trusted input only.

    Examples: dpr-cache index -c configs/toy.yaml;
    dpr-cache index --embeddings 'vecs/*.npy' --out vecs/index --type ivfpq --memory-gb 8
    """
    options = {
        "index.type": type_,
        "index.memory_gb": memory_gb,
        "index.ivf_nlist": nlist,
        "index.pq_m": pq_m,
        "index.dim": dim,
    }
    extra = [f"{key}={value}" for key, value in options.items() if value is not None]
    cfg = load(config, [*(set_ or []), *extra])  # validated like --set: one-line errors
    if embeddings is None and config is None:
        raise InputError("index: give --config FILE (to encode data.passages) or --embeddings")
    if embeddings is None and out is not None:
        raise InputError(
            "index --out: with --config the index goes to output_dir/index (--set "
            "output_dir=DIR); --out is for --embeddings"
        )
    if embeddings is not None and out is None:
        raise InputError("index --embeddings: --out DIR is needed")
    from dpr_cache.model.hub import resolve_model_dir
    from dpr_cache.retrieval.dense.layout import index_dir_of
    from dpr_cache.runtime.lock import output_lock

    if embeddings is None:  # what it reads is there, before the heavy imports
        resolve_model_dir(model, cfg.output_path / "model")
        passages = _required(cfg.data.passages, "data.passages", "a DPR passages TSV")
        check_config_files({"data.passages": passages})
    else:
        check_matches(embeddings)
    with output_lock(out if embeddings is not None else index_dir_of(cfg.output_path)):
        from dpr_cache.retrieval.drivers.index import index_command

        path = index_command(
            cfg,
            model,
            embeddings=embeddings,
            out=out,
            progress=not quiet,
            overridden=overridden(set_),
        )
    if path is not None:
        print(f"index written to {path}")


@app.command("eval", cls=Command)
@guarded
def eval_(
    config: ConfigOpt,
    set_: SetOpt = None,
    model: ModelOpt = None,
    out: Annotated[
        Path | None, typer.Option(help="Where the results go (default output_dir/eval).")
    ] = None,
    dim: DimOpt = None,
    quiet: QuietOpt = False,
) -> None:
    """Search data.dev_qa questions, judge them (DPR's answer match, or data.qrels), print the
    metrics; writes retrieval.json, retrieval.pyserini.json, run.trec, metrics.json,
    timings.json and config.yaml (and fusion.json when fused with BM25).

    Example: dpr-cache eval -c configs/toy.yaml --set eval.top_k=[1,5,20]
    """
    cfg = load(config, [*(set_ or []), *([f"index.dim={dim}"] if dim is not None else [])])
    from dpr_cache.model.hub import resolve_model_dir
    from dpr_cache.retrieval.dense.layout import index_dir_of, read_meta
    from dpr_cache.retrieval.drivers.overrides import refuse_train_overrides
    from dpr_cache.runtime.lock import output_lock

    refuse_train_overrides(overridden(set_), "eval")
    read_meta(index_dir_of(cfg.output_path))  # eval before index: said before the heavy imports
    resolve_model_dir(model, cfg.output_path / "model")
    data, spec = cfg.data, cfg.eval
    _required(data.dev_qa, "data.dev_qa", _QAS)
    several = len(cfg.dev_sets) > 1
    check_config_files(
        {
            **{
                f"data.dev_qa{f'[{i}]' if several else ''}": p
                for i, (_, p) in enumerate(cfg.dev_sets)
            },
            "data.passages": _required(data.passages, "data.passages", _INDEXED),
            "data.qrels": data.qrels,
            "eval.bm25_run": spec.bm25_run,
            "eval.fusion_tune_qa": spec.fusion_tune_qa,
        }
    )
    with output_lock(out or cfg.output_path / "eval"):
        from dpr_cache.retrieval.drivers.eval import (
            eval_command,
            format_metrics_table,
            format_sets_table,
        )

        metrics = eval_command(
            cfg,
            model,
            out_dir=out,
            progress=not quiet,
            overridden=overridden(set_),
            command=shlex.join(["dpr-cache", *sys.argv[1:]]),
        )
    if metrics is not None:
        print(format_sets_table(metrics) if "sets" in metrics else format_metrics_table(metrics))
        print(f"results in {out or cfg.output_path / 'eval'}")


@app.command(cls=Command)
@guarded
def verify(
    config: ConfigOpt,
    set_: SetOpt = None,
    double: Annotated[bool, typer.Option("--double", help="Run both in float64.")] = False,
) -> None:
    """One step on a real batch, full batch versus GradCache (dropout off): the gradient gap,
    its bound and the verdict (exit 1 when over the bound).

    Example: dpr-cache verify -c configs/toy.yaml --double (float64: a gap near 1e-13, bound 1e-10)
    """
    cfg = load(config, set_)
    from dpr_cache.train.verify import verify as run

    report = run(cfg, double=double)
    if report is None:  # a rank but 0 of a sharded check: rank 0 prints
        return
    for key, value in report.items():
        print(f"{key:>28}: {value}")
    if report["verdict"].startswith("DIFFERENT"):
        raise typer.Exit(1)


@app.command(cls=Command)
@guarded
def bench(
    config: ConfigOpt,
    set_: SetOpt = None,
    chunks: Annotated[
        str, typer.Option(help="Chunk sizes to time, comma-separated (default: the config's).")
    ] = "",
    steps: Annotated[int, typer.Option(help="Timed updates per chunk size (median).")] = 3,
    warmup: Annotated[int, typer.Option(help="Untimed updates first.")] = 1,
) -> None:
    """Time this config's training step at each chunk size on this machine (a fresh process
    each) and say which chunk to train with: the fastest within train.memory_budget.

    Example: dpr-cache bench -c configs/toy.yaml --chunks 4,8,16,32
    """
    cfg = load(config, set_)
    try:
        sizes = [int(c) for c in chunks.replace(" ", "").split(",") if c]
    except ValueError:
        raise InputError(f"--chunks: expected comma-separated integers, got {chunks!r}") from None
    if not sizes:
        if cfg.train.chunk_size == "auto":
            raise InputError("--chunks: give the sizes to time (train.chunk_size is auto)")
        sizes = [int(cfg.train.chunk_size)]
    from dpr_cache.train.bench import bench_chunks, choose_chunk, format_table

    timings = bench_chunks(cfg, sizes, steps, warmup)
    print(format_table(timings, cfg.train.memory_budget))
    best = choose_chunk(timings, cfg)
    print(f"fastest: train.chunk_size={best.chunk} ({best.pairs_per_s:.2f} pairs/s)")
