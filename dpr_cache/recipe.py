"""What a config means for the model and for each step's batch (shared by train and verify)."""

from __future__ import annotations

from typing import Any

from dpr_cache.config import Config
from dpr_cache.data import Batch, TrainBatches, build_batch
from dpr_cache.errors import InputError
from dpr_cache.model import BiEncoder

__all__ = ["load_model", "step_batch"]

_KEEP = object()


def load_model(config: Config, *, dropout: Any = _KEEP) -> BiEncoder:
    """The BiEncoder ``model.*`` describes (``dropout`` overrides ``model.dropout``)."""
    model = BiEncoder.from_pretrained(
        config.model.name_or_path,
        shared=config.model.shared,
        pooling=config.model.pooling,
        gradient_checkpointing=config.model.gradient_checkpointing,
        dropout=config.model.dropout if dropout is _KEEP else dropout,
    )
    if model.tokenizer is None:
        raise InputError(f"model.name_or_path: no tokenizer files in {config.model.name_or_path}")
    return model


def step_batch(
    config: Config,
    dataset,
    batches: TrainBatches,
    tokenizer,
    step: int,
    *,
    rank: int = 0,
    world_size: int = 1,
) -> Batch:
    """This rank's slice of the global batch of ``step``, tokenized, passages grouped."""
    indices = TrainBatches.rank_slice(batches.batch_indices(step), rank, world_size)
    return build_batch(
        [dataset[i] for i in indices],
        tokenizer=tokenizer,
        hard_negatives=config.train.hard_negatives,
        max_query_length=config.model.max_query_length,
        max_passage_length=config.model.max_passage_length,
        seed=config.train.seed,
        step=step,
        pool_for_padding=dataset,
        indices=indices,
    )
