"""The watcher a config asks for: TensorBoard when installed (``train.log_to``), validation every
``train.eval_every`` steps over ``train.eval_passages`` sampled passages and the first
``train.eval_questions`` dev questions."""

from __future__ import annotations

import logging
from pathlib import Path

import numpy as np
import torch

from dpr_cache.config import Config
from dpr_cache.data.passages import load_passages, passage_columns
from dpr_cache.data.qas import read_qas
from dpr_cache.errors import InputError
from dpr_cache.train.watch import Validator, Watcher, tensorboard_available

__all__ = ["make_watcher"]

log = logging.getLogger(__name__)


def make_watcher(config: Config, device: torch.device, start_step: int = 0) -> Watcher:
    cfg = config.train
    tensorboard = cfg.log_to == "tensorboard" or (cfg.log_to is None and tensorboard_available())
    if cfg.log_to == "tensorboard" and not tensorboard_available():
        raise InputError("train.log_to: tensorboard is not installed (pip install tensorboard)")
    validator = None
    if cfg.eval_every:
        if config.model.vectors == "multi":
            raise InputError(
                "train.eval_every: validation during training scores one vector a text; a "
                "multi-vector model (model.vectors: multi) is evaluated by `dpr-cache eval`"
            )
        if not (config.data.dev_qa and config.data.passages):
            raise InputError("train.eval_every: needs data.dev_qa and data.passages to validate on")
        dev = config.dev_sets[0][1]  # the first of several
        questions = read_qas(dev)[: cfg.eval_questions]
        if not questions:
            raise InputError(f"{dev}: no questions to validate on")
        dataset = load_passages(Path(config.data.passages), config.cache_path)
        n = min(cfg.eval_passages, len(dataset))
        rows = np.sort(np.random.default_rng(0).choice(len(dataset), size=n, replace=False))
        validator = Validator(
            questions,
            passage_columns(dataset, rows.tolist()),
            config.eval.top_k,
            max_query_length=config.model.max_query_length,
            max_passage_length=config.model.max_passage_length,
            batch_size=config.index.batch_size,
            match=config.eval.match,
        )
    return Watcher(
        config.output_path,
        tensorboard=tensorboard,
        validator=validator,
        eval_every=cfg.eval_every,
        device=device,
        start_step=start_step,
    )
