"""An index folder read without its libraries (no FAISS, numpy or torch): where a run's index
lives, and its ``meta.json`` checked, so that a command refuses a missing or foreign index in a
second, before its heavy imports."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from dpr_cache.errors import InputError

__all__ = [
    "META_FILE",
    "FORMAT",
    "MULTI",
    "check_vectors",
    "model_vectors",
    "index_dir_of",
    "meta_passages",
    "read_meta",
    "recorded_passages",
]

META_FILE = "meta.json"
FORMAT = 2
MULTI = "multi"
"""``meta.json``'s ``"vectors"`` for an index of a multi-vector model's token vectors (absent:
one vector a passage)."""


def index_dir_of(output_dir: Path) -> Path:
    """Where a run's index lives: ``output_dir/index``."""
    return Path(output_dir) / "index"


def read_meta(index_dir: str | Path) -> dict[str, Any]:
    """The index's ``meta.json``; InputError when there is no index at ``index_dir``, or it is
    not valid JSON, or of another dpr-cache version."""
    index_dir = Path(index_dir)
    meta_path = index_dir / META_FILE
    if not meta_path.is_file():
        raise InputError(f"no index at {index_dir}: run `dpr-cache index` first")
    try:
        meta = json.loads(meta_path.read_text())
    except ValueError:
        raise InputError(f"{meta_path}: not valid JSON: rerun `dpr-cache index`") from None
    if not isinstance(meta, dict) or meta.get("format") != FORMAT:
        raise InputError(
            f"{index_dir}: an index of another dpr-cache version (format "
            f"{meta.get('format') if isinstance(meta, dict) else None}, this one reads {FORMAT}): "
            "rerun `dpr-cache index`"
        )
    return meta


def meta_passages(meta: dict[str, Any]) -> Path | None:
    """The passages file an index's meta records (None: none)."""
    recorded = meta.get("passages")
    return Path(recorded["path"]) if isinstance(recorded, dict) and "path" in recorded else None


def recorded_passages(index_dir: str | Path | None) -> Path | None:
    """The passages file the index at ``index_dir`` was encoded from, as its meta records it,
    read before the index is opened (None when there is none, or its meta cannot be read:
    opening the index then says what is wrong)."""
    if index_dir is None:
        return None
    try:
        return meta_passages(json.loads((Path(index_dir) / META_FILE).read_text()))
    except (OSError, ValueError, AttributeError):
        return None


def model_vectors(model_dir: str | Path) -> str:
    """What the model folder encodes, as it records it: ``multi`` (a vector a token) or
    ``single`` (one a text)."""
    from dpr_cache.model.encoding import folder_encoding

    return folder_encoding(model_dir).get("vectors") or "single"


def check_vectors(model_dir: str | Path, meta: dict[str, Any], index_dir: str | Path) -> None:
    """InputError when the model folder and the index (its ``meta``) are of different kinds:
    a multi-vector model's token vectors against one vector a passage, or the reverse."""
    model, index = model_vectors(model_dir), meta.get("vectors") or "single"
    if model == index:
        return
    words = {MULTI: "a multi-vector model (a vector a token)", "single": "one vector a text"}
    held = {MULTI: "token vectors (a multi-vector model's)", "single": "one vector a passage"}
    raise InputError(
        f"{model_dir}: {words[model]}, but the index at {index_dir} holds {held[index]}: pass "
        "the model that built it, or index the passages with this one"
    )
