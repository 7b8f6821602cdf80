"""A spawned process joining a process group of ranks on this host, on the CPU: the set-up the
2-rank workers share (``distributed_cases.main``, the resumable parts' test); imports nothing
heavier than torch, so that a worker pays only for what it uses."""

from __future__ import annotations

import os

import torch

from dpr_cache.runtime import distributed
from dpr_cache.runtime.distributed import DistEnv


def join(rank: int, world: int, port: int) -> DistEnv:
    """This spawned process as rank ``rank`` of ``world`` on the CPU (gloo, one thread), its
    peers met at ``port`` on this host."""
    os.environ.update(
        MASTER_ADDR="127.0.0.1",
        MASTER_PORT=str(port),
        RANK=str(rank),
        LOCAL_RANK=str(rank),
        WORLD_SIZE=str(world),
    )
    torch.set_num_threads(1)
    return distributed.setup("cpu")


def spawn_ranks(main, world: int, *args, timeout: float) -> None:
    """``main(rank, world, port, *args)`` in ``world`` spawned processes, their group met at a
    free port on this host; AssertionError when they have not all ended within ``timeout``
    seconds (they are killed) or when one of them failed."""
    import time

    import torch.multiprocessing as mp

    from dpr_cache.runtime.processes import free_port

    context = mp.start_processes(
        main, args=(world, free_port(), *args), nprocs=world, join=False, start_method="spawn"
    )
    deadline = time.monotonic() + timeout
    while not context.join(timeout=2):
        if time.monotonic() > deadline:
            for proc in context.processes:
                proc.kill()
            raise AssertionError(f"{world} spawned ranks did not finish within {timeout:g}s")
