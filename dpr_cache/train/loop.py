"""The training loop, top to bottom: set-up, resume, steps, logs, checkpoints, final model.

One step = one global batch of ``train.batch_size`` questions (each with its positive and
``train.hard_negatives`` hard negatives); under ``torchrun`` each rank builds its slice of the
same global batch. The step object (GradCache, full batch or plain accumulation) fills
``.grad``; clipping, the optimizer, the scaler and the schedule act on the assembled gradient.
``train`` is the entry point: it reads the config; everything it calls takes plain arguments.
"""

from __future__ import annotations

import contextlib
import json
import logging
import math
import random
import signal
import time
from pathlib import Path

import numpy as np
import torch
import torch.distributed as dist
from tqdm.auto import tqdm

from dpr_cache.config import Config, parse_bytes, save_config
from dpr_cache.core.steppers import make_loss_fn, make_stepper
from dpr_cache.data.batches import TrainBatches
from dpr_cache.data.training import load_training_set
from dpr_cache.errors import InputError, Interrupted
from dpr_cache.model.ddp import wrap_towers
from dpr_cache.model.fast_dropout import use_fast_dropout
from dpr_cache.model.loading import load_biencoder
from dpr_cache.runtime import distributed, memory
from dpr_cache.runtime.atomic import append_line, read_lines, write_dir_atomic, write_text_atomic
from dpr_cache.runtime.device import autocast
from dpr_cache.runtime.distributed import DistEnv, all_mean
from dpr_cache.runtime.seeds import stream_seed
from dpr_cache.train.autochunk import BatchShape, ProbeSpec, pick_chunk_size
from dpr_cache.train.checkpoint import latest_checkpoint, load_checkpoint, save_checkpoint
from dpr_cache.train.recipe import (
    BatchRecipe,
    flat_softmax_warning,
    linear_warmup_decay,
    param_groups,
    step_batches,
)
from dpr_cache.train.watch_setup import make_watcher

__all__ = ["train"]

logger = logging.getLogger(__name__)

LOG_FILE = "train_log.jsonl"


def train(config: Config, *, resume: bool = False, progress: bool = True) -> Path:
    """Train per ``config``; return ``output_dir/model``. Raises InputError on bad input."""
    cfg, m = config.train, config.model
    out = config.output_path
    ckpt_root = out / "checkpoints"
    if not config.data.train:
        raise InputError("data.train: no training file given")
    if not resume and latest_checkpoint(ckpt_root) is not None:
        raise InputError(
            f"{out}: holds checkpoints of an earlier run; pass --resume to continue it or choose "
            "another output_dir"
        )
    env = distributed.setup(cfg.device)
    try:
        if cfg.batch_size % env.world_size != 0:
            raise InputError(
                f"train.batch_size ({cfg.batch_size}) must be divisible by the world size "
                f"({env.world_size})"
            )
        if cfg.num_threads:
            torch.set_num_threads(cfg.num_threads)
        _seed_everything(cfg.seed)

        # -- data: rank 0 fills the Arrow cache, the others then open it --------------------
        if env.is_main:
            dataset = load_training_set(Path(config.data.train), config.cache_path)
        distributed.barrier()
        if not env.is_main:
            dataset = load_training_set(Path(config.data.train), config.cache_path)
        batches = TrainBatches(len(dataset), cfg.batch_size, cfg.seed, source=config.data.train)
        total_steps = cfg.max_steps or batches.steps_per_epoch * cfg.epochs
        recipe = BatchRecipe(cfg.hard_negatives, m.max_query_length, m.max_passage_length, cfg.seed)

        # -- model, optimizer, schedule, precision ---------------------------------------------
        model = load_biencoder(
            m.name_or_path, shared=m.shared, pooling=m.pooling, dropout=m.dropout,
            gradient_checkpointing=m.gradient_checkpointing, normalize=m.normalize,
            source="model.name_or_path",
        ).to(env.device)  # fmt: skip
        if env.is_main and (warning := flat_softmax_warning(model.normalize, cfg.temperature)):
            logger.warning("%s", warning)
        if cfg.fast_dropout and env.device.type == "cpu":  # CUDA keeps its fused kernels
            use_fast_dropout([model.query_encoder, model.passage_encoder])
        model.train()
        optimizer = torch.optim.AdamW(
            param_groups(model, cfg.weight_decay), lr=cfg.lr, eps=cfg.adam_eps
        )
        scheduler = torch.optim.lr_scheduler.LambdaLR(
            optimizer, linear_warmup_decay(cfg.warmup_steps, total_steps)
        )
        use_fp16 = cfg.precision == "fp16"
        scaler = torch.amp.GradScaler(env.device.type) if use_fp16 else None
        chunk_size = _chunk_size(config, model, env)
        towers = wrap_towers(model, env)  # DDP broadcasts rank 0's weights
        # Each rank its dropout stream; rank 0's is a single process's.
        torch.manual_seed(stream_seed("dropout", cfg.seed, env.rank))
        group_size = 1 + cfg.hard_negatives
        loss_fn = make_loss_fn(
            temperature=cfg.temperature, tile_size=cfg.loss_tile_size, group_size=group_size,
            rank=env.rank, world_size=env.world_size,
        )  # fmt: skip
        stepper = make_stepper(
            cfg.mode, towers, loss_fn, chunk_size=chunk_size, p_chunk_size=cfg.p_chunk_size,
            scaler=scaler, keep_last_graph=cfg.keep_last_graph, length_order=cfg.length_order,
            release_memory=memory.trim,
        )  # fmt: skip

        # -- resume or start -------------------------------------------------------------------
        start_step = 0
        if resume and (latest := latest_checkpoint(ckpt_root)) is not None:
            start_step = load_checkpoint(latest, model, optimizer, scheduler, scaler, env)
        log_path = out / LOG_FILE
        if env.is_main:
            save_config(config, out / "config.yaml")
            _truncate_log(log_path, start_step)

        negatives = _negatives_per_question(cfg.mode, cfg.batch_size, chunk_size, env, group_size)
        watcher = make_watcher(config, env.device, start_step) if env.is_main else None
        stop = _StopFlag()
        bar = tqdm(
            total=total_steps,
            initial=start_step,
            disable=not (progress and env.is_main),
            desc=f"train {cfg.mode} B={cfg.batch_size}",
            dynamic_ncols=True,
        )
        params = [p for p in model.parameters() if p.requires_grad]
        log = open(log_path, "a", encoding="utf-8") if env.is_main else contextlib.nullcontext()
        loader = step_batches(
            recipe, dataset, batches, model.tokenizer, start_step, total_steps,
            rank=env.rank, world_size=env.world_size, num_workers=config.data.num_workers,
        )  # fmt: skip
        with stop.installed(), log, bar:
            for step, batch in enumerate(loader, start=start_step):
                started = time.perf_counter()
                digest = batch.digest() if env.is_main else None
                batch = batch.to(env.device)
                optimizer.zero_grad(set_to_none=True)
                with autocast(env.device, cfg.precision):
                    loss = stepper.step(batch.q_inputs, batch.p_inputs, p_ids=batch.p_ids)
                if scaler is not None:
                    scaler.unscale_(optimizer)
                grad_norm = torch.nn.utils.clip_grad_norm_(params, cfg.max_grad_norm or math.inf)
                if scaler is not None:
                    scaler.step(optimizer)
                    scaler.update()
                else:
                    optimizer.step()
                lr = scheduler.get_last_lr()[0]
                scheduler.step()
                loss_value = all_mean(loss, env)
                seconds = time.perf_counter() - started
                if env.is_main:
                    record = watcher.step(
                        {
                            "step": step + 1,
                            "epoch": batches.epoch_of(step),
                            "loss": loss_value,
                            "lr": lr,
                            "grad_norm": float(grad_norm),
                            "batch_size": cfg.batch_size,
                            "negatives_per_question": negatives,
                            "batch_digest": digest,  # rank 0's slice
                            "seconds": round(seconds, 4),
                            "pairs_per_second": round(cfg.batch_size / seconds, 2),
                            "peak_memory_bytes": memory.peak_memory_bytes(env.device),
                        },
                        model, step + 1, last=step + 1 == total_steps,
                    )  # fmt: skip
                    validated = any(key.startswith("val_") for key in record)
                    if (step + 1) % cfg.log_every == 0 or validated:
                        append_line(log, json.dumps(record))
                bar.update(1)
                bar.set_postfix(
                    loss=f"{loss_value:.4f}",
                    lr=f"{lr:.2e}",
                    pairs_s=f"{cfg.batch_size / seconds:.1f}",
                )
                done = step + 1
                interrupted = stop.agreed(env)
                if done % cfg.checkpoint_every == 0 or done == total_steps or interrupted:
                    path = save_checkpoint(
                        ckpt_root,
                        done,
                        model,
                        optimizer,
                        scheduler,
                        scaler,
                        env,
                        cfg.keep_checkpoints,
                    )
                    if interrupted:
                        raise Interrupted(path)
        if env.is_main:
            watcher.close(log_path)
        model_dir = out / "model"
        if env.is_main:
            model.max_query_length, model.max_passage_length = (
                m.max_query_length,
                m.max_passage_length,
            )
            write_dir_atomic(model_dir, model.save_pretrained)
        distributed.barrier()
        return model_dir
    finally:
        distributed.teardown()


# -- pieces of the loop -----------------------------------------------------------------------


def _seed_everything(seed: int) -> None:
    random.seed(seed)
    np.random.seed(seed % 2**32)
    torch.manual_seed(seed)


def _chunk_size(config: Config, model, env: DistEnv) -> int:
    """``train.chunk_size``, or the probe's choice for ``auto``."""
    cfg, m = config.train, config.model
    if cfg.chunk_size != "auto":
        return int(cfg.chunk_size)
    probe = ProbeSpec(
        model=m.name_or_path, shared=m.shared, pooling=m.pooling, dropout=m.dropout,
        checkpointing=m.gradient_checkpointing, q_len=m.max_query_length,
        p_len=m.max_passage_length, p_chunk_size=cfg.p_chunk_size, threads=cfg.num_threads,
        precision=cfg.precision,
    )  # fmt: skip
    shape = BatchShape(cfg.batch_size, cfg.hard_negatives, cfg.loss_tile_size)
    budget = parse_bytes(cfg.memory_budget)
    return pick_chunk_size(probe, shape, model, env, budget, config.output_path)


def _negatives_per_question(
    mode: str, batch_size: int, chunk_size: int, env: DistEnv, group_size: int
) -> int:
    """Passages a question is scored against, besides its positive."""
    if mode == "accumulate":
        local = batch_size // env.world_size
        return min(chunk_size, local) * env.world_size * group_size - 1
    return batch_size * group_size - 1


class _StopFlag:
    """Ctrl-C / SIGTERM set a flag; the loop stops after the current step, on every rank."""

    def __init__(self) -> None:
        self.requested = False

    @contextlib.contextmanager
    def installed(self):
        def handler(signum, frame):
            if self.requested:  # a second Ctrl-C: stop now
                raise KeyboardInterrupt
            self.requested = True

        previous = {s: signal.signal(s, handler) for s in (signal.SIGINT, signal.SIGTERM)}
        try:
            yield self
        finally:
            for s, h in previous.items():
                signal.signal(s, h)

    def agreed(self, env: DistEnv) -> bool:
        if not env.enabled:
            return self.requested
        flag = torch.tensor([1.0 if self.requested else 0.0], device=env.device)
        dist.all_reduce(flag, op=dist.ReduceOp.MAX)
        return bool(flag.item() > 0)


def _truncate_log(log_path: Path, step: int) -> None:
    """Keep the log lines of steps up to ``step`` (those after the checkpoint are redone)."""
    if step == 0:
        log_path.unlink(missing_ok=True)
        return
    kept = [line for line in read_lines(log_path) if json.loads(line)["step"] <= step]
    write_text_atomic(log_path, "".join(line + "\n" for line in kept))
