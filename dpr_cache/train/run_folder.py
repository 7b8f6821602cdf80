"""A training run's folder read without torch: its checkpoints, the config it saved, whether it
finished, and the command that continues it. ``train`` reads it before its heavy imports, so
that what refuses a run or ends it at once says so in a second."""

from __future__ import annotations

import json
import os
import shlex
from pathlib import Path
from typing import Any

from dpr_cache.runtime.atomic import write_json_atomic

__all__ = [
    "CHECKPOINTS",
    "MODEL",
    "CONFIG",
    "FINISHED",
    "STATE_FILE",
    "latest_checkpoint",
    "continue_command",
    "record_finished",
    "finished_step",
]

CHECKPOINTS, MODEL, CONFIG, FINISHED = "checkpoints", "model", "config.yaml", "finished.json"
STATE_FILE = "state.pt"  # a checkpoint folder is complete once it holds this
FINISH_KEYS = ("data.train", "train.batch_size", "train.epochs", "train.max_steps")
"""What sets a run's last step: a run finished under other values of them has steps to go."""


def latest_checkpoint(root: Path) -> Path | None:
    """The newest checkpoint folder under ``root`` (checked or not), or None."""
    done = sorted(p for p in Path(root).glob("step-*") if (p / STATE_FILE).is_file())
    return done[-1] if done else None


def continue_command(out: Path) -> str:
    """The command that continues the run in ``out`` as printed: its own saved config (every
    setting it was started with) and ``--resume``; under ``torchrun`` on as many ranks."""
    world = int(os.environ.get("WORLD_SIZE", "1"))
    launcher = "dpr-cache" if world == 1 else f"torchrun --nproc_per_node {world} -m dpr_cache"
    return f"{launcher} train --config {shlex.quote(str(Path(out) / CONFIG))} --resume"


def _settings(config) -> dict[str, Any]:
    """The values of :data:`FINISH_KEYS` in ``config``."""
    train, data = config.train, config.data
    return {
        "data.train": data.model_dump(mode="json")["train"],
        "train.batch_size": train.batch_size,
        "train.epochs": train.epochs,
        "train.max_steps": train.max_steps,
    }


def record_finished(out: Path, step: int, config) -> None:
    """``out/finished.json``: the run ended at ``step`` with its model saved, under these
    settings of :data:`FINISH_KEYS`."""
    write_json_atomic(Path(out) / FINISHED, {"step": step, "settings": _settings(config)})


def finished_step(config) -> int | None:
    """The step the run in ``config``'s output_dir finished at, when it finished under
    ``config``'s settings of :data:`FINISH_KEYS` with its model there; else None."""
    out = config.output_path
    path = out / FINISHED
    if not (path.is_file() and (out / MODEL).is_dir()):
        return None
    try:
        record = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return None
    if not isinstance(record, dict) or record.get("settings") != _settings(config):
        return None
    step = record.get("step")
    return step if isinstance(step, int) else None
