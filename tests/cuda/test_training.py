"""The trainer and the command line on CUDA: an fp16 overflow skipped and counted, the toy
pipeline (train fp16, index, eval, verify), resume after a kill, a chunk too large for the GPU,
a command out of GPU memory, and NCCL's collectives."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from benchmarks.gpu import cli, perf
from benchmarks.gpu.suite import default_tokenizer
from benchmarks.harness import write_random_bert


def test_fp16_overflow_steps_are_skipped_and_counted(cuda):
    row = cli.fp16_overflow(cuda)
    assert row["ok"], row


def test_toy_pipeline_on_cuda(tmp_path):
    row = cli.toy_pipeline(tmp_path, "cuda")
    assert row["ok"], row["commands"]
    assert row["logged_steps"] == 12


def test_resume_after_a_kill_is_bit_exact_with_deterministic_kernels(tmp_path):
    rows = cli.resume_equality(tmp_path, "cuda")
    det = rows["deterministic"]
    assert det["killed_mid_run"], rows
    assert det["resumed_vs_unbroken"]["bitwise_equal"], rows
    assert det["two_unbroken_runs"]["bitwise_equal"], rows


@pytest.fixture(scope="module")
def base_model(tmp_path_factory) -> Path:
    return write_random_bert(tmp_path_factory.mktemp("base") / "m", 768, 12, default_tokenizer())


def test_a_chunk_too_large_for_the_gpu_is_one_line(tmp_path, base_model):
    row = cli.chunk_too_large(tmp_path, base_model, "cuda")
    assert row["ok"], row


def test_nccl_runs_the_gather_and_its_gradient():
    row = cli.nccl_collectives()
    assert row["ok"], row


def test_host_waits_are_counted_where_they_happen(cuda):
    """A step that reads a device value back waits for the device; one that only queues work
    does not (the negative control)."""
    x = torch.ones(64, 64, device=cuda)
    waits = perf.count_syncs(lambda: (x @ x).sum().item(), cuda, "fp32")
    assert waits["count"] >= 1 and any(w.startswith("test_training.py:") for w in waits["top"])
    assert perf.count_syncs(lambda: (x @ x).sum(), cuda, "fp32")["count"] == 0


def test_a_command_out_of_gpu_memory_ends_in_one_line(tmp_path):
    """A real CUDA out of memory: a fresh process whose allocator is held to a sliver of the GPU,
    less than the tiny model's weights; the control, the same command with the whole GPU,
    encodes."""
    import subprocess
    import sys

    from dpr_cache.runtime.processes import child_env
    from tests.support.fixtures import REPO

    args = ["encode", "--model", "data/toy/tiny-bert", "--passages", "data/toy/passages.tsv"]
    args += ["--device", "cuda", "--num-workers", "0", "-q"]
    starved = (
        "import sys, torch; torch.cuda.set_per_process_memory_fraction(1e-6, 0); "
        "from dpr_cache.cli import app; app(sys.argv[1:], prog_name='dpr-cache')"
    )

    def run(*command: str, out: Path) -> subprocess.CompletedProcess:
        cmd = [sys.executable, *command, *args, "--out", str(out)]
        return subprocess.run(
            cmd, cwd=REPO, env=child_env(), capture_output=True, text=True, timeout=300
        )

    failed = run("-c", starved, out=tmp_path / "starved")
    line = failed.stderr.strip()
    assert failed.returncode == 1 and "\n" not in line, failed.stderr[-2000:]
    assert line.startswith("error: encode: ") and "(cuda:0) ran out of memory: " in line, line
    assert line.endswith("free the GPU of other processes, or lower --batch-size"), line
    control = run("-m", "dpr_cache", out=tmp_path / "whole")
    assert control.returncode == 0, control.stderr[-2000:]
