"""``dpr-cache train``, top to bottom: set up, then a loop of named steps (step, log, checkpoint),
then the final model.

One step = one global batch of ``train.batch_size`` questions (each with its positive and
``train.hard_negatives`` hard negatives); under ``torchrun`` each rank builds its slice of the
same global batch. :func:`train` reads the config; what it calls takes plain arguments, the
trainer (:mod:`dpr_cache.train.trainer`) aside, which is built from it.
"""

from __future__ import annotations

import contextlib
import logging
import os
import random
import signal
import sys
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import torch

from dpr_cache.config import Config, save_config
from dpr_cache.core.distill import Distillation
from dpr_cache.data.batches import SourceBatches, TrainBatches
from dpr_cache.errors import Diverged, InputError, Interrupted
from dpr_cache.runtime import distributed
from dpr_cache.runtime.device import advises_on_out_of_memory, deterministic_kernels
from dpr_cache.runtime.distributed import DistEnv, any_rank
from dpr_cache.runtime.lock import output_lock
from dpr_cache.train.log import TrainLog, negatives_per_question
from dpr_cache.train.recipe import step_batches
from dpr_cache.train.resume import Start, check_start
from dpr_cache.train.run_folder import (
    CHECKPOINTS,
    MODEL,
    continue_command,
    latest_checkpoint,
    record_finished,
)
from dpr_cache.train.settle import settle_model
from dpr_cache.train.step import distillation_of
from dpr_cache.train.trainer import (
    NonFinite,
    Trainer,
    batch_recipe,
    build_trainer,
    out_of_memory,
    training_data,
)
from dpr_cache.train.watch_setup import make_watcher

__all__ = ["train"]

logger = logging.getLogger(__name__)


@advises_on_out_of_memory("lower train.chunk_size")
def train(
    config: Config, *, resume: bool = False, progress: bool = True, start: Start | None = None
) -> Path:
    """Train per ``config``; return ``output_dir/model``. Raises InputError on bad input, and
    when another command holds ``output_dir``. ``start``: what :func:`check_start` found, where
    the caller checked before its heavy imports (the CLI, under this lock); else it is checked
    here and its note said. A ``--resume`` of a run finished under these settings ends at once,
    nothing rewritten."""
    config = settle_model(config)
    with output_lock(config.output_path):
        if start is None:
            main = int(os.environ.get("RANK", "0")) == 0  # before the process group
            start = check_start(config, resume)
            if start.note and main:
                print(start.note, file=sys.stderr)
        if start.finished is not None:
            return config.output_path / MODEL
        return _train(config, resume, progress, start.warning)


@dataclass
class _Run:
    """What the loop runs: the trainer, the batches (their order and the loader from the first
    step to run), the log, and the steps from ``start`` to ``total``."""

    trainer: Trainer
    batches: TrainBatches
    loader: Iterator
    log: TrainLog
    distill: Distillation | None
    start: int
    total: int
    sources: list[str]  # the training sources' names
    masked: bool = False  # a batch's rows of one text under two ids said once
    skipped_in_a_row: int = 0  # fp16: the steps skipped since the last update


def _train(config: Config, resume: bool, progress: bool, warning: str | None = None) -> Path:
    out = config.output_path
    deterministic_kernels(config.train.deterministic)
    env = distributed.setup(config.train.device)
    distributed.continued_by(continue_command(out))
    try:
        run = _set_up(config, env, resume, progress, warning)
        _loop(config, env, run)
        m = config.model
        run.trainer.save_model(out / MODEL, m.max_query_length, m.max_passage_length)
        if env.is_main:
            record_finished(out, run.total, config)
        distributed.barrier()
        return out / MODEL
    finally:
        distributed.teardown()


def _set_up(
    config: Config, env: DistEnv, resume: bool, progress: bool, warning: str | None = None
) -> _Run:
    """The data, the trainer (resumed from its last checkpoint when asked), the saved config,
    the log and the loader of the steps to run."""
    cfg, out = config.train, config.output_path
    if cfg.batch_size % env.world_size != 0:
        raise InputError(
            f"train.batch_size ({cfg.batch_size}) must be divisible by the world size "
            f"({env.world_size})"
        )
    if cfg.num_threads:
        torch.set_num_threads(cfg.num_threads)
    _seed_everything(cfg.seed)
    dataset, batches, sources = training_data(config, env)
    total = cfg.max_steps or batches.steps_per_epoch * cfg.epochs
    trainer = build_trainer(config, env, total)
    if env.is_main:  # once the model is there: a run that cannot start says that alone
        _warn_if_a_gpu_config_found_no_gpu(config, env)
    recipe = batch_recipe(config, trainer.model, trainer.length_bucket, trainer.guide)
    trainer.source_prompts = {
        s.name: (r.query_prefix, r.passage_prefix)
        for s, r in zip(sources, recipe.sources, strict=True)
        if s.query_prefix is not None or s.passage_prefix is not None
    }
    start = trainer.resume(out / CHECKPOINTS, cfg.seed) if resume else 0
    if warning and env.is_main:  # the resumed run's changed settings, once it has started
        logger.warning(warning)
    if env.is_main:
        save_config(config, out / "config.yaml")
    distill = distillation_of(config)
    log = _log(config, env, trainer, distill, start, total, progress)
    loader = step_batches(
        recipe,
        dataset,
        batches,
        trainer.model.tokenizer,
        start,
        total,
        rank=env.rank,
        world_size=env.world_size,
        num_workers=config.data.num_workers,
    )
    names = [s.name for s in sources]
    return _Run(trainer, batches, loader, log, distill, start, total, names)


def _log(config: Config, env: DistEnv, trainer, distill, start: int, total: int, progress: bool):
    """The run's log: what each step records, and what the whole run holds fixed."""
    cfg = config.train
    fixed = {
        "batch_size": cfg.batch_size,
        "negatives_per_question": negatives_per_question(
            cfg.mode,
            cfg.batch_size,
            trainer.chunk_size,
            env.world_size,
            1 + cfg.hard_negatives,
            in_batch=distill is None or distill.weight > 0,
        ),
    }
    watcher = make_watcher(config, env.device, start) if env.is_main else None
    return TrainLog(
        config.output_path,
        env,
        start=start,
        total=total,
        fixed=fixed,
        watcher=watcher,
        log_every=cfg.log_every,
        progress=progress,
        desc=f"train {cfg.mode} B={cfg.batch_size} on {env.device} {cfg.precision}",
    )


def _loop(config: Config, env: DistEnv, run: _Run) -> None:
    """The steps: each one updates the model, is logged, and is checkpointed every
    ``train.checkpoint_every`` steps, at the last, and when a stop is asked for."""
    cfg, checkpoints, trainer = config.train, config.output_path / CHECKPOINTS, run.trainer
    stop = StopRequest()
    with stop.installed(), run.log:
        for step, batch in enumerate(run.loader, start=run.start):
            digest = batch.digest() if env.is_main else None
            try:
                result = trainer.step(batch)
            except NonFinite as e:
                diverged = _diverged(e, step, batch.digest(), run.batches, checkpoints, run.distill)
                raise diverged from None
            except torch.OutOfMemoryError:
                result = None  # explained below, once the failed step's memory is freed
            if result is None:
                raise out_of_memory(config, trainer, step)
            source = None
            if isinstance(run.batches, SourceBatches):
                name = run.sources[run.batches.source_of(step)]
                source = (name, run.batches.batches_seen(step))
            run.log.record(step, run.batches.epoch_of(step), digest, result, trainer.model, source)
            run.skipped_in_a_row = run.skipped_in_a_row + 1 if result.skipped else 0
            if cfg.max_skipped_steps is not None and run.skipped_in_a_row > cfg.max_skipped_steps:
                tried = result.loss_scale / trainer.scaler.get_backoff_factor()  # the last tried
                raise _skipped_too_often(run.skipped_in_a_row, step, tried, checkpoints, run)
            if batch.text_duplicates and not run.masked:
                run.masked = True
                logger.warning(
                    "step %d: %d passage rows hold the text of another row under another id; "
                    "each is masked as that passage (never its negative)",
                    step + 1,
                    batch.text_duplicates,
                )
            done, interrupted = step + 1, stop.agreed(env)
            if done % cfg.checkpoint_every == 0 or done == run.total or interrupted:
                path = trainer.checkpoint(checkpoints, done, cfg.keep_checkpoints)
                if interrupted:
                    raise Interrupted(path, continue_command(config.output_path))
        run.log.finish()


def _diverged(
    e: NonFinite, step: int, digest: str, batches, root: Path, distill: Distillation | None
) -> Diverged:
    """What stopped the run: the step, its batch (digest, first questions), the checkpoint,
    and what to try (under distillation, the teacher's scores: fp16 would skip every step
    their scale overflows, and end with the model it began with)."""
    first = ", ".join(str(i) for i in batches.batch_indices(step)[:3])
    kept = latest_checkpoint(root)
    advice = (
        "check the scale of data.train's teacher_score values, or lower train.lr"
        if distill
        else "lower train.lr, or train in fp16 (its steps skip such a batch) or bf16"
    )
    return Diverged(
        f"train: the {e} is not finite at step {step + 1} (batch {digest}, questions {first}, "
        f"... of the training set); stopped with nothing updated, the last checkpoint "
        f"{kept.name if kept else '(none)'} as it was: {advice}"
    )


def _skipped_too_often(count: int, step: int, scale: float, root: Path, run: _Run) -> Diverged:
    """fp16: ``count`` steps in a row skipped, the last at ``step`` with the loss scale ``scale``:
    past train.max_skipped_steps, the run stops with the checkpoints as they are (a skipped step
    changes no weight). A run resumed amid such steps counts them from its resume."""
    kept = latest_checkpoint(root)
    advice = (
        "check the scale of data.train's teacher_score values, or lower train.lr"
        if run.distill
        else "lower train.lr, or train in bf16 or fp32 (where such a step stops the run at "
        "once, its batch named)"
    )
    return Diverged(
        f"train: {count} steps in a row skipped (steps {step + 2 - count} to {step + 1}), "
        f"the loss or its gradient not finite at every loss scale tried, down to "
        f"{scale:g}; stopped past train.max_skipped_steps, the last checkpoint "
        f"{kept.name if kept else '(none)'} kept: {advice}, or raise train.max_skipped_steps"
    )


def _warn_if_a_gpu_config_found_no_gpu(config: Config, env: DistEnv) -> None:
    """A config for a GPU (fp16) whose ``device: auto`` found none: said once, so that a torch
    built for the CPU alone does not train on the CPU unnoticed."""
    cfg = config.train
    if cfg.device == "auto" and env.device.type == "cpu" and cfg.precision == "fp16":
        fix = (
            "check the GPU's driver and CUDA_VISIBLE_DEVICES"
            if torch.version.cuda
            else "install a CUDA build of torch (the README: make install TORCH=...)"
        )
        logger.warning(
            "train.device auto found no CUDA device (torch %s): training on the CPU in fp16, "
            "slowly; %s, or set train.device=cpu and train.precision=fp32",
            torch.__version__,
            fix,
        )


def _seed_everything(seed: int) -> None:
    random.seed(seed)
    np.random.seed(seed % 2**32)
    torch.manual_seed(seed)


class StopRequest:
    """Ctrl-C / SIGTERM set a flag; the loop stops after the current step, on every rank. A
    SIGTERM from torchrun's agent once a peer has ended stops this rank at once, naming it."""

    def __init__(self) -> None:
        self.requested = False

    @contextlib.contextmanager
    def installed(self):
        def handler(signum, frame):
            if signum == signal.SIGTERM:
                distributed.stop_if_a_peer_ended()
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
        """Whether any rank was asked to stop (every rank gets the same answer)."""
        return any_rank(self.requested, env)
