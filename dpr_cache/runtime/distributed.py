"""torch.distributed set-up: join the process group ``torchrun`` describes, if any.

Gloo on CPU, NCCL on GPU, one device per ``LOCAL_RANK``. The gather whose backward keeps the
gradient exact lives in :mod:`dpr_cache.core.gather`.
"""

from __future__ import annotations

import os
from dataclasses import dataclass

import torch
import torch.distributed as dist

from dpr_cache.runtime.device import resolve_device

__all__ = ["DistEnv", "setup", "teardown", "barrier", "all_mean"]


@dataclass(frozen=True)
class DistEnv:
    """Where this process stands: rank, world size and its device."""

    rank: int = 0
    world_size: int = 1
    local_rank: int = 0
    device: torch.device = torch.device("cpu")

    @property
    def is_main(self) -> bool:
        return self.rank == 0

    @property
    def enabled(self) -> bool:
        return self.world_size > 1


def setup(device: str = "auto", key: str = "train.device") -> DistEnv:
    """This process's rank and device (``device``, set by the config key ``key``); joins the
    process group when ``WORLD_SIZE`` > 1."""
    world_size = int(os.environ.get("WORLD_SIZE", "1"))
    local_rank = int(os.environ.get("LOCAL_RANK", "0"))
    chosen = resolve_device(device, local_rank, key)
    if world_size <= 1:
        return DistEnv(device=chosen)
    if chosen.type == "cuda":
        torch.cuda.set_device(chosen)
    if not dist.is_initialized():
        dist.init_process_group(backend="nccl" if chosen.type == "cuda" else "gloo")
    return DistEnv(dist.get_rank(), dist.get_world_size(), local_rank, chosen)


def teardown() -> None:
    if dist.is_available() and dist.is_initialized():
        dist.destroy_process_group()


def barrier() -> None:
    if dist.is_available() and dist.is_initialized():
        dist.barrier()


def all_mean(value: torch.Tensor, env: DistEnv) -> float:
    """The mean of a scalar over the ranks (the value itself on one process), as a float."""
    value = value.detach().to(torch.float64).reshape(1)
    if env.enabled:
        value = value.to(env.device)
        dist.all_reduce(value)
        value /= env.world_size
    return float(value)
