"""``dpr-cache export --format merged``: a run trained with LoRA as plain model folders, the
adapters merged into the base.

The output is laid out as a run's own model folder (``query_encoder/``, ``passage_encoder/``,
``biencoder.json``, the tokenizer), each tower a complete ``transformers`` folder (config and
merged weights, ``AutoModel`` loads it without peft) and sentence-transformers folder: its
pooling (``lasttoken`` for ``pooling: last``), its prompt and its normalization, and the
tokenizer whose template appends EOS where the run's did. ``SentenceTransformer(tower)`` then
encodes as dpr-cache does.
"""

from __future__ import annotations

import json
from pathlib import Path

from dpr_cache.model.biencoder import BiEncoder

__all__ = ["export_merged", "MERGED_ENTRIES"]

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


def export_merged(model_dir: str | Path, out_dir: str | Path, dtype: str | None = None) -> Path:
    """Write ``model_dir`` (a saved BiEncoder, with or without adapters) with each tower's
    adapters merged into its base, into ``out_dir``; ``dtype`` (``fp32 | bf16 | fp16``) the
    weights are merged and written in (None: the dtype the run recorded, else fp32)."""
    model = BiEncoder.from_pretrained(model_dir, shared=_shared(model_dir), dtype=dtype)
    return model.merge_adapters().save_pretrained(out_dir)


def _shared(model_dir: str | Path) -> bool:
    """Whether the saved model's towers are one (its ``biencoder.json``)."""
    meta = Path(model_dir) / "biencoder.json"
    return meta.is_file() and bool(json.loads(meta.read_text(encoding="utf-8")).get("shared"))
