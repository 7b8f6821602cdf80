"""What a training run is made of, and one optimizer step of it.

:func:`build_trainer` turns the config into a :class:`Trainer`: the model (fast CPU dropout,
train mode), AdamW with DPR's groups, the warm-up-then-decay schedule, the fp16 scaler, the
towers (DDP-wrapped on several ranks) and the step object of ``train.mode`` (GradCache, full
batch or accumulation) over the loss. :meth:`Trainer.step` is one update: the step object fills
``.grad``; clipping, the optimizer, the scaler and the schedule act on the assembled gradient.
"""

from __future__ import annotations

import dataclasses
import functools
import logging
import math
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

import torch
from datasets import Dataset
from torch.nn.utils import clip_grad_norm_

from dpr_cache.config import Config, LoraConfig, ModelConfig, TrainConfig, parse_bytes, source_name
from dpr_cache.core.steppers import Towers
from dpr_cache.data.batches import TrainBatches
from dpr_cache.data.collate import Batch
from dpr_cache.data.sources import Source, load_sources
from dpr_cache.data.training import Reading
from dpr_cache.errors import InputError
from dpr_cache.model.attention import use_sdpa_without_wait
from dpr_cache.model.biencoder import BiEncoder
from dpr_cache.model.compiled import COMPILED_BUCKET, compile_mode_for, compile_towers, compiles
from dpr_cache.model.ddp import wrap_towers
from dpr_cache.model.decoders import check_dtype_on, check_positions
from dpr_cache.model.fast_dropout import use_fast_dropout
from dpr_cache.model.fsdp import full_state, full_value, is_sharded, shard_towers
from dpr_cache.model.guide import GuideModel
from dpr_cache.model.loading import load_biencoder
from dpr_cache.runtime import distributed
from dpr_cache.runtime.atomic import write_dir_atomic
from dpr_cache.runtime.device import autocast
from dpr_cache.runtime.distributed import DistEnv, all_mean
from dpr_cache.runtime.seeds import stream_seed
from dpr_cache.train.autochunk import ProbeSpec, largest_fitting_chunk
from dpr_cache.train.checkpoint import (
    latest_checkpoint,
    load_checkpoint,
    save_checkpoint,
    sound_checkpoint,
)
from dpr_cache.train.recipe import (
    BatchRecipe,
    SourceRecipe,
    flat_softmax_warning,
    linear_warmup_decay,
    param_groups,
)
from dpr_cache.train.step import (
    batch_shape_of,
    build_step,
    chunking_of,
    distillation_of,
    guide_of,
)

__all__ = [
    "Trainer",
    "StepResult",
    "NonFinite",
    "build_trainer",
    "load_model",
    "batch_recipe",
    "training_data",
    "sources_of",
    "training_files",
    "prepare_towers",
    "distribute_towers",
    "compile_as_set",
    "length_bucket_of",
    "out_of_memory",
]

logger = logging.getLogger(__name__)


class NonFinite(ArithmeticError):
    """A step's loss or gradient is not finite (fp32, bf16): nothing was updated."""


@dataclass
class StepResult:
    """What one update reports: the loss (mean over ranks), the learning rate it used, the
    gradient norm before clipping, its wall seconds, whether it was skipped and the loss scale
    (fp16)."""

    loss: float
    lr: float
    grad_norm: float
    seconds: float
    skipped: bool = False
    loss_scale: float | None = None  # fp16: the scaler's scale after the step


@dataclass
class Trainer:
    """The model and everything that updates it; ``stepper`` fills ``.grad`` for a batch."""

    model: BiEncoder
    optimizer: torch.optim.Optimizer
    scheduler: torch.optim.lr_scheduler.LRScheduler
    scaler: torch.amp.GradScaler | None
    stepper: object
    env: DistEnv
    chunk_size: int
    precision: str = "fp32"
    max_grad_norm: float | None = None
    length_bucket: int | None = None  # GradCache's; batches are padded to a multiple of it
    unsharded: Callable[[], BiEncoder] | None = None  # sharded: a whole model to save into
    guide: GuideModel | None = None  # train.guide: the frozen model whose vectors guide the loss
    # each named training source's own (query, passage) prompts, recorded in the saved model
    source_prompts: dict[str, tuple[str, str]] = field(default_factory=dict)

    def step(self, batch: Batch) -> StepResult:
        """One update on this rank's slice of a global batch. A loss or gradient that is not
        finite: in fp16 the update is skipped and the loss scale lowered, as torch's GradScaler
        does (the schedule waits, as Hugging Face's Trainer's does); in fp32 and bf16,
        :class:`NonFinite`, with nothing updated."""
        started = time.perf_counter()
        batch = batch.to(self.env.device)
        self.optimizer.zero_grad(set_to_none=True)
        try:
            with autocast(self.env.device, self.precision):
                loss = self.stepper.step(batch.q_inputs, batch.p_inputs, **self.loss_inputs(batch))
        except FloatingPointError:
            if self.scaler is None:
                raise NonFinite("loss") from None
            return self._skipped(started)
        if self.scaler is not None:
            self.scaler.unscale_(self.optimizer)
        params = [p for p in self.model.parameters() if p.requires_grad]
        grad_norm = full_value(clip_grad_norm_(params, self.max_grad_norm or math.inf))
        skipped = False
        if self.scaler is not None:
            scale = self.scaler.get_scale()
            self.scaler.step(self.optimizer)  # skipped when the gradients hold inf or nan
            self.scaler.update()
            skipped = self.scaler.get_scale() < scale
        elif not torch.isfinite(grad_norm):
            raise NonFinite("gradient")
        else:
            self.optimizer.step()
        lr = self.scheduler.get_last_lr()[0]
        if not skipped:
            self.scheduler.step()
        loss_value = all_mean(loss, self.env)
        seconds = time.perf_counter() - started
        scale = self.scaler.get_scale() if self.scaler is not None else None
        return StepResult(loss_value, lr, float(grad_norm), seconds, skipped, scale)

    def loss_inputs(self, batch: Batch) -> dict:
        """What the step's loss takes besides the reps: the batch's ids and teacher scores,
        and the guide's vectors of its rows (computed here, without a graph)."""
        inputs = batch.loss_inputs()
        if self.guide is not None:
            inputs.update(self.guide.reps(*batch.guide_inputs))
        return inputs

    def _skipped(self, started: float) -> StepResult:
        """fp16, a loss that is not finite: no update, the scale lowered by its backoff."""
        self.optimizer.zero_grad(set_to_none=True)
        self.scaler.scale(torch.zeros((), device=self.env.device))  # the scale exists
        self.scaler.update(self.scaler.get_scale() * self.scaler.get_backoff_factor())
        lr = self.scheduler.get_last_lr()[0]
        nan = float("nan")
        seconds = time.perf_counter() - started
        return StepResult(nan, lr, nan, seconds, skipped=True, loss_scale=self.scaler.get_scale())

    def resume(self, root: Path, seed: int) -> int:
        """Restore the newest sound checkpoint under ``root`` (a damaged one is passed over,
        with a warning); the steps it had done (0: none). ``seed``: the run's, from which each
        rank's streams are drawn afresh where the world size changed."""
        latest = sound_checkpoint(root)
        if latest is None:
            if latest_checkpoint(root) is not None:
                raise InputError(
                    f"{root}: every checkpoint is damaged or of an earlier version (no matching "
                    "checksum): finish the run with the version that started it, or train afresh"
                )
            return 0
        return load_checkpoint(
            latest, self.model, self.optimizer, self.scheduler, self.scaler, self.env, seed=seed
        )

    def checkpoint(self, root: Path, done: int, keep: int) -> Path:
        """Save every state after ``done`` steps under ``root`` (rank 0 writes)."""
        return save_checkpoint(
            root, done, self.model, self.optimizer, self.scheduler, self.scaler, self.env, keep
        )

    def save_model(self, out: Path, max_query_length: int, max_passage_length: int) -> None:
        """Rank 0 writes the model folder, swapped in whole, with the lengths it trained at. A
        sharded model's weights are gathered once into rank 0's memory (a collective) and
        written from a whole copy, the same folder an unsharded run writes."""
        model = self.model
        if is_sharded(model):
            state = full_state(model)
            model = self.unsharded() if self.env.is_main else None
            if model is not None:
                model.load_state_dict(state)
        if self.env.is_main:
            model.max_query_length = max_query_length
            model.max_passage_length = max_passage_length
            model.source_prompts = dict(self.source_prompts)
            saved = [p for p in model.parameters() if p.requires_grad or not model.has_adapters]
            size = 2 * sum(p.numel() * p.element_size() for p in saved)
            write_dir_atomic(out, model.save_pretrained, size_hint=size)


def build_trainer(config: Config, env: DistEnv, total_steps: int) -> Trainer:
    """The trainer ``config`` describes, on ``env``'s device, its schedule over ``total_steps``.
    Each rank then draws dropout from its own stream (rank 0's is a single process's)."""
    cfg, m = config.train, config.model
    model = load_model(m, env.device, dropout=m.dropout, lora=m.lora)
    check_trains(model, m)
    cosine = model.normalize and model.multi is None  # MaxSim sums a cosine a question token
    if env.is_main and (warning := flat_softmax_warning(cosine, cfg.temperature)):
        logger.warning("%s", warning)
    prepare_towers(model, cfg, env.device)
    model.train()
    chunking = chunking_of(config, model, env, out_dir=config.output_path)  # eager towers
    compiled = compile_as_set(model, cfg, env.device)
    chunking = dataclasses.replace(chunking, length_bucket=length_bucket_of(cfg, compiled))
    towers = distribute_towers(model, cfg, env)
    optimizer = torch.optim.AdamW(  # over the parameters as sharded, where they are
        param_groups(model, cfg.weight_decay), lr=cfg.lr, eps=cfg.adam_eps
    )
    scheduler = torch.optim.lr_scheduler.LambdaLR(
        optimizer, linear_warmup_decay(cfg.warmup_steps, total_steps)
    )
    scaler = torch.amp.GradScaler(env.device.type) if cfg.precision == "fp16" else None
    torch.manual_seed(stream_seed("dropout", cfg.seed, env.rank))
    stepper = build_step(
        config,
        model,
        rank=env.rank,
        world_size=env.world_size,
        towers=towers,
        chunking=chunking,
        scaler=scaler,
    )
    return Trainer(
        model,
        optimizer,
        scheduler,
        scaler,
        stepper,
        env,
        chunking.chunk_size,
        cfg.precision,
        cfg.max_grad_norm,
        chunking.length_bucket,
        unsharded_model(m, env) if cfg.shard == "fsdp" else None,
        guide_of(config, env.device, chunking),
    )


def check_trains(model: BiEncoder, m: ModelConfig) -> None:
    """InputError when nothing of ``model`` would train, or when its fp16 weights would: a
    loss scaler unscales fp32 gradients only, so fp16 weights train adapters alone."""
    trainable = [p for p in model.parameters() if p.requires_grad]
    if not trainable:
        raise InputError(
            f"{m.name_or_path}: no weight of the model trains (the base is frozen): set "
            "model.lora to train adapters on it"
        )
    if m.dtype == "fp16" and any(p.dtype == torch.float16 for p in trainable):
        raise InputError(
            "model.dtype: fp16 weights train with LoRA only (model.lora): set model.lora, or "
            "keep the weights fp32 or bf16 (train.precision fp16 computes in fp16 all the same)"
        )


def unsharded_model(m: ModelConfig, env: DistEnv) -> Callable[[], BiEncoder]:
    """What builds a whole copy of the model ``model.*`` describes, with its dropout and
    adapters: on the CPU (fp16 weights, which the CPU does not run, on ``env``'s device)."""
    device = env.device if m.dtype == "fp16" else torch.device("cpu")
    return functools.partial(load_model, m, device, dropout=m.dropout, lora=m.lora)


def distribute_towers(model: BiEncoder, cfg: TrainConfig, env: DistEnv) -> Towers:
    """``model``'s towers as the step objects take them: sharded with FSDP2 (``train.shard:
    fsdp``, also on one process), wrapped in DDP on several ranks (which broadcasts rank 0's
    weights), or as they are."""
    if cfg.shard == "fsdp":
        return shard_towers(model, env, precision=cfg.precision, sync=cfg.shard_sync)
    return wrap_towers(model, env)


def load_model(
    m: ModelConfig, device: torch.device, *, dropout: float | None, lora: LoraConfig | None
) -> BiEncoder:
    """The model ``model.*`` describes on ``device``, with ``dropout`` and ``lora`` (the keys'
    values, or verify's, which turns dropout off); InputError for fp16 weights on a CPU and for
    a tower whose context is shorter than its texts' length."""
    check_dtype_on(m.dtype, device)
    model = load_biencoder(
        m.name_or_path,
        shared=m.shared,
        pooling=m.pooling,
        dropout=dropout,
        gradient_checkpointing=m.gradient_checkpointing,
        normalize=m.normalize,
        prefixes=(m.query_prefix, m.passage_prefix),
        source="model.name_or_path",
        dtype=m.dtype,
        attn_implementation=m.attn_implementation,
        lora=lora,
        vectors=m.vectors,
        multi_dim=m.multi_dim,
    )
    check_positions(model.query_encoder, m.max_query_length, "model.max_query_length")
    check_positions(model.passage_encoder, m.max_passage_length, "model.max_passage_length")
    return model.to(device)


def prepare_towers(model: BiEncoder, cfg: TrainConfig, device: torch.device) -> None:
    """Make ``model``'s eager towers run as ``cfg`` asks on ``device``: on CUDA, SDPA builds
    its padding masks without host waits; on the CPU, dropout is drawn by
    :mod:`~dpr_cache.model.fast_dropout` (``train.fast_dropout``), unless the towers are to be
    compiled (PyTorch's dropout then, whose draws inductor leaves to PyTorch's generator)."""
    towers = [model.query_encoder, model.passage_encoder]
    if device.type == "cuda":
        use_sdpa_without_wait(towers)
    elif cfg.fast_dropout and not compiles(cfg.compile):
        use_fast_dropout(towers)


def compile_as_set(model: BiEncoder, cfg: TrainConfig, device: torch.device) -> bool:
    """Compile ``model``'s towers in place where ``train.compile`` says so; whether it did."""
    if not compiles(cfg.compile):
        return False
    compile_towers([model.query_encoder, model.passage_encoder], compile_mode_for(device))
    return True


def length_bucket_of(cfg: TrainConfig, compiled: bool) -> int | None:
    """``train.length_bucket``, or :data:`COMPILED_BUCKET` for compiled towers given none."""
    if cfg.length_bucket is None and compiled:
        return COMPILED_BUCKET
    return cfg.length_bucket


def training_files(config: Config) -> list[Path]:
    """The ``data.train`` files; InputError when none is given."""
    if not config.train_files:
        raise InputError("data.train: no training file given")
    return config.train_files


def sources_of(config: Config) -> list[Source]:
    """``data.train``'s sources: a path read as DPR's (or as its columns say), a mapping as it
    says."""
    training_files(config)
    out = []
    for item in config.train_sources:
        if isinstance(item, str):
            out.append(Source(Path(item), source_name(item)))
            continue
        reading = Reading(item.format, tuple(sorted((item.columns or {}).items())), item.split)
        name = source_name(item)
        out.append(
            Source(
                Path(item.path),
                name,
                reading,
                item.weight,
                item.query_prefix,
                item.passage_prefix,
                item.hard_negatives,
            )
        )
    return out


def training_data(config: Config, env: DistEnv) -> tuple[Dataset, TrainBatches, list[Source]]:
    """The ``data.train`` sources as one dataset (rank 0 fills the Arrow caches, the other
    ranks then open them), the steps' batches over it, and the sources. A distillation loss
    needs every record's positive and ``train.hard_negatives`` hard negatives scored by the
    teacher (checked here, before any step)."""
    sources = sources_of(config)
    cfg = config.train
    scored = cfg.hard_negatives if distillation_of(config) is not None else None
    load = functools.partial(load_sources, sources, config.cache_path, scored_negatives=scored)
    loaded = load() if env.is_main else None
    distributed.barrier()
    if loaded is None:
        loaded = load()
    batches = loaded.batches(cfg.batch_size, cfg.seed, config.data.batching)
    return loaded.dataset, batches, sources


def batch_recipe(
    config: Config,
    model: BiEncoder,
    pad_to_multiple_of: int | None = None,
    guide: GuideModel | None = None,
) -> BatchRecipe:
    """How a step's examples become the batch ``model`` trains on (its prompts included, or
    each source's own), padded to a multiple of ``pad_to_multiple_of`` (the engine's length
    bucket) when given; with ``guide``, the rows tokenized for it too."""
    cfg, m = config.train, config.model
    own = [
        SourceRecipe(
            model.query_prefix if s.query_prefix is None else s.query_prefix,
            model.passage_prefix if s.passage_prefix is None else s.passage_prefix,
            s.hard_negatives,
        )
        for s in sources_of(config)
    ]
    return BatchRecipe(
        cfg.hard_negatives,
        m.max_query_length,
        m.max_passage_length,
        cfg.seed,
        model.query_prefix,
        model.passage_prefix,
        distillation_of(config) is not None,
        pad_to_multiple_of,
        guide.text if guide is not None else None,
        tuple(own),
    )


def probe_spec(config: Config) -> ProbeSpec:
    """What the chunk probe of ``config``'s model and lengths needs."""
    return ProbeSpec(config.model, config.train)


def out_of_memory(config: Config, trainer: Trainer, step: int) -> InputError:
    """The one line for a step that ran out of GPU memory: the chunk (or full batch) that did
    not fit and the largest chunk that does on this GPU, found by the chunk probe."""
    cfg, device = config.train, trainer.env.device
    trainer.optimizer.zero_grad(set_to_none=True)
    torch.cuda.empty_cache()
    total = torch.cuda.get_device_properties(device).total_memory
    budget = parse_bytes(cfg.memory_budget) if cfg.memory_budget else total
    local = cfg.batch_size // trainer.env.world_size
    shape = batch_shape_of(config)
    fits = largest_fitting_chunk(probe_spec(config), shape, trainer.model, local, budget)
    where = f"{torch.cuda.get_device_name(device)} ({total / 1e9:.1f} GB)"
    what = (
        f"a full batch of {local} questions"
        if cfg.mode == "full"
        else f"chunk {trainer.chunk_size}"
    )
    advice = (
        f"chunk {fits} fits: set train.chunk_size={fits}"
        + (" and train.mode=gradcache" if cfg.mode == "full" else "")
        + " (or train.chunk_size=auto with train.memory_budget)"
        if fits
        else "not even a chunk of 1 fits: shorten model.max_passage_length or use a larger GPU"
    )
    return InputError(
        f"train.chunk_size: {what} ran out of GPU memory at step {step + 1} on {where}; {advice}"
    )
