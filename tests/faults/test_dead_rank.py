"""A rank killed under torchrun (2 gloo ranks, its process SIGKILLed mid-training, as the OOM
killer would): the survivor stops within seconds with one line naming the dead rank, not a
backend's traceback nor a hang until a collective's time-out; ``--resume`` on 2 ranks then ends
with the weights of a run never interrupted.

torchrun's agent ends every rank with SIGTERM once one dies, and that SIGTERM can reach the
survivor before its collective has failed or while it unwinds from the failure (a slow teardown
on a loaded machine). That race is made certain by a process standing for rank 0, its peer's
process ended, which SIGTERMs itself while it unwinds, through the CLI's own error mapping."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time

import pytest

from dpr_cache.runtime.processes import child_env
from tests.faults.inject import record, start
from tests.support.cli import run_cli, toy_overrides
from tests.support.fixtures import REPO, saved_weights

STEPS = 10


def _args(tmp_path):
    sets = toy_overrides(tmp_path, **{"train.max_steps": STEPS, "train.checkpoint_every": 2})
    return ["train", "--config", "configs/toy.yaml", "-q", *sets]


def _rank_process(agent: int, rank: int) -> int | None:
    """The pid of rank ``rank``'s process: a child of the torchrun agent with that RANK."""
    for pid in filter(str.isdigit, os.listdir("/proc")):
        try:
            with open(f"/proc/{pid}/stat") as f:
                parent = int(f.read().split(") ", 1)[1].split()[1])
            with open(f"/proc/{pid}/environ", "rb") as f:
                env = f.read().split(b"\0")
        except (OSError, IndexError, ValueError):
            continue
        if parent == agent and f"RANK={rank}".encode() in env:
            return int(pid)
    return None


def test_a_dead_rank_is_named_and_the_run_resumes(tmp_path) -> None:
    whole = run_cli(*_args(tmp_path / "whole"), world=2)
    assert whole.returncode == 0
    want = saved_weights(tmp_path / "whole" / "run" / "model")
    agent = start(*_args(tmp_path), world=2, env={"DPR_CACHE_DIST_TIMEOUT": "600"})
    log = tmp_path / "run" / "train_log.jsonl"
    victim: list[int] = []

    def after_step_3() -> bool:
        if log.is_file() and log.read_text().count("\n") >= 3:
            victim.append(_rank_process(agent.pid, 1))
            return victim[-1] is not None
        return False

    deadline = time.monotonic() + 300
    while not after_step_3():
        assert agent.poll() is None and time.monotonic() < deadline, agent.stderr.read()
        time.sleep(0.02)
    killed_at = time.monotonic()
    os.kill(victim[-1], 9)
    _, err = agent.communicate(timeout=300)
    stopped_in = time.monotonic() - killed_at
    assert agent.returncode != 0 and stopped_in < 60, stopped_in
    ours = [line for line in err.splitlines() if "error: rank 0:" in line]
    assert ours and f"rank 1 (pid {victim[-1]}) stopped" in ours[0], err[-3000:]
    assert "--resume continues from the last checkpoint" in ours[0]
    assert not any(line.startswith("[rank0]: Traceback") for line in err.splitlines())
    resumed = run_cli(*_args(tmp_path), "--resume", world=2)
    assert resumed.returncode == 0
    got = saved_weights(tmp_path / "run" / "model")
    assert got.keys() == want.keys() and all((got[k] == want[k]).all() for k in want)
    record("a rank killed", "train under torchrun (2 gloo ranks)",
           f"after step 3; the survivor stopped in {stopped_in:.0f} s", True)  # fmt: skip


def test_a_rank_that_stops_answering_is_given_up_on_at_the_timeout(tmp_path) -> None:
    """A rank frozen (SIGSTOP: as a lost node, it closes no connection): the survivor waits no
    longer than DPR_CACHE_DIST_TIMEOUT, then names it; its checkpoint is kept for --resume."""
    agent = start(*_args(tmp_path), world=2, env={"DPR_CACHE_DIST_TIMEOUT": "15"})
    log = tmp_path / "run" / "train_log.jsonl"
    deadline = time.monotonic() + 300
    while not (log.is_file() and log.read_text().count("\n") >= 3):
        assert agent.poll() is None and time.monotonic() < deadline, agent.stderr.read()
        time.sleep(0.02)
    frozen, survivor = _rank_process(agent.pid, 1), _rank_process(agent.pid, 0)
    assert frozen and survivor
    os.kill(frozen, signal.SIGSTOP)
    frozen_at = time.monotonic()
    while os.path.exists(f"/proc/{survivor}") and time.monotonic() - frozen_at < 120:
        time.sleep(0.1)
    gave_up_in = time.monotonic() - frozen_at
    os.kill(frozen, signal.SIGKILL)  # what torchrun's agent would have to wait 30 s more for
    _, err = agent.communicate(timeout=120)
    assert 15 <= gave_up_in < 15 + 30, gave_up_in
    ours = [line for line in err.splitlines() if "error: rank 0:" in line]
    assert ours and f"rank 1 (pid {frozen}, not answering) stopped" in ours[0], err[-3000:]
    assert (tmp_path / "run" / "checkpoints" / "step-00000002").is_dir()
    record("a rank killed", "train under torchrun (2 gloo ranks)",
           f"rank 1 frozen (SIGSTOP) after step 3, timeout 15 s: the survivor stopped in "
           f"{gave_up_in:.0f} s", True)  # fmt: skip


CHILD = """
import os, signal, socket, subprocess, sys, time
import typer
from dpr_cache.cli.app import guarded
from dpr_cache.runtime import distributed

peer = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"],
                        stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
if sys.argv[1] == "ended":
    peer.kill(); peer.wait()
distributed.PEERS.update({0: (socket.gethostname(), os.getpid()),
                          1: (socket.gethostname(), peer.pid)})
print(peer.pid, flush=True)
if sys.argv[2] == "installed":
    distributed.name_lost_rank_on_sigterm()

def step():
    try:
        raise RuntimeError("[gloo] Connection closed by peer [127.0.0.1]:29500")
    finally:  # the teardown, slow enough for the agent's SIGTERM to come first
        os.kill(os.getpid(), signal.SIGTERM)
        time.sleep(2)
        peer.kill()

try:
    guarded(step)()
except typer.Exit as e:
    sys.exit(e.exit_code)
"""


def _run(peer: str, handler: str) -> tuple[int, int, str]:
    os_env = {**child_env(), "RANK": "0"}
    done = subprocess.run([sys.executable, "-c", CHILD, peer, handler], cwd=REPO, env=os_env,
                          capture_output=True, text=True, timeout=60)  # fmt: skip
    return done.returncode, int(done.stdout.split()[0]), done.stderr


def test_a_sigterm_amid_the_failure_still_names_the_dead_rank() -> None:
    code, pid, err = _run("ended", "installed")
    lines = [line for line in err.splitlines() if line.strip()]
    assert code == 1, err
    assert lines == [
        f"error: rank 0: rank 1 (pid {pid}) stopped, so this rank stops too (torchrun ended "
        "this rank when its peer ended): once every rank can run, --resume continues from the "
        "last checkpoint"
    ], err
    record("a rank killed", "the CLI's error mapping (rank 0 alone, its peer's process ended)",
           "SIGTERM while unwinding from the collective's failure", True)  # fmt: skip


@pytest.mark.parametrize("peer, handler", [("ended", "not installed"), ("running", "installed")])
def test_without_the_handler_or_a_dead_peer_sigterm_ends_the_process(peer, handler) -> None:
    """Negative controls: without the handler the signal ends the process with no line (what
    happened before); with every peer running, a SIGTERM is a plain stop, as by default."""
    code, _, err = _run(peer, handler)
    assert code == -15, err
    assert "error:" not in err
