"""What a training step is made of, shared by the trainer and ``verify``: the batch of a step and
the optimizer and schedule DPR uses."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import torch

from dpr_cache.data.batches import TrainBatches
from dpr_cache.data.collate import Batch, build_batch
from dpr_cache.runtime.processes import worker_init

__all__ = [
    "BatchRecipe",
    "SourceRecipe",
    "step_batches",
    "param_groups",
    "linear_warmup_decay",
    "flat_softmax_warning",
]


@dataclass(frozen=True)
class SourceRecipe:
    """What one training source's questions are given: their prompts, and how many hard
    negatives come from their own (None: all the step's)."""

    query_prefix: str
    passage_prefix: str
    hard_negatives: int | None = None


class _Rows:
    """Rows ``rows`` of a dataset, indexed from 0 (a source's questions, for the fill)."""

    def __init__(self, dataset, rows: range):
        self.dataset, self.rows = dataset, rows

    def __len__(self) -> int:
        return len(self.rows)

    def __getitem__(self, i: int):
        return self.dataset[self.rows[i]]


@dataclass(frozen=True)
class BatchRecipe:
    """How a step's examples become a tokenized batch."""

    hard_negatives: int
    max_query_length: int
    max_passage_length: int
    seed: int
    query_prefix: str = ""
    passage_prefix: str = ""
    teacher_scores: bool = False  # carry each passage row's teacher score (distillation)
    pad_to_multiple_of: int | None = None  # each side padded to a multiple of this
    guide: Any = None  # a GuideText: the rows tokenized for the guide model too (train.guide)
    sources: tuple[SourceRecipe, ...] = ()  # a data.train source's own prompts (none: the above)

    def batch(
        self,
        dataset,
        batches: TrainBatches,
        tokenizer,
        step: int,
        rank: int = 0,
        world_size: int = 1,
    ) -> Batch:
        """This rank's slice of the global batch of ``step``, tokenized, passages grouped: each
        question with its source's prompts; a batch of one source fills short negative groups
        from that source alone."""
        indices = TrainBatches.rank_slice(batches.batch_indices(step), rank, world_size)
        source = batches.source_of(step)
        query_prefix, passage_prefix, pool, own = (
            self.query_prefix,
            self.passage_prefix,
            dataset,
            None,
        )
        if self.sources:
            rows = [self.sources[s] for s in batches.sources_of(indices)]
            query_prefix = [r.query_prefix for r in rows]
            passage_prefix = [r.passage_prefix for r in rows]
        if source is not None and self.sources:
            own = self.sources[source].hard_negatives
        if source is not None and len(batches.offsets) > 1:
            pool = _Rows(dataset.select_columns(["positive_ctxs"]), batches.rows_of(source))
        batch = build_batch(
            [dataset[i] for i in indices],
            tokenizer=tokenizer,
            hard_negatives=self.hard_negatives,
            max_query_length=self.max_query_length,
            max_passage_length=self.max_passage_length,
            seed=self.seed,
            epoch=batches.draw_epoch(step),
            pool_for_padding=pool,
            indices=indices,
            query_prefix=query_prefix,
            passage_prefix=passage_prefix,
            teacher_scores=self.teacher_scores,
            pad_to_multiple_of=self.pad_to_multiple_of,
            guide=self.guide,
            own_negatives=own,
        )
        batch.source = source
        return batch


class _StepBatches(torch.utils.data.Dataset):
    """Item i: this rank's batch of step ``start + i``, tokenized (in a DataLoader worker)."""

    def __init__(self, recipe: BatchRecipe, dataset, batches, tokenizer, start, stop, rank, world):
        self.args = (recipe, dataset, batches, tokenizer)
        self.start, self.stop, self.rank, self.world = start, stop, rank, world

    def __len__(self) -> int:
        return self.stop - self.start

    def __getitem__(self, i: int) -> Batch:
        recipe, dataset, batches, tokenizer = self.args
        return recipe.batch(dataset, batches, tokenizer, self.start + i, self.rank, self.world)


def step_batches(
    recipe: BatchRecipe,
    dataset,
    batches: TrainBatches,
    tokenizer,
    start: int,
    stop: int,
    *,
    rank: int = 0,
    world_size: int = 1,
    num_workers: int,
):
    """The batches of steps ``start .. stop - 1`` in order, built ``num_workers`` processes
    ahead of the training step (0: in this process). A batch depends on its step alone, and the
    loader draws from its own generator, so workers change nothing but the time (a resumed run
    stays bit-identical)."""
    return torch.utils.data.DataLoader(
        _StepBatches(recipe, dataset, batches, tokenizer, start, stop, rank, world_size),
        batch_size=None,
        num_workers=num_workers,
        worker_init_fn=worker_init() if num_workers else None,
        prefetch_factor=2 if num_workers else None,
        generator=torch.Generator().manual_seed(0),  # its seed draw must not touch the global RNG
    )


def param_groups(model: torch.nn.Module, weight_decay: float) -> list[dict[str, Any]]:
    """AdamW groups: no decay on biases and norm weights (as DPR and BERT do; a decoder's
    RMSNorm weights, named ``input_layernorm`` or ``norm``, are vectors as LayerNorm's are). Only
    what trains is grouped: with LoRA, the adapters."""
    decay, no_decay, seen = [], [], set()
    for name, param in model.named_parameters():
        if id(param) in seen or not param.requires_grad:
            continue
        seen.add(id(param))
        lowered = name.lower()
        norm = "layernorm" in lowered or "layer_norm" in lowered or param.dim() < 2
        skip = name.endswith("bias") or norm
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


def flat_softmax_warning(normalize: bool, temperature: float) -> str | None:
    """A warning when unit-length vectors meet a temperature near DPR's 1: the scores are cosines
    in [-1, 1], so the softmax over them is nearly flat and the negatives barely count."""
    if not normalize or temperature < 0.5:
        return None
    return (
        f"train.temperature is {temperature:g} but the model's vectors are unit length (cosine"
        " scores in [-1, 1]): the softmax is nearly flat and the negatives barely count; models"
        " trained on cosines use about 0.05 (sentence-transformers' scale of 20)"
    )
