"""One step assembly: the step object that train, verify and bench all run, built from a config.

:func:`build_step` turns the ``train`` section into the core's specs once: the mode and every
engine setting (chunk rows or a token budget, the kept last graph, length order and bucket), the
loss with all its options (:func:`objective_of`: directions, partition, hardness, a guide's rule,
Matryoshka, distillation) and the rank's place among the ranks. Its ``.step(q_inputs, p_inputs,
*, p_ids=None, teacher_scores=None, guide_q=None, guide_p=None) -> loss`` fills ``.grad``.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import torch

from dpr_cache.config import Config, parse_bytes
from dpr_cache.core.distill import Distillation
from dpr_cache.core.loss import Guide, InfoNCE
from dpr_cache.core.objective import Matryoshka, Objective, make_loss_fn
from dpr_cache.core.steppers import Towers, make_stepper
from dpr_cache.errors import InputError
from dpr_cache.model.biencoder import BiEncoder
from dpr_cache.model.guide import GuideModel, load_guide
from dpr_cache.runtime import memory
from dpr_cache.runtime.distributed import DistEnv
from dpr_cache.train.autochunk import BatchShape, ProbeSpec, pick_chunk_size

__all__ = [
    "Chunking",
    "batch_shape_of",
    "build_step",
    "chunking_of",
    "distillation_of",
    "guide_of",
    "objective_of",
]


@dataclass(frozen=True)
class Chunking:
    """How GradCache cuts a step: question rows a chunk (passage rows: ``train.p_chunk_size``
    or the same), a token budget a chunk (None: rows alone) and the width bucket."""

    chunk_size: int
    chunk_tokens: int | None = None
    length_bucket: int | None = None


def distillation_of(config: Config) -> Distillation | None:
    """``train.loss`` and its keys as the core's spec; None for the contrastive loss alone.
    Unset keys take the spec's defaults: ``distill_weight`` 0 (distillation alone),
    ``teacher_temperature`` 1."""
    cfg = config.train
    if cfg.loss == "contrastive":
        return None
    given = {"weight": cfg.distill_weight, "teacher_temperature": cfg.teacher_temperature}
    return Distillation(cfg.loss, **{k: v for k, v in given.items() if v is not None})


MULTI_VECTOR_TILE = 64
"""A multi-vector model's loss tile when ``train.loss_tile_size`` is null: the direct loss would
hold every question's token scores against every passage token at once
(:func:`~dpr_cache.core.similarity.token_tile` cuts it further to a bounded block)."""


def objective_of(config: Config, model: BiEncoder) -> Objective:
    """The loss ``train.*`` describes for ``model`` (Matryoshka's prefixes re-normalized when
    its vectors are unit length; a multi-vector model's loss tiled); InputError for Matryoshka
    dims above its width, and for Matryoshka on a multi-vector model."""
    cfg = config.train
    guide = Guide(cfg.guide_margin, cfg.guide_margin_strategy) if cfg.guide else None
    tile = cfg.loss_tile_size
    if tile is None and model.multi is not None:
        tile = MULTI_VECTOR_TILE
    infonce = InfoNCE(
        temperature=cfg.temperature,
        tile_size=tile,
        directions=tuple(cfg.directions),
        partition=cfg.partition,
        hardness=cfg.hardness,
        hardness_strength=cfg.hardness_strength,
        guide=guide,
    )
    matryoshka = None
    if cfg.matryoshka_dims and model.multi is not None:
        raise InputError(
            "train.matryoshka_dims: a multi-vector model (model.vectors: multi) trains its "
            "token vectors at one width (model.multi_dim)"
        )
    if cfg.matryoshka_dims:
        if cfg.matryoshka_dims[0] > model.dim:
            raise InputError(
                f"train.matryoshka_dims: {cfg.matryoshka_dims[0]} is above the model's width "
                f"({model.dim}): give dims of at most {model.dim}"
            )
        weights = tuple(cfg.matryoshka_weights) if cfg.matryoshka_weights else None
        matryoshka = Matryoshka(tuple(cfg.matryoshka_dims), weights, model.normalize)
    return Objective(1 + cfg.hard_negatives, infonce, distillation_of(config), matryoshka)


def batch_shape_of(config: Config) -> BatchShape:
    """What of ``config``'s step scales with the whole batch (the chunk probe's companion)."""
    cfg, m = config.train, config.model
    lengths = (m.max_query_length, m.max_passage_length)
    return BatchShape(cfg.batch_size, cfg.hard_negatives, cfg.loss_tile_size, lengths)


def chunking_of(
    config: Config,
    model: BiEncoder,
    env: DistEnv,
    *,
    out_dir=None,
    length_bucket: int | None = None,
) -> Chunking:
    """``train.chunk_size`` and ``train.chunk_tokens`` as numbers: ``auto`` resolved by the chunk
    probe (:func:`~dpr_cache.train.autochunk.pick_chunk_size`, its choice written to
    ``out_dir`` when given). ``chunk_tokens: auto`` is the probed chunk's tokens at the longest
    passages (``chunk x model.max_passage_length``), its rows then uncapped unless
    ``train.chunk_size`` is a number."""
    cfg = config.train
    probed = None
    if "auto" in (cfg.chunk_size, cfg.chunk_tokens):
        shape = batch_shape_of(config)
        budget = parse_bytes(cfg.memory_budget)
        spec = ProbeSpec(config.model, cfg)
        probed = pick_chunk_size(spec, shape, model, env, budget, out_dir)
    chunk = probed if cfg.chunk_size == "auto" else int(cfg.chunk_size)
    tokens = cfg.chunk_tokens
    if tokens == "auto":
        tokens = probed * config.model.max_passage_length
        if cfg.chunk_size == "auto":
            chunk = cfg.batch_size // env.world_size
    return Chunking(chunk, tokens, length_bucket)


def guide_of(config: Config, device: torch.device, chunking: Chunking) -> GuideModel | None:
    """The frozen guide of ``train.guide`` on ``device``, encoding in GradCache's chunks (None
    without one)."""
    if config.train.guide is None:
        return None
    return load_guide(config.train.guide, device, chunking.chunk_size, chunking.chunk_tokens)


def build_step(
    cfg: Config,
    model: BiEncoder,
    *,
    rank: int = 0,
    world_size: int = 1,
    towers: Towers | None = None,
    chunking: Chunking | None = None,
    scaler: torch.amp.GradScaler | None = None,
    release_memory: Callable[[], object] | None = memory.trim,
):
    """The step object of ``cfg`` over ``model`` (GradCache, full batch or accumulation) for
    rank ``rank`` of ``world_size``: its ``.step(q_inputs, p_inputs, *, p_ids=None,
    teacher_scores=None, guide_q=None, guide_p=None) -> loss`` fills ``.grad``.

    ``towers``: the model's towers as wrapped for the ranks (DDP, FSDP2; default: as they
    are). ``chunking``: the engine's chunks, resolved (default: from the config, ``auto``
    probed without writing a choice file). ``scaler``: fp16's loss scaler.
    """
    if chunking is None:
        device = model.device
        env = DistEnv(rank=rank, world_size=world_size, device=device)
        chunking = chunking_of(cfg, model, env, length_bucket=cfg.train.length_bucket)
    t = cfg.train
    loss_fn = make_loss_fn(objective_of(cfg, model), rank=rank, world_size=world_size)
    return make_stepper(
        t.mode,
        towers or Towers(model.encode_query, model.encode_passage),
        loss_fn,
        chunk_size=chunking.chunk_size,
        p_chunk_size=t.p_chunk_size,
        chunk_tokens=chunking.chunk_tokens if t.mode == "gradcache" else None,
        scaler=scaler,
        keep_last_graph=t.keep_last_graph,
        length_order=t.length_order,
        length_bucket=chunking.length_bucket,
        release_memory=release_memory,
    )
