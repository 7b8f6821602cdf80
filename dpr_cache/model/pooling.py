"""From a tower's last hidden state to one vector a text: DPR's [CLS], the masked mean, or the
last real token (decoders)."""

from __future__ import annotations

import torch
from torch import Tensor

__all__ = ["POOLINGS", "pool", "last_positions"]

POOLINGS = ("cls", "mean", "last")
"""``model.pooling``'s values (``config.ModelConfig``, which model/ may not import: a test
checks that the two agree)."""


def last_positions(attention_mask: Tensor) -> Tensor:
    """[n] the column of each row's last attended token: right for right padding (the last
    column before the padding) and left padding (the final column) alike; 0 for a row with
    none attended."""
    columns = torch.arange(attention_mask.shape[1], device=attention_mask.device)
    return (attention_mask.ne(0) * columns).amax(dim=1)


def pool(hidden: Tensor, attention_mask: Tensor, pooling: str) -> Tensor:
    """[n, seq, d] hidden states and their [n, seq] mask -> [n, d].

    ``cls``: the first position (DPR). ``mean``: the mean over attended positions
    (sentence-transformers); a row with no attended position gives zeros. ``last``: the
    hidden state of each row's final attended token (RepLLaMA, E5-Mistral; sentence-transformers'
    ``lasttoken``), whichever side the row is padded on.
    """
    if pooling == "cls":
        return hidden[:, 0]
    if pooling == "mean":
        mask = attention_mask.unsqueeze(-1).to(hidden.dtype)  # [n, seq, 1]
        return (hidden * mask).sum(1) / mask.sum(1).clamp(min=1.0)
    if pooling == "last":
        rows = torch.arange(hidden.shape[0], device=hidden.device)
        return hidden[rows, last_positions(attention_mask)]
    raise ValueError(f"pooling must be one of {POOLINGS}, got {pooling!r}")
