"""CPU seconds a test spent, for finding where the suite's time goes (``DPR_CACHE_TESTS_CPU``):
this process's, its reaped children's and the fork server's reaped children's."""

from __future__ import annotations

import json
import os
import resource
import time

from tests.support import cli

__all__ = ["cpu_seconds", "record"]


def _server_children() -> float:
    """The fork server's reaped children's CPU seconds (``cutime + cstime`` of /proc/PID/stat)."""
    server = cli._server
    if server is None or not server.alive():
        return 0.0
    with open(f"/proc/{server.proc.pid}/stat") as f:
        fields = f.read().rsplit(") ", 1)[1].split()
    return (int(fields[13]) + int(fields[14])) / os.sysconf("SC_CLK_TCK")


def cpu_seconds() -> dict[str, float]:
    own = resource.getrusage(resource.RUSAGE_SELF)
    kids = resource.getrusage(resource.RUSAGE_CHILDREN)
    return {
        "wall": time.monotonic(),
        "self": own.ru_utime + own.ru_stime,
        "children": kids.ru_utime + kids.ru_stime,
        "forked": _server_children(),
        "server": cli._server.proc.pid if cli._server is not None else 0,
    }


def record(path: str, test: str, before: dict, after: dict) -> None:
    spent = {k: round(after[k] - before[k], 2) for k in ("wall", "self", "children")}
    same = before["server"] == after["server"]
    spent["forked"] = round(after["forked"] - (before["forked"] if same else 0.0), 2)
    spent["cpu"] = round(spent["self"] + spent["children"] + spent["forked"], 2)
    with open(path, "a") as f:
        f.write(json.dumps({"test": test, **spent}) + "\n")
