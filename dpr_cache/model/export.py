"""``dpr-cache export``: a saved model written for another tool, in one of :data:`FORMATS`:
HF's DPR classes (``dpr-hf``, :func:`~dpr_cache.model.dpr_formats.export_dpr_hf`), or a run
trained with LoRA as plain model folders, the adapters merged into the base (``merged``).

The merged output is laid out as a run's own model folder (``query_encoder/``, ``passage_encoder/``,
``biencoder.json``, the tokenizer), each tower a complete ``transformers`` folder (config and
merged weights, ``AutoModel`` loads it without peft) and sentence-transformers folder: its
pooling (``lasttoken`` for ``pooling: last``), its prompt and its normalization, and the
tokenizer whose template appends EOS where the run's did. ``SentenceTransformer(tower)`` then
encodes as dpr-cache does.
"""

from __future__ import annotations

import json
from pathlib import Path

from dpr_cache.errors import InputError
from dpr_cache.runtime.atomic import check_output_folder, write_dir_atomic

__all__ = ["FORMATS", "export", "export_merged", "MERGED_ENTRIES"]

FORMATS = {
    "dpr-hf": "HF's DPR classes (OUT/question_encoder, OUT/ctx_encoder; CLS pooling only)",
    "merged": "LoRA adapters merged into the base (OUT/query_encoder, OUT/passage_encoder)",
}
"""Each format ``export`` writes, and what it is (the CLI's ``--format`` help; the CLI imports
this module to list them, so torch and transformers are imported only where a model is)."""

MERGED_ENTRIES = (
    "query_encoder",
    "passage_encoder",
    "biencoder.json",
    "tokenizer.json",
    "tokenizer_config.json",
    "special_tokens_map.json",
    "chat_template.jinja",
)
"""What an export's folder holds (so that exporting again into it may replace it)."""


def export(model_dir: str | Path, out: str | Path, format: str) -> Path:
    """Write the saved model ``model_dir`` into the folder ``out`` in ``format`` (one of
    :data:`FORMATS`), swapped in whole; InputError for another format, or an ``out`` that is or
    holds ``model_dir`` or holds anything but an earlier export."""
    if format not in FORMATS:
        raise InputError(f"--format: {format!r} is not a known format ({', '.join(FORMATS)})")
    inputs = {"the model (--model)": model_dir}
    if format == "merged":
        check_output_folder(out, inputs, MERGED_ENTRIES)
        return write_dir_atomic(out, lambda tmp: export_merged(model_dir, tmp))
    from dpr_cache.model.dpr_formats import DPR_HF_FOLDERS, export_dpr_hf
    from dpr_cache.model.loading import load_encoder

    check_output_folder(out, inputs, DPR_HF_FOLDERS)
    encoder = load_encoder(Path(model_dir))
    return write_dir_atomic(out, lambda tmp: export_dpr_hf(encoder, tmp))


def export_merged(model_dir: str | Path, out_dir: str | Path, dtype: str | None = None) -> Path:
    """Write ``model_dir`` (a saved BiEncoder, with or without adapters) with each tower's
    adapters merged into its base, into ``out_dir``; ``dtype`` (``fp32 | bf16 | fp16``) the
    weights are merged and written in (None: the dtype the run recorded, else fp32)."""
    from dpr_cache.model.biencoder import BiEncoder

    model = BiEncoder.from_pretrained(model_dir, shared=_shared(model_dir), dtype=dtype)
    return model.merge_adapters().save_pretrained(out_dir)


def _shared(model_dir: str | Path) -> bool:
    """Whether the saved model's towers are one (its ``biencoder.json``)."""
    meta = Path(model_dir) / "biencoder.json"
    return meta.is_file() and bool(json.loads(meta.read_text(encoding="utf-8")).get("shared"))
