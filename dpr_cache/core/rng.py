"""The random state a chunk is encoded under, captured and replayed: GradCache's re-forward draws
exactly the dropout masks of the graph-less forward."""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from dataclasses import dataclass

import torch
from torch import Tensor

from dpr_cache.core.inputs import Inputs

__all__ = ["RngState", "cuda_devices"]


def cuda_devices(inputs: Inputs) -> list[int]:
    """The CUDA devices the tensors of ``inputs`` sit on (none on the CPU)."""
    return sorted({t.device.index or 0 for t in inputs.values() if t.device.type == "cuda"})


@dataclass
class RngState:
    """The CPU and CUDA RNG states at one moment, to replay a chunk's dropout exactly."""

    cpu: Tensor
    cuda: dict[int, Tensor]

    @classmethod
    def capture(cls, cuda_devices: list[int]) -> RngState:
        return cls(
            cpu=torch.get_rng_state(),
            cuda={d: torch.cuda.get_rng_state(d) for d in cuda_devices},
        )

    @contextlib.contextmanager
    def replay(self) -> Iterator[None]:
        """Run the block from this state; the global RNG is restored afterwards."""
        with torch.random.fork_rng(devices=list(self.cuda), enabled=True):
            torch.set_rng_state(self.cpu)
            for device, state in self.cuda.items():
                torch.cuda.set_rng_state(state, device)
            yield
