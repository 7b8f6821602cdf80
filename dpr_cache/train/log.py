"""What a training run leaves as it goes, on rank 0: ``train_log.jsonl`` (a line a step), the
progress bar, and the watcher (TensorBoard, validation with the best model kept, the loss curve).

A resumed run keeps the log lines of the steps its checkpoint holds and writes the rest again.
"""

from __future__ import annotations

import contextlib
import json
from pathlib import Path
from typing import Any

from tqdm.auto import tqdm

from dpr_cache.runtime import memory
from dpr_cache.runtime.atomic import append_line, read_lines, write_text_atomic
from dpr_cache.runtime.distributed import DistEnv
from dpr_cache.train.trainer import StepResult
from dpr_cache.train.watch import Watcher

__all__ = ["LOG_FILE", "TrainLog", "negatives_per_question"]

LOG_FILE = "train_log.jsonl"


def negatives_per_question(
    mode: str,
    batch_size: int,
    chunk_size: int,
    world_size: int,
    group_size: int,
    *,
    in_batch: bool = True,
) -> int:
    """Passages a question is scored against, besides its positive: with ``in_batch`` False
    (distillation alone, which scores each question against its own group only) its hard
    negatives."""
    if not in_batch:
        return group_size - 1
    if mode == "accumulate":
        local = batch_size // world_size
        return min(chunk_size, local) * world_size * group_size - 1
    return batch_size * group_size - 1


class TrainLog(contextlib.AbstractContextManager):
    """Rank 0's log file, progress bar and watcher; on other ranks only the bar (disabled)."""

    def __init__(
        self,
        out: Path,
        env: DistEnv,
        *,
        start: int,
        total: int,
        fixed: dict[str, Any],
        watcher: Watcher | None,
        log_every: int,
        progress: bool = True,
        desc: str = "train",
    ) -> None:
        self.path, self.env, self.fixed, self.watcher = out / LOG_FILE, env, fixed, watcher
        self.log_every, self.total, self.skipped = log_every, total, 0
        if env.is_main:
            keep_lines_up_to(self.path, start)
            kept = read_lines(self.path)
            self.skipped = json.loads(kept[-1]).get("skipped_steps", 0) if kept else 0
        self.file = open(self.path, "a", encoding="utf-8") if env.is_main else None  # noqa: SIM115
        self.bar = tqdm(
            total=total,
            initial=start,
            disable=not (progress and env.is_main),
            desc=desc,
            dynamic_ncols=True,
        )

    def record(
        self,
        step: int,
        epoch: int,
        digest: str | None,
        result: StepResult,
        model,
        source: tuple[str, int] | None = None,
    ) -> None:
        """Log step ``step`` (0-based): its line (every ``log_every`` steps and whenever it
        validated), the watcher's figures, the bar. ``source``: the training source the batch
        came from, and how many batches it has given so far."""
        done = step + 1
        self.skipped += result.skipped
        if self.env.is_main:
            record = {
                "step": done,
                "epoch": epoch,
                "loss": result.loss,
                "lr": result.lr,
                "grad_norm": result.grad_norm,
                **self.fixed,
                "batch_digest": digest,  # rank 0's slice
                "seconds": round(result.seconds, 4),
                "pairs_per_second": round(self.fixed["batch_size"] / result.seconds, 2),
                "peak_memory_bytes": memory.peak_memory_bytes(self.env.device),
            }
            if source is not None:
                record.update(source=source[0], source_batches=source[1])
            if result.loss_scale is not None:
                record["loss_scale"] = result.loss_scale
            if self.skipped:  # fp16 steps skipped for a loss or gradient not finite, so far
                record.update(skipped=result.skipped, skipped_steps=self.skipped)
            if self.watcher is not None:
                record = self.watcher.step(record, model, done, last=done == self.total)
            validated = any(key.startswith("val_") for key in record)
            if done % self.log_every == 0 or validated:
                append_line(self.file, json.dumps(record))
        self.bar.update(1)
        pairs = self.fixed["batch_size"] / result.seconds
        self.bar.set_postfix(
            loss=f"{result.loss:.4f}", lr=f"{result.lr:.2e}", pairs_s=f"{pairs:.1f}"
        )

    def finish(self) -> None:
        """Close the watcher (the loss curve is drawn from the finished log)."""
        if self.file is not None:
            self.file.close()
            self.file = None
        if self.watcher is not None:
            self.watcher.close(self.path)

    def __exit__(self, *exc) -> None:
        self.bar.close()
        if self.file is not None:
            self.file.close()


def keep_lines_up_to(log_path: Path, step: int) -> None:
    """Keep the log lines of steps up to ``step`` (those after the checkpoint are redone)."""
    if step == 0:
        log_path.unlink(missing_ok=True)
        return
    kept = [line for line in read_lines(log_path) if json.loads(line)["step"] <= step]
    write_text_atomic(log_path, "".join(line + "\n" for line in kept))
