"""What a training step is made of, shared by the trainer and ``verify``: the batch of a step and
the optimizer and schedule DPR uses."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import torch

from dpr_cache.data.batches import TrainBatches
from dpr_cache.data.collate import Batch, build_batch

__all__ = ["BatchRecipe", "param_groups", "linear_warmup_decay"]


@dataclass(frozen=True)
class BatchRecipe:
    """How a step's examples become a tokenized batch."""

    hard_negatives: int
    max_query_length: int
    max_passage_length: int
    seed: int

    def batch(
        self,
        dataset,
        batches: TrainBatches,
        tokenizer,
        step: int,
        rank: int = 0,
        world_size: int = 1,
    ) -> Batch:
        """This rank's slice of the global batch of ``step``, tokenized, passages grouped."""
        indices = TrainBatches.rank_slice(batches.batch_indices(step), rank, world_size)
        return build_batch(
            [dataset[i] for i in indices],
            tokenizer=tokenizer,
            hard_negatives=self.hard_negatives,
            max_query_length=self.max_query_length,
            max_passage_length=self.max_passage_length,
            seed=self.seed,
            step=step,
            pool_for_padding=dataset,
            indices=indices,
        )


def param_groups(model: torch.nn.Module, weight_decay: float) -> list[dict[str, Any]]:
    """AdamW groups: no decay on biases and LayerNorm weights (as DPR and BERT do)."""
    decay, no_decay, seen = [], [], set()
    for name, param in model.named_parameters():
        if id(param) in seen or not param.requires_grad:
            continue
        seen.add(id(param))
        lowered = name.lower()
        skip = name.endswith("bias") or "layernorm" in lowered or "layer_norm" in lowered
        (no_decay if skip else decay).append(param)
    return [
        {"params": decay, "weight_decay": weight_decay},
        {"params": no_decay, "weight_decay": 0.0},
    ]


def linear_warmup_decay(warmup: int, total: int):
    """LambdaLR factor: linear warm-up over ``warmup`` steps, then linear decay to 0 at
    ``total``."""

    def factor(step: int) -> float:
        if warmup and step < warmup:
            return (step + 1) / warmup
        return max(0.0, (total - step) / max(1, total - warmup))

    return factor
