"""Who holds the GPU's memory while the suite runs: a thread that reads, twice a second, the
device's memory in use (``cudaMemGetInfo``, every process together) and the share this process's
CUDA allocator has reserved, under the name of the section running; and every few seconds the
processes ``nvidia-smi`` names with their memory and command lines. A command beside the
sections that runs out of device memory is then traced to the section, or the process, that held
it.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import threading
import time
from pathlib import Path

import torch

from benchmarks.harness import proc_field

__all__ = ["DeviceWatch", "summarize", "parse_compute_apps"]

GB = 1e9
FULL_BYTES = 2**30  # under this much free, a moment is counted as the device being full
SMI_TIMEOUT_S = 5


class DeviceWatch:
    """Samples of ``(seconds since start, section, bytes in use, bytes this process reserved)``
    and the largest memory ``nvidia-smi`` saw each process hold."""

    def __init__(self, device: torch.device, start: float, every_s: float = 0.5):
        self.device, self.start, self.every_s = device, start, every_s
        self.section = "start"
        self.samples: list[tuple[float, str, int, int]] = []
        self.processes: dict[int, dict] = {}
        self.total = torch.cuda.mem_get_info(device)[1]
        self._stop = threading.Event()
        self._lock = threading.Lock()  # the samples and processes, read by end() while written
        self._thread = threading.Thread(target=self._run, name="device-watch", daemon=True)
        self._smi = shutil.which("nvidia-smi")

    @classmethod
    def begin_on(
        cls, device: torch.device, start: float, every_s: float = 0.5
    ) -> DeviceWatch | None:
        """A watch of ``device`` started now; None where it is no CUDA device this process
        can read."""
        if device.type != "cuda" or not torch.cuda.is_available():
            return None
        watch = cls(device, start, every_s)
        watch._thread.start()
        return watch

    def summary(self) -> dict:
        """What the readings so far show (:func:`summarize`)."""
        with self._lock:
            return summarize(self.samples, self.total, self.processes)

    def end(self) -> dict:
        self._stop.set()
        self._thread.join(SMI_TIMEOUT_S + 5)
        return self.summary()

    def _run(self) -> None:
        polls = 0
        while not self._stop.wait(self.every_s):
            try:
                free, _ = torch.cuda.mem_get_info(self.device)
                mine = torch.cuda.memory_reserved(self.device)
            except RuntimeError:
                continue
            t = round(time.monotonic() - self.start, 1)
            with self._lock:
                self.samples.append((t, self.section, self.total - free, mine))
            polls += 1
            if self._smi and polls % 6 == 1:
                self._poll_processes(t)

    def _poll_processes(self, t: float) -> None:
        query = [self._smi, "--query-compute-apps=pid,used_memory", "--format=csv,noheader"]
        try:
            run = subprocess.run(query, capture_output=True, text=True, timeout=SMI_TIMEOUT_S)
        except (OSError, subprocess.SubprocessError):
            return
        for pid, used in parse_compute_apps(run.stdout):
            command = _command_line(pid) if pid not in self.processes else None
            with self._lock:
                seen = self.processes.setdefault(pid, {"peak_bytes": 0, "first_s": t})
                seen["last_s"] = t
                if used > seen["peak_bytes"]:
                    seen.update(peak_bytes=used, peak_s=t, section=self.section)
                seen.setdefault("command", command)


def parse_compute_apps(text: str) -> list[tuple[int, int]]:
    """``(pid, bytes)`` from ``nvidia-smi --query-compute-apps=pid,used_memory
    --format=csv,noheader`` (lines ``1234, 5678 MiB``); lines it cannot read are left out."""
    rows = []
    for line in text.splitlines():
        parts = [p.strip() for p in line.split(",")]
        if len(parts) != 2 or not parts[0].isdigit():
            continue
        value, _, unit = parts[1].partition(" ")
        scale = {"MiB": 2**20, "GiB": 2**30, "KiB": 2**10}.get(unit)
        if scale is None or not value.replace(".", "", 1).isdigit():
            continue
        rows.append((int(parts[0]), int(float(value) * scale)))
    return rows


def _command_line(pid: int) -> str | None:
    """The command line of ``pid`` where it is this process or one it started (``nvidia-smi``
    may report another namespace's ids, which name some other process here); else None."""
    if not _ours(pid):
        return None
    try:
        raw = Path(f"/proc/{pid}/cmdline").read_bytes()
    except OSError:
        return None
    return raw.replace(b"\0", b" ").decode(errors="replace").strip()[:200] or None


def _ours(pid: int) -> bool:
    """Whether ``pid`` is this process or descends from it (its parents read from ``/proc``)."""
    me = os.getpid()
    for _ in range(64):
        if pid == me:
            return True
        if pid <= 1:
            return False
        ppid = proc_field(f"/proc/{pid}/status", "PPid:")
        if ppid is None:
            return False
        pid = int(ppid)
    return False


def summarize(samples: list[tuple[float, str, int, int]], total: int, processes: dict) -> dict:
    """Per section, the most memory in use on the device and this process's reserved share at
    that moment; the moments with under ``FULL_BYTES`` free, by section; a reading a second
    (for gpu.json, to line up with the commands' times); each process ``nvidia-smi`` named,
    largest first."""
    sections: dict[str, dict] = {}
    full: dict[str, int] = {}
    for t, section, used, mine in samples:
        row = sections.setdefault(section, {"samples": 0, "peak_used_gb": -1.0})
        row["samples"] += 1
        if used / GB > row["peak_used_gb"]:
            row.update(peak_used_gb=round(used / GB, 2), own_gb=round(mine / GB, 2), at_s=t)
        if total - used < FULL_BYTES:
            full[section] = full.get(section, 0) + 1
    named = sorted(processes.items(), key=lambda item: -item[1]["peak_bytes"])
    series, second = [], None  # the first reading of each whole second
    for t, _, used, mine in samples:
        if int(t) != second:
            second = int(t)
            series.append([t, round(used / GB, 2), round(mine / GB, 2)])
    return {
        "total_gb": round(total / GB, 2),
        "series": series,  # [seconds, GB in use, the suite's own GB]
        "sections": sections,
        "full_samples": full,
        "processes": [
            {
                "pid": pid,
                **{k: v for k, v in p.items() if k != "peak_bytes"},
                "peak_gb": round(p["peak_bytes"] / GB, 2),
            }
            for pid, p in named
        ],
    }
