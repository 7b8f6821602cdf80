"""Towers compiled by ``torch.compile``, with dropout masks GradCache can replay.

Each tower's forward is compiled in place (``nn.Module.compile``: the module, its parameters and
what it saves stay the same). Inductor draws random numbers with its own generator unless told
to fall back to PyTorch's: :func:`compile_towers` sets that fallback, so a compiled forward
draws its dropout masks from the global RNG as an eager one does, and the RNG state GradCache
records before a chunk's graph-less forward gives its re-forward the same masks. Shapes are
compiled as they come (``dynamic=False``): give the engine a ``length_bucket`` so that a step's
chunks take few widths. On CUDA, ``mode="reduce-overhead"`` replays each shape as a CUDA graph.
"""

from __future__ import annotations

import torch
from torch import nn

from dpr_cache.model.attention import distinct

__all__ = [
    "COMPILE_MODES",
    "COMPILED_BUCKET",
    "compile_towers",
    "compile_mode_for",
    "compiles",
]

COMPILE_MODES = ("default", "reduce-overhead", "max-autotune-no-cudagraphs")

RECOMPILE_LIMIT = 256
"""Graphs a compiled tower may hold before falling back to eager (torch's default is 8)."""

COMPILED_BUCKET = 32
"""Chunk widths are rounded up to a multiple of this when compiled towers are given none:
a 256-token passage tower then compiles at most 8 widths."""


def compiles(setting: str) -> bool:
    """Whether ``train.compile`` (``auto | on | off``) compiles. ``auto`` is off on every
    device: on the CPU compiled towers cost half as much a chunk but more a step at few chunks,
    and every new shape compiles anew, for seconds (docs/bench/chunk_cost.md); on CUDA no
    measurement has decided it yet."""
    return setting == "on"


def compile_mode_for(device: torch.device) -> str:
    """The mode towers are compiled in on ``device``: CUDA graphs on CUDA, else the default."""
    return "reduce-overhead" if device.type == "cuda" else "default"


def compile_towers(towers: list[nn.Module], mode: str = "default") -> int:
    """Compile each distinct tower of ``towers`` in place; return how many were compiled."""
    if mode not in COMPILE_MODES:
        raise ValueError(f"compile mode must be one of {COMPILE_MODES}, got {mode!r}")
    import torch._dynamo.config as dynamo
    import torch._inductor.config as inductor

    # for the whole process: masks from the global RNG, replayed as eager ones are
    inductor.fallback_random = True
    # one graph a shape and grad mode: chunk widths x row counts x (graph-less, re-forward)
    dynamo.recompile_limit = max(dynamo.recompile_limit, RECOMPILE_LIMIT)
    compiled = 0
    for tower in distinct(towers):
        tower.compile(dynamic=False, mode=mode)
        compiled += 1
    return compiled
