"""A saved encoder for inference (index and eval): find it, load it, fingerprint it, and encode
passages in length-sorted batches."""

from __future__ import annotations

import contextlib
import hashlib
import os
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import numpy as np
import torch

from dpr_cache.config import Config
from dpr_cache.errors import InputError
from dpr_cache.model import BiEncoder, resolve_model_path

__all__ = [
    "resolve_model_dir",
    "resolve_device",
    "autocast_for",
    "load_encoder",
    "model_fingerprint",
    "encode_passage_texts",
]


def resolve_model_dir(config: Config, model_dir: str | Path | None) -> Path:
    """The model folder (default ``output_dir/model``), absolute; InputError if missing."""
    path = (
        Path(resolve_model_path(model_dir))
        if model_dir is not None
        else config.output_path / "model"
    )
    if not path.is_dir():
        raise InputError(f"{path}: no model folder: run `dpr-cache train` first or pass --model")
    return path.resolve()


def resolve_device(preference: str | torch.device) -> torch.device:
    """``auto`` = cuda if available else cpu; plain ``cuda`` under torchrun = cuda:LOCAL_RANK."""
    if isinstance(preference, torch.device):
        return preference
    if preference == "auto":
        preference = "cuda" if torch.cuda.is_available() else "cpu"
    try:
        device = torch.device(preference)
    except RuntimeError:
        raise InputError(f"train.device: not a device: {preference!r}") from None
    if device.type == "cuda":
        if not torch.cuda.is_available():
            raise InputError(f"train.device: {preference!r} asked for but CUDA is not available")
        if device.index is None and "LOCAL_RANK" in os.environ:
            device = torch.device("cuda", int(os.environ["LOCAL_RANK"]))
    return device


def autocast_for(device: torch.device, precision: str) -> contextlib.AbstractContextManager:
    """fp16/bf16 autocast on CUDA; a no-op elsewhere (CPU encodes in fp32)."""
    if device.type == "cuda" and precision in ("fp16", "bf16"):
        dtype = torch.float16 if precision == "fp16" else torch.bfloat16
        return torch.autocast("cuda", dtype=dtype)
    return contextlib.nullcontext()


def load_encoder(model_dir: Path, config: Config, *, query_only: bool = False) -> BiEncoder:
    """A saved BiEncoder (both towers, or only the query tower), or a plain HF folder, once."""
    saved = (model_dir / "query_encoder").is_dir()
    try:
        model = BiEncoder.from_pretrained(
            model_dir, shared=query_only or not saved, pooling=config.model.pooling
        )
    except (OSError, ValueError) as e:
        msg = " ".join(str(e).split())[:200]
        raise InputError(f"{model_dir}: cannot load a model ({msg})") from None
    if model.tokenizer is None:
        raise InputError(f"{model_dir}: no tokenizer files in the model folder")
    return model.eval()


def model_fingerprint(model_dir: str | Path) -> str:
    """sha256 over every file of the folder (relative path, size, bytes); hidden files skipped."""
    root = Path(model_dir)
    digest = hashlib.sha256()
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


def _tokenize_pairs(tokenizer, titles: list[str], texts: list[str], max_length: int) -> dict:
    """Unpadded (title, text) pair encodings, truncating the text (DPR); per-pair fallback to
    ``longest_first`` when a title alone is too long."""
    kwargs: dict[str, Any] = {"max_length": max_length, "padding": False}
    try:
        return dict(tokenizer(titles, texts, truncation="only_second", **kwargs))
    except Exception:  # fast tokenizers raise a bare Exception ("Truncation error: ...")
        pass
    rows = []
    for title, text in zip(titles, texts, strict=True):
        try:
            rows.append(tokenizer(title, text, truncation="only_second", **kwargs))
        except Exception:
            rows.append(tokenizer(title, text, truncation="longest_first", **kwargs))
    return {key: [row[key] for row in rows] for key in rows[0]}


def _pad(features: dict, rows: np.ndarray, pad_id: int, width: int, left: bool) -> dict:
    """Tensors of the selected rows padded to ``width`` (input_ids with pad_id, others 0)."""
    out = {}
    for key, seqs in features.items():
        arr = np.full((len(rows), width), pad_id if key == "input_ids" else 0, dtype=np.int64)
        for i, r in enumerate(rows):
            seq = seqs[r]
            if left:
                arr[i, width - len(seq) :] = seq
            else:
                arr[i, : len(seq)] = seq
        out[key] = torch.from_numpy(arr)
    return out


def encode_passage_texts(
    model: BiEncoder,
    titles: Sequence[str],
    texts: Sequence[str],
    *,
    max_length: int,
    batch_size: int,
    device: torch.device,
    precision: str = "fp32",
    sort_by_length: bool = True,
    on_batch: Callable[[int], Any] | None = None,
) -> np.ndarray:
    """Passage embeddings [n, dim] (float32, input order) from the passage tower.

    ``sort_by_length``: batches of similar length (longest first), each padded to its longest;
    otherwise batches in input order padded to ``max_length``, as DPR does.
    """
    n = len(texts)
    tok = model.tokenizer
    feats = _tokenize_pairs(tok, list(titles), list(texts), max_length)
    lengths = np.fromiter((len(s) for s in feats["input_ids"]), dtype=np.int64, count=n)
    order = np.argsort(-lengths, kind="stable") if sort_by_length else np.arange(n)
    pad_id = tok.pad_token_id if tok.pad_token_id is not None else 0
    left = getattr(tok, "padding_side", "right") == "left"
    out = np.empty((n, model.dim), dtype=np.float32)
    with torch.inference_mode(), autocast_for(device, precision):
        for start in range(0, n, batch_size):
            rows = order[start : start + batch_size]
            width = int(lengths[rows].max()) if sort_by_length else max_length
            inputs = {k: v.to(device) for k, v in _pad(feats, rows, pad_id, width, left).items()}
            out[rows] = model.encode_passage(inputs).float().cpu().numpy()
            if on_batch is not None:
                on_batch(len(rows))
    return out
