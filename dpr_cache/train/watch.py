"""Training you can watch: TensorBoard scalars, validation during training with the best model
kept (as DPR selects its checkpoint), and a loss-curve PNG at the end.

Validation encodes a fixed sample of the corpus with the passage tower and the first dev
questions with the query tower (inference mode: the dropout RNG is not touched, so a resumed run
stays bit-identical), ranks by brute force and reports DPR's hit rate at each k. When the hit rate
at the largest k improves, the model is saved whole as ``output_dir/best_model`` and the step and
figure recorded in ``best.json``.
"""

from __future__ import annotations

import functools
import importlib.util
import json
import logging
import shutil
from pathlib import Path
from typing import Any

import numpy as np
import torch

from dpr_cache.data.answers import has_answer
from dpr_cache.retrieval.dense.encode import encode_passage_texts
from dpr_cache.retrieval.dense.questions import QuestionRun, question_vectors
from dpr_cache.retrieval.metrics import first_relevant_rank, hit_metrics
from dpr_cache.runtime.atomic import read_lines, write_atomic, write_dir_atomic, write_json_atomic

__all__ = ["Validator", "Watcher", "plot_loss_curve", "tensorboard_available"]

log = logging.getLogger(__name__)

BEST_DIR, BEST_FILE, CURVE_FILE = "best_model", "best.json", "loss_curve.png"


def tensorboard_available() -> bool:
    return importlib.util.find_spec("tensorboard") is not None


class Validator:
    """Hit rates of the dev questions over a fixed sample of the corpus."""

    def __init__(
        self,
        questions,
        passages: dict[str, list[str]],
        ks,
        *,
        max_query_length: int,
        max_passage_length: int,
        batch_size: int,
        match: str,
    ) -> None:
        self.questions, self.passages, self.ks = questions, passages, sorted(ks)
        self.lengths = (max_query_length, max_passage_length)
        self.batch_size, self.match = batch_size, match

    def __call__(self, model, device: torch.device) -> dict[str, float]:
        was_training = model.training
        model.eval()
        try:
            p = encode_passage_texts(
                model,
                self.passages["title"],
                self.passages["text"],
                max_length=self.lengths[1],
                batch_size=self.batch_size,
                device=device,
            )
            texts = [text for text, _ in self.questions]
            run = QuestionRun(device, "fp32", self.batch_size)
            q = question_vectors(model, texts, run, max_length=self.lengths[0])
        finally:
            model.train(was_training)
        k_max = min(max(self.ks), len(p))
        top = np.argsort(-(q @ p.T), axis=1, kind="stable")[:, :k_max]  # [n_q, k]
        texts = self.passages["text"]
        first = [
            first_relevant_rank([has_answer(answers, texts[r], self.match) for r in rows])
            for (_, answers), rows in zip(self.questions, top, strict=True)
        ]
        hits = hit_metrics(first, self.ks)
        return {f"val_top{k}": float(hits[f"top{k}"].mean()) for k in self.ks}


class Watcher:
    """Where each step's record goes besides the log, on rank 0."""

    def __init__(
        self,
        out: Path,
        *,
        tensorboard: bool,
        validator: Validator | None,
        eval_every: int | None,
        device: torch.device,
        start_step: int = 0,
    ) -> None:
        self.out, self.validator, self.eval_every, self.device = out, validator, eval_every, device
        self.writer = None
        if tensorboard:
            from torch.utils.tensorboard import SummaryWriter

            # a resumed run drops the events logged after its checkpoint (they are replayed)
            self.writer = SummaryWriter(
                log_dir=str(out / "tensorboard"), purge_step=start_step or None
            )
        best = out / BEST_FILE
        self.best = json.loads(best.read_text()) if start_step and best.is_file() else None
        if self.best is None:  # a new run: an earlier run's best model is not this run's
            best.unlink(missing_ok=True)
            shutil.rmtree(out / BEST_DIR, ignore_errors=True)

    def step(self, record: dict[str, Any], model, done: int, last: bool) -> dict[str, Any]:
        """Log ``record``; validate when due (every ``eval_every`` steps and at the end)."""
        if self.validator is not None and (last or done % self.eval_every == 0):
            record.update(self.validator(model, self.device))
            key = f"val_top{self.validator.ks[-1]}"
            if self.best is None or record[key] > self.best.get(key, -1.0):
                model.max_query_length, model.max_passage_length = self.validator.lengths
                write_dir_atomic(self.out / BEST_DIR, model.save_pretrained)
                self.best = {"step": done, key: record[key]}
                write_json_atomic(self.out / BEST_FILE, self.best)
        if self.writer is not None:
            for name, value in record.items():
                if name not in ("step", "epoch", "source_batches") and isinstance(
                    value, (int, float)
                ):
                    self.writer.add_scalar(name, value, done)
            if "source" in record:  # each source's loss and batches, a curve a source
                where = f"source/{record['source']}"
                self.writer.add_scalar(f"{where}/loss", record["loss"], done)
                self.writer.add_scalar(f"{where}/batches", record["source_batches"], done)
            self.writer.flush()
        return record

    def close(self, log_path: Path) -> None:
        if self.writer is not None:
            self.writer.close()
        plot_loss_curve(log_path, self.out / CURVE_FILE)


def plot_loss_curve(log_path: Path, png: Path) -> Path | None:
    """The loss (and validation hit rates, when logged) against the step, from the train log."""
    rows = [json.loads(line) for line in read_lines(log_path)]
    if not rows:
        return None
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(7, 3.8))
    ax.plot([r["step"] for r in rows], [r["loss"] for r in rows], label="loss", linewidth=1)
    ax.set(xlabel="step", ylabel="loss", title="training loss")
    ax.grid(alpha=0.3)
    val = sorted({k for r in rows for k in r if k.startswith("val_top")})
    if val:
        right = ax.twinx()
        for key in val:
            points = [(r["step"], r[key]) for r in rows if key in r]
            right.plot(*zip(*points, strict=True), marker="o", linestyle="--", label=key)
        right.set_ylabel("validation hit rate (%)")
        right.legend(fontsize=8, loc="center right")
    fig.tight_layout()
    write_atomic(png, functools.partial(fig.savefig, dpi=110, format="png"))
    plt.close(fig)
    return png
