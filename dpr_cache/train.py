"""The training loop, top to bottom: set-up, resume, steps, logs, checkpoints, final model.

One step = one global batch of ``train.batch_size`` questions (each with its positive and
``train.hard_negatives`` hard negatives); under ``torchrun`` each rank builds its slice of the
same global batch. The step object (GradCache, full batch or plain accumulation) fills
``.grad``; clipping, the optimizer, the scaler and the schedule act on the assembled gradient.
"""

from __future__ import annotations

import contextlib
import json
import math
import os
import random
import shutil
import signal
import time
from pathlib import Path
from typing import Any

import numpy as np
import torch
import torch.distributed as dist
from tqdm.auto import tqdm

from dpr_cache import distributed
from dpr_cache.atomic import write_atomic
from dpr_cache.config import Config, save_config
from dpr_cache.cpu_memory import peak_rss_bytes
from dpr_cache.data import TrainBatches, load_training_set
from dpr_cache.distributed import DistEnv
from dpr_cache.errors import InputError
from dpr_cache.model import BiEncoder
from dpr_cache.recipe import load_model, step_batch
from dpr_cache.steppers import make_loss_fn, make_stepper, wrap_towers

__all__ = ["train", "Interrupted", "peak_memory_bytes"]

_DTYPES = {"fp32": torch.float32, "bf16": torch.bfloat16, "fp16": torch.float16}


class Interrupted(Exception):
    """Raised after Ctrl-C / SIGTERM once a checkpoint of the last finished step is saved."""

    def __init__(self, checkpoint: Path):
        super().__init__(f"interrupted: checkpoint saved at {checkpoint}")
        self.checkpoint = checkpoint


def peak_memory_bytes(device: torch.device) -> int:
    """Peak allocated CUDA memory, or this process's peak resident set size on CPU."""
    if device.type == "cuda":
        return int(torch.cuda.max_memory_allocated(device))
    return peak_rss_bytes()


def train(config: Config, *, resume: bool = False, progress: bool = True) -> Path:
    """Train per ``config``; return ``output_dir/model``. Raises InputError on bad input."""
    env = distributed.setup(config.train.device)
    try:
        return _train(config, env, resume=resume, progress=progress)
    finally:
        distributed.teardown()


def _train(config: Config, env: DistEnv, *, resume: bool, progress: bool) -> Path:
    cfg = config.train
    out = config.output_path
    ckpt_root = out / "checkpoints"
    if not config.data.train:
        raise InputError("data.train: no training file given")
    if not resume and _latest_checkpoint(ckpt_root) is not None:
        raise InputError(
            f"{out}: holds checkpoints of an earlier run; pass --resume to continue it or choose "
            "another output_dir"
        )
    if cfg.batch_size % env.world_size != 0:
        raise InputError(
            f"train.batch_size ({cfg.batch_size}) must be divisible by the world size "
            f"({env.world_size})"
        )
    if cfg.num_threads:
        torch.set_num_threads(cfg.num_threads)
    _seed_everything(cfg.seed)

    # -- data ------------------------------------------------------------------------------
    cache_dir = config.cache_path
    if env.is_main:
        dataset = load_training_set(Path(config.data.train), cache_dir)
    distributed.barrier()
    if not env.is_main:
        dataset = load_training_set(Path(config.data.train), cache_dir)
    batches = TrainBatches(len(dataset), cfg.batch_size, cfg.seed, source=str(config.data.train))
    total_steps = cfg.max_steps or batches.steps_per_epoch * cfg.epochs

    # -- model, optimizer, schedule, precision -------------------------------------------------
    model = load_model(config).to(env.device)
    model.train()
    optimizer = torch.optim.AdamW(
        _param_groups(model, cfg.weight_decay), lr=cfg.lr, eps=cfg.adam_eps
    )
    scheduler = torch.optim.lr_scheduler.LambdaLR(
        optimizer, _linear_warmup_decay(cfg.warmup_steps, total_steps)
    )
    use_fp16 = cfg.precision == "fp16"
    scaler = torch.amp.GradScaler(env.device.type, enabled=use_fp16) if use_fp16 else None
    autocast = (
        torch.autocast(env.device.type, dtype=_DTYPES[cfg.precision])
        if cfg.precision != "fp32"
        else contextlib.nullcontext()
    )
    chunk_size = _resolve_chunk_size(config, model, env)
    towers = wrap_towers(model, env)  # DDP broadcasts rank 0's weights
    torch.manual_seed(cfg.seed + env.rank)  # each rank its own dropout stream (rank 0 = 1 process)
    group_size = 1 + cfg.hard_negatives
    loss_fn = make_loss_fn(
        temperature=cfg.temperature, tile_size=cfg.loss_tile_size, group_size=group_size, env=env
    )
    stepper = make_stepper(
        cfg.mode,
        towers,
        loss_fn,
        chunk_size=chunk_size,
        p_chunk_size=cfg.p_chunk_size,
        scaler=scaler,
        keep_last_graph=cfg.keep_last_graph,
    )

    # -- resume or start ---------------------------------------------------------------------
    start_step = 0
    if resume and (latest := _latest_checkpoint(ckpt_root)) is not None:
        start_step = _load_checkpoint(latest, model, optimizer, scheduler, scaler, env)
    log_path = out / "train_log.jsonl"
    if env.is_main:
        out.mkdir(parents=True, exist_ok=True)
        save_config(config, out / "config.yaml")
        _truncate_log(log_path, start_step)

    negatives = _negatives_per_question(cfg.mode, cfg.batch_size, chunk_size, env, group_size)
    stop = _StopFlag()
    bar = tqdm(
        total=total_steps,
        initial=start_step,
        disable=not (progress and env.is_main),
        desc=f"train {cfg.mode} B={cfg.batch_size}",
        dynamic_ncols=True,
    )
    params = [p for p in model.parameters() if p.requires_grad]
    with stop.installed(), open(log_path, "a") if env.is_main else contextlib.nullcontext() as log:
        for step in range(start_step, total_steps):
            started = time.perf_counter()
            batch = step_batch(
                config,
                dataset,
                batches,
                model.tokenizer,
                step,
                rank=env.rank,
                world_size=env.world_size,
            ).to(env.device)
            optimizer.zero_grad(set_to_none=True)
            with autocast:
                loss = stepper.step(batch.q_inputs, batch.p_inputs, p_ids=batch.p_ids)
            if scaler is not None:
                scaler.unscale_(optimizer)
            grad_norm = torch.nn.utils.clip_grad_norm_(params, cfg.max_grad_norm or math.inf)
            if scaler is not None:
                scaler.step(optimizer)
                scaler.update()
            else:
                optimizer.step()
            lr = scheduler.get_last_lr()[0]
            scheduler.step()
            loss_value = _global_mean(loss, env)
            seconds = time.perf_counter() - started
            if env.is_main and (step + 1) % cfg.log_every == 0:
                record = {
                    "step": step + 1,
                    "epoch": batches.epoch_of(step),
                    "loss": loss_value,
                    "lr": lr,
                    "grad_norm": float(grad_norm),
                    "batch_size": cfg.batch_size,
                    "negatives_per_question": negatives,
                    "seconds": round(seconds, 4),
                    "peak_memory_bytes": peak_memory_bytes(env.device),
                }
                log.write(json.dumps(record) + "\n")
                log.flush()
            bar.update(1)
            bar.set_postfix(
                loss=f"{loss_value:.4f}", lr=f"{lr:.2e}", pairs_s=f"{cfg.batch_size / seconds:.1f}"
            )
            done = step + 1
            interrupted = stop.agreed(env)
            if done % cfg.checkpoint_every == 0 or done == total_steps or interrupted:
                path = _save_checkpoint(
                    ckpt_root, done, model, optimizer, scheduler, scaler, env, cfg.keep_checkpoints
                )
                if interrupted:
                    bar.close()
                    raise Interrupted(path)
    bar.close()
    model_dir = out / "model"
    if env.is_main:
        _atomic_dir(model_dir, model.save_pretrained)
    distributed.barrier()
    return model_dir


# -- pieces of the loop -----------------------------------------------------------------------


def _seed_everything(seed: int) -> None:
    random.seed(seed)
    np.random.seed(seed % 2**32)
    torch.manual_seed(seed)


def _param_groups(model: torch.nn.Module, weight_decay: float) -> list[dict[str, Any]]:
    """AdamW groups: no decay on biases and LayerNorm weights (as DPR and BERT do)."""
    decay, no_decay, seen = [], [], set()
    for name, param in model.named_parameters():
        if id(param) in seen or not param.requires_grad:
            continue
        seen.add(id(param))
        lowered = name.lower()
        skip = name.endswith("bias") or "layernorm" in lowered or "layer_norm" in lowered
        (no_decay if skip else decay).append(param)
    return [
        {"params": decay, "weight_decay": weight_decay},
        {"params": no_decay, "weight_decay": 0.0},
    ]


def _linear_warmup_decay(warmup: int, total: int):
    def factor(step: int) -> float:
        if warmup and step < warmup:
            return (step + 1) / warmup
        return max(0.0, (total - step) / max(1, total - warmup))

    return factor


def _resolve_chunk_size(config: Config, model: BiEncoder, env: DistEnv) -> int:
    cfg = config.train
    if cfg.chunk_size != "auto":
        return int(cfg.chunk_size)
    from dpr_cache.autochunk import pick_chunk_size
    from dpr_cache.config import parse_bytes

    return pick_chunk_size(config, model, env, parse_bytes(cfg.memory_budget))


def _negatives_per_question(
    mode: str, batch_size: int, chunk_size: int, env: DistEnv, group_size: int
) -> int:
    """Passages a question is scored against, besides its positive."""
    if mode == "accumulate":
        local = batch_size // env.world_size
        return min(chunk_size, local) * env.world_size * group_size - 1
    return batch_size * group_size - 1


def _global_mean(loss: torch.Tensor, env: DistEnv) -> float:
    value = loss.detach().to(torch.float64).reshape(1)
    if env.enabled:
        value = value.to(env.device)
        dist.all_reduce(value)
        value /= env.world_size
    return float(value)


class _StopFlag:
    """Ctrl-C / SIGTERM set a flag; the loop stops after the current step, on every rank."""

    def __init__(self) -> None:
        self.requested = False

    @contextlib.contextmanager
    def installed(self):
        def handler(signum, frame):
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
        if not env.enabled:
            return self.requested
        flag = torch.tensor([1.0 if self.requested else 0.0], device=env.device)
        dist.all_reduce(flag, op=dist.ReduceOp.MAX)
        return bool(flag.item() > 0)


# -- checkpoints -----------------------------------------------------------------------------


def _rng_states() -> dict[str, Any]:
    return {
        "python": random.getstate(),
        "numpy": np.random.get_state(),
        "torch": torch.get_rng_state(),
        "cuda": torch.cuda.get_rng_state_all() if torch.cuda.is_available() else [],
    }


def _set_rng_states(states: dict[str, Any]) -> None:
    random.setstate(states["python"])
    np.random.set_state(states["numpy"])
    torch.set_rng_state(states["torch"])
    if states["cuda"] and torch.cuda.is_available():
        torch.cuda.set_rng_state_all(states["cuda"])


def _atomic_dir(final: Path, write) -> Path:
    """Write a folder under a temporary name, then swap it into place."""
    tmp = final.with_name(f".tmp-{final.name}-{os.getpid()}")
    shutil.rmtree(tmp, ignore_errors=True)
    write(tmp)
    old = final.with_name(f".old-{final.name}-{os.getpid()}")
    if final.exists():
        final.rename(old)
    tmp.rename(final)
    shutil.rmtree(old, ignore_errors=True)
    return final


def _save_checkpoint(root, step, model, optimizer, scheduler, scaler, env, keep) -> Path:
    """Rank 0 writes ``checkpoints/step-N`` atomically; every rank's RNG state goes with it."""
    rng = _rng_states()
    if env.enabled:
        gathered: list[Any] = [None] * env.world_size
        dist.all_gather_object(gathered, rng)
    else:
        gathered = [rng]
    final = root / f"step-{step:08d}"
    if env.is_main:
        state = {
            "step": step,
            "model": model.state_dict(),
            "optimizer": optimizer.state_dict(),
            "scheduler": scheduler.state_dict(),
            "scaler": scaler.state_dict() if scaler is not None else None,
            "rng": gathered,
            "world_size": env.world_size,
        }

        def write(tmp: Path) -> None:
            tmp.mkdir(parents=True)
            with open(tmp / "state.pt", "wb") as f:
                torch.save(state, f)
                f.flush()
                os.fsync(f.fileno())

        root.mkdir(parents=True, exist_ok=True)
        _atomic_dir(final, write)
        for old in sorted(root.glob("step-*"))[:-keep]:
            shutil.rmtree(old, ignore_errors=True)
    distributed.barrier()
    return final


def _latest_checkpoint(root: Path) -> Path | None:
    done = sorted(p for p in root.glob("step-*") if (p / "state.pt").is_file())
    return done[-1] if done else None


def _load_checkpoint(path, model, optimizer, scheduler, scaler, env) -> int:
    state = torch.load(path / "state.pt", map_location=env.device, weights_only=False)
    if state["world_size"] != env.world_size:
        raise InputError(
            f"{path}: saved with {state['world_size']} ranks, resumed with {env.world_size}; "
            "resume with the same world size"
        )
    model.load_state_dict(state["model"])
    optimizer.load_state_dict(state["optimizer"])
    scheduler.load_state_dict(state["scheduler"])
    if scaler is not None and state["scaler"] is not None:
        scaler.load_state_dict(state["scaler"])
    rng = state["rng"][env.rank]
    rng["torch"] = rng["torch"].cpu()
    _set_rng_states(rng)
    return int(state["step"])


def _truncate_log(log_path: Path, step: int) -> None:
    """Keep the log lines of steps up to ``step`` (those after the checkpoint are redone)."""
    if not log_path.exists():
        return
    if step == 0:
        log_path.unlink()
        return
    kept = [
        line
        for line in log_path.read_text().splitlines()
        if line.strip() and json.loads(line)["step"] <= step
    ]
    write_atomic(log_path, lambda tmp: tmp.write_text("".join(line + "\n" for line in kept)))
