"""`dpr-cache score`: a teacher's score on each positive and hard negative of a training file."""

from __future__ import annotations

import shlex
import sys
from pathlib import Path
from typing import Annotated

import typer

from dpr_cache.cli.app import Command, app, check_inputs, check_model_and_index, guarded
from dpr_cache.cli.options import DimOpt, QuietOpt, TeacherMarginOpt, TeacherRelativeOpt
from dpr_cache.config import default_of


@app.command(cls=Command)
@guarded
def score(
    teacher: Annotated[
        str, typer.Option(help="bm25, hybrid, or a Hugging Face cross-encoder folder.")
    ],
    train: Annotated[Path, typer.Option(help="A DPR training file (JSON or JSON Lines).")],
    out: Annotated[Path, typer.Option(help="The scored training file (JSON Lines).")],
    passages: Annotated[
        Path | None,
        typer.Option(help="The passages TSV (bm25: needed; hybrid: default the index's own)."),
    ] = None,
    model: Annotated[
        str | None, typer.Option("--model", help="hybrid: the model that encoded --index.")
    ] = None,
    index: Annotated[Path | None, typer.Option("--index", help="hybrid: its index folder.")] = None,
    fusion_weight: Annotated[
        float | None, typer.Option(help="hybrid: the dense score's weight (default eval's).")
    ] = None,
    precision: Annotated[
        str,
        typer.Option(
            help="cross-encoder: auto (bf16 on a GPU that has it, else fp16; fp32 on CPU), "
            "fp32, bf16, fp16."
        ),
    ] = "auto",
    batch_size: Annotated[
        int | None, typer.Option(help="cross-encoder: pairs a forward (default 64).")
    ] = None,
    max_length: Annotated[
        int | None, typer.Option(help="cross-encoder: tokens a pair (default the model's).")
    ] = None,
    teacher_margin: TeacherMarginOpt = None,
    teacher_relative: TeacherRelativeOpt = None,
    batch: Annotated[int, typer.Option(help="Records per part (resumable unit).")] = 1024,
    device: Annotated[str, typer.Option(help="auto, cpu or cuda.")] = default_of("eval.device"),
    cache_dir: Annotated[Path | None, typer.Option(help="Arrow and BM25 caches.")] = None,
    dim: DimOpt = None,
    quiet: QuietOpt = False,
) -> None:
    """A teacher's score on each positive and hard negative of a training file, as
    teacher_score, for train.loss distill_kl or margin_mse.

    Writes OUT (JSON Lines, every key kept) and its summary beside it; resumable; under
    torchrun the records are split over the ranks. With --teacher-margin or --teacher-relative,
    the hard negatives the teacher scores near its first positive are left out of OUT
    (cleaning: the summary counts them).

    Examples: dpr-cache score --teacher bm25 --passages data/toy/passages.tsv
    --train data/toy/train.jsonl --out runs/toy/train.bm25-scored.jsonl;
    dpr-cache score --teacher data/toy/tiny-cross-encoder --train data/toy/train.jsonl
    --out runs/toy/train.ce-scored.jsonl
    """
    check_inputs(train=train, passages=passages)
    from dpr_cache.retrieval.dense.layout import recorded_passages
    from dpr_cache.runtime.atomic import check_output_file
    from dpr_cache.runtime.lock import output_lock

    if teacher == "hybrid":  # what it reads is there, before the heavy imports
        check_model_and_index(model, index)
    read = {"the training file": train, "the passages file": passages or recorded_passages(index)}
    check_output_file(out, read)
    with output_lock(out, is_file=True):
        from dpr_cache.data.arrow_cache import default_cache_dir
        from dpr_cache.retrieval.drivers.score import format_summary, score_file
        from dpr_cache.retrieval.scoring import ScoreSpec
        from dpr_cache.retrieval.teacher import TeacherSpec

        spec = TeacherSpec(
            teacher,
            passages,
            model,
            index,
            fusion_weight,
            precision,
            batch_size,
            max_length,
            device,
            dim,
        )
        summary = score_file(
            spec,
            train,
            out,
            ScoreSpec(batch, teacher_margin, teacher_relative),
            cache_dir=cache_dir or default_cache_dir(),
            progress=not quiet,
            command=shlex.join(["dpr-cache", *sys.argv[1:]]),
        )
        if summary is not None:
            print(format_summary(summary))
            print(f"written to {out}")
