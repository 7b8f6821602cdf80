"""`dpr-cache mine`: hard negatives for a training file, ranked by a model or by BM25."""

from __future__ import annotations

import shlex
import sys
from pathlib import Path
from typing import Annotated

import typer

from dpr_cache.cli.app import (
    Command,
    app,
    check_inputs,
    check_model_and_index,
    check_search_flags,
    guarded,
)
from dpr_cache.cli.options import (
    AUTOCAST,
    DimOpt,
    EfSearchOpt,
    MemoryOpt,
    NprobeOpt,
    QuietOpt,
    TeacherMarginOpt,
    TeacherRelativeOpt,
)
from dpr_cache.config import default_of
from dpr_cache.errors import InputError
from dpr_cache.retrieval.mining.rules import MineSpec, NegativeRules


@app.command(cls=Command)
@guarded
def mine(
    train: Annotated[Path, typer.Option(help="A DPR training file (JSON or JSON Lines).")],
    out: Annotated[Path, typer.Option(help="The mined training file (JSON Lines).")],
    ranker: Annotated[
        str, typer.Option(help="What ranks the candidates: model (over --index) or bm25.")
    ] = "model",
    model: Annotated[
        str | None, typer.Option("--model", help="The model that encoded --index.")
    ] = None,
    index: Annotated[
        Path | None, typer.Option("--index", help="Its index folder (dpr-cache index).")
    ] = None,
    passages: Annotated[
        Path | None,
        typer.Option(help="The passages TSV (bm25: needed; model: default the index's own)."),
    ] = None,
    negatives: Annotated[
        int, typer.Option(help="Hard negatives kept per question.")
    ] = MineSpec.negatives,
    depth: Annotated[int, typer.Option(help="Candidates ranked per question.")] = MineSpec.depth,
    skip: Annotated[
        int, typer.Option(help="The ranker's top ranks left out first.")
    ] = MineSpec.skip,
    keep_bm25: Annotated[
        bool, typer.Option("--keep-bm25", help="Keep the file's own hard negatives after these.")
    ] = MineSpec.keep_bm25,
    match: Annotated[
        str, typer.Option(help="Answer check: string, regex or none (DPR's has_answer).")
    ] = NegativeRules.match,
    qrels: Annotated[
        Path | None, typer.Option(help="TREC qrels: a passage judged relevant is dropped.")
    ] = None,
    margin: Annotated[
        float | None, typer.Option(help="Drop a candidate scoring at least positive - MARGIN.")
    ] = None,
    relative_margin: Annotated[
        float | None,
        typer.Option(help="Drop a candidate scoring at least positive - MARGIN x |positive|."),
    ] = None,
    teacher: Annotated[
        str | None,
        typer.Option(
            help="Drop candidates a teacher (bm25, hybrid or a cross-encoder folder) "
            "scores near the positive."
        ),
    ] = None,
    teacher_margin: TeacherMarginOpt = None,
    teacher_relative: TeacherRelativeOpt = None,
    fusion_weight: Annotated[
        float | None, typer.Option(help="--teacher hybrid: the dense score's weight.")
    ] = None,
    precision: Annotated[
        str,
        typer.Option(
            help="The autocast of --ranker model's question encoder and of a cross-encoder "
            f"teacher: {AUTOCAST}."
        ),
    ] = "auto",
    batch: Annotated[
        int, typer.Option(help="Questions per part (resumable unit).")
    ] = MineSpec.batch,
    memory_gb: MemoryOpt = default_of("index.memory_gb"),
    nprobe: NprobeOpt = default_of("index.ivf_nprobe"),
    ef_search: EfSearchOpt = default_of("index.hnsw_ef_search"),
    device: Annotated[str, typer.Option(help="auto, cpu or cuda.")] = default_of("eval.device"),
    cache_dir: Annotated[Path | None, typer.Option(help="Arrow and BM25 caches.")] = None,
    dim: DimOpt = None,
    quiet: QuietOpt = False,
) -> None:
    """Hard negatives for a training file: the best-ranked passages that are not positives,
    hold no answer and are not judged relevant. With --ranker model, the model's own over its
    index (DPR's second round); with --ranker bm25, BM25's (DPR's first).

    Writes OUT (every key kept) and OUT's summary beside it (what mined it, what each rule
    dropped); resumable. Under torchrun the index's shards are split over the ranks.

    Examples: dpr-cache mine --ranker bm25 --passages data/toy/passages.tsv
    --train data/toy/train.jsonl --out runs/toy/train.bm25.jsonl;
    dpr-cache mine --model runs/toy/model --index runs/toy/index
    --train data/toy/train.jsonl --out runs/toy/train.mined.jsonl
    """
    check_inputs(train=train, passages=passages, qrels=qrels)
    from dpr_cache.retrieval.dense.layout import recorded_passages
    from dpr_cache.runtime.atomic import check_output_file
    from dpr_cache.runtime.lock import output_lock

    if ranker == "model" or teacher == "hybrid":  # else refused below: bm25 takes neither
        check_model_and_index(model, index)  # what it reads is there, before the heavy imports
    read = {"the training file": train, "the passages file": passages or recorded_passages(index)}
    check_output_file(out, read)
    with output_lock(out, is_file=True):
        from dpr_cache.data.arrow_cache import default_cache_dir
        from dpr_cache.retrieval.drivers.mine import RankerSpec, format_summary, mine_file
        from dpr_cache.retrieval.teacher import TeacherSpec

        if teacher is None and fusion_weight is not None:
            raise InputError("--fusion-weight is the hybrid teacher's: give --teacher hybrid")
        check_search_flags(memory_gb, nprobe, ef_search)
        rules = NegativeRules.from_flag(
            match,
            margin=margin,
            relative_margin=relative_margin,
            teacher_margin=teacher_margin,
            teacher_relative=teacher_relative,
        )
        taught = None
        if teacher is not None:  # --precision is a cross-encoder's; bm25 and hybrid score in fp32
            crossed = TeacherSpec(teacher).kind == "cross-encoder"
            taught = TeacherSpec(
                teacher,
                fusion_weight=fusion_weight,
                precision=precision if crossed else "auto",
                device=device,
            )
        spec = MineSpec(negatives, depth, skip, keep_bm25, rules, batch)
        if dim is not None and ranker != "model" and teacher != "hybrid":
            raise InputError(
                "--dim: the width of a model's vectors (--ranker model, --teacher hybrid)"
            )
        ranks = RankerSpec(
            ranker, model, index, passages, nprobe, ef_search, memory_gb, device, precision, dim
        )
        summary = mine_file(
            ranks,
            train,
            out,
            spec,
            qrels=qrels,
            cache_dir=cache_dir or default_cache_dir(),
            progress=not quiet,
            command=shlex.join(["dpr-cache", *sys.argv[1:]]),
            teacher=taught,
        )
        if summary is not None:
            print(format_summary(summary))
            print(f"written to {out}")
