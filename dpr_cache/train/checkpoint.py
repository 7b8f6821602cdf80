"""Checkpoints that resume bit-exactly: weights, optimizer, schedule, scaler and every rank's RNG.

A LoRA run's checkpoint holds the adapters alone (:func:`model_state`), its base being the
frozen one ``model.name_or_path`` loads again. A sharded run's (``train.shard: fsdp``) weights
and optimizer state are saved by every rank, each its own shards, with
``torch.distributed.checkpoint`` into ``step-N/shards/`` (checked by ``shards.sha256``); the rest
is ``state.pt`` as in any run. ``checkpoints/step-N/state.pt`` is written by
rank 0 under a temporary name, flushed to disk and swapped into place, with its SHA-256 beside it
(``state.sha256``); the oldest are removed beyond
``keep``. Resuming takes the newest checkpoint whose bytes match their checksum: one cut short or
with a flipped bit is reported and passed over for the one before it.

A checkpoint resumes on any number of ranks, sharded or not: sharded weights and optimizer state
are resharded by ``torch.distributed.checkpoint`` as they load (into shards of another count, or
whole), and a whole checkpoint's are cut into this run's shards. The global batch and its order
do not depend on the world size; each rank's RNG does, so on another world size every rank
seeds its streams afresh from (``train.seed``, step, rank) (:func:`seed_resumed_rank`), said
once. It refuses a checkpoint of another layout (:data:`FORMAT`) and another way of drawing the
epochs' batch orders (:data:`dpr_cache.data.batches.EPOCH_ORDER`: the rest of the epoch would
differ) or the questions' hard negatives (:data:`dpr_cache.data.collate.NEGATIVE_DRAW`).
"""

from __future__ import annotations

import functools
import hashlib
import logging
import os
import random
import shutil
from pathlib import Path
from typing import Any

import numpy as np
import torch

from dpr_cache.data.batches import EPOCH_ORDER
from dpr_cache.data.collate import NEGATIVE_DRAW
from dpr_cache.errors import InputError
from dpr_cache.model.fsdp import is_sharded
from dpr_cache.runtime import distributed
from dpr_cache.runtime.atomic import (
    DiskFull,
    out_of_space,
    write_atomic,
    write_dir_atomic,
    write_text_atomic,
)
from dpr_cache.runtime.distributed import DistEnv, all_objects
from dpr_cache.runtime.seeds import stream_seed
from dpr_cache.train.run_folder import STATE_FILE, latest_checkpoint

__all__ = [
    "save_checkpoint",
    "latest_checkpoint",
    "sound_checkpoint",
    "load_checkpoint",
    "rng_states",
    "model_state",
    "seed_resumed_rank",
]

log = logging.getLogger(__name__)

_STEP_DRAW = "stream_entropy(seed, step, question index)"
"""The hard-negative draw of checkpoints that do not record theirs (one draw a step)."""
CHECKSUM_FILE = "state.sha256"
SHARDS, SHARDS_CHECKSUM = "shards", "shards.sha256"
FORMAT = 3
"""The layout of ``state.pt``; a checkpoint of another layout is refused, not converted."""


def rng_states() -> dict[str, Any]:
    """The Python, NumPy, torch CPU and CUDA RNG states of this process."""
    return {
        "python": random.getstate(),
        "numpy": np.random.get_state(),
        "torch": torch.get_rng_state(),
        "cuda": torch.cuda.get_rng_state_all() if torch.cuda.is_available() else [],
    }


def _frozen_base(model: torch.nn.Module) -> bool:
    """Whether ``model`` trains adapters on a frozen base (LoRA)."""
    return bool(getattr(model, "has_adapters", False))


def _trainable_names(model: torch.nn.Module) -> set[str]:
    """The state-dict names of ``model``'s trainable parameters (a shared tower's under both
    of its names)."""
    return {n for n, p in model.named_parameters(remove_duplicate=False) if p.requires_grad}


def model_state(model: torch.nn.Module) -> dict[str, torch.Tensor]:
    """What a checkpoint keeps of ``model``: every weight, or with LoRA the adapters alone
    (what trains; the frozen base is reloaded from ``model.name_or_path`` on resume)."""
    state = model.state_dict()
    if not _frozen_base(model):
        return state
    trainable = _trainable_names(model)
    return {name: tensor for name, tensor in state.items() if name in trainable}


def _set_rng_states(states: dict[str, Any]) -> None:
    random.setstate(states["python"])
    np.random.set_state(states["numpy"])
    torch.set_rng_state(states["torch"])
    if states["cuda"] and torch.cuda.is_available():
        torch.cuda.set_rng_state_all(states["cuda"])


def save_checkpoint(root, step, model, optimizer, scheduler, scaler, env: DistEnv, keep) -> Path:
    """Rank 0 writes ``root/step-N`` atomically; every rank's RNG state goes with it, and under
    sharding every rank's shards."""
    gathered = all_objects(rng_states())
    final = Path(root) / f"step-{step:08d}"
    sharded = is_sharded(model)
    state = {
        "format": FORMAT,
        "step": step,
        "sharded": sharded,
        "weights": "trainable" if _frozen_base(model) else "all",
        "scheduler": scheduler.state_dict(),
        "scaler": scaler.state_dict() if scaler is not None else None,
        "rng": gathered,
        "world_size": env.world_size,
        "epoch_order": EPOCH_ORDER,
        "negative_draw": NEGATIVE_DRAW,
    }
    if sharded:
        _save_sharded(final, state, model, optimizer, env)
    elif env.is_main:
        state.update(model=model_state(model), optimizer=optimizer.state_dict())
        write_dir_atomic(
            final, functools.partial(_write_state, state), size_hint=_tensor_bytes(state)
        )
    if env.is_main:
        for old in sorted(Path(root).glob("step-*"))[:-keep]:
            shutil.rmtree(old, ignore_errors=True)
    distributed.barrier()
    return final


def _write_state(state: dict[str, Any], folder: Path) -> None:
    """``state.pt`` and its checksum, written into a new ``folder``."""
    folder.mkdir(parents=True, exist_ok=True)
    save = functools.partial(torch.save, state)
    write_atomic(folder / STATE_FILE, save, fsync=True, size_hint=_tensor_bytes(state))
    write_text_atomic(folder / CHECKSUM_FILE, _sha256(folder / STATE_FILE) + "\n")


def _save_sharded(final: Path, state: dict[str, Any], model, optimizer, env: DistEnv) -> None:
    """Every rank's shards into a folder beside ``final``, then rank 0's ``state.pt`` and the
    checksums, and the folder swapped into place."""
    partial = final.with_name(f".{final.name}.partial")
    if env.is_main:
        shutil.rmtree(partial, ignore_errors=True)
        partial.mkdir(parents=True)
    distributed.barrier()
    shards = sharded_state(model, optimizer)
    try:
        distributed.sharded_save(shards, partial / SHARDS)
    except distributed.ShardsNotWritten as e:  # every rank has it: a lost rank's error has not
        error, full = e.error, None
        if out_of_space(error, partial / SHARDS):  # said as every rank finds the disk, the same
            size = _tensor_bytes(shards) + _tensor_bytes(state)  # a DTensor counts whole
            full = DiskFull(final, size, code=getattr(error, "errno", None))
        distributed.barrier()  # every rank has looked at the disk before the folder goes
        if env.is_main:
            shutil.rmtree(partial, ignore_errors=True)
        raise (full or error) from None
    distributed.barrier()
    if env.is_main:
        write_text_atomic(partial / SHARDS_CHECKSUM, _folder_sha256(partial / SHARDS) + "\n")
        _write_state(state, partial)
        shutil.rmtree(final, ignore_errors=True)
        os.replace(partial, final)


def sharded_state(model, optimizer) -> dict[str, Any]:
    """A sharded model's and its optimizer's state as this rank holds it (the adapters alone
    under LoRA): what ``torch.distributed.checkpoint`` saves and loads in place."""
    from torch.distributed.checkpoint.state_dict import get_state_dict

    model_state, optimizer_state = get_state_dict(model, optimizer, options=_sharded_options())
    return {"model": model_state, "optimizer": optimizer_state}


def _sharded_options():
    """What a sharded checkpoint holds: what trains (the frozen weights, a LoRA base or BERT's
    unused pooler, are loaded again from ``model.name_or_path``), so loading it leaves them be;
    ``torch.distributed.checkpoint`` refuses a checkpoint that lacks a key asked for."""
    from torch.distributed.checkpoint.state_dict import StateDictOptions

    return StateDictOptions(ignore_frozen_params=True, strict=False)


def sound_checkpoint(root: Path) -> Path | None:
    """The newest checkpoint under ``root`` whose state matches its checksum; each newer one
    that does not (cut short, a flipped bit, no checksum) is reported and passed over."""
    done = sorted(p for p in Path(root).glob("step-*") if (p / STATE_FILE).is_file())
    for path in reversed(done):
        why = _damage(path)
        if why is None:
            return path
        log.warning("%s: damaged (%s): passed over for the checkpoint before it", path, why)
    return None


def _damage(path: Path) -> str | None:
    """What is wrong with the checkpoint at ``path`` (None: its state and any shards match
    their checksums)."""
    stored = path / CHECKSUM_FILE
    if not stored.is_file():
        return "it has no checksum: cut short, or written by an earlier version"
    if stored.read_text().strip() != _sha256(path / STATE_FILE):
        return "its bytes do not match its checksum"
    if not (path / SHARDS).exists():
        return None
    shards = path / SHARDS_CHECKSUM
    if not shards.is_file() or shards.read_text().strip() != _folder_sha256(path / SHARDS):
        return "its shards do not match their checksum"
    return None


def _sha256(path: Path) -> str:
    digest = hashlib.sha256()
    with open(path, "rb") as f:
        while block := f.read(1 << 22):
            digest.update(block)
    return digest.hexdigest()


def _folder_sha256(folder: Path) -> str:
    """One digest of every file in ``folder``: their names and bytes, in name order."""
    digest = hashlib.sha256()
    for path in sorted(p for p in folder.rglob("*") if p.is_file()):
        digest.update(f"{path.relative_to(folder)}\0{_sha256(path)}\n".encode())
    return digest.hexdigest()


def _tensor_bytes(obj) -> int:
    """The bytes of the tensors in a nested state (what saving it needs, give or take)."""
    if isinstance(obj, torch.Tensor):
        return obj.numel() * obj.element_size()
    if isinstance(obj, dict):
        return sum(_tensor_bytes(v) for v in obj.values())
    if isinstance(obj, (list, tuple)):
        return sum(_tensor_bytes(v) for v in obj)
    return 0


def load_checkpoint(path, model, optimizer, scheduler, scaler, env: DistEnv, *, seed: int) -> int:
    """Restore every state from ``path``; return the number of steps it had finished. Saved on
    another number of ranks, or sharded where this run is not (or the reverse), the weights
    and the optimizer state are resharded and each rank's RNG seeded afresh from ``seed``."""
    # read into host memory: the CUDA RNG states must stay CPU byte tensors, and the model's and
    # the optimizer's ``load_state_dict`` copy their tensors onto the parameters' device
    state = torch.load(path / STATE_FILE, map_location="cpu", weights_only=False)
    if not isinstance(state, dict) or state.get("format") != FORMAT:
        raise InputError(
            f"{path}: a checkpoint of another dpr-cache version (format "
            f"{state.get('format') if isinstance(state, dict) else None}, this one reads "
            f"{FORMAT}): finish the run with the version that started it, or train afresh"
        )
    order = state["epoch_order"]
    if order != EPOCH_ORDER:
        raise InputError(
            f"{path}: its run draws batch orders as {order}, this dpr-cache as {EPOCH_ORDER}; "
            "finish it with the dpr-cache that started it, or train afresh"
        )
    draw = state.get("negative_draw", _STEP_DRAW)
    if draw != NEGATIVE_DRAW:
        raise InputError(
            f"{path}: its run draws hard negatives as {draw}, this dpr-cache as "
            f"{NEGATIVE_DRAW}; finish it with the dpr-cache that started it, or train afresh"
        )
    if state.get("sharded"):
        _load_sharded(path, model, optimizer)
    elif is_sharded(model):
        _load_whole_into_shards(path, state, model, optimizer)
    else:
        _load_whole(path, state, model, optimizer)
    scheduler.load_state_dict(state["scheduler"])
    if scaler is not None and state["scaler"] is not None:
        scaler.load_state_dict(state["scaler"])
    step = int(state["step"])
    if state["world_size"] == env.world_size:
        _set_rng_states(state["rng"][env.rank])
    else:
        seed_resumed_rank(seed, step, env.rank)
    if env.is_main and (moved := _layout_change(path, state, model, env)):
        log.warning("%s", moved)
    return step


def seed_resumed_rank(seed: int, step: int, rank: int) -> None:
    """This rank's Python, NumPy and torch streams (dropout) seeded from (``seed``, ``step``,
    ``rank``): a resume on another world size, whose ranks' saved streams do not line up."""
    random.seed(stream_seed("resumed python", seed, step, rank))
    np.random.seed(stream_seed("resumed numpy", seed, step, rank) % 2**32)
    torch.manual_seed(stream_seed("dropout", seed, step, rank))


def _layout_change(path: Path, state: dict[str, Any], model, env: DistEnv) -> str | None:
    """The line that says a checkpoint was resumed on another world size or sharding (None:
    the same), and what that changes."""

    def layout(world: int, sharded: bool) -> str:
        return f"{world} rank{'s' if world > 1 else ''}, {'sharded' if sharded else 'unsharded'}"

    saved = layout(state["world_size"], bool(state.get("sharded")))
    now = layout(env.world_size, is_sharded(model))
    if saved == now:
        return None
    rng = (
        "each rank's dropout drawn afresh from (train.seed, step, rank)"
        if state["world_size"] != env.world_size
        else "each rank's RNG as saved"
    )
    return (
        f"{path.name}: saved on {saved}, resumed on {now}: weights and optimizer state loaded "
        f"into this layout; the global batch, its order and the hard negatives as before; {rng}"
    )


def _load_sharded(path: Path, model, optimizer) -> None:
    """The sharded checkpoint's weights and optimizer state into this run's model, sharded
    or whole: ``torch.distributed.checkpoint`` reads of every saved shard what this rank holds."""
    from torch.distributed.checkpoint.state_dict import set_state_dict

    state = sharded_state(model, optimizer)
    distributed.sharded_load(state, path / SHARDS)
    set_state_dict(
        model,
        optimizer,
        model_state_dict=state["model"],
        optim_state_dict=state["optimizer"],
        options=_sharded_options(),
    )


def _load_whole_into_shards(path: Path, state: dict[str, Any], model, optimizer) -> None:
    """An unsharded checkpoint's weights and optimizer state, whole on every rank, cut into this
    rank's shards. A weight shared by both towers is given under its first name alone (the
    loader cuts each module's tensors once). The optimizer state is keyed by position; this
    run's optimizer lists the same parameters in the same order (DPR's groups over the same
    model), so each position is named by its parameter's name here."""
    from torch.distributed.checkpoint.state_dict import StateDictOptions, set_state_dict

    _check_fits(path, state, model)
    first = {n for n, _ in model.named_parameters()} | {n for n, _ in model.named_buffers()}
    every = {n for n, _ in model.named_parameters(remove_duplicate=False)}
    every |= {n for n, _ in model.named_buffers(remove_duplicate=False)}
    weights = {k: v for k, v in state["model"].items() if k in first or k not in every}
    names = {id(p): n for n, p in model.named_parameters()}
    order = [names[id(p)] for group in optimizer.param_groups for p in group["params"]]
    saved = state["optimizer"]
    listed = sum(len(group["params"]) for group in saved["param_groups"])
    if listed != len(order):
        raise InputError(
            f"{path}: does not fit this model (its optimizer trains {listed} parameters, this "
            f"run's {len(order)}): resume with the run's own config"
        )
    named = {
        "state": {order[i]: value for i, value in saved["state"].items()},
        "param_groups": [
            {**group, "params": [order[i] for i in group["params"]]}
            for group in saved["param_groups"]
        ],
    }
    options = StateDictOptions(full_state_dict=True, ignore_frozen_params=True, strict=False)
    set_state_dict(
        model, optimizer, model_state_dict=weights, optim_state_dict=named, options=options
    )


def _refuse_misfit(path: Path, missing: list[str], unexpected: list[str]) -> None:
    """InputError naming the first weight missing and the first unexpected, where any is."""
    if missing or unexpected:
        raise InputError(
            f"{path}: does not fit this model ({len(missing)} weights missing, e.g. "
            f"{(missing or [None])[0]!r}; {len(unexpected)} unexpected, e.g. "
            f"{(unexpected or [None])[0]!r}): resume with the run's own config"
        )


def _check_fits(path: Path, state: dict[str, Any], model) -> None:
    """InputError unless the checkpoint's weights are this model's: the same names (the
    trainable ones alone where it kept those) and the same shapes."""
    wanted = {k: tuple(v.shape) for k, v in model.state_dict().items()}
    saved = state["model"]
    missing = [k for k in wanted if k not in saved]
    if state.get("weights") == "trainable":  # the frozen base comes from model.name_or_path
        missing = [k for k in missing if k in _trainable_names(model)]
    _refuse_misfit(path, missing, [k for k in saved if k not in wanted])
    for key, tensor in saved.items():
        if tuple(tensor.shape) != wanted[key]:
            raise InputError(
                f"{path}: does not fit this model ({key} is {tuple(tensor.shape)} there, "
                f"{wanted[key]} here): resume with the run's own config"
            )


def _load_whole(path: Path, state: dict[str, Any], model, optimizer) -> None:
    """The weights (or the adapters) and the optimizer state of an unsharded checkpoint."""
    try:
        missing, unexpected = model.load_state_dict(state["model"], strict=False)
    except RuntimeError as exc:  # a weight of another shape
        first = next(
            (line.strip() for line in str(exc).splitlines() if "size mismatch" in line), ""
        )
        raise InputError(
            f"{path}: does not fit this model ({first.rstrip('.')}): resume with the run's own "
            "config"
        ) from None
    if state.get("weights") == "trainable":  # the frozen base comes from model.name_or_path
        missing = [name for name in missing if name in _trainable_names(model)]
    _refuse_misfit(path, missing, unexpected)
    optimizer.load_state_dict(state["optimizer"])
