"""What ``train`` may start or continue, read before its heavy imports (torch is not imported
here): its training files exist, a fresh run never overwrites another's checkpoints, a
``--resume`` says what it found, and a resumed run's settings are held against the ones it was
started with (``config.yaml``)."""

from __future__ import annotations

import logging
from dataclasses import dataclass
from pathlib import Path

from dpr_cache.config import Config, changed_settings
from dpr_cache.data.files import check_file
from dpr_cache.errors import InputError
from dpr_cache.train.run_folder import (
    CHECKPOINTS,
    CONFIG,
    MODEL,
    continue_command,
    finished_step,
    latest_checkpoint,
)

__all__ = [
    "Start",
    "check_start",
    "finished_resume",
    "check_resumed_settings",
    "RESUME_FREE",
    "RESUME_KEPT",
]

logger = logging.getLogger(__name__)


@dataclass(frozen=True)
class Start:
    """What a ``train`` call found: the step its run already finished at (a ``--resume`` then
    ends at once, nothing rewritten) and the line to say first (None: nothing)."""

    finished: int | None = None
    note: str | None = None
    warning: str | None = None  # said once the run has loaded its data and resumed

    def finished_line(self, out: Path) -> str:
        return f"{out} finished at step {self.finished}; model at {Path(out) / MODEL}"


def finished_resume(config: Config) -> Start | None:
    """A ``--resume`` of a run already finished under these settings, found without taking its
    lock (so that nothing of the folder is rewritten): its :class:`Start`, else None. A
    setting the checkpoint keeps (the optimizer's) changed is an InputError, as for any
    resume."""
    step = finished_step(config)
    if step is None:
        return None
    check_resumed_settings(config, config.output_path / CONFIG)
    return Start(finished=step)


def check_start(config: Config, resume: bool) -> Start:
    """The refusals and notes of a ``train`` call, before anything heavy: InputError for a
    training file given none or missing, and for a fresh run in a folder that holds another
    run's checkpoints (naming the command that continues that run); with ``resume``, a
    finished run (its step), no checkpoint (a new run starts, said), or a checkpoint whose run's
    settings are held against these (:func:`check_resumed_settings`: its warning kept for
    when the run has started)."""
    if not config.train_files:
        raise InputError("data.train: no training file given")
    for path in config.train_files:
        if not path.is_dir():  # a folder: datasets' save_to_disk or BEIR's, read when loaded
            check_file(path)
    out = config.output_path
    latest = latest_checkpoint(out / CHECKPOINTS)
    if not resume:
        if latest is not None:
            raise InputError(
                f"{out}: holds checkpoints of an earlier run: continue it with "
                f"`{continue_command(out)}`, or choose another output_dir"
            )
        return Start()
    if latest is None:
        return Start(note=f"no checkpoint in {out}: starting a new run")
    warning = check_resumed_settings(config, out / CONFIG)
    return Start(finished=finished_step(config), warning=warning)


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
    "train.shard",
    "train.shard_sync",
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
# keys whose weights the checkpoint holds: the adapters, a multi-vector model's projection
RESUME_HELD = ("model.lora", "model.vectors", "model.multi_dim")
# keys whose null means "as the model folder records" (else the default): a run saved before
# they were settled recorded the value its model took, which null still gives
AS_RECORDED = ("model.pooling", "model.normalize", "model.query_prefix", "model.passage_prefix")


def check_resumed_settings(config: Config, saved: Path) -> str | None:
    """A resumed run's settings against its config.yaml (``saved``): InputError for one the
    checkpoint keeps its own value of; the warning (None: none) naming the others that the
    steps to come depend on beyond their rounding."""
    if not saved.is_file():
        return None
    try:
        changed = changed_settings(saved, config)
    except InputError as exc:
        return f"--resume: the run's settings cannot be compared: {exc}"
    changed = [c for c in changed if not (c[0] in AS_RECORDED and c[2] is None)]
    said = {key: f"{key} {before!r} -> {now!r}" for key, before, now in changed}
    kept = [said[key] for key in RESUME_KEPT if key in said]
    if kept:
        raise InputError(
            f"--resume: {'; '.join(kept)}: a resumed run keeps its optimizer's "
            f"{', '.join(RESUME_KEPT)} from its checkpoint: set them back, or train afresh in "
            "another output_dir"
        )
    held = [text for key, text in said.items() if key.startswith(RESUME_HELD)]
    if held:
        raise InputError(
            f"--resume: {'; '.join(held)}: the checkpoint holds the run's own adapters and "
            "projection: set them back, or train afresh in another output_dir"
        )
    free = RESUME_FREE + RESUME_ROUNDING
    if config.train.mode != "accumulate":
        free += RESUME_CHUNKS
    rest = [text for key, text in said.items() if not key.startswith(free)]
    if not rest:
        return None
    return (
        f"--resume with settings other than the run's ({'; '.join(rest)}): the steps to come "
        "follow the new ones, so the model is not the one an unbroken run would train"
    )
