"""The tests' fork server: a forked command answers as a fresh interpreter does (exit code,
stdout, stderr, working folder), a command out of time is killed and the server serves on, and a
command in another environment is not forked."""

from __future__ import annotations

import shutil
import subprocess
import sys

import pytest

from dpr_cache.runtime.processes import child_env
from tests.support.fixtures import REPO
from tests.support.forkserver import ForkServer


@pytest.fixture(scope="module")
def server():
    started = ForkServer(child_env(), REPO)
    yield started
    started.close()


def _fresh(args: list[str], cwd) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, "-m", "dpr_cache", *args],
        cwd=cwd,
        env=child_env(),
        capture_output=True,
        text=True,
        timeout=300,
    )


@pytest.mark.parametrize(
    "args",
    [
        ["train", "--config", "configs/toy.yaml", "--set", "train.bogus=1"],  # exit 2, one line
        ["eval", "--help"],  # exit 0, stdout
        ["no-such-command"],  # Click's usage error, exit 2
    ],
)
def test_a_forked_command_answers_as_a_fresh_interpreter(server, tmp_path, args):
    shutil.copytree(REPO / "configs", tmp_path / "configs")  # relative to the working folder
    forked = server.run(args, tmp_path, child_env(), timeout=300)
    fresh = _fresh(args, tmp_path)
    assert (forked.returncode, forked.stdout, forked.stderr) == (
        fresh.returncode,
        fresh.stdout,
        fresh.stderr,
    )
    assert forked.stdout or forked.stderr  # it said something: the comparison compared


def test_the_working_folder_is_the_commands(server, tmp_path):
    args = ["train", "--config", "configs/toy.yaml", "--set", "train.bogus=1"]
    elsewhere = server.run(args, tmp_path, child_env(), timeout=300)  # no configs/ there
    assert elsewhere.returncode == 2 and "no such config file" in elsewhere.stderr


def test_a_command_out_of_time_is_killed_and_the_server_serves_on(server, tmp_path):
    args = ["train", "--config", "configs/toy.yaml", "--set", f"output_dir={tmp_path / 'run'}"]
    args += ["--set", f"data.cache_dir={tmp_path / 'cache'}", "--set", "train.max_steps=100000"]
    with pytest.raises(subprocess.TimeoutExpired):
        server.run(args, REPO, child_env(), timeout=3)
    after = server.run(["eval", "--help"], REPO, child_env(), timeout=300)
    assert after.returncode == 0 and "eval" in after.stdout


def test_another_environment_is_not_served(server):
    env = child_env()
    assert ForkServer.may_serve(server.env, {**env, "PYTEST_CURRENT_TEST": "another test (call)"})
    assert not ForkServer.may_serve(server.env, {**env, "OMP_NUM_THREADS": "7"})
    assert not ForkServer.may_serve(server.env, {k: v for k, v in env.items() if k != "PATH"})
