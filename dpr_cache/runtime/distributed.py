"""torch.distributed set-up: join the process group ``torchrun`` describes, if any.

Gloo on CPU, NCCL on GPU, one device per ``LOCAL_RANK``. A collective waits at most
``DPR_CACHE_DIST_TIMEOUT`` seconds (default 600) for a rank that stopped answering. Each rank
records every rank's host and pid when the group forms, so that a rank whose peer died (the OOM
killer, a lost node) can say which one in one line (:func:`lost_rank`) instead of a backend's
traceback. It says so too when ``torchrun``'s agent, which ends the other ranks once one dies,
stops it (SIGTERM) before it has reported its own failed collective
(:func:`name_lost_rank_on_sigterm`).
The gather whose backward keeps the gradient exact lives in :mod:`dpr_cache.core.gather`.
"""

from __future__ import annotations

import contextlib
import datetime
import os
import signal
import socket
import sys
import threading
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch
import torch.distributed as dist

from dpr_cache.runtime.device import resolve_device
from dpr_cache.runtime.processes import alive, state

__all__ = [
    "DistEnv",
    "setup",
    "teardown",
    "barrier",
    "rank0_says",
    "all_mean",
    "joined",
    "all_objects",
    "rank0_gathers",
    "any_rank",
    "lost_rank",
    "name_lost_rank_on_sigterm",
    "stop_if_a_peer_ended",
    "PEERS",
    "device_mesh",
    "sharded_save",
    "sharded_load",
]

PEERS: dict[int, tuple[str, int]] = {}
"""Every rank's (host, pid), once the group has formed (empty on one process)."""
_RANK_PROCESS: list[int] = []  # the pid that installed the SIGTERM handler (not a forked worker)
_GONE_WORDS = (
    "closed by peer",
    "connection reset",
    "broken pipe",
    "timed out",
    "timeout",
    "nccl",
    "gloo",
)
_NEXT = ["once every rank can run, --resume continues from the last checkpoint"]


def continued_by(command: str) -> None:
    """Name ``command`` (e.g. ``train``'s own, with ``--resume``) as what continues this
    process's work when a rank is lost (:func:`lost_rank`'s line ends with it)."""
    _NEXT[0] = f"once every rank can run, continue with: {command}"


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
        seconds = float(os.environ.get("DPR_CACHE_DIST_TIMEOUT", "600"))
        dist.init_process_group(
            backend="nccl" if chosen.type == "cuda" else "gloo",
            timeout=datetime.timedelta(seconds=seconds),
        )
        peers: list = [None] * dist.get_world_size()
        dist.all_gather_object(peers, (socket.gethostname(), os.getpid()))
        PEERS.update(enumerate(peers))
        name_lost_rank_on_sigterm()
    return DistEnv(dist.get_rank(), dist.get_world_size(), local_rank, chosen)


def joined() -> bool:
    """Whether this process is a rank of a process group."""
    return dist.is_available() and dist.is_initialized()


def teardown() -> None:
    if joined():
        dist.destroy_process_group()


def barrier() -> None:
    if joined():
        dist.barrier()


def rank0_says(value: Any) -> Any:
    """Rank 0's ``value`` on every rank (a picklable object; itself on one process): one answer
    where ranks could see different files, as on nodes without a shared disk."""
    if not joined():
        return value
    box = [value]
    dist.broadcast_object_list(box, src=0)
    return box[0]


def all_objects(value: Any) -> list[Any]:
    """Every rank's ``value`` (a picklable object), in rank order, on every rank; ``[value]`` on
    one process."""
    if not joined():
        return [value]
    gathered: list[Any] = [None] * dist.get_world_size()
    dist.all_gather_object(gathered, value)
    return gathered


def rank0_gathers(value: Any) -> list[Any] | None:
    """Every rank's ``value`` in rank order on rank 0, None on the others; ``[value]`` on one
    process."""
    if not joined():
        return [value]
    gathered = [None] * dist.get_world_size() if dist.get_rank() == 0 else None
    dist.gather_object(value, gathered, dst=0)
    return gathered


def device_mesh(env: DistEnv):
    """The one-dimensional mesh of every rank's device, for FSDP's sharding. A single process
    joins a group of one first (an in-process store: nothing listens), so that a model is
    sharded the same way on one GPU as on many."""
    from torch.distributed.device_mesh import init_device_mesh

    if not joined():
        backend = "nccl" if env.device.type == "cuda" else "gloo"
        dist.init_process_group(backend, store=dist.HashStore(), rank=0, world_size=1)
    return init_device_mesh(env.device.type, (dist.get_world_size(),))


class ShardsNotWritten(Exception):
    """A rank's write of its shards failed, raised on every rank alike; ``error`` is the first
    failed rank's own."""

    def __init__(self, error: Exception):
        super().__init__(str(error))
        self.error = error


def sharded_save(state: dict[str, Any], folder: Path) -> None:
    """``state`` (sharded tensors and the objects beside them) saved by every rank into
    ``folder`` with ``torch.distributed.checkpoint``: each rank writes its shards, rank 0 the
    metadata. A rank's failed write is raised on every rank as :class:`ShardsNotWritten`,
    holding the first failed rank's own error (a full disk, say), not as the library's wrapper
    of every rank's traceback; any other error (a rank lost in a collective) as it came."""
    import torch.distributed.checkpoint as dcp
    from torch.distributed.checkpoint.api import CheckpointException

    try:
        dcp.save(state, checkpoint_id=str(folder))
    except CheckpointException as e:  # every rank's: the failed ranks' errors gathered
        failed = [f[0] if isinstance(f, tuple) else f for _, f in sorted(e.failures.items())]
        first = next((f for f in failed if isinstance(f, Exception)), None)
        if first is None:
            raise
        raise ShardsNotWritten(first) from None


def sharded_load(state: dict[str, Any], folder: Path) -> None:
    """``state``'s tensors filled in place from ``folder`` (:func:`sharded_save`'s), each rank
    reading the shards it holds."""
    import torch.distributed.checkpoint as dcp

    dcp.load(state, checkpoint_id=str(folder))


def any_rank(flag: bool, env: DistEnv) -> bool:
    """Whether ``flag`` holds on any rank (every rank gets the same answer)."""
    if not env.enabled:
        return flag
    value = torch.tensor([1.0 if flag else 0.0], device=env.device)
    dist.all_reduce(value, op=dist.ReduceOp.MAX)
    return bool(value.item() > 0)


def all_mean(value: torch.Tensor, env: DistEnv) -> float:
    """The mean of a scalar over the ranks (the value itself on one process), as a float."""
    value = value.detach().to(torch.float64).reshape(1)
    if env.enabled:
        value = value.to(env.device)
        dist.all_reduce(value)
        value /= env.world_size
    return float(value)


def lost_rank(error: BaseException, wait: float = 5.0) -> str | None:
    """One line for a collective that failed because a rank is gone (its process ended, or it
    stopped answering), naming it; None when ``error`` is no such failure. A peer on this host
    is looked up by its pid (given ``wait`` seconds to end, or found stopped); one on another
    host is named by its host."""
    text = " ".join(str(error).split())
    if not PEERS or not any(word in text.lower() for word in _GONE_WORDS):
        return None
    gone: list[str] = []
    deadline = time.monotonic() + wait
    while not gone and time.monotonic() < deadline:
        gone = _ended_peers()
        if not gone:
            time.sleep(0.2)
    if not gone:  # alive but not answering: a peer held by a signal (SIGSTOP, a debugger)
        gone = [
            f"rank {r} (pid {pid}, not answering)"
            for r, pid in _local_peers()
            if state(pid) in ("T", "t")
        ]
    if not gone:
        host = socket.gethostname()
        others = sorted({h for r, (h, _) in PEERS.items() if h != host})
        gone = [f"a rank on {', '.join(others)}" if others else "another rank"]
    return (
        f"{_me()}: {' and '.join(gone)} stopped, so this rank stops too ({text[:120]}): {_NEXT[0]}"
    )


def name_lost_rank_on_sigterm() -> None:
    """From now on, a SIGTERM while a peer on this host has ended ends this rank with the line
    that names it (:func:`stop_if_a_peer_ended`); one while every peer runs ends it as SIGTERM
    does by default. ``torchrun``'s agent ends every rank once one dies, and its SIGTERM can come
    before this rank has reported its own failed collective. A handler runs once the main
    thread is back in Python (a long call into torch or FAISS finishes first). Only the main
    thread can install it, and a handler someone else installed is kept."""
    main = threading.current_thread() is threading.main_thread()
    if main and signal.getsignal(signal.SIGTERM) in (signal.SIG_DFL, None):
        _RANK_PROCESS[:] = [os.getpid()]
        signal.signal(signal.SIGTERM, _on_sigterm)


def stop_if_a_peer_ended() -> None:
    """In a rank's own process, when a peer on this host has ended: write the one line naming it
    and exit 1 at once. What a ``kill -9`` would leave is left (every file is written
    atomically, a checkpoint whole or not at all); torchrun would SIGKILL the rank 30 s on."""
    gone = _ended_peers() if _RANK_PROCESS == [os.getpid()] else []
    if not gone:
        return
    stopped = f"{' and '.join(gone)} stopped, and torchrun stopped this rank"
    line = f"error: {_me()}: {stopped}: {_NEXT[0]}"
    with contextlib.suppress(Exception):  # a flush cut into by the signal: the line still goes
        sys.stdout.flush()
        sys.stderr.flush()
    os.write(2, (line + "\n").encode())
    os._exit(1)


def _on_sigterm(signum: int, frame: Any) -> None:
    stop_if_a_peer_ended()
    signal.signal(signum, signal.SIG_DFL)
    os.kill(os.getpid(), signum)


def _me() -> str:
    return f"rank {os.environ.get('RANK', '0')}"


def _local_peers() -> list[tuple[int, int]]:
    """(rank, pid) of every other rank on this host."""
    me, host = int(os.environ.get("RANK", "0")), socket.gethostname()
    return [(r, pid) for r, (h, pid) in PEERS.items() if r != me and h == host]


def _ended_peers() -> list[str]:
    """The other ranks on this host whose process has ended."""
    return [f"rank {r} (pid {pid})" for r, pid in _local_peers() if not alive(pid)]
