"""Hugging Face encoder towers: load or build a tower, load a tokenizer."""

from __future__ import annotations

import copy
from pathlib import Path

import torch
from torch import nn
from transformers import AutoConfig, AutoModel, AutoTokenizer, PretrainedConfig

__all__ = [
    "load_tower",
    "decoder_only",
    "tower_from_config",
    "load_tokenizer",
]

_DROPOUT_KEYS = (
    "hidden_dropout_prob",
    "attention_probs_dropout_prob",
    "dropout",
    "attention_dropout",
)


def _set_dropout(config: PretrainedConfig, dropout: float | None) -> PretrainedConfig:
    if dropout is not None:
        for key in _DROPOUT_KEYS:
            if hasattr(config, key):
                setattr(config, key, dropout)
    return config


def decoder_only(config: PretrainedConfig) -> bool:
    """Whether ``config`` is a decoder-only model's (Llama, Mistral, Qwen2, ...): a causal
    language model's type that is no masked one (BERT is both)."""
    from transformers.models.auto.modeling_auto import (
        MODEL_FOR_CAUSAL_LM_MAPPING_NAMES,
        MODEL_FOR_MASKED_LM_MAPPING_NAMES,
    )

    kind = getattr(config, "model_type", None)
    return (
        kind in MODEL_FOR_CAUSAL_LM_MAPPING_NAMES and kind not in MODEL_FOR_MASKED_LM_MAPPING_NAMES
    )


def _no_kv_cache(config: PretrainedConfig) -> PretrainedConfig:
    """A decoder-only model's config with its key-value cache off: a tower encodes each text in
    one forward and generates nothing, so a cache would only hold memory (and checkpointed
    layers turn it off with a warning)."""
    if decoder_only(config):
        config.use_cache = False
    return config


def _freeze_pooler(tower: nn.Module) -> nn.Module:
    """Keep BERT's pooler (saved, so ``pooler_output`` means what the checkpoint meant) but out
    of training: DPR pools from the last hidden state, and DDP ignores frozen parameters."""
    pooler = getattr(tower, "pooler", None)
    if isinstance(pooler, nn.Module):
        pooler.requires_grad_(False)
    return tower


def _loading_options(dtype: torch.dtype | None, attention: str | None) -> dict:
    """``from_pretrained`` / ``from_config`` keywords for a dtype and an attention
    implementation, each only when given (else transformers' own choice)."""
    options: dict = {}
    if dtype is not None:
        options["dtype"] = dtype
    if attention is not None:
        options["attn_implementation"] = attention
    return options


def load_tower(
    path: str | Path,
    dropout: float | None = None,
    dtype: torch.dtype | None = None,
    attention: str | None = None,
) -> nn.Module:
    """A pretrained encoder or decoder (``AutoModel``: a causal LM's checkpoint gives its base
    model); ``dropout`` overrides its dropout probabilities, ``dtype`` the dtype its weights
    load in, ``attention`` its attention implementation, each when given."""
    config = _no_kv_cache(_set_dropout(AutoConfig.from_pretrained(path), dropout))
    options = _loading_options(dtype, attention)
    return _freeze_pooler(AutoModel.from_pretrained(path, config=config, **options))


def tower_from_config(
    config: PretrainedConfig,
    dropout: float | None = None,
    dtype: torch.dtype | None = None,
    attention: str | None = None,
) -> nn.Module:
    """A randomly initialised model of ``config``."""
    config = _no_kv_cache(_set_dropout(copy.deepcopy(config), dropout))
    options = _loading_options(dtype, attention)
    return _freeze_pooler(AutoModel.from_config(config, **options))


def load_tokenizer(path: Path):
    """The tokenizer saved in ``path``, or None when the folder holds no tokenizer files."""
    names = ("tokenizer.json", "vocab.txt", "tokenizer_config.json")
    if any((path / name).is_file() for name in names):
        return AutoTokenizer.from_pretrained(path)
    return None
