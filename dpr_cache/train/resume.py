"""What ``train --resume`` may continue: a fresh run never overwrites another's checkpoints, and a
resumed run's settings are held against the ones it was started with (``config.yaml``)."""

from __future__ import annotations

import logging
from pathlib import Path

from dpr_cache.config import Config, changed_settings
from dpr_cache.errors import InputError
from dpr_cache.train.checkpoint import latest_checkpoint

__all__ = ["check_start", "check_resumed_settings", "RESUME_FREE", "RESUME_KEPT"]

logger = logging.getLogger(__name__)


def check_start(config: Config, checkpoints: Path, resume: bool) -> None:
    """A fresh run does not overwrite another run's checkpoints (in ``checkpoints``)."""
    if not resume and latest_checkpoint(checkpoints) is not None:
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
    "model.attn_implementation",
)
RESUME_CHUNKS = ("train.chunk_size", "train.p_chunk_size")
# keys a resumed run takes from its checkpoint: the optimizer's state holds them
RESUME_KEPT = ("train.lr", "train.weight_decay", "train.adam_eps")


def check_resumed_settings(config: Config, saved: Path, *, warn: bool) -> None:
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
    adapters = [text for key, text in said.items() if key.startswith("model.lora")]
    if adapters:
        raise InputError(
            f"--resume: {'; '.join(adapters)}: the checkpoint holds the run's own adapters: set "
            "model.lora back, or train afresh in another output_dir"
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
