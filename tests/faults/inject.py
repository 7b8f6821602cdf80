"""What the fault tests share: the real commands started as processes, a kill at a chosen moment,
and the checks of what a fault leaves (no file under its final name is partial; a rerun leaves no
temporary behind).

Every injection is recorded (fault, command, where it struck, survived) in ``RECORDS``; the
folder's conftest writes them out (``DPR_CACHE_FAULT_REPORT``).
"""

from __future__ import annotations

import json
import os
import re
import signal
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path

import numpy as np

from dpr_cache.runtime.processes import alive, child_env, rank_process
from tests.support.fixtures import REPO

RECORDS: list[dict] = []
TEMPORARY = re.compile(r".*\.tmp\d+|\.tmp-.*-\d+|\.old-.*-\d+")


def start(*args: str, env: dict | None = None, world: int = 1) -> subprocess.Popen:
    """``python -m dpr_cache ARGS`` (under torchrun with ``world`` > 1) in the background."""
    launcher = [sys.executable]
    if world > 1:
        from dpr_cache.runtime.processes import free_port

        launcher += [
            "-m",
            "torch.distributed.run",
            f"--nproc_per_node={world}",
            "--master_addr=127.0.0.1",
            f"--master_port={free_port()}",
        ]
    full = {**child_env(), **(env or {})}
    if world > 1:
        full["OMP_NUM_THREADS"] = "1"
    return subprocess.Popen(
        [*launcher, "-m", "dpr_cache", *args],
        cwd=REPO,
        env=full,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )


def descendants(pid: int) -> list[int]:
    """The processes ``pid`` started, and theirs (data-loader workers), from /proc."""
    parents: dict[int, list[int]] = {}
    for stat in Path("/proc").glob("[0-9]*/stat"):
        try:
            fields = stat.read_text().rsplit(") ", 1)[1].split()
        except (OSError, IndexError):  # ended while being read
            continue
        parents.setdefault(int(fields[1]), []).append(int(stat.parent.name))
    found, todo = [], [pid]
    while todo:
        children = parents.get(todo.pop(), [])
        found += children
        todo += children
    return found


def kill_when(proc: subprocess.Popen, ready: Callable[[], bool], timeout: float = 300) -> bool:
    """SIGKILL ``proc`` as soon as ``ready()`` holds; False when it ended first. The processes
    it had started (its data-loader workers) must end with it, within seconds."""
    deadline = time.monotonic() + timeout
    while proc.poll() is None:
        if ready():
            children = descendants(proc.pid)
            proc.send_signal(signal.SIGKILL)
            proc.wait()
            _assert_ended(children, proc.args)
            return True
        assert time.monotonic() < deadline, "the kill point was never reached"
        time.sleep(0.005)
    return False


def _assert_ended(pids: list[int], args, wait: float = 10.0) -> None:
    deadline = time.monotonic() + wait
    left = pids
    while left and time.monotonic() < deadline:
        time.sleep(0.1)
        left = [p for p in left if alive(p)]
    for pid in left:
        os.kill(pid, signal.SIGKILL)  # not left running after this test
    assert not left, f"{' '.join(args[2:5])}: processes {left} outlived their parent's kill -9"


def folder_bytes(path: Path) -> int:
    """Bytes of every file under ``path`` (temporaries included: they grow as they are written);
    files and folders renamed or removed while they are counted count nothing."""
    total = 0
    for folder, _, files in os.walk(path):  # a folder gone before it is listed is skipped
        for name in files:
            try:
                total += os.stat(os.path.join(folder, name)).st_size
            except FileNotFoundError:
                pass
    return total


def leftovers(path: Path) -> list[str]:
    """Temporaries (``X.tmp<pid>``, ``.tmp-X-<pid>``, ``.old-X-<pid>``) under ``path``."""
    return sorted(str(p) for p in Path(path).rglob("*") if TEMPORARY.fullmatch(p.name))


def assert_whole(path: Path) -> None:
    """Every file under ``path`` with a final name is whole: JSON parses, a JSON Lines file ends
    its last line, a .npy holds the rows its header says, a TREC run's lines have 6 fields."""
    for p in Path(path).rglob("*"):
        if not p.is_file() or any(TEMPORARY.fullmatch(part) for part in p.parts):
            continue
        if p.suffix == ".json":
            json.loads(p.read_text())
        elif p.suffix == ".jsonl" and p.name != "train_log.jsonl":  # the log's reader drops a
            assert p.read_bytes().endswith(b"\n") or not p.stat().st_size, p  # torn last line
        elif p.suffix == ".npy":
            np.load(p, mmap_mode="r")
        elif p.suffix == ".trec":
            assert all(len(line.split()) == 6 for line in p.read_text().splitlines()), p


def record(fault: str, command: str, where: str, survived: bool, lost_bytes: int = 0) -> None:
    """An injection, with the test file that made it (the table's reproduce command)."""
    test = os.environ.get("PYTEST_CURRENT_TEST", "").split("::")[0]
    RECORDS.append(
        {
            "fault": fault,
            "command": command,
            "where": where,
            "survived": survived,
            "lost_bytes": lost_bytes,
            "test": test,
        }
    )


VOLATILE = {
    "timings",
    "seconds",
    "seconds_by_stage",
    "started",
    "build_seconds",
    "encode_seconds",
    "passages_per_second",
    "pairs_per_second",
    "peak_memory_bytes",
    "load_average_at_start",
}


def _steady(obj):
    """``obj`` without the keys that time or measure the machine."""
    if isinstance(obj, dict):
        return {k: _steady(v) for k, v in obj.items() if k not in VOLATILE}
    if isinstance(obj, list):
        return [_steady(v) for v in obj]
    return obj


def digest(path: Path, skip: tuple[str, ...] = ("tensorboard", "checkpoints")) -> dict[str, str]:
    """A fingerprint of every output under ``path`` (relative name -> sha256 of its content, times
    and measurements left out; locks, temporaries and the ``skip`` folders left out)."""
    import hashlib

    out = {}
    for p in sorted(Path(path).rglob("*")):
        rel = p.relative_to(path)
        if not p.is_file() or p.name.endswith(".lock") or TEMPORARY.fullmatch(p.name):
            continue
        if rel.parts[0] in skip or p.name == "timings.json":
            continue
        data = p.read_bytes()
        if p.suffix == ".json":
            data = json.dumps(_steady(json.loads(data)), sort_keys=True).encode()
        elif p.name == "train_log.jsonl":
            lines = [json.dumps(_steady(json.loads(x)), sort_keys=True) for x in data.splitlines()]
            data = "\n".join(lines).encode()
        out[str(rel)] = hashlib.sha256(data).hexdigest()
    return out


def freeze_rank_1(agent: subprocess.Popen, limit: float = 120) -> tuple[int, float, str]:
    """SIGSTOP rank 1 of a 2-rank torchrun ``agent`` (as a lost node: it closes no connection)
    and wait, up to ``limit`` s, for rank 0 to end; then SIGKILL rank 1 (what the agent would
    wait 30 s more for). Rank 1's pid, the seconds rank 0 lasted, the agent's stderr."""
    frozen, survivor = rank_process(agent.pid, 1), rank_process(agent.pid, 0)
    assert frozen and survivor
    os.kill(frozen, signal.SIGSTOP)
    frozen_at = time.monotonic()
    while os.path.exists(f"/proc/{survivor}") and time.monotonic() - frozen_at < limit:
        time.sleep(0.1)
    gave_up_in = time.monotonic() - frozen_at
    os.kill(frozen, signal.SIGKILL)
    _, err = agent.communicate(timeout=120)
    return frozen, gave_up_in, err


def damage(path: Path, how: str) -> None:
    """``path`` cut to half its bytes (``truncated``) or one bit flipped in its middle."""
    data = bytearray(path.read_bytes())
    if how == "truncated":
        data = data[: len(data) // 2]
    else:
        data[len(data) // 2] ^= 0x10
    path.write_bytes(bytes(data))
