"""Where a named model's files are: a local folder, ``python:PACKAGE`` (a folder shipped inside an
installed package), or a Hugging Face hub name such as ``bert-base-uncased``, downloaded once into
the hub's cache as ``transformers`` does and read from there afterwards (``HF_HUB_OFFLINE=1``:
from the cache only). Every later step then works on a local folder."""

from __future__ import annotations

import importlib
import os
import re
from pathlib import Path

from dpr_cache.errors import InputError

__all__ = ["ModelNotFound", "resolve_model_path", "resolve_model_dir", "hub_name_of", "HUB_FILES"]

HUB_FILES = ["*.json", "*.txt", "*.model", "*.safetensors", "1_Pooling/*", "2_Normalize/*"]
"""What a download fetches: configs, tokenizer files, safetensors weights and the
sentence-transformers modules (not the TensorFlow, Flax or ONNX copies many hub models carry)."""

_HUB_NAME = re.compile(r"[A-Za-z0-9][\w.-]*(/[A-Za-z0-9][\w.-]*)?")


class ModelNotFound(FileNotFoundError):
    """A model name that is no local folder and could not be had from the hub: the message is
    one line that says why and what to do."""


def resolve_model_path(name_or_path: str | Path) -> Path:
    """The local folder (or DPR ``.cp`` file) of a model name; see the module docstring."""
    text = str(name_or_path)
    if text.startswith("python:"):
        try:
            return Path(importlib.import_module(text.removeprefix("python:")).get_model_path())
        except (ImportError, ValueError, AttributeError) as exc:
            raise ModelNotFound(
                2, f"not an installed package that ships a model ({type(exc).__name__})", text
            ) from None
    path = Path(text).expanduser()
    if path.exists() or not _is_hub_name(text):
        return path
    return _hub_snapshot(text)


def resolve_model_dir(model_dir: str | Path | None, default: Path) -> Path:
    """``model_dir`` (or ``default``, e.g. ``output_dir/model``), absolute; InputError if absent."""
    try:
        path = resolve_model_path(model_dir) if model_dir is not None else Path(default)
    except ModelNotFound as e:
        raise InputError(f"--model: {e}") from None
    if not (path.is_dir() or (path.is_file() and path.suffix == ".cp")):
        raise InputError(f"{path}: no model folder: run `dpr-cache train` first or pass --model")
    return path.resolve()


def hub_name_of(folder: Path) -> str | None:
    """The hub name (``org/name``) of a snapshot folder of the Hugging Face cache
    (``.../models--org--name/snapshots/<revision>``, as :func:`resolve_model_path` gives a hub
    model), or None for any other folder."""
    parent, repo = folder.parent, folder.parent.parent.name
    if parent.name == "snapshots" and repo.startswith("models--"):
        return repo.removeprefix("models--").replace("--", "/")
    return None


def _is_hub_name(text: str) -> bool:
    """``name`` or ``org/name``, where ``org`` is not a local folder (``runs/model`` that is
    missing is a missing path, not a hub model)."""
    return bool(_HUB_NAME.fullmatch(text)) and not ("/" in text and Path(text).parent.is_dir())


def _offline() -> bool:
    """Whether the hub may not be asked, read as huggingface_hub reads it (``HF_HUB_OFFLINE``,
    else ``TRANSFORMERS_OFFLINE``)."""
    value = os.environ.get("HF_HUB_OFFLINE") or os.environ.get("TRANSFORMERS_OFFLINE") or ""
    return value.lower() in ("1", "true", "yes", "on")


def _hub_snapshot(name: str) -> Path:
    from huggingface_hub import snapshot_download
    from huggingface_hub.errors import (
        GatedRepoError,
        HFValidationError,
        LocalEntryNotFoundError,
        RepositoryNotFoundError,
    )

    try:
        folder = Path(snapshot_download(name, allow_patterns=HUB_FILES))
        if not any(folder.glob("*.safetensors")):  # an older model: PyTorch weights only
            folder = Path(snapshot_download(name, allow_patterns=[*HUB_FILES, "*.bin"]))
    except HFValidationError:
        raise ModelNotFound(2, "no such model folder", name) from None
    except GatedRepoError:
        raise ModelNotFound(
            f"{name}: no such local folder, and the Hugging Face hub keeps this model behind a "
            "login: accept its terms on the hub and log in (hf auth login), or give a local folder"
        ) from None
    except RepositoryNotFoundError:
        raise ModelNotFound(
            f"{name}: no such local folder, and no such model on the Hugging Face hub"
        ) from None
    except LocalEntryNotFoundError as e:
        if _offline():
            why = "it is not in the Hugging Face cache and HF_HUB_OFFLINE=1 forbids a download"
        else:
            cause = " ".join(str(e).split())[:120]
            why = f"the Hugging Face hub could not be reached to download it ({cause})"
        raise ModelNotFound(
            f"{name}: no such local folder, and {why}: download it once with network access, "
            "or give a local model folder"
        ) from None
    return folder
