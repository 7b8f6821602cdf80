"""The overlap helpers: which device pins and queues its copies, results landing in their rows
whether written at once or queued, and items made one ahead in a thread."""

from __future__ import annotations

import threading

import numpy as np
import pytest
import torch

from dpr_cache.errors import InputError
from dpr_cache.runtime.overlap import HostRows, Transfer, ahead, to_device, transfer_for


def test_cuda_pins_and_queues_its_copies_other_devices_copy_plainly() -> None:
    assert transfer_for(torch.device("cuda", 0)) == Transfer(pin=True, non_blocking=True)
    assert transfer_for(torch.device("cuda")) == Transfer(pin=True, non_blocking=True)
    assert transfer_for(torch.device("cpu")) == Transfer(pin=False, non_blocking=False)
    batch = {"input_ids": torch.arange(6).view(2, 3), "attention_mask": torch.ones(2, 3)}
    moved = to_device(batch, torch.device("cpu"), Transfer(pin=False, non_blocking=True))
    assert set(moved) == set(batch)
    assert all(torch.equal(moved[k], batch[k]) for k in batch)


def _put_all(transfer: Transfer, results: list[tuple[np.ndarray, torch.Tensor]], depth: int):
    out = np.full((12, 3), -1.0, np.float32)
    landed: list[int] = []
    rows_to_host = HostRows(
        out, torch.device("cpu"), on_rows=landed.append, transfer=transfer, depth=depth
    )
    in_flight = []
    for rows, result in results:
        rows_to_host.put(rows, result)
        in_flight.append(len(rows_to_host.pending))
    before_finish = out.copy()
    rows_to_host.finish()
    return out, landed, in_flight, before_finish


def test_queued_results_land_in_their_rows_as_written_at_once() -> None:
    gen = torch.Generator().manual_seed(0)
    order = torch.randperm(12, generator=gen).numpy()
    results = [(order[i : i + 5], torch.randn(len(order[i : i + 5]), 3)) for i in (0, 5, 10)]
    plain, plain_landed, plain_flight, _ = _put_all(Transfer(False, False), results, depth=2)
    want = np.empty((12, 3), np.float32)
    for rows, result in results:  # the reference: each result written straight into its rows
        want[rows] = result.numpy()
    assert np.array_equal(plain, want) and plain_landed == [5, 5, 2] and plain_flight == [0] * 3
    queued, landed, in_flight, before = _put_all(Transfer(False, True), results, depth=1)
    assert np.array_equal(queued, want) and landed == [5, 5, 2]
    assert in_flight == [1, 1, 1]  # never more than depth batches held back
    assert (before[results[-1][0]] == -1).all()  # control: the last batch waited for finish
    assert not np.array_equal(queued[::-1], want)  # control: the comparison sees rows swapped


def test_items_are_made_one_ahead_in_a_thread() -> None:
    started_second = threading.Event()
    makers: list[int] = []

    def items():
        for i in range(3):
            makers.append(threading.get_ident())
            if i == 1:
                started_second.set()
            yield i

    made = ahead(items())
    assert next(made) == 0
    assert started_second.wait(timeout=60)  # made before it was asked for
    assert list(made) == [1, 2]
    assert set(makers) != {threading.get_ident()}
    inline = ahead(_flagged(started := threading.Event()), enabled=False)
    assert next(inline) == 0 and not started.is_set()  # control: inline, nothing ahead
    assert list(inline) == [1, 2]


def _flagged(started_second: threading.Event):
    yield 0
    started_second.set()
    yield 1
    yield 2


def test_an_error_making_an_item_comes_where_the_item_would() -> None:
    def items():
        yield 0
        yield 1
        raise InputError("record 3: bad")

    got = []
    with pytest.raises(InputError, match="record 3: bad"):
        for item in ahead(items()):
            got.append(item)
    assert got == [0, 1]
