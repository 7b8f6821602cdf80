"""Memory readings (this process as the kernel counts it, or the CUDA allocator's peak) and
handing freed heap back to the operating system.

``rss_bytes`` / ``peak_rss_bytes`` read the current and peak resident set size;
``peak_memory_bytes`` is the one device-aware reading (trainer's log, benchmarks, probes).
``memory_limit`` turns a memory budget (``index.memory_gb``, given or
unset) into the bound on this process's resident memory that searches and index builds plan
under. ``trim`` calls glibc's ``malloc_trim``: on CPU, glibc keeps the pages
of freed tensors that sit below live ones; GradCache's graph-less first pass frees many such
buffers just before the kept graphs are built, so without a trim its peak resident memory
carries that slack (about 10% on a 2-core run of all-MiniLM-L6-v2). A no-op where glibc is not
the allocator.
"""

from __future__ import annotations

import ctypes
import functools
import math
import os
import sys

from dpr_cache.errors import InputError

__all__ = [
    "HEADROOM_GB",
    "trim",
    "rss_bytes",
    "peak_rss_bytes",
    "peak_memory_bytes",
    "memory_limit",
]

HEADROOM_GB = 4.0  # what an unset memory budget lets the process add to what it holds


@functools.cache
def _malloc_trim():
    if not sys.platform.startswith("linux"):
        return None
    try:
        return ctypes.CDLL("libc.so.6").malloc_trim
    except (OSError, AttributeError):
        return None


def trim() -> bool:
    """Release free heap pages; True if glibc's ``malloc_trim`` ran."""
    fn = _malloc_trim()
    if fn is None:
        return False
    fn(0)
    return True


def rss_bytes() -> int:
    """Current resident set size of this process (Linux ``/proc``); 0 where unavailable."""
    try:
        with open("/proc/self/statm") as f:
            return int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")
    except (OSError, ValueError, IndexError):
        return 0


def peak_rss_bytes() -> int:
    """Peak resident set size of this process (``ru_maxrss``, KiB on Linux)."""
    import resource

    return int(resource.getrusage(resource.RUSAGE_SELF).ru_maxrss) * 1024


def peak_memory_bytes(device=None) -> int:
    """Peak allocated CUDA memory on a CUDA ``device``, else this process's peak RSS."""
    if device is not None:
        import torch

        device = torch.device(device)
        if device.type == "cuda":
            return int(torch.cuda.max_memory_allocated(device))
    return peak_rss_bytes()


def memory_limit(memory_gb: float | None) -> int:
    """The bound on this process's resident memory, in bytes: ``memory_gb`` (10^9 bytes) when
    given, else what the process holds now plus ``HEADROOM_GB``, since what a process holds
    before its first block (libraries, a device's runtime) differs by machine and no block size
    gives it back. A command resolves it once, when its first search or index build begins
    (after its model has encoded), and plans under that number throughout."""
    if memory_gb is None:
        return rss_bytes() + int(HEADROOM_GB * 1e9)
    if not 0 < memory_gb < math.inf:
        raise InputError(f"--memory-gb / index.memory_gb {memory_gb}: give a number of GB above 0")
    return int(memory_gb * 1e9)
