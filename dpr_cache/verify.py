"""``dpr-cache verify``: the user's own proof that GradCache equals the full batch.

One real batch from ``data.train`` with the configured model, dropout off: the gradient of a
plain full-batch step and of a GradCache step, and the largest relative difference.
"""

from __future__ import annotations

from pathlib import Path

import torch

from dpr_cache.config import Config
from dpr_cache.data import TrainBatches, load_training_set
from dpr_cache.distributed import DistEnv
from dpr_cache.errors import InputError
from dpr_cache.recipe import load_model, step_batch
from dpr_cache.steppers import make_loss_fn, make_stepper, wrap_towers

__all__ = ["verify"]


def _grads(model: torch.nn.Module) -> dict[str, torch.Tensor]:
    return {n: p.grad.detach().clone() for n, p in model.named_parameters() if p.grad is not None}


def verify(config: Config, *, double: bool = False, step: int = 0) -> dict[str, object]:
    """Full batch vs GradCache on the batch of ``step``; returns the figures it prints."""
    cfg = config.train
    if not config.data.train:
        raise InputError("data.train: no training file given")
    chunk = 8 if cfg.chunk_size == "auto" else int(cfg.chunk_size)
    dataset = load_training_set(Path(config.data.train), config.cache_path)
    batches = TrainBatches(len(dataset), cfg.batch_size, cfg.seed, source=str(config.data.train))
    model = load_model(config, dropout=0.0)
    if double:
        model = model.double()
    model.train()
    batch = step_batch(config, dataset, batches, model.tokenizer, step)
    towers = wrap_towers(model, DistEnv())
    loss_fn = make_loss_fn(
        temperature=cfg.temperature, tile_size=cfg.loss_tile_size, group_size=batch.group_size
    )
    results = {}
    for mode in ("full", "gradcache"):
        model.zero_grad(set_to_none=True)
        stepper = make_stepper(
            mode, towers, loss_fn, chunk_size=chunk, p_chunk_size=cfg.p_chunk_size
        )
        loss = stepper.step(batch.q_inputs, batch.p_inputs, p_ids=batch.p_ids)
        results[mode] = (float(loss), _grads(model))
    full_loss, full = results["full"]
    cache_loss, cached = results["gradcache"]
    scale = max(g.abs().max().item() for g in full.values())
    worst_name, worst = max(
        ((n, (cached[n] - full[n]).abs().max().item()) for n in full), key=lambda item: item[1]
    )
    return {
        "model": config.model.name_or_path,
        "dtype": "float64" if double else "float32",
        "batch (questions x passages)": f"{batch.n_questions} x {batch.p_ids.numel()}",
        "chunk size": chunk,
        "loss full / gradcache": f"{full_loss:.10f} / {cache_loss:.10f}",
        "max relative grad difference": f"{worst / scale:.3e}",
        "worst parameter": worst_name,
    }
