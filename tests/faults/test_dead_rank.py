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
import typer

from dpr_cache.cli.app import guarded
from dpr_cache.errors import InputError
from dpr_cache.runtime.processes import child_env, rank_process
from tests.faults.inject import freeze_rank_1, record, start
from tests.support.cli import run_cli, toy_overrides
from tests.support.fixtures import REPO, saved_weights

STEPS = 10


def _args(tmp_path):
    sets = toy_overrides(tmp_path, **{"train.max_steps": STEPS, "train.checkpoint_every": 2})
    return ["train", "--config", "configs/toy.yaml", "-q", *sets]


def test_a_dead_rank_is_named_and_the_run_resumes(tmp_path) -> None:
    whole = run_cli(*_args(tmp_path / "whole"), world=2)
    assert whole.returncode == 0
    want = saved_weights(tmp_path / "whole" / "run" / "model")
    agent = start(*_args(tmp_path), world=2, env={"DPR_CACHE_DIST_TIMEOUT": "600"})
    log = tmp_path / "run" / "train_log.jsonl"
    victim: list[int] = []

    def after_step_3() -> bool:
        if log.is_file() and log.read_text().count("\n") >= 3:
            victim.append(rank_process(agent.pid, 1))
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
    assert len(ours) == 1 and f"rank 1 (pid {victim[-1]}) stopped" in ours[0], err[-3000:]
    continue_with = "continue with: torchrun --nproc_per_node 2 -m dpr_cache train --config "
    assert continue_with in ours[0] and ours[0].endswith("config.yaml --resume"), ours[0]
    assert not any(line.startswith("[rank0]: Traceback") for line in err.splitlines())
    resumed = run_cli(*_args(tmp_path), "--resume", world=2)
    assert resumed.returncode == 0
    got = saved_weights(tmp_path / "run" / "model")
    assert got.keys() == want.keys() and all((got[k] == want[k]).all() for k in want)
    record(
        "a rank killed",
        "train under torchrun (2 gloo ranks)",
        "after step 3; the survivor stopped in under 60 s (asserted)",
        True,
    )


def test_a_rank_that_stops_answering_is_given_up_on_at_the_timeout(tmp_path) -> None:
    """A rank frozen (SIGSTOP: as a lost node, it closes no connection): the survivor waits no
    longer than DPR_CACHE_DIST_TIMEOUT, then names it; its checkpoint is kept for --resume."""
    agent = start(*_args(tmp_path), world=2, env={"DPR_CACHE_DIST_TIMEOUT": "15"})
    log = tmp_path / "run" / "train_log.jsonl"
    deadline = time.monotonic() + 300
    while not (log.is_file() and log.read_text().count("\n") >= 3):
        assert agent.poll() is None and time.monotonic() < deadline, agent.stderr.read()
        time.sleep(0.02)
    frozen, gave_up_in, err = freeze_rank_1(agent)
    assert 15 <= gave_up_in <= 15 + 10, gave_up_in  # the timeout, plus 10 s at most
    ours = [line for line in err.splitlines() if "error: rank 0:" in line]
    assert ours and f"rank 1 (pid {frozen}, not answering) stopped" in ours[0], err[-3000:]
    assert (tmp_path / "run" / "checkpoints" / "step-00000002").is_dir()
    record(
        "a rank killed",
        "train under torchrun (2 gloo ranks)",
        "rank 1 frozen (SIGSTOP) after step 3, timeout 15 s: the survivor stopped within 10 s "
        "past it (asserted)",
        True,
    )


CHILD = """
import os, signal, socket, subprocess, sys, time
import typer
from dpr_cache.cli.app import guarded
from dpr_cache.errors import InputError
from dpr_cache.runtime import distributed
from dpr_cache.train.loop import StopRequest

peer_state, handler, where = sys.argv[1:4]
peer = subprocess.Popen([sys.executable, "-c", "import sys; sys.stdin.read()"],
                        stdin=subprocess.PIPE)  # ends with this process
if peer_state == "ended":
    peer.kill(); peer.wait()
host = socket.gethostname()
distributed.PEERS.update({0: (host, os.getpid()), 1: (host, peer.pid)})
if handler == "installed":
    distributed.name_lost_rank_on_sigterm()
print(peer.pid, flush=True)


def sigterm():
    os.kill(os.getpid(), signal.SIGTERM)


class Failed(RuntimeError):  # the backend's error; the report starts by reading its text
    def __str__(self):
        if where == "reading the error":
            sigterm()
        return "[gloo] Connection closed by peer [127.0.0.1]:29500"


class Stderr:  # the agent's SIGTERM right after this rank's own line
    def __init__(self, real):
        self.real = real
    def write(self, text):
        self.real.write(text)
        if text.startswith("error:"):
            sigterm()
    def flush(self):
        self.real.flush()


def command():
    if where == "unwinding":
        try:
            raise Failed()
        finally:  # a teardown slow enough for the agent's SIGTERM to come first
            sigterm()
    if where == "reading the error":
        raise Failed()
    if where == "after another error's line":
        sys.stderr = Stderr(sys.stderr)
        raise InputError("data.train: no training file given")
    if where == "the training loop":
        with StopRequest().installed():
            sigterm()
            time.sleep(1)
        sys.exit(5)
    if where == "a forked worker":
        child = os.fork()
        if child == 0:
            sigterm()
            time.sleep(1)
            os._exit(0)
        print(os.waitstatus_to_exitcode(os.waitpid(child, 0)[1]), flush=True)


try:
    guarded(command)()
except typer.Exit as e:
    sys.exit(e.exit_code)
"""
LINE = (
    "error: rank 0: rank 1 (pid {}) stopped, and torchrun stopped this rank: once every rank "
    "can run, --resume continues from the last checkpoint"
)


def _run(peer: str, handler: str, where: str) -> tuple[int, list[str], list[str]]:
    """The stand-in rank's exit code, its stdout's lines (the peer's pid first) and the lines
    of stderr that are errors or tracebacks."""
    env = {**child_env(), "RANK": "0", "WORLD_SIZE": "2"}  # as torchrun sets them
    done = subprocess.run(
        [sys.executable, "-c", CHILD, peer, handler, where],
        cwd=REPO,
        env=env,
        capture_output=True,
        text=True,
        timeout=60,
    )
    out = done.stdout.split()
    assert out, done.stderr[-3000:]
    said = [line for line in done.stderr.splitlines() if line.startswith(("error:", "Traceback"))]
    return done.returncode, out, said


MOMENTS = {
    "unwinding": "while unwinding from the failure",
    "reading the error": "while reading the error",
    "the training loop": "inside the training loop",
}


@pytest.mark.parametrize("where", list(MOMENTS))
def test_a_sigterm_before_the_report_still_names_the_dead_rank(where) -> None:
    code, out, said = _run("ended", "installed", where)
    assert (code, said) == (1, [LINE.format(out[0])])
    record(
        "a rank killed",
        "the survivor's report (one process, its peer's process ended)",
        f"torchrun's SIGTERM {MOMENTS[where]}",
        True,
    )


def test_a_sigterm_after_another_errors_line_adds_nothing() -> None:
    code, _, said = _run("ended", "installed", "after another error's line")
    assert (code, said) == (2, ["error: data.train: no training file given"])
    record(
        "a rank killed",
        "the survivor's report (one process, its peer's process ended)",
        "torchrun's SIGTERM after another error's line",
        True,
    )


def test_a_forked_worker_is_not_a_rank() -> None:
    code, out, said = _run("ended", "installed", "a forked worker")
    assert (code, out[1:], said) == (0, ["-15"], [])


@pytest.mark.parametrize("peer, handler", [("ended", "not installed"), ("running", "installed")])
def test_without_the_handler_or_a_dead_peer_sigterm_ends_the_process(peer, handler) -> None:
    """Negative controls: without the handler the signal ends the process with no line (what
    happened before); with every peer running, a SIGTERM is a plain stop, as by default."""
    code, _, said = _run(peer, handler, "unwinding")
    assert (code, said) == (-15, [])


def test_one_process_keeps_its_sigterm_after_an_error(monkeypatch) -> None:
    """Outside torchrun an error's line leaves SIGTERM as it was (a process that ignored it
    would pass that on to every process it starts)."""

    def command():
        raise InputError("data.train: no training file given")

    monkeypatch.delenv("WORLD_SIZE", raising=False)
    before = signal.getsignal(signal.SIGTERM)
    with pytest.raises(typer.Exit):
        guarded(command)()
    assert signal.getsignal(signal.SIGTERM) is before
    monkeypatch.setenv("WORLD_SIZE", "2")  # the control: as a rank under torchrun
    try:
        with pytest.raises(typer.Exit):
            guarded(command)()
        assert signal.getsignal(signal.SIGTERM) is signal.SIG_IGN
    finally:
        signal.signal(signal.SIGTERM, before)
