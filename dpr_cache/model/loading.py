"""Load a model the user named, for training or for encoding, with one-line errors; fingerprint
a saved model folder (so an index is never searched with another model's vectors); load one for
encoding with its settings settled by the one rule of :mod:`dpr_cache.model.encoding`."""

from __future__ import annotations

import hashlib
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from dpr_cache.errors import InputError
from dpr_cache.model.biencoder import BiEncoder
from dpr_cache.model.dpr_formats import dpr_kind
from dpr_cache.model.encoding import settle_encoding
from dpr_cache.model.hub import ModelNotFound, resolve_model_dir, resolve_model_path
from dpr_cache.model.lora import ADAPTER_CONFIG

__all__ = [
    "resolve_model_dir",
    "load_biencoder",
    "load_encoder",
    "load_settled",
    "model_fingerprint",
    "output_dim",
]


def load_biencoder(
    path: str | Path,
    *,
    prefixes: tuple[str | None, str | None] = (None, None),
    source: str | None = None,
    frozen: bool = False,
    **towers: Any,
) -> BiEncoder:
    """:meth:`BiEncoder.from_pretrained` of ``path`` with ``towers``, its settings (``shared``,
    ``pooling``, ``gradient_checkpointing``, ``dropout``, ``normalize``, ``dtype``,
    ``attn_implementation``, ``lora``: ``model.*``), and a tokenizer; or InputError naming the
    path, the ``source`` it came from (a flag or config key) when given, and what went wrong.
    ``prefixes`` (query, passage) replace the model's own prompts where not None. ``frozen``:
    loaded to encode, a folder's LoRA adapters frozen with their base; else loaded to train,
    where a folder holding adapters with no ``lora`` is an InputError (nothing of it would
    train)."""
    where = f"{source}: {path}" if source else str(path)
    try:
        lora = towers.get("lora")
        if not frozen and lora is None and _holds_adapters(resolve_model_path(path)):
            raise InputError(
                f"{where} holds LoRA adapters and model.lora is null, so nothing would train: "
                "set model.lora (as the adapters were saved) to train them, or give the base "
                "model (or the run's `dpr-cache export --format merged`) to fine-tune every weight"
            )
        model = BiEncoder.from_pretrained(path, **towers)
    except InputError:  # already one line naming its key
        raise
    except ModuleNotFoundError as e:  # a module the model's code needs is not installed
        raise InputError(f"{where}: {e}") from None
    except ModelNotFound as e:  # neither a local folder nor had from the hub: says why
        raise InputError(f"{source or 'model'}: {e}") from None
    except (OSError, ValueError) as e:  # no folder, no config.json, unreadable weights
        msg = " ".join(str(e).split())[:200]
        raise InputError(f"{where}: cannot load a model ({msg})") from None
    if model.tokenizer is None:
        raise InputError(f"{where}: no tokenizer files in the model folder")
    query_prefix, passage_prefix = prefixes
    if query_prefix is not None:
        model.query_prefix = query_prefix
    if passage_prefix is not None:
        model.passage_prefix = passage_prefix
    return model


def _holds_adapters(path: Path) -> bool:
    """Whether the model folder ``path`` holds LoRA adapters (a saved BiEncoder's towers, or a
    peft adapter folder itself)."""
    return any((Path(path) / sub / ADAPTER_CONFIG).is_file() for sub in ("query_encoder", "."))


def load_encoder(
    model_dir: Path,
    *,
    pooling: str | None = None,
    normalize: bool | None = None,
    prefixes: tuple[str | None, str | None] = (None, None),
    query_only: bool = False,
    dtype: str | None = None,
    attn_implementation: str | None = None,
) -> BiEncoder:
    """A saved BiEncoder (both towers, or only the query tower), or a plain HF folder serving
    both towers, in eval mode, its weights in ``dtype`` (None: as the folder records) with
    ``attn_implementation`` (None: transformers' choice)."""
    saved = (Path(model_dir) / "query_encoder").is_dir() or dpr_kind(Path(model_dir)) is not None
    model = load_biencoder(
        model_dir,
        shared=query_only or not saved,
        pooling=pooling,
        normalize=normalize,
        prefixes=prefixes,
        dtype=dtype,
        attn_implementation=attn_implementation,
        frozen=True,
    )
    return model.eval()


def model_fingerprint(model_dir: str | Path) -> str:
    """sha256 over every file of the folder (relative path, size, bytes; hidden files skipped),
    or over the one file a model is (a DPR ``.cp``)."""
    root = Path(model_dir)
    digest = hashlib.sha256()
    if root.is_file():
        files, root = [root], root.parent
    else:
        files = sorted(
            p
            for p in root.rglob("*")
            if p.is_file() and not any(part.startswith(".") for part in p.relative_to(root).parts)
        )
    for file in files:
        digest.update(f"{file.relative_to(root).as_posix()}\0{file.stat().st_size}\0".encode())
        with open(file, "rb") as f:
            while block := f.read(1 << 20):
                digest.update(block)
    return digest.hexdigest()


def load_settled(
    model_dir: Path,
    asked: Mapping[str, Any],
    fallback: Mapping[str, Any],
    records: Sequence[tuple[str, Mapping[str, Any], str]] = (),
    *,
    query_only: bool = False,
    loading: Mapping[str, Any] | None = None,
) -> BiEncoder:
    """:func:`load_encoder` with its encoding settled by
    :func:`~dpr_cache.model.encoding.settle_encoding`: ``asked`` checked against ``records``
    (an index's, when searching one) and what the folder records, else ``fallback`` (None:
    as the folder ships it). ``loading``: how the weights load (``dtype``,
    ``attn_implementation``; a key missing or None: as the folder records), which changes a
    vector's rounding, not what it means, so no record is checked against it."""
    settled = settle_encoding(model_dir, asked, fallback, records)
    model = load_encoder(
        model_dir,
        pooling=settled["pooling"],
        normalize=settled["normalize"],
        prefixes=(settled["query_prefix"], settled["passage_prefix"]),
        query_only=query_only,
        dtype=(loading or {}).get("dtype"),
        attn_implementation=(loading or {}).get("attn_implementation"),
    )
    model.max_query_length = settled["max_query_length"] or model.max_query_length
    model.output_dim = output_dim(model, settled["dim"])
    return model


def output_dim(model: BiEncoder, dim: int | None) -> int | None:
    """``dim`` (``index.dim``, ``--dim``) as the model's ``output_dim``: None for the full
    width; InputError when it is above it."""
    if dim is None or dim == model.width:
        return None
    if not 1 <= dim <= model.width:
        raise InputError(
            f"index.dim (--dim): {dim} is not a width of the model's vectors (1 to {model.width})"
        )
    return int(dim)
