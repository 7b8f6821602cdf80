"""From a tower's last hidden state to one vector a text: DPR's [CLS] or the masked mean."""

from __future__ import annotations

from torch import Tensor

__all__ = ["POOLINGS", "pool"]

POOLINGS = ("cls", "mean")


def pool(hidden: Tensor, attention_mask: Tensor, pooling: str) -> Tensor:
    """[n, seq, d] hidden states and their [n, seq] mask -> [n, d].

    ``cls``: the first position (DPR). ``mean``: the mean over attended positions
    (sentence-transformers); a row with no attended position gives zeros.
    """
    if pooling == "cls":
        return hidden[:, 0]
    if pooling == "mean":
        mask = attention_mask.unsqueeze(-1).to(hidden.dtype)  # [n, seq, 1]
        return (hidden * mask).sum(1) / mask.sum(1).clamp(min=1.0)
    raise ValueError(f"pooling must be one of {POOLINGS}, got {pooling!r}")
