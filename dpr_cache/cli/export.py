"""`dpr-cache export`: a saved model written for another tool (HF's DPR classes, or a LoRA
run's adapters merged into its base)."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated

import typer

from dpr_cache.cli.app import Command, app, guarded
from dpr_cache.errors import InputError

FORMATS = ("dpr-hf", "merged")


@app.command(cls=Command)
@guarded
def export(
    model: Annotated[str, typer.Option("--model", help="A saved dpr-cache model folder.")],
    out: Annotated[Path, typer.Option(help="Output folder.")],
    format_: Annotated[
        str,
        typer.Option(
            "--format",
            help="dpr-hf: HF's DPR classes; merged: LoRA adapters merged into the base.",
        ),
    ] = "dpr-hf",
) -> None:
    """Write the model for another tool.

    dpr-hf: OUT/question_encoder and OUT/ctx_encoder for HF's DPRQuestionEncoder /
    DPRContextEncoder, with their tokenizers; CLS pooling only. merged: a run trained with
    LoRA, its adapters merged into the base: OUT/query_encoder and OUT/passage_encoder, each a
    folder that transformers.AutoModel and sentence_transformers.SentenceTransformer load
    (last-token pooling, prompts, normalization), encoding as dpr-cache does.

    Example: dpr-cache export --format merged --model runs/toy-llm/model --out runs/toy-llm/merged
    """
    from dpr_cache.model.loading import resolve_model_dir
    from dpr_cache.runtime.atomic import check_output_folder, write_dir_atomic

    if format_ not in FORMATS:
        raise InputError(f"--format: {format_!r} is not a known format ({', '.join(FORMATS)})")
    model_dir = resolve_model_dir(model, Path("."))
    if format_ == "merged":
        from dpr_cache.model.export import MERGED_ENTRIES, export_merged

        check_output_folder(out, {"the model (--model)": model_dir}, MERGED_ENTRIES)
        write_dir_atomic(out, lambda tmp: export_merged(model_dir, tmp))
    else:
        from dpr_cache.model.dpr_formats import DPR_HF_FOLDERS, export_dpr_hf
        from dpr_cache.model.loading import load_encoder

        check_output_folder(out, {"the model (--model)": model_dir}, DPR_HF_FOLDERS)
        encoder = load_encoder(model_dir)
        write_dir_atomic(out, lambda tmp: export_dpr_hf(encoder, tmp))
    print(f"exported to {out}")
