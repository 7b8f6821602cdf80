"""Two commands on one output: the second is refused at once with a message naming the holder;
the lock of a holder killed with ``kill -9`` does not stay (the next command takes it)."""

from __future__ import annotations

import subprocess
import sys
import time
from pathlib import Path

import pytest

from tests.faults.inject import kill_when, record, start
from tests.support.cli import bm25_args, encode_args, fork_server_ready, run_cli, toy_overrides
from tests.support.fixtures import TOY


def test_a_second_train_on_one_folder_is_refused_and_a_dead_holder_frees_it(tmp_path) -> None:
    args = [
        "train",
        "--config",
        "configs/toy.yaml",
        "-q",
        *toy_overrides(tmp_path, **{"train.max_steps": 40, "train.checkpoint_every": 2}),
    ]
    fork_server_ready()  # so that the second command below starts at once
    first = start(*args)
    log = tmp_path / "run" / "train_log.jsonl"
    deadline = time.monotonic() + 300
    while not (log.is_file() and log.read_text().count("\n") >= 1):
        assert first.poll() is None and time.monotonic() < deadline, first.stderr.read()
        time.sleep(0.05)
    second = run_cli(*args, "--resume", check=False)
    assert second.returncode == 2 and first.poll() is None  # refused while the holder runs
    [line] = second.stderr.strip().splitlines()
    assert f"in use by pid {first.pid} on" in line and "(dpr-cache train --config" in line
    assert kill_when(first, lambda: True)  # kill -9 the holder
    again = run_cli(*args, "--resume")  # the lock died with its holder
    assert again.returncode == 0 and (tmp_path / "run" / "model").is_dir()
    record("two commands, one folder", "train", "a second train while the first ran", True)


@pytest.fixture(scope="module")
def toy_run(tmp_path_factory) -> Path:
    """A toy model and its index: what encode, index and mine read."""
    root = tmp_path_factory.mktemp("locks")
    sets = toy_overrides(root, **{"train.max_steps": 2})
    run_cli("train", "--config", "configs/toy.yaml", "-q", *sets)
    run_cli("index", "--config", "configs/toy.yaml", "-q", *sets)
    return root


def _hold(target: Path, is_file: bool) -> subprocess.Popen:
    """A process holding the lock of ``target`` until killed."""
    holder = subprocess.Popen(
        [
            sys.executable,
            "-c",
            "import sys, time\n"
            "from dpr_cache.runtime.lock import output_lock\n"
            "with output_lock(sys.argv[1], is_file=sys.argv[2] == 'file'):\n"
            "    print('held', flush=True); time.sleep(600)",
            str(target),
            "file" if is_file else "folder",
        ],
        stdout=subprocess.PIPE,
        text=True,
    )
    assert holder.stdout.readline().strip() == "held"
    return holder


@pytest.mark.parametrize("command", ["encode", "index", "mine", "score"])
def test_a_command_into_an_output_another_process_writes_is_refused(
    tmp_path, toy_run, command
) -> None:
    """A toy encode, index or mine ends before a second command has even started, so the first
    holder here is a process that takes the output's lock and waits: the real command must
    refuse at once, write nothing, then run once the holder is gone."""
    model, cache = toy_run / "run" / "model", ["--cache-dir", str(toy_run / "cache")]
    to_file = command in ("mine", "score")
    out = tmp_path / ("mined.jsonl" if to_file else "out")
    args = {
        "encode": encode_args(model, out, *cache),
        "index": [
            "index",
            "--embeddings",
            str(toy_run / "run" / "index" / "shards" / "*.npy"),
            "--out",
            str(out),
        ],
        "mine": [
            "mine",
            "--model",
            str(model),
            "--index",
            str(toy_run / "run" / "index"),
            "--train",
            str(TOY / "train.jsonl"),
            "--out",
            str(out),
            "--negatives",
            "3",
            "--depth",
            "10",
            *cache,
        ],
        "score": bm25_args("score", out, *cache),
    }[command]
    holder = _hold(out, is_file=to_file)
    second = run_cli(*args, "-q", check=False)
    assert second.returncode == 2 and f"in use by pid {holder.pid}" in second.stderr
    written = [p.name for p in tmp_path.rglob("*") if not p.name.endswith(".lock")]
    assert written == ([] if to_file else ["out"]), written  # the lock's folder only
    assert kill_when(holder, lambda: True)
    assert run_cli(*args, "-q").returncode == 0 and out.exists()
    record("two commands, one folder", command, f"a second {command} into the same output", True)
