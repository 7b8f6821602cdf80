"""The config-free vector commands: encode texts into shards, search an index into a TREC run."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated

import typer

from dpr_cache.cli.app import Command, app, check_inputs, check_search_flags, guarded
from dpr_cache.cli.options import AUTOCAST, DimOpt, EfSearchOpt, MemoryOpt, NprobeOpt, QuietOpt
from dpr_cache.config import check_flags, default_of


@app.command(cls=Command)
@guarded
def encode(
    model: Annotated[str, typer.Option("--model", help="Model folder (or python:PKG).")],
    out: Annotated[Path, typer.Option(help="Output folder of the shards.")],
    passages: Annotated[Path | None, typer.Option(help="A DPR passages TSV.")] = None,
    questions: Annotated[Path | None, typer.Option(help="A DPR qas file.")] = None,
    pooling: Annotated[str | None, typer.Option(help="Default: as the model saved it.")] = None,
    max_length: Annotated[int | None, typer.Option(help="Default: as the model saved it.")] = None,
    batch_size: Annotated[int, typer.Option(help="Texts per forward.")] = default_of(
        "index.batch_size"
    ),
    shard_size: Annotated[int, typer.Option(help="Passages per shard.")] = default_of(
        "index.shard_size"
    ),
    store_dtype: Annotated[
        str,
        typer.Option(
            help="The stored passage vectors' dtype: float16 or float32 (questions: float32)."
        ),
    ] = default_of("index.store_dtype"),
    num_workers: Annotated[int, typer.Option(help="Tokenizing processes.")] = default_of(
        "data.num_workers"
    ),
    cache_dir: Annotated[Path | None, typer.Option(help="Arrow caches.")] = None,
    device: Annotated[str, typer.Option(help="Where to encode: auto, cpu or cuda.")] = default_of(
        "index.device"
    ),
    precision: Annotated[
        str,
        typer.Option(help=f"The encoder's autocast: {AUTOCAST}."),
    ] = default_of("index.precision"),
    dim: DimOpt = None,
    quiet: QuietOpt = False,
) -> None:
    """Embedding shards (X.npy + X.ids.txt) of a passages TSV or a questions file.

    Question ids are the file's own (X.ids.txt beside it), else its row numbers from 0. No config:
    the model folder says how.

    Example: dpr-cache encode --model runs/toy/model --passages data/toy/passages.tsv --out vecs
    """
    check_inputs(passages=passages, questions=questions)
    settings = check_flags(
        "index",
        {
            "--batch-size": ("batch_size", batch_size),
            "--shard-size": ("shard_size", shard_size),
            "--store-dtype": ("store_dtype", store_dtype),
            "--precision": ("precision", precision),
            "--dim": ("dim", dim),
        },
    )
    if pooling is not None:
        check_flags("model", {"--pooling": ("pooling", pooling)})
    from dpr_cache.model.hub import resolve_model_dir
    from dpr_cache.runtime.lock import output_lock

    resolve_model_dir(model, Path("."))  # before the heavy imports, as the lock
    with output_lock(out):
        from dpr_cache.data.arrow_cache import default_cache_dir
        from dpr_cache.retrieval.drivers.encode import encode_file
        from dpr_cache.runtime.device import resolve_device

        paths = encode_file(
            model,
            out,
            settings,
            pooling=pooling,
            max_length=max_length,
            num_workers=num_workers,
            passages=passages,
            questions=questions,
            device=resolve_device(device, key="--device"),
            cache_dir=cache_dir or default_cache_dir(),
            progress=not quiet,
        )
    print(f"{len(paths)} shard(s) written to {out}")


@app.command(cls=Command)
@guarded
def search(
    index: Annotated[Path, typer.Option("--index", help="An index folder.")],
    out: Annotated[Path, typer.Option(help="The TREC run file to write.")],
    k: Annotated[int, typer.Option("--k", help="Passages per query.")] = 100,
    query_embeddings: Annotated[
        Path | None, typer.Option(help="Q.npy (ids from Q.ids.txt beside it, else row numbers).")
    ] = None,
    questions: Annotated[
        Path | None,
        typer.Option(help="A DPR qas file (with --model); ids from X.ids.txt, else row numbers."),
    ] = None,
    model: Annotated[str | None, typer.Option(help="Model folder for --questions.")] = None,
    memory_gb: MemoryOpt = default_of("index.memory_gb"),
    nprobe: NprobeOpt = default_of("index.ivf_nprobe"),
    ef_search: EfSearchOpt = default_of("index.hnsw_ef_search"),
    tag: Annotated[str, typer.Option(help="The run's name in its last column.")] = "dpr-cache",
    device: Annotated[
        str, typer.Option(help="Where --questions are encoded: auto, cpu or cuda.")
    ] = default_of("eval.device"),
    precision: Annotated[
        str,
        typer.Option(help=f"The question encoder's autocast: {AUTOCAST}."),
    ] = default_of("eval.precision"),
    fusion: Annotated[
        str, typer.Option(help="none, linear (BM25 + weight x dense) or rrf, with BM25.")
    ] = default_of("eval.fusion"),
    fusion_weight: Annotated[
        float, typer.Option(help="linear: the dense score's weight.")
    ] = default_of("eval.fusion_weight"),
    fusion_depth: Annotated[int, typer.Option(help="Candidates from each side.")] = default_of(
        "eval.fusion_depth"
    ),
    bm25_run: Annotated[
        Path | None, typer.Option(help="A TREC run to fuse (rrf) instead of building BM25.")
    ] = None,
    passages: Annotated[
        Path | None, typer.Option(help="BM25's passages TSV (default: the index's own).")
    ] = None,
    cache_dir: Annotated[Path | None, typer.Option(help="Arrow and BM25 caches.")] = None,
    dim: DimOpt = None,
) -> None:
    """Top-k passages of each query as a TREC run (qid Q0 pid rank score tag).

    Searched in bounded memory; under torchrun each rank scans its share of a flat index. With
    --fusion, fused with BM25 (built over the passages for --questions, or --bm25-run).

    Example: dpr-cache search --index vecs/index --query-embeddings q/questions.npy --out run.trec
    """
    check_inputs(
        query_embeddings=query_embeddings, questions=questions, bm25_run=bm25_run, passages=passages
    )
    settings = check_flags(
        "eval",
        {
            "--fusion": ("fusion", fusion),
            "--fusion-weight": ("fusion_weight", fusion_weight),
            "--fusion-depth": ("fusion_depth", fusion_depth),
            "--k": ("top_k", [k]),
            "--bm25-run": ("bm25_run", None if bm25_run is None else str(bm25_run)),
            "--device": ("device", device),
            "--precision": ("precision", precision),
        },
    )
    knobs = check_search_flags(memory_gb, nprobe, ef_search)
    from dpr_cache.model.hub import resolve_model_dir
    from dpr_cache.retrieval.dense.layout import read_meta, recorded_passages
    from dpr_cache.runtime.atomic import check_output_file
    from dpr_cache.runtime.lock import output_lock

    read = {
        "the questions file": questions,
        "the query vectors": query_embeddings,
        "the passages file": passages or recorded_passages(index),
    }
    check_output_file(out, read, folders={"the index": index})
    read_meta(index)  # the index and the model are there, before the heavy imports
    if questions is not None and model is not None:
        resolve_model_dir(model, Path("."))
    with output_lock(out, is_file=True):
        from dpr_cache.data.arrow_cache import default_cache_dir
        from dpr_cache.retrieval.drivers.search import Lexical, Queries
        from dpr_cache.retrieval.drivers.search import search as run

        path = run(
            index,
            Queries(query_embeddings, questions, model, dim),
            out,
            settings,
            knobs,
            Lexical(cache_dir or default_cache_dir(), passages),
            tag,
        )
    if path is not None:
        print(f"run written to {path}")
