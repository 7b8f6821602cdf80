"""Checkpoints resume to bit-identical weights: after SIGKILL, after Ctrl-C, versus one run."""

from __future__ import annotations

import shlex
import signal
import time

import torch

from tests.support.cli import popen_cli, run_cli, toy_overrides
from tests.support.fixtures import saved_weights as weights

STEPS = 8


def overrides(tmp_path):
    # dropout stays on (0.1 in toy.yaml): replaying RNG state is part of what must resume
    return toy_overrides(tmp_path, **{"train.max_steps": STEPS, "train.checkpoint_every": 3})


def uninterrupted(tmp_path):
    run_cli("train", "--config", "configs/toy.yaml", *overrides(tmp_path), "-q")
    return weights(tmp_path / "run" / "model")


def wait_for(path, proc, timeout=300.0):
    deadline = time.time() + timeout
    while not path.exists():
        assert proc.poll() is None, proc.stderr.read()
        assert time.time() < deadline, f"{path} never appeared"
        time.sleep(0.02)


def assert_identical(got, want):
    assert got.keys() == want.keys()
    for key in want:
        assert torch.equal(got[key], want[key]), key


def test_resume_after_sigkill_is_bit_identical(tmp_path):
    want = uninterrupted(tmp_path / "a")
    run_dir = tmp_path / "b" / "run"
    proc = popen_cli("train", "--config", "configs/toy.yaml", *overrides(tmp_path / "b"), "-q")
    wait_for(run_dir / "checkpoints" / "step-00000003" / "state.pt", proc)
    proc.send_signal(signal.SIGKILL)
    proc.wait()
    assert not (run_dir / "model").exists(), "the run ended before the kill: nothing tested"
    run_cli("train", "--config", "configs/toy.yaml", *overrides(tmp_path / "b"), "--resume", "-q")
    assert_identical(weights(run_dir / "model"), want)
    steps = [line for line in (run_dir / "train_log.jsonl").read_text().splitlines() if line]
    assert len(steps) == STEPS  # the log holds each step once


def test_ctrl_c_saves_a_checkpoint_then_resume_is_identical(tmp_path):
    want = uninterrupted(tmp_path / "a")
    run_dir = tmp_path / "b" / "run"
    proc = popen_cli("train", "--config", "configs/toy.yaml", *overrides(tmp_path / "b"), "-q")
    wait_for(run_dir / "checkpoints" / "step-00000003" / "state.pt", proc)
    proc.send_signal(signal.SIGINT)
    _, err = proc.communicate(timeout=300)
    assert proc.returncode == 130, err
    (line,) = [x for x in err.splitlines() if "checkpoint saved" in x]
    saved = sorted((run_dir / "checkpoints").glob("step-*"))
    assert saved and not (run_dir / "model").exists()
    # the line names the command that continues the run, needing no flag repeated: run it so
    command = line.split("; continue with: ", 1)[1]
    assert command == f"dpr-cache train --config {run_dir / 'config.yaml'} --resume"
    run_cli(*shlex.split(command)[1:], "-q")
    assert_identical(weights(run_dir / "model"), want)


def test_fresh_run_refuses_to_overwrite_checkpoints(tmp_path):
    args = toy_overrides(tmp_path, **{"train.max_steps": 3})
    run_cli("train", "--config", "configs/toy.yaml", *args, "-q")
    proc = run_cli("train", "--config", "configs/toy.yaml", *args, "-q", check=False)
    continues = f"`dpr-cache train --config {tmp_path / 'run' / 'config.yaml'} --resume`"
    assert proc.returncode == 2 and proc.stderr.startswith("error:") and continues in proc.stderr


def test_resume_with_no_checkpoint_says_so_and_starts(tmp_path):
    args = toy_overrides(tmp_path, **{"train.max_steps": 2})
    proc = run_cli("train", "--config", "configs/toy.yaml", *args, "--resume", "-q")
    assert f"no checkpoint in {tmp_path / 'run'}: starting a new run" in proc.stderr
    assert (tmp_path / "run" / "model").is_dir()


def test_resume_of_a_finished_run_says_so_and_rewrites_nothing(tmp_path):
    args = toy_overrides(tmp_path, **{"train.max_steps": 2})
    run_cli("train", "--config", "configs/toy.yaml", *args, "-q")
    run = tmp_path / "run"
    before = {p: (p.read_bytes(), p.stat().st_mtime_ns) for p in run.rglob("*") if p.is_file()}
    proc = run_cli("train", "--config", "configs/toy.yaml", *args, "--resume", "-q")
    assert proc.stdout.strip() == f"{run} finished at step 2; model at {run / 'model'}"
    after = {p: (p.read_bytes(), p.stat().st_mtime_ns) for p in run.rglob("*") if p.is_file()}
    assert after == before  # the model's bytes, the log, the checkpoints: all as they were
    # the control: a run given more steps is not finished, and goes on
    more = toy_overrides(tmp_path, **{"train.max_steps": 3})
    proc = run_cli("train", "--config", "configs/toy.yaml", *more, "--resume", "-q")
    assert "finished at step" not in proc.stdout and "model saved to" in proc.stdout


def test_deterministic_kernels_train_the_same_weights_on_the_cpu(tmp_path):
    """``train.deterministic`` turns on PyTorch's deterministic algorithms (CUDA's bit-exact
    reruns); every kernel training uses has such a version on the CPU, where the weights equal
    the default run's."""
    want = uninterrupted(tmp_path / "a")
    args = overrides(tmp_path / "b") + ["--set", "train.deterministic=true"]
    run_cli("train", "--config", "configs/toy.yaml", *args, "-q")
    assert_identical(weights(tmp_path / "b" / "run" / "model"), want)


def test_resume_with_other_settings_names_those_the_steps_depend_on(tmp_path):
    """A resumed run follows its new settings: those that change what its steps compute beyond
    rounding are named in a warning (logging, checkpoints, threads and gradcache's chunks are
    not), config.yaml then holds them; one its checkpoint keeps (the learning rate) is refused."""
    args = toy_overrides(tmp_path, **{"train.max_steps": 2, "train.checkpoint_every": 1})
    run_cli("train", "--config", "configs/toy.yaml", *args, "-q")
    free = ["train.log_every=2", "train.keep_checkpoints=3", "train.num_threads=1"]
    free = [x for item in free + ["train.chunk_size=3"] for x in ("--set", item)]
    quiet = run_cli("train", "--config", "configs/toy.yaml", *args, *free, "--resume", "-q")
    assert "--resume" not in quiet.stderr  # control: only free and rounding keys changed
    config = tmp_path / "run" / "config.yaml"
    before = config.read_text()
    lr = ["--set", "train.lr=0.001", "--set", "train.adam_eps=1e-6"]
    lr_args = [*args, *lr, "--resume", "-q"]
    refused = run_cli("train", "--config", "configs/toy.yaml", *lr_args, check=False)
    assert refused.returncode == 2 and refused.stderr.strip().splitlines() == [
        "error: --resume: train.lr 0.0005 -> 0.001; train.adam_eps 1e-08 -> 1e-06: a resumed "
        "run keeps its optimizer's train.lr, train.weight_decay, train.adam_eps from its "
        "checkpoint: set them back, or train afresh in another output_dir"
    ], refused.stderr
    assert config.read_text() == before  # nothing written
    more = ["--set", "train.max_steps=3", "--set", "train.temperature=0.5"]
    done = run_cli("train", "--config", "configs/toy.yaml", *args, *free, *more, "--resume", "-q")
    warned = [line for line in done.stderr.splitlines() if "--resume with settings" in line]
    assert len(warned) == 1, done.stderr
    assert "(train.max_steps 2 -> 3; train.temperature 0.05 -> 0.5)" in warned[0], warned
    saved = config.read_text()
    assert "max_steps: 3" in saved and "temperature: 0.5" in saved
