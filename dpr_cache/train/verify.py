"""``dpr-cache verify``: the user's own proof that GradCache equals the full batch.

One real batch from ``data.train`` with the configured model (its LoRA adapters, pooling and
towers), dropout off (LoRA's too), in float32 (or float64) whatever ``model.dtype``: the gradient
of a plain full-batch step and of a GradCache step, the largest difference relative to the largest
gradient, and the verdict against the bound of the precision (:data:`BOUNDS`): rounding alone
stays far below it, a wrong gradient (a chunk's RNG not replayed, a dropped chunk) far above.
"""

from __future__ import annotations

import torch

from dpr_cache.config import Config
from dpr_cache.core.distill import Distillation
from dpr_cache.core.steppers import Towers, make_loss_fn, make_stepper
from dpr_cache.model.fsdp import full_value, shard_towers
from dpr_cache.runtime import distributed
from dpr_cache.runtime.device import advises_on_out_of_memory, resolve_device
from dpr_cache.runtime.distributed import DistEnv
from dpr_cache.runtime.memory import trim
from dpr_cache.train.trainer import (
    batch_recipe,
    compile_as_set,
    distillation_of,
    length_bucket_of,
    load_model,
    prepare_towers,
    training_data,
)

__all__ = ["verify", "compare_steps", "sharded_step", "BOUNDS"]

BOUNDS = {"float64": 1e-10, "float32": 1e-4}
"""Largest relative gradient difference that is rounding, per dtype."""


def _grads(model: torch.nn.Module) -> dict[str, torch.Tensor]:
    """Every gradient of ``model``, a sharded one gathered whole (a collective)."""
    return {
        n: full_value(p.grad).detach().clone()
        for n, p in model.named_parameters()
        if p.grad is not None
    }


def compare_steps(
    model,
    batch,
    *,
    chunk: int,
    p_chunk: int | None,
    temperature: float,
    tile: int | None,
    distillation: Distillation | None = None,
    length_bucket: int | None = None,
    modes: tuple[str, ...] = ("full", "gradcache"),
    towers: Towers | None = None,
    env: DistEnv = DistEnv(),
) -> dict[str, tuple[float, dict]]:
    """The loss and the gradients of a full-batch step and of a GradCache step on ``batch``,
    for the contrastive loss or its mix with ``distillation``; GradCache's chunks rounded to
    ``length_bucket`` as the trainer rounds them. ``towers`` (default: the model's own) may be
    sharded over ``env``'s ranks, ``batch`` then being this rank's slice: the loss is the mean
    over ranks, the gradients are gathered whole."""
    towers = towers or Towers(model.encode_query, model.encode_passage)
    loss_fn = make_loss_fn(
        temperature=temperature,
        tile_size=tile,
        group_size=batch.group_size,
        rank=env.rank,
        world_size=env.world_size,
        distillation=distillation,
    )
    results = {}
    for mode in modes:
        model.zero_grad(set_to_none=True)
        stepper = make_stepper(
            mode,
            towers,
            loss_fn,
            chunk_size=chunk,
            p_chunk_size=p_chunk,
            length_bucket=length_bucket,
            release_memory=trim,
        )
        loss = stepper.step(batch.q_inputs, batch.p_inputs, **batch.loss_inputs())
        results[mode] = (distributed.all_mean(loss, env), _grads(model))
    return results


@advises_on_out_of_memory("lower train.batch_size")
def verify(config: Config, *, double: bool = False, step: int = 0) -> dict[str, object] | None:
    """Full batch vs GradCache on the batch of ``step``; returns the figures it prints. With
    ``train.shard: fsdp`` (under torchrun) GradCache runs on the towers sharded over the ranks,
    each on its slice of the batch, against one rank's unsharded full batch; None on the ranks
    but 0."""
    cfg = config.train
    sharded = cfg.shard == "fsdp"
    env = distributed.setup(cfg.device) if sharded else DistEnv()
    try:
        return _verify(config, env, sharded, double, step)
    finally:
        if sharded:
            distributed.teardown()


def _verify(config: Config, env: DistEnv, sharded: bool, double: bool, step: int):
    cfg, m = config.train, config.model
    chunk = 8 if cfg.chunk_size == "auto" else int(cfg.chunk_size)
    dataset, batches = training_data(config, env)
    device = env.device if sharded else resolve_device(cfg.device, key="train.device")
    model = _model(config, device, double)
    compiled = compile_as_set(model, cfg, device) if not sharded else False
    recipe = batch_recipe(config, model, length_bucket_of(cfg, compiled))
    batch = recipe.batch(dataset, batches, model.tokenizer, step).to(device)
    spec = {
        "chunk": chunk,
        "p_chunk": cfg.p_chunk_size,
        "temperature": cfg.temperature,
        "tile": cfg.loss_tile_size,
        "distillation": distillation_of(config),
        "length_bucket": length_bucket_of(cfg, compiled),
    }
    if sharded:
        results = compare_steps(model, batch, modes=("full",), **spec)
        part = recipe.batch(dataset, batches, model.tokenizer, step, env.rank, env.world_size)
        twin = _model(config, device, double)  # the same weights, to be sharded
        results["gradcache"] = sharded_step(twin, part.to(device), env, cfg.shard_sync, **spec)
    else:
        results = compare_steps(model, batch, **spec)
    if not env.is_main:
        return None
    full_loss, full = results["full"]
    cache_loss, cached = results["gradcache"]
    scale = max(g.abs().max().item() for g in full.values())
    worst_name, worst = max(
        ((n, (cached[n] - full[n]).abs().max().item()) for n in full), key=lambda item: item[1]
    )
    dtype = "float64" if double else "float32"
    gap, bound = worst / scale, BOUNDS[dtype]
    towers = "compiled" if compiled else "eager"
    if sharded:
        towers = f"sharded over {env.world_size} rank(s) (FSDP2, sync per {cfg.shard_sync})"
    return {
        "model": m.name_or_path,
        "loss": _loss_name(config),
        "dtype": dtype,
        "device": str(device),
        "batch (questions x passages)": f"{batch.n_questions} x {batch.p_ids.numel()}",
        "chunk size": chunk,
        "towers": towers,
        "loss full / gradcache": f"{full_loss:.10f} / {cache_loss:.10f}",
        "max relative grad difference": f"{gap:.1e} (bound {bound:.0e} in {dtype})",
        "worst parameter": worst_name,
        "verdict": "equal: GradCache gives the full batch's gradient"
        if gap <= bound
        else "DIFFERENT: the gap is over the bound",
    }


def _model(config: Config, device: torch.device, double: bool):
    """The configured model with dropout off (LoRA's too), in float32 or float64 whatever
    ``model.dtype``, its towers prepared as training prepares them; its adapters drawn from
    ``train.seed`` (two calls give the same weights)."""
    m, cfg = config.model, config.train
    lora = m.lora.model_copy(update={"dropout": 0.0}) if m.lora is not None else None
    torch.manual_seed(cfg.seed)
    model = load_model(m.model_copy(update={"dtype": "fp32"}), device, dropout=0.0, lora=lora)
    model = model.to(device, torch.float64 if double else torch.float32)
    prepare_towers(model, cfg, device)
    return model.train()


def sharded_step(model, part, env: DistEnv, sync: str, **spec) -> tuple[float, dict]:
    """GradCache's loss (the mean over ranks) and gradient (gathered whole) on ``model``
    sharded over ``env``'s ranks in place, each rank stepping on its slice ``part`` of the
    batch with every rank's passages as negatives."""
    towers = shard_towers(model, env, precision="fp32", sync=sync)
    results = compare_steps(model, part, modes=("gradcache",), towers=towers, env=env, **spec)
    return results["gradcache"]


def _loss_name(config: Config) -> str:
    """The configured loss in words: its name, its mix and its temperatures."""
    spec, cfg = distillation_of(config), config.train
    if spec is None:
        return f"contrastive (temperature {cfg.temperature:g})"
    mix = f"{spec.weight:g} x contrastive + {1 - spec.weight:g} x " if spec.weight else ""
    teacher = (
        f", teacher temperature {spec.teacher_temperature:g}" if spec.loss == "distill_kl" else ""
    )
    return f"{mix}{spec.loss} (temperature {cfg.temperature:g}{teacher})"
