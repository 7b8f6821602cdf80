"""`dpr-cache export`: a saved model written for another tool (HF's DPR classes, or a LoRA
run's adapters merged into its base; :func:`dpr_cache.model.export.export`)."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated

import typer

from dpr_cache.cli.app import Command, app, guarded
from dpr_cache.model.export import FORMATS

_FORMAT_HELP = "; ".join(f"{name}: {what}" for name, what in FORMATS.items())


@app.command(cls=Command)
@guarded
def export(
    model: Annotated[str, typer.Option("--model", help="A saved dpr-cache model folder.")],
    out: Annotated[Path, typer.Option(help="Output folder.")],
    format_: Annotated[str, typer.Option("--format", help=_FORMAT_HELP)] = next(iter(FORMATS)),
) -> None:
    """Write the model for another tool.

    dpr-hf: OUT/question_encoder and OUT/ctx_encoder for HF's DPRQuestionEncoder /
    DPRContextEncoder, with their tokenizers; CLS pooling only. merged: a run trained with
    LoRA, its adapters merged into the base: OUT/query_encoder and OUT/passage_encoder, each a
    folder that transformers.AutoModel and sentence_transformers.SentenceTransformer load
    (last-token pooling, prompts, normalization), encoding as dpr-cache does.

    Example: dpr-cache export --format merged --model runs/toy-llm/model --out runs/toy-llm/merged
    """
    from dpr_cache.model.hub import resolve_model_dir

    folder = resolve_model_dir(model, Path("."))  # there, before the heavy imports
    from dpr_cache.model.export import export as export_model

    export_model(folder, out, format_)
    print(f"exported to {out}")
