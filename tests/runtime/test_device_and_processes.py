"""Device and precision resolution, memory readings, and the project's child processes."""

from __future__ import annotations

import contextlib
import os

import pytest
import torch

from dpr_cache.errors import InputError
from dpr_cache.runtime.device import autocast, precision_dtype, resolve_device
from dpr_cache.runtime.memory import peak_memory_bytes, peak_rss_bytes, rss_bytes
from dpr_cache.runtime.processes import ChildFailed, child_env, run_json_child
from tests.support.fixtures import REPO


def test_devices_resolve_and_bad_ones_are_input_errors(monkeypatch) -> None:
    assert resolve_device("cpu") == torch.device("cpu")
    assert resolve_device(torch.device("cpu")) == torch.device("cpu")
    if not torch.cuda.is_available():
        assert resolve_device("auto") == torch.device("cpu")
        with pytest.raises(InputError, match="CUDA is not available"):
            resolve_device("cuda")
    with pytest.raises(InputError, match="not a device"):
        resolve_device("tpu:banana")
    with pytest.raises(InputError, match="^index.device: not a device"):  # names its setting
        resolve_device("tpu:banana", key="index.device")


def test_precisions_map_to_dtypes_and_autocast() -> None:
    assert precision_dtype("bf16") is torch.bfloat16 and precision_dtype("fp32") is torch.float32
    with pytest.raises(ValueError, match="precision"):
        precision_dtype("fp8")
    cpu = torch.device("cpu")
    assert isinstance(autocast(cpu, "fp32"), contextlib.nullcontext)
    a, b = torch.randn(4, 4), torch.randn(4, 4)
    with autocast(cpu, "bf16"):
        assert (a @ b).dtype is torch.bfloat16


def test_memory_readings_see_a_new_block() -> None:
    """A 256 MiB block, every page touched, shows in the reading (the rest of the process may
    hand a few MiB back meanwhile, so the bound leaves room for that)."""
    before = rss_bytes()
    block = torch.ones(256 * 2**20 // 4)
    assert rss_bytes() - before > 200 * 2**20
    assert peak_rss_bytes() >= 256 * 2**20 and peak_memory_bytes("cpu") == peak_rss_bytes()
    del block


def test_a_child_inherits_the_environment_with_this_checkout_first(monkeypatch) -> None:
    monkeypatch.setenv("DPR_CACHE_PROBE", "x")
    env = child_env()
    assert env["DPR_CACHE_PROBE"] == "x" and env["HF_HUB_OFFLINE"] == "1"  # the tests' own
    assert env["PYTHONPATH"].split(os.pathsep)[0] == str(REPO)  # this checkout first


def test_a_child_returns_its_last_json_line() -> None:
    row = run_json_child("benchmarks.loss", ["--child", "--batch", "8", "--dim", "4"])
    assert row["batch"] == 8 and row["dim"] == 4 and row["mode"] == "tiled"
    assert row["loss"] > 0 and row["backward_s"] is not None


def test_a_failing_child_reports_its_last_stderr_line() -> None:
    with pytest.raises(ChildFailed) as info:
        run_json_child("benchmarks.loss", ["--child", "--batch", "not-a-number"])
    assert info.value.returncode == 2 and "invalid int value" in info.value.tail
