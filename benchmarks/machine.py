"""What a benchmark ran on: the CPU (model and vector flags: machines here differ), cores, RAM,
the load, library versions, and this machine's plain float32 matmul rate."""

from __future__ import annotations

import os
import platform
import time
from pathlib import Path

import numpy as np

__all__ = [
    "cpu_info",
    "cpu_text",
    "machine_info",
    "load_average",
    "matmul_gflops",
    "proc_field",
    "transparent_hugepages",
]

_FLAG_PREFIXES = ("avx", "fma", "amx", "sse4", "f16c")


def proc_field(path: str, key: str) -> str | None:
    """The value of the first ``key: value`` line of a ``/proc`` file starting with ``key``;
    None where the file or the line is missing."""
    try:
        for line in Path(path).read_text().splitlines():
            if line.startswith(key):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return None


def transparent_hugepages() -> str | None:
    """The kernel's transparent huge page mode (``always [madvise] never``: the bracketed one
    holds); with ``always``, every touched 2 MB of anonymous memory may be resident whole."""
    try:
        return Path("/sys/kernel/mm/transparent_hugepage/enabled").read_text().strip()
    except OSError:
        return None


def cpu_info() -> dict:
    """CPU model, its vector-instruction flags, cores, RAM (Linux ``/proc``) and the transparent
    huge page mode (it sets what a resident-memory figure counts)."""
    flags = (proc_field("/proc/cpuinfo", "flags") or "").split()
    mem = proc_field("/proc/meminfo", "MemTotal")
    return {
        "cpu": proc_field("/proc/cpuinfo", "model name") or platform.processor(),
        "flags": [f for f in flags if f.startswith(_FLAG_PREFIXES)],
        "cores": os.cpu_count(),
        "ram_gb": round(int(mem.split()[0]) * 1024 / 1e9, 1) if mem else None,
        "transparent_hugepage": transparent_hugepages(),
    }


def cpu_text(info: dict) -> str:
    """One line for a report: CPU model, cores, RAM and vector flags, from :func:`cpu_info`."""
    ram = f"{info['ram_gb']:g} GB" if info.get("ram_gb") else "unknown"
    flags = " ".join(info.get("flags") or []) or "none listed"
    return f"{info.get('cpu')}, {info.get('cores')} cores, {ram} RAM; vector flags: {flags}"


def load_average() -> tuple[float, float, float] | None:
    """The 1, 5 and 15 minute load averages (other jobs distort timings), where the OS has them."""
    return os.getloadavg() if hasattr(os, "getloadavg") else None


def machine_info(device: str, threads: int | None) -> dict:
    """:func:`cpu_info` with the torch threads, device, versions and load (training benches)."""
    import torch
    import transformers

    return {
        **cpu_info(),
        "threads": threads or torch.get_num_threads(),
        "device": device,
        "torch": torch.__version__,
        "transformers": transformers.__version__,
        "python": platform.python_version(),
        "platform": platform.platform(),
        "load_average": load_average(),
    }


def matmul_gflops(rows: int, dim: int, cols: int = 65_536, seconds: float = 20.0) -> float:
    """Plain float32 ``[rows, dim] @ [dim, cols]`` GFLOP/s with numpy's BLAS, over ``seconds``."""
    rng = np.random.default_rng(0)
    a = rng.standard_normal((rows, dim)).astype(np.float32)
    b = rng.standard_normal((dim, cols)).astype(np.float32)
    a @ b  # warm-up
    runs, start = 0, time.perf_counter()
    while time.perf_counter() - start < seconds:
        a @ b
        runs += 1
    return 2 * rows * dim * cols * runs / (time.perf_counter() - start) / 1e9
