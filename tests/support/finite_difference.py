"""A directional finite-difference check of a gradient, for float64 tests."""

from __future__ import annotations

from collections.abc import Callable

import torch
from torch import nn

__all__ = ["directional_error"]


def directional_error(
    model: nn.Module, loss: Callable[[], torch.Tensor], eps: float = 1e-6
) -> float:
    """|FD - analytic| / |analytic| along one random direction in parameter space.

    ``loss`` computes the loss and fills ``.grad`` (zeroing it first); it must draw the same
    randomness each call (seed inside it). Central differences: the truncation error is
    O(eps^2), so in float64 ``eps`` 1e-6 leaves about 1e-8."""
    loss()
    params = [p for p in model.parameters() if p.requires_grad]
    gen = torch.Generator().manual_seed(5)
    direction = [torch.randn(p.shape, generator=gen, dtype=p.dtype) for p in params]
    analytic = sum((p.grad * d).sum() for p, d in zip(params, direction, strict=True)).item()
    values = []
    for sign in (1, -1):
        with torch.no_grad():
            for p, d in zip(params, direction, strict=True):
                p.add_(sign * eps * d)
        values.append(loss().item())
        with torch.no_grad():
            for p, d in zip(params, direction, strict=True):
                p.sub_(sign * eps * d)
    numeric = (values[0] - values[1]) / (2 * eps)
    return abs(numeric - analytic) / abs(analytic)
