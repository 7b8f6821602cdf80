"""Faults injected into sharded runs (``train.shard: fsdp`` on 2 gloo ranks under torchrun; the toy
BERT, and the tiny decoder trained with LoRA): a rank killed with ``kill -9`` after a step and
while a sharded checkpoint is written, a rank frozen (SIGSTOP), a rank's shard file truncated or
with a flipped bit, the disk full while the shards are written, and a second run on the same
folder. Each: the survivor stops with one line naming the rank (within the timeout, for a frozen
one), a damaged checkpoint is found by its checksum and the one before it used, and
``--resume`` ends with the outputs of a run never interrupted, compared by hash."""

from __future__ import annotations

import os
import shutil
import signal
import subprocess
import time
from pathlib import Path

import pytest
import torch.distributed as dist

from dpr_cache.runtime.processes import rank_process
from tests.faults.inject import damage, digest, freeze_rank_1, record, start
from tests.support.cli import fork_server_ready, run_cli, toy_overrides

pytestmark = [
    pytest.mark.slow,
    pytest.mark.skipif(
        not (dist.is_available() and dist.is_gloo_available()),
        reason="torch.distributed with gloo is unavailable",
    ),
]

CONFIGS = {"toy": "configs/toy.yaml", "lora-decoder": "configs/toy_llm.yaml"}
STEPS = 8


def _args(tmp_path: Path, config: str = "toy") -> list[str]:
    sets = {"train.max_steps": STEPS, "train.checkpoint_every": 2, "train.shard": "fsdp"}
    if config == "lora-decoder":
        sets.update({"train.batch_size": 8, "train.chunk_size": 4})
    return ["train", "--config", CONFIGS[config], "-q", *toy_overrides(tmp_path, **sets)]


@pytest.fixture(scope="module")
def unbroken(tmp_path_factory) -> dict[str, Path]:
    """Each config's sharded run, never interrupted."""
    root = tmp_path_factory.mktemp("sharded-faults")
    for config in CONFIGS:
        run_cli(*_args(root / config, config), world=2)
    return {config: root / config / "run" for config in CONFIGS}


def assert_same_outputs(run: Path, want: Path) -> None:
    """Every output of ``run`` (the model, the log, the plots, the finished record: checkpoints,
    times and measurements aside) byte for byte the unbroken run's, its saved config but for
    the folder it names."""
    got, whole = digest(run), digest(want)
    differ = sorted(k for k in got.keys() | whole.keys() if got.get(k) != whole.get(k))
    assert set(differ) <= {"config.yaml"}, differ
    config = (run / "config.yaml").read_text().replace(str(run.parent), str(want.parent))
    assert config == (want / "config.yaml").read_text()


def _wait(agent: subprocess.Popen, ready, timeout: float = 300) -> None:
    deadline = time.monotonic() + timeout
    while not ready():
        assert agent.poll() is None and time.monotonic() < deadline, agent.stderr.read()
        time.sleep(0.005)


def _after_step(run: Path, step: int):
    log = run / "train_log.jsonl"
    return lambda: log.is_file() and log.read_text().count("\n") >= step


def _inside_a_checkpoint(run: Path):
    """A sharded checkpoint's folder, being written, holds a rank's shard."""
    return lambda: any(run.glob("checkpoints/.step-*.partial/shards/*"))


def _resumed(tmp_path: Path, config: str, want: Path) -> None:
    """``--resume`` on 2 ranks ends with the unbroken run's outputs, no partial folder left."""
    run_cli(*_args(tmp_path, config), "--resume", world=2)
    assert_same_outputs(tmp_path / "run", want)
    assert not list((tmp_path / "run" / "checkpoints").glob(".*"))


@pytest.mark.parametrize(
    "config, moment",
    [("toy", "after step 3"), ("toy", "inside a checkpoint"), ("lora-decoder", "after step 3")],
)
def test_a_rank_killed_is_named_and_the_run_resumes(tmp_path, unbroken, config, moment) -> None:
    run = tmp_path / "run"
    agent = start(*_args(tmp_path, config), world=2, env={"DPR_CACHE_DIST_TIMEOUT": "600"})
    ready = _after_step(run, 3) if moment == "after step 3" else _inside_a_checkpoint(run)
    _wait(agent, ready)
    victim = rank_process(agent.pid, 1)
    os.kill(victim, signal.SIGKILL)
    killed_at = time.monotonic()
    _, err = agent.communicate(timeout=300)
    stopped_in = time.monotonic() - killed_at
    ours = [line for line in err.splitlines() if line.startswith("error: rank 0:")]
    assert agent.returncode != 0 and stopped_in < 60, (stopped_in, err[-3000:])
    assert len(ours) == 1 and f"rank 1 (pid {victim}) stopped" in ours[0], err[-3000:]
    assert ours[0].endswith("config.yaml --resume"), ours[0]
    _resumed(tmp_path, config, unbroken[config])
    record(
        "a rank killed",
        f"train, sharded (2 gloo ranks, fsdp, {config})",
        f"{moment}; the survivor stopped in under 60 s (asserted)",
        True,
    )


def test_a_frozen_rank_is_given_up_on_within_the_timeout(tmp_path, unbroken) -> None:
    """A rank frozen (SIGSTOP, as a lost node: no connection closes) inside a sharded run: the
    survivor waits no longer than DPR_CACHE_DIST_TIMEOUT plus 10 s, then names it."""
    run = tmp_path / "run"
    agent = start(*_args(tmp_path), world=2, env={"DPR_CACHE_DIST_TIMEOUT": "15"})
    _wait(agent, _after_step(run, 3))
    frozen, gave_up_in, err = freeze_rank_1(agent)
    assert 15 <= gave_up_in <= 15 + 10, gave_up_in
    ours = [line for line in err.splitlines() if line.startswith("error: rank 0:")]
    assert ours and f"rank 1 (pid {frozen}, not answering) stopped" in ours[0], err[-3000:]
    _resumed(tmp_path, "toy", unbroken["toy"])
    record(
        "a rank killed",
        "train, sharded (2 gloo ranks, fsdp, toy)",
        "rank 1 frozen (SIGSTOP) after step 3, timeout 15 s: the survivor stopped within 10 s "
        "past it (asserted)",
        True,
    )


@pytest.mark.parametrize("how", ["truncated", "bit flipped"])
def test_a_damaged_shard_is_passed_over(tmp_path, unbroken, how) -> None:
    """Rank 1's shard file of the last checkpoint damaged in a copy of the unbroken run (its
    model and its end gone): ``--resume`` names that checkpoint, takes the one before it and
    ends with the unbroken run's weights."""
    shutil.copytree(unbroken["toy"], tmp_path / "run")
    shutil.rmtree(tmp_path / "run" / "model")
    (tmp_path / "run" / "finished.json").unlink()
    last = tmp_path / "run" / "checkpoints" / f"step-{STEPS:08d}"
    [shard] = (last / "shards").glob("__1_*.distcp")
    damage(shard, how)
    done = run_cli(*_args(tmp_path), "--resume", world=2)
    said = f"step-{STEPS:08d}: damaged (its shards do not match their checksum)"
    assert said in done.stderr, done.stderr[-3000:]
    assert_same_outputs(tmp_path / "run", unbroken["toy"])
    record("damaged checkpoint", "train --resume, sharded (2 gloo ranks)", f"a shard {how}", True)


def test_a_second_run_on_a_sharded_runs_folder_is_refused(tmp_path, unbroken) -> None:
    """A second ``train`` under torchrun into the folder a sharded run writes: refused at once
    with one line naming the holder; the first run ends as an unbroken one. The first run's
    ranks are held (SIGSTOP) while the second starts, so that it cannot finish first."""
    fork_server_ready()
    first = start(*_args(tmp_path), world=2)
    _wait(first, _after_step(tmp_path / "run", 1))
    ranks = [rank_process(first.pid, rank) for rank in (0, 1)]
    assert all(ranks)
    for pid in ranks:
        os.kill(pid, signal.SIGSTOP)
    try:
        second = run_cli(*_args(tmp_path), "--resume", world=2, check=False)
    finally:
        for pid in ranks:
            os.kill(pid, signal.SIGCONT)
    assert second.returncode != 0 and first.poll() is None
    said = [line for line in second.stderr.splitlines() if line.startswith("error: ")]
    assert len(said) == 1 and "in use by pid" in said[0], second.stderr[-3000:]
    assert first.wait(timeout=300) == 0, first.stderr.read()[-3000:]
    assert_same_outputs(tmp_path / "run", unbroken["toy"])
    record("two commands, one folder", "train, sharded (2 gloo ranks)", "a second run", True)
