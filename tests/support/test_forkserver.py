"""The tests' fork server: a forked command answers as a fresh interpreter does (exit code,
stdout, stderr, working folder), a command out of time is killed and the server serves on, and a
command in another environment is not forked; the suite's own commands are forked whatever the
test modules' imports set, and what a test sets in passing is undone after it. Its stand-ins for
``python`` and ``dpr-cache``: the same answers through a script's own streams
(KeyboardInterrupt's end by SIGINT, a last flush, the caller's umask and ignored signals, a file
left open), signals relayed both ways, commands side by side, and a child that outlives its
client killed."""

from __future__ import annotations

import importlib
import os
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from dpr_cache.runtime.processes import child_env
from dpr_cache.runtime.quiet import QUIET_ENV
from tests.support import cli
from tests.support.fixtures import REPO
from tests.support.forkserver import ForkServer, may_serve

# A test module's import that sets variables read as modules are imported (scikit-learn sets
# KMP_DUPLICATE_LIB_OK and KMP_INIT_AT_FORK), made here after tests.support.cli is imported, as
# collecting the whole suite makes them.
importlib.import_module("sklearn")


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
    forked = server.run(["-m", "dpr_cache", *args], tmp_path, child_env(), timeout=300)
    fresh = _fresh(args, tmp_path)
    assert (forked.returncode, forked.stdout, forked.stderr) == (
        fresh.returncode,
        fresh.stdout,
        fresh.stderr,
    )
    assert forked.stdout or forked.stderr  # it said something: the comparison compared


def test_the_suites_commands_are_forked_whatever_the_test_modules_imports_set():
    assert "KMP_INIT_AT_FORK" in os.environ  # the import above set it: the case is real
    before = cli.commands_forked()
    done = cli.run_cli("eval", "--help")
    assert done.returncode == 0 and "eval" in done.stdout
    assert cli.commands_forked() == before + 1


def test_a_test_sets_a_variable_read_at_import_in_passing():
    os.environ["OMP_DISPLAY_ENV"] = "TRUE"  # as torch's compiler sets its cache folder's
    assert may_serve(child_env(), child_env()) and not may_serve(cli._server_env(), child_env())


def test_the_next_test_runs_in_the_environment_as_collected():
    """The test before set OMP_DISPLAY_ENV and left it: tests/conftest.py undid it."""
    assert "OMP_DISPLAY_ENV" not in os.environ
    before = cli.commands_forked()
    cli.run_cli("eval", "--help")
    assert cli.commands_forked() == before + 1


def test_the_working_folder_is_the_commands(server, tmp_path):
    args = ["train", "--config", "configs/toy.yaml", "--set", "train.bogus=1"]
    elsewhere = server.run(
        ["-m", "dpr_cache", *args], tmp_path, child_env(), timeout=300
    )  # no configs/ there
    assert elsewhere.returncode == 2 and "no such config file" in elsewhere.stderr


def test_a_command_out_of_time_is_killed_and_the_server_serves_on(server, tmp_path):
    args = ["train", "--config", "configs/toy.yaml", "--set", f"output_dir={tmp_path / 'run'}"]
    args += ["--set", f"data.cache_dir={tmp_path / 'cache'}", "--set", "train.max_steps=100000"]
    with pytest.raises(subprocess.TimeoutExpired):
        server.run(["-m", "dpr_cache", *args], REPO, child_env(), timeout=3)
    after = server.run(["-m", "dpr_cache", "eval", "--help"], REPO, child_env(), timeout=300)
    assert after.returncode == 0 and "eval" in after.stdout


def test_another_environment_is_not_served(server):
    env = child_env()
    assert may_serve(server.env, {**env, "PYTEST_CURRENT_TEST": "another test (call)"})
    assert may_serve(server.env, {**env, "OUT": "/somewhere", "SEEDS": "1 2"})  # a script's own
    assert may_serve(server.env, {**env, **QUIET_ENV})  # set in this process by in-process CLIs
    assert not may_serve(server.env, {**env, "OMP_NUM_THREADS": "7"})
    assert not may_serve(server.env, {**env, "PYTHONPATH": "/elsewhere"})
    assert not may_serve(server.env, {k: v for k, v in env.items() if k != "PYTHONPATH"})
    assert not may_serve(server.env, {**env, "DPR_CACHE_TESTS_FORK": "0"})
    assert server.run(["-c", "pass"], REPO, {**env, "OMP_NUM_THREADS": "7"}, timeout=60) is None


_SHOW = "import os, sys; print(sys.argv, sys.path[0], os.getcwd(), os.environ.get('OUT'))"


@pytest.mark.parametrize(
    "argv, stdin",
    [
        (["-c", _SHOW, "a", "b c"], ""),
        (["-c", "import sys; sys.exit('no: ' + sys.stdin.read())"], "from stdin"),  # exit 1
        (["-c", "raise SystemExit(3)"], ""),
        (["-c", "1 / 0"], ""),  # a traceback
        (["-c", "raise KeyboardInterrupt"], ""),  # a traceback, then the end by SIGINT
        (["-c", "import sys; sys.stdout.write('no newline')"], ""),  # flushed at the end
        (["-m", "json.tool", "--sort-keys"], '{"b": 1, "a": [2]}'),
        (["-m", "no_such_module_here"], ""),
    ],
)
def test_the_stand_in_answers_as_python_does(server, tmp_path, argv, stdin):
    env = {**child_env(), "OUT": str(tmp_path)}
    got, want = (
        subprocess.run(
            [python, *argv], cwd=tmp_path, env=env, input=stdin, capture_output=True, text=True
        )
        for python in (str(server.python()), sys.executable)
    )
    assert (got.returncode, got.stdout, got.stderr) == (want.returncode, want.stdout, want.stderr)
    assert got.stdout or got.stderr or got.returncode  # it did something: the comparison compared


def test_the_stand_in_keeps_what_the_caller_set_and_closes_what_the_command_left_open(
    server, tmp_path
):
    """The caller's umask and ignored signals hold in the child (a ``nohup`` or ``&`` job); a
    file the command left open is written out as the interpreter's end would."""
    show = (
        "import os, signal; print(os.umask(0), signal.getsignal(signal.SIGHUP) is signal.SIG_IGN)"
    )

    def caller() -> None:
        os.umask(0o027)
        signal.signal(signal.SIGHUP, signal.SIG_IGN)

    got, want = (
        subprocess.run(
            [python, "-c", show], env=child_env(), preexec_fn=caller, capture_output=True, text=True
        )
        for python in (str(server.python()), sys.executable)
    )
    assert got.stdout == want.stdout == "23 True\n"
    left_open = "f = open('left-open', 'w'); f.write('written')"
    subprocess.run([str(server.python()), "-c", left_open], cwd=tmp_path, env=child_env())
    assert (tmp_path / "left-open").read_text() == "written"


@pytest.mark.parametrize("args", [["--help"], ["no-such-command"], ["eval", "--bogus"]])
def test_the_dpr_cache_stand_in_answers_as_the_installed_command(server, args):
    installed = Path(sys.executable).parent / "dpr-cache"
    got, want = (
        subprocess.run([str(command), *args], env=child_env(), capture_output=True, text=True)
        for command in (server.dpr_cache(), installed)
    )
    assert (got.returncode, got.stdout, got.stderr) == (want.returncode, want.stdout, want.stderr)
    assert "dpr-cache" in got.stdout + got.stderr  # named as installed, not python -m dpr_cache


def _parent_of(python: str, env: dict[str, str]) -> int:
    done = subprocess.run(
        [python, "-c", "import os; print(os.getppid())"], env=env, capture_output=True, text=True
    )
    return int(done.stdout)


def test_the_stand_in_forks_only_what_it_may(server):
    python, env = str(server.python()), child_env()
    assert _parent_of(python, env) == server.proc.pid  # forked by the server
    for other in ({**env, "OMP_NUM_THREADS": "7"}, {**env, "DPR_CACHE_TESTS_FORK": "0"}):
        assert _parent_of(python, other) == os.getpid()  # the stand-in became python
    done = subprocess.run([python, "-S", "-c", "print(1)"], capture_output=True, text=True)
    assert done.stdout == "1\n"  # options it does not serve: python itself


def test_signals_are_relayed_both_ways(server, tmp_path):
    """SIGTERM to the stand-in reaches the child, which ends by it, and so does the stand-in;
    a stand-in killed outright takes its child with it; a child killed outright ends its
    stand-in the same way."""
    code = "import os, time; print(os.getpid(), flush=True); time.sleep(120)"
    for signum in (signal.SIGTERM, signal.SIGKILL):
        client = subprocess.Popen(
            [str(server.python()), "-c", code], env=child_env(), stdout=subprocess.PIPE, text=True
        )
        child = int(client.stdout.readline())
        assert child != client.pid  # forked, not python itself
        client.send_signal(signum)
        assert client.wait(timeout=30) == -signum
        _wait_gone(child)
    client = subprocess.Popen(
        [str(server.python()), "-c", code], env=child_env(), stdout=subprocess.PIPE, text=True
    )
    os.kill(int(client.stdout.readline()), signal.SIGKILL)  # the child killed outright
    assert client.wait(timeout=30) == -signal.SIGKILL
    assert server.alive()


def _wait_gone(pid: int) -> None:
    for _ in range(300):
        try:
            os.kill(pid, 0)
        except ProcessLookupError:
            return
        time.sleep(0.1)
    raise AssertionError(f"process {pid} still runs")


def test_commands_run_side_by_side(server, tmp_path):
    """Two commands at once: the second starts while the first waits for it."""
    flag = tmp_path / "flag"
    waits = (
        f"import pathlib, time\nwhile not pathlib.Path({str(flag)!r}).exists(): time.sleep(0.05)"
    )
    python = str(server.python())
    first = subprocess.Popen([python, "-c", waits], env=child_env())
    second = subprocess.run(
        [python, "-c", f"open({str(flag)!r}, 'w')"], env=child_env(), timeout=60
    )
    assert second.returncode == 0 and first.wait(timeout=60) == 0
