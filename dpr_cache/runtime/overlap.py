"""The host's work overlapped with the device's: batches sent without a host wait, results read
back without a wait per batch, and the next piece of input prepared while the device works.

On CUDA (:func:`transfer_for`) a batch's tensors are copied into pinned (page-locked) host
memory and sent with ``non_blocking=True`` (:func:`to_device`): the copy is queued on the
device's stream and the host goes on at once. Each batch's result is copied back the same way
into a pinned host tensor, with an event recorded after the copy (:class:`HostRows`); the host
reads a result once its event has passed, and waits only when more than ``depth`` batches are
in flight, and at the end. So the host pads and launches the next batches while the device
runs the earlier ones.

On the CPU nothing is pinned (pinning is CUDA's) and every copy is the plain one, made at once:
the results are the same bits, written and reported in the same order as a plain loop's.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Callable, Iterator, Mapping
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from typing import Any, TypeVar

import numpy as np
import torch
from torch import Tensor

__all__ = ["Transfer", "transfer_for", "to_device", "HostRows", "ahead", "IN_FLIGHT"]

IN_FLIGHT = 2
"""Batches whose results may still be on their way back before the host waits for the oldest:
enough for the device to hold queued work while the host prepares the next batch."""

T = TypeVar("T")


@dataclass(frozen=True)
class Transfer:
    """How batches travel between host and device: ``pin`` (copy through pinned host memory)
    and ``non_blocking`` (queue the copies; read a result back only once its event passed)."""

    pin: bool
    non_blocking: bool


def transfer_for(device: torch.device) -> Transfer:
    """Pinned, non-blocking copies on CUDA; plain ones on any other device."""
    cuda = torch.device(device).type == "cuda"
    return Transfer(pin=cuda, non_blocking=cuda)


def to_device(
    batch: Mapping[str, Tensor], device: torch.device, transfer: Transfer | None = None
) -> dict[str, Tensor]:
    """Each host tensor of ``batch`` on ``device``, as ``transfer`` (default: the device's)
    says: pinned and queued on CUDA, a plain ``.to`` otherwise (a tensor already on a GPU is
    copied as it is)."""
    how = transfer or transfer_for(device)
    return {
        key: (value.pin_memory() if how.pin and not value.is_cuda else value).to(
            device, non_blocking=how.non_blocking
        )
        for key, value in batch.items()
    }


class HostRows:
    """Results of batches written into rows of the host array ``out`` as they land.

    :meth:`put` takes a batch's rows of ``out`` and its result (a tensor of ``out``'s dtype, on
    the device); ``on_rows(n)`` is called with a batch's row count once its result is in
    ``out``, in the order the batches were put. With ``transfer.non_blocking`` the copy back is
    queued (into pinned memory when ``transfer.pin``) and at most ``depth`` batches are left in
    flight; :meth:`finish` waits for the rest. Otherwise each result is written at once.
    """

    def __init__(
        self,
        out: np.ndarray,
        device: torch.device,
        *,
        on_rows: Callable[[int], Any] | None = None,
        transfer: Transfer | None = None,
        depth: int = IN_FLIGHT,
    ) -> None:
        self.out, self.device = out, torch.device(device)
        self.on_rows, self.depth = on_rows, depth
        self.transfer = transfer or transfer_for(self.device)
        self.pending: deque[tuple[np.ndarray, Tensor, Any]] = deque()

    def put(self, rows: np.ndarray, result: Tensor) -> None:
        """Write ``result`` [len(rows), ...] into ``out[rows]``, now or once it has landed."""
        if not self.transfer.non_blocking:
            self._write(rows, result.cpu())
            return
        host = torch.empty(result.shape, dtype=result.dtype, pin_memory=self.transfer.pin)
        host.copy_(result, non_blocking=True)
        self.pending.append((rows, host, self._landed_marker()))
        while len(self.pending) > self.depth:
            self._land_oldest()

    def finish(self) -> None:
        """Wait for every result still in flight and write it."""
        while self.pending:
            self._land_oldest()

    def _landed_marker(self) -> Any:
        """An event recorded after the copy back (None where copies are not queued: the CPU)."""
        if self.device.type != "cuda":
            return None
        event = torch.cuda.Event()
        event.record(torch.cuda.current_stream(self.device))
        return event

    def _land_oldest(self) -> None:
        rows, host, event = self.pending.popleft()
        if event is not None:
            event.synchronize()
        self._write(rows, host)

    def _write(self, rows: np.ndarray, host: Tensor) -> None:
        self.out[rows] = host.numpy()
        if self.on_rows is not None:
            self.on_rows(len(rows))


_END = object()


def ahead(items: Iterator[T], enabled: bool = True) -> Iterator[T]:
    """The items of ``items``, each made in a background thread while the caller works on the
    one before (one item ahead); an error making an item is raised where that item would have
    been taken. ``enabled`` False: made in the caller's thread, one at a time, as a plain loop.

    The thread pays where making an item mostly waits outside the interpreter's lock (a fast
    tokenizer, file reads) while the caller mostly waits on a device."""
    if not enabled:
        yield from items
        return
    with ThreadPoolExecutor(max_workers=1, thread_name_prefix="dpr-cache-ahead") as pool:
        coming = pool.submit(next, items, _END)
        while True:
            item = coming.result()
            if item is _END:
                return
            coming = pool.submit(next, items, _END)
            yield item
