"""A command that runs out of GPU memory outside a training step ends with one line: what the GPU
holds (free of total, the most this process reserved) and the setting to lower, exit 1, no
traceback.

No GPU here: the command's work raises ``torch.OutOfMemoryError`` with CUDA's own message and
``torch.cuda``'s readings are stand-ins, so what is checked is the line and the exit; a real one
is ``tests/cuda``'s and the GPU suite's.
"""

from __future__ import annotations

import importlib

import pytest
import torch
from typer.testing import CliRunner

from dpr_cache.cli import app
from dpr_cache.errors import OutOfDeviceMemory
from dpr_cache.runtime.device import advises_on_out_of_memory

GB = 10**9
CUDA_MESSAGE = (
    "CUDA out of memory. Tried to allocate 2.00 MiB. GPU 1 has a total capacity of 139.80 GiB "
    "of which 3.94 MiB is free. Of the allocated memory 0 bytes is allocated by PyTorch."
)


@pytest.fixture
def full_gpu(monkeypatch):
    """``torch.cuda`` as a GPU that other processes fill: 4 MB of 150 GB free, the device asked
    for each reading recorded."""
    asked: list[int] = []

    def reading(value):
        return lambda index: asked.append(index) or value

    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "empty_cache", lambda: None)
    monkeypatch.setattr(torch.cuda, "max_memory_reserved", reading(int(0.5 * GB)))
    monkeypatch.setattr(torch.cuda, "mem_get_info", reading((4 * 2**20, 150 * GB)))
    monkeypatch.setattr(torch.cuda, "get_device_name", reading("Test GPU"))
    return asked


def _fails_with(monkeypatch, target: str, error: BaseException):
    def work(*args, **kwargs):
        raise error

    monkeypatch.setattr(target, work)


def _encode_failing_with(monkeypatch, tmp_path, error: BaseException):
    """``dpr-cache encode`` of the toy passages, its encoding raising ``error``."""
    _fails_with(monkeypatch, "dpr_cache.retrieval.drivers.encode.encode_passage_shards", error)
    args = ["--model", "data/toy/tiny-bert", "--passages", "data/toy/passages.tsv"]
    return CliRunner().invoke(app, ["encode", *args, "--out", str(tmp_path), "--device", "cpu"])


def test_encode_out_of_gpu_memory_is_one_line_with_what_the_gpu_holds(
    full_gpu, monkeypatch, tmp_path
):
    result = _encode_failing_with(monkeypatch, tmp_path, torch.OutOfMemoryError(CUDA_MESSAGE))
    assert result.exit_code == 1, result.output
    assert result.output.splitlines() == [
        "error: encode: Test GPU (cuda:1) ran out of memory: 0.00 of 150.0 GB free now, this "
        "process held at most 0.50 GB: free the GPU of other processes, or lower --batch-size"
    ]
    assert set(full_gpu) == {1}  # the GPU CUDA's message names, not the current one
    assert "Traceback" not in result.output


def test_eval_names_its_own_batch_setting(full_gpu, monkeypatch, tmp_path):
    error = torch.OutOfMemoryError("CUDA out of memory. Tried to allocate 20.00 MiB.")
    monkeypatch.setattr(torch.cuda, "current_device", lambda: 0)
    _fails_with(monkeypatch, "dpr_cache.retrieval.drivers.eval.evaluate", error)
    (tmp_path / "index").mkdir()  # an index and a model: eval refuses a run without them first
    (tmp_path / "index" / "meta.json").write_text('{"format": 2}')
    args = ["--config", "configs/toy.yaml", "--set", f"output_dir={tmp_path}"]
    args += ["--set", "eval.device=cpu", "--model", "data/toy/tiny-bert"]
    result = CliRunner().invoke(app, ["eval", *args])
    assert result.exit_code == 1, result.output
    line = result.output.strip()
    assert line.startswith("error: eval: Test GPU (cuda:0) ran out of memory") and "\n" not in line
    assert line.endswith("or lower eval.batch_size")


def test_any_other_runtime_error_is_not_taken_for_one(full_gpu, monkeypatch, tmp_path):
    result = _encode_failing_with(monkeypatch, tmp_path, RuntimeError("boom"))
    assert isinstance(result.exception, RuntimeError) and str(result.exception) == "boom"
    assert full_gpu == []  # the GPU was not read


def test_a_cuda_calls_own_out_of_memory_counts_too_and_an_unreadable_gpu_is_said_plainly(
    full_gpu, monkeypatch, tmp_path
):
    """A CUDA call that fails for memory (a context, a library's workspace) raises a plain
    RuntimeError with CUDA's text; a GPU that cannot be read then is not read."""

    def unreadable(index):
        raise RuntimeError("CUDA error: out of memory")

    monkeypatch.setattr(torch.cuda, "current_device", lambda: 0)
    monkeypatch.setattr(torch.cuda, "mem_get_info", unreadable)
    error = RuntimeError(
        "CUDA error: out of memory\nCompile with `TORCH_USE_CUDA_DSA` to enable device-side "
        "assertions."
    )
    result = _encode_failing_with(monkeypatch, tmp_path, error)
    assert result.exit_code == 1, result.output
    assert result.output.splitlines() == [
        "error: encode: the GPU ran out of memory: free the GPU of other processes, or lower "
        "--batch-size"
    ]


@pytest.mark.parametrize(
    ("driver", "way_out"),
    [
        ("dpr_cache.retrieval.drivers.index:index_command", "lower index.batch_size"),
        ("dpr_cache.retrieval.drivers.eval:eval_command", "lower eval.batch_size"),
        ("dpr_cache.retrieval.drivers.encode:encode_file", "lower --batch-size"),
        ("dpr_cache.retrieval.drivers.score:score_file", "lower --batch-size"),
        ("dpr_cache.retrieval.drivers.search:search", "run it with --device cpu"),
        ("dpr_cache.retrieval.drivers.mine:mine_file", "run it with --device cpu"),
        ("dpr_cache.train.verify:verify", "lower train.batch_size"),
        ("dpr_cache.train.loop:train", "lower train.chunk_size"),
    ],
)
def test_each_commands_work_names_its_own_way_out(driver, way_out):
    """The function each command calls carries the setting that bounds what it puts on the
    GPU at once."""
    module, name = driver.split(":")
    assert importlib.import_module(module).__dict__[name].way_out == way_out


def test_the_advice_is_added_to_an_out_of_memory_error_alone(full_gpu):
    @advises_on_out_of_memory("lower x.batch_size")
    def work(error):
        raise error

    with pytest.raises(OutOfDeviceMemory) as caught:
        work(torch.OutOfMemoryError(CUDA_MESSAGE))
    line = str(caught.value)
    assert line.startswith("Test GPU (cuda:1) ran out of memory: 0.00 of 150.0 GB free now")
    assert line.endswith(": free the GPU of other processes, or lower x.batch_size")
    with pytest.raises(RuntimeError, match="^boom$"):  # control: any other error passes through
        work(RuntimeError("boom"))


def test_work_without_its_own_advice_is_told_to_free_the_gpu(full_gpu):
    import sys

    cli_app = sys.modules["dpr_cache.cli.app"]
    line = cli_app._out_of_device_memory(torch.OutOfMemoryError(CUDA_MESSAGE), "export")
    assert line.startswith("export: Test GPU (cuda:1) ran out of memory")
    assert line.endswith(": free the GPU of other processes")
