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
import random
import signal
from pathlib import Path

import numpy as np
import torch

from dpr_cache.config import Config, changed_settings, save_config
from dpr_cache.core.distill import Distillation
from dpr_cache.errors import Diverged, InputError, Interrupted
from dpr_cache.runtime import distributed
from dpr_cache.runtime.device import deterministic_kernels
from dpr_cache.runtime.distributed import DistEnv, any_rank
from dpr_cache.runtime.lock import output_lock
from dpr_cache.train.checkpoint import latest_checkpoint
from dpr_cache.train.log import TrainLog, negatives_per_question
from dpr_cache.train.recipe import step_batches
from dpr_cache.train.trainer import (
    NonFinite,
    batch_recipe,
    build_trainer,
    distillation_of,
    out_of_memory,
    training_data,
    training_files,
)
from dpr_cache.train.watch_setup import make_watcher

__all__ = ["train"]

CHECKPOINTS, MODEL = "checkpoints", "model"


logger = logging.getLogger(__name__)


def train(config: Config, *, resume: bool = False, progress: bool = True) -> Path:
    """Train per ``config``; return ``output_dir/model``. Raises InputError on bad input, and
    when another command holds ``output_dir``."""
    with output_lock(config.output_path):
        return _train(config, resume, progress)


def _train(config: Config, resume: bool, progress: bool) -> Path:
    cfg, m = config.train, config.model
    out = config.output_path
    _check_start(config, resume)
    deterministic_kernels(cfg.deterministic)
    env = distributed.setup(cfg.device)
    try:
        # -- set-up: data, trainer, resume, log ---------------------------------------------------
        if cfg.batch_size % env.world_size != 0:
            raise InputError(
                f"train.batch_size ({cfg.batch_size}) must be divisible by the world size "
                f"({env.world_size})"
            )
        if cfg.num_threads:
            torch.set_num_threads(cfg.num_threads)
        _seed_everything(cfg.seed)
        dataset, batches = training_data(config, env)
        total = cfg.max_steps or batches.steps_per_epoch * cfg.epochs
        trainer = build_trainer(config, env, total)
        if env.is_main:  # once the model is there: a run that cannot start says that alone
            _warn_if_a_gpu_config_found_no_gpu(config, env)
        recipe = batch_recipe(config, trainer.model, trainer.length_bucket)
        start = trainer.resume(out / CHECKPOINTS) if resume else 0
        if start:
            _check_resumed_settings(config, out / "config.yaml", warn=env.is_main)
        if env.is_main:
            save_config(config, out / "config.yaml")
        distill = distillation_of(config)
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
        log = TrainLog(
            out,
            env,
            start=start,
            total=total,
            fixed=fixed,
            watcher=watcher,
            log_every=cfg.log_every,
            progress=progress,
            desc=f"train {cfg.mode} B={cfg.batch_size} on {env.device} {cfg.precision}",
        )
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

        # -- the loop: step, log, checkpoint ------------------------------------------------------
        stop = StopRequest()
        with stop.installed(), log:
            for step, batch in enumerate(loader, start=start):
                digest = batch.digest() if env.is_main else None
                try:
                    result = trainer.step(batch)
                except NonFinite as e:
                    root = out / CHECKPOINTS
                    raise _diverged(e, step, batch.digest(), batches, root, distill) from None
                except torch.OutOfMemoryError:
                    result = None  # explained below, once the failed step's memory is freed
                if result is None:
                    raise out_of_memory(config, trainer, step)
                log.record(step, batches.epoch_of(step), digest, result, trainer.model)
                done, interrupted = step + 1, stop.agreed(env)
                if done % cfg.checkpoint_every == 0 or done == total or interrupted:
                    path = trainer.checkpoint(out / CHECKPOINTS, done, cfg.keep_checkpoints)
                    if interrupted:
                        raise Interrupted(path)
            log.finish()

        # -- the final model ----------------------------------------------------------------------
        trainer.save_model(out / MODEL, m.max_query_length, m.max_passage_length)
        distributed.barrier()
        return out / MODEL
    finally:
        distributed.teardown()


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


def _check_start(config: Config, resume: bool) -> None:
    """A training file is given; a fresh run does not overwrite another run's checkpoints."""
    training_files(config)
    if not resume and latest_checkpoint(config.output_path / CHECKPOINTS) is not None:
        raise InputError(
            f"{config.output_path}: holds checkpoints of an earlier run; pass --resume to "
            "continue it or choose another output_dir"
        )


# keys a resumed run may set anew: its steps compute the same without them
RESUME_FREE = (
    "output_dir",
    "data.cache_dir",
    "data.num_workers",
    "data.passages",
    "data.dev_qa",
    "data.qrels",
    "train.checkpoint_every",
    "train.keep_checkpoints",
    "train.log_every",
    "train.log_to",
    "train.eval_every",
    "train.eval_passages",
    "train.eval_questions",
    "index.",
    "eval.",
)
# keys that change only the rounding of what the steps compute (the chunk sizes but under
# accumulation, where a chunk bounds the negatives)
RESUME_ROUNDING = (
    "train.num_threads",
    "train.memory_budget",
    "train.loss_tile_size",
    "train.keep_last_graph",
    "train.length_order",
    "train.length_bucket",
    "model.gradient_checkpointing",
)
RESUME_CHUNKS = ("train.chunk_size", "train.p_chunk_size")
# keys a resumed run takes from its checkpoint: the optimizer's state holds them
RESUME_KEPT = ("train.lr", "train.weight_decay", "train.adam_eps")


def _check_resumed_settings(config: Config, saved: Path, *, warn: bool) -> None:
    """A resumed run's settings against its config.yaml (``saved``): InputError for one the
    checkpoint keeps its own value of; with ``warn``, one warning naming the others that the
    steps to come depend on beyond their rounding."""
    if not saved.is_file():
        return
    try:
        changed = changed_settings(saved, config)
    except InputError as exc:
        if warn:
            logger.warning("--resume: the run's settings cannot be compared: %s", exc)
        return
    said = {key: f"{key} {before!r} -> {now!r}" for key, before, now in changed}
    kept = [said[key] for key in RESUME_KEPT if key in said]
    if kept:
        raise InputError(
            f"--resume: {'; '.join(kept)}: a resumed run keeps its optimizer's "
            f"{', '.join(RESUME_KEPT)} from its checkpoint: set them back, or train afresh in "
            "another output_dir"
        )
    free = RESUME_FREE + RESUME_ROUNDING
    if config.train.mode != "accumulate":
        free += RESUME_CHUNKS
    rest = [text for key, text in said.items() if not key.startswith(free)]
    if rest and warn:
        logger.warning(
            "--resume with settings other than the run's (%s): the steps to come follow the new "
            "ones, so the model is not the one an unbroken run would train",
            "; ".join(rest),
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
