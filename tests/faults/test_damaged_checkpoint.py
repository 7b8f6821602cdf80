"""A checkpoint cut short or with a flipped bit: ``--resume`` detects it by its checksum, says so,
and resumes from the checkpoint before it, ending with the weights of a run never interrupted;
when every checkpoint is damaged, a one-line error."""

from __future__ import annotations

import shutil

import pytest

from tests.faults.inject import damage, kill_when, record, start
from tests.support.cli import run_cli, toy_overrides
from tests.support.fixtures import saved_weights

STEPS = 8


def _args(tmp_path):
    sets = toy_overrides(tmp_path, **{"train.max_steps": STEPS, "train.checkpoint_every": 2})
    return ["train", "--config", "configs/toy.yaml", "-q", *sets]


@pytest.fixture(scope="module")
def cut_run(tmp_path_factory):
    """The weights of an uninterrupted run, and a run killed after step 6 (checkpoints at 4, 6)."""
    root = tmp_path_factory.mktemp("damaged")
    run_cli(*_args(root / "whole"))
    want = saved_weights(root / "whole" / "run" / "model")
    out = root / "cut" / "run"
    proc = start(*_args(root / "cut"))
    assert kill_when(
        proc, lambda: (out / "checkpoints" / "step-00000006" / "state.sha256").is_file()
    )
    return want, root / "cut"


@pytest.mark.parametrize("how", ["truncated", "bit flipped"])
def test_a_damaged_checkpoint_is_passed_over(cut_run, tmp_path, how) -> None:
    want, cut = cut_run
    shutil.copytree(cut, tmp_path, dirs_exist_ok=True)
    state = tmp_path / "run" / "checkpoints" / "step-00000006" / "state.pt"
    damage(state, how)
    done = run_cli(*_args(tmp_path), "--resume")
    assert "step-00000006: damaged (its bytes do not match its checksum)" in done.stderr
    got = saved_weights(tmp_path / "run" / "model")
    assert got.keys() == want.keys() and all((got[k] == want[k]).all() for k in want)
    record("damaged checkpoint", "train --resume", how, True)


def test_every_checkpoint_damaged_is_one_line(cut_run, tmp_path) -> None:
    _, cut = cut_run
    shutil.copytree(cut, tmp_path, dirs_exist_ok=True)
    for state in (tmp_path / "run" / "checkpoints").glob("step-*/state.pt"):
        state.write_bytes(state.read_bytes()[:100])
    done = run_cli(*_args(tmp_path), "--resume", check=False)
    assert done.returncode == 2
    last = done.stderr.strip().splitlines()[-1]
    assert "every checkpoint is damaged" in last and last.endswith("train afresh"), last
