"""``dpr-cache verify``: the user's own proof that GradCache equals the full batch.

One real batch from ``data.train`` with the configured model (its LoRA adapters, pooling and
towers), dropout off (LoRA's too), in float32 (or float64) whatever ``model.dtype``: the gradient
of a plain full-batch step and of a GradCache step, the largest difference relative to the largest
gradient, and the verdict against the bound of the precision (:data:`BOUNDS`): rounding alone
stays far below it, a wrong gradient (a chunk's RNG not replayed, a dropped chunk) far above.
"""

from __future__ import annotations

import dataclasses

import torch

from dpr_cache.config import Config
from dpr_cache.core.steppers import Towers
from dpr_cache.model.fsdp import full_value, shard_towers
from dpr_cache.runtime import distributed
from dpr_cache.runtime.device import advises_on_out_of_memory, resolve_device
from dpr_cache.runtime.distributed import DistEnv
from dpr_cache.train.settle import settle_model
from dpr_cache.train.step import Chunking, build_step, chunking_of, distillation_of, guide_of
from dpr_cache.train.trainer import (
    batch_recipe,
    compile_as_set,
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


def _in_mode(config: Config, mode: str) -> Config:
    """``config`` with ``train.mode`` set to ``mode``."""
    return config.model_copy(update={"train": config.train.model_copy(update={"mode": mode})})


def compare_steps(
    config: Config,
    model,
    batch,
    *,
    chunking: Chunking,
    loss_inputs: dict | None = None,
    modes: tuple[str, ...] = ("full", "gradcache"),
    towers: Towers | None = None,
    env: DistEnv = DistEnv(),
) -> dict[str, tuple[float, dict]]:
    """The loss and the gradients of each step object in ``modes`` that :func:`build_step`
    assembles from ``config`` (``train.mode`` set to each) on ``batch``, GradCache cut as
    ``chunking`` says. ``loss_inputs``: the loss's inputs besides the reps (default: the
    batch's). ``towers`` (default: the model's own) may be sharded over ``env``'s ranks,
    ``batch`` then being this rank's slice: the loss is the mean over ranks, the gradients are
    gathered whole."""
    inputs = batch.loss_inputs() if loss_inputs is None else loss_inputs
    results = {}
    for mode in modes:
        model.zero_grad(set_to_none=True)
        stepper = build_step(
            _in_mode(config, mode),
            model,
            rank=env.rank,
            world_size=env.world_size,
            towers=towers,
            chunking=chunking,
        )
        loss = stepper.step(batch.q_inputs, batch.p_inputs, **inputs)
        results[mode] = (distributed.all_mean(loss, env), _grads(model))
    return results


@advises_on_out_of_memory("lower train.batch_size")
def verify(config: Config, *, double: bool = False, step: int = 0) -> dict[str, object] | None:
    """Full batch vs GradCache on the batch of ``step``, the step assembled as training
    assembles it (every engine setting and loss option of the config); returns the figures it
    prints. With ``train.shard: fsdp`` (under torchrun) GradCache runs on the towers sharded
    over the ranks, each on its slice of the batch, against one rank's unsharded full batch;
    None on the ranks but 0."""
    config = settle_model(config)
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
    dataset, batches, _ = training_data(config, env)
    device = env.device if sharded else resolve_device(cfg.device, key="train.device")
    model = _model(config, device, double)
    chunking = chunking_of(config, model, env)  # auto: probed as training probes it
    compiled = compile_as_set(model, cfg, device) if not sharded else False
    chunking = dataclasses.replace(chunking, length_bucket=length_bucket_of(cfg, compiled))
    guide = guide_of(config, device, chunking)
    recipe = batch_recipe(config, model, chunking.length_bucket, guide)
    batch = recipe.batch(dataset, batches, model.tokenizer, step).to(device)
    if sharded:
        results = compare_steps(
            config,
            model,
            batch,
            chunking=chunking,
            loss_inputs=_inputs(batch, guide),
            modes=("full",),
        )
        part = recipe.batch(dataset, batches, model.tokenizer, step, env.rank, env.world_size)
        part = part.to(device)
        twin = _model(config, device, double)  # the same weights, to be sharded
        results["gradcache"] = sharded_step(
            config, twin, part, env, chunking=chunking, loss_inputs=_inputs(part, guide)
        )
    else:
        inputs = _inputs(batch, guide)
        results = compare_steps(config, model, batch, chunking=chunking, loss_inputs=inputs)
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
        "engine": _engine_name(config, chunking),
        "towers": towers,
        "loss full / gradcache": f"{full_loss:.10f} / {cache_loss:.10f}",
        "max relative grad difference": f"{gap:.1e} (bound {bound:.0e} in {dtype})",
        "worst parameter": worst_name,
        "verdict": "equal: GradCache gives the full batch's gradient"
        if gap <= bound
        else "DIFFERENT: the gap is over the bound",
    }


def _inputs(batch, guide) -> dict:
    """The loss's inputs besides the reps: the batch's, and the guide's vectors of its rows."""
    inputs = batch.loss_inputs()
    if guide is not None:
        inputs.update(guide.reps(*batch.guide_inputs))
    return inputs


def _engine_name(config: Config, chunking: Chunking) -> str:
    """GradCache's settings in words: its chunks, the kept graph, the order and the bucket."""
    t = config.train
    chunks = f"chunk {chunking.chunk_size}"
    if t.p_chunk_size:
        chunks += f" (passages {t.p_chunk_size})"
    if chunking.chunk_tokens:
        chunks += f", at most {chunking.chunk_tokens} tokens a chunk"
    parts = [
        chunks,
        "last graph kept" if t.keep_last_graph else "every chunk re-encoded",
        "rows longest first" if t.length_order else "rows in batch order",
    ]
    if chunking.length_bucket:
        parts.append(f"widths a multiple of {chunking.length_bucket}")
    return ", ".join(parts)


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


def sharded_step(
    config: Config, model, part, env: DistEnv, *, chunking: Chunking, loss_inputs=None
) -> tuple[float, dict]:
    """GradCache's loss (the mean over ranks) and gradient (gathered whole) on ``model``
    sharded over ``env``'s ranks in place (``train.shard_sync``), each rank stepping on its
    slice ``part`` of the batch with every rank's passages as negatives."""
    towers = shard_towers(model, env, precision="fp32", sync=config.train.shard_sync)
    results = compare_steps(
        config,
        model,
        part,
        chunking=chunking,
        loss_inputs=loss_inputs,
        modes=("gradcache",),
        towers=towers,
        env=env,
    )
    return results["gradcache"]


def _loss_name(config: Config) -> str:
    """The configured loss in words: its name, its mix, its temperatures and its options."""
    spec, cfg = distillation_of(config), config.train
    options = [f"temperature {cfg.temperature:g}"]
    if cfg.directions != ["query_to_passage"]:
        options.append(f"directions {' + '.join(cfg.directions)} ({cfg.partition})")
    if cfg.hardness:
        options.append(f"hardness {cfg.hardness} x {cfg.hardness_strength:g}")
    if cfg.guide:
        margin = f"margin {cfg.guide_margin:g} {cfg.guide_margin_strategy}"
        options.append(f"guided by {cfg.guide} ({margin})")
    if cfg.matryoshka_dims:
        options.append(f"Matryoshka {'/'.join(str(d) for d in cfg.matryoshka_dims)}")
    if cfg.loss_tile_size:
        options.append(f"tiled {cfg.loss_tile_size}")
    if spec is None:
        return f"contrastive ({'; '.join(options)})"
    if spec.loss == "distill_kl":
        options.append(f"teacher temperature {spec.teacher_temperature:g}")
    mix = f"{spec.weight:g} x contrastive + {1 - spec.weight:g} x " if spec.weight else ""
    return f"{mix}{spec.loss} ({'; '.join(options)})"
