"""Dropout with masks drawn four times faster on a CPU, for every dropout of a BERT tower.

PyTorch's CPU dropout draws one Bernoulli sample per element from its Mersenne Twister; in a
MiniLM training step that is a large share of a forward. Here one 64-bit draw of the same
generator (``Tensor.random_``) gives four 15-bit uniforms, each compared with ``p`` rounded to a
multiple of 2**-15 (0.1 -> 3277/32768 = 0.100006). The masks come from the global RNG, so
GradCache's replay of each chunk's RNG state redraws them exactly in the re-forward, on CPU and
CUDA alike. A backward keeps the boolean mask, as PyTorch's dropout does.

:func:`use_fast_dropout` swaps a tower's ``nn.Dropout`` modules for :class:`FastDropout` and
its attention for :func:`attention_with_fast_dropout` (a registered transformers attention
implementation: scores, softmax, this dropout, values; plain SDPA without dropout, as in eval
mode; its padding mask is transformers' SDPA mask, causal for decoders, whose grouped key and
value heads it repeats as SDPA does). LoRA's dropout modules (peft's, ``nn.Dropout``) are
swapped with the rest. Nothing saved
changes: the modules hold no weights and the attention implementation is not written to
``config.json``.
"""

from __future__ import annotations

import math

import torch
from torch import Tensor, nn

from dpr_cache.model.attention import distinct, register

__all__ = ["FastDropout", "fast_dropout", "keep_mask", "use_fast_dropout", "ATTENTION_NAME"]

ATTENTION_NAME = "dpr_cache_fast_dropout"
_LEVELS = 1 << 15  # uniforms per draw: 15 bits


def keep_mask(shape: torch.Size | tuple[int, ...], p: float, device: torch.device) -> Tensor:
    """A boolean mask of ``shape``, each element kept with probability ``1 - p`` (``p`` rounded to
    a multiple of 2**-15), from the global RNG of ``device``."""
    n = math.prod(shape)
    words = torch.empty((n + 3) // 4, dtype=torch.int64, device=device).random_()  # 63 bits each
    draws = words.view(torch.int16)[:n] & (_LEVELS - 1)  # four uniform 15-bit values a word
    return (draws >= round(p * _LEVELS)).view(shape)


def fast_dropout(x: Tensor, p: float, training: bool = True) -> Tensor:
    """``x`` with each element zeroed with probability ``p`` and the rest scaled by 1/(1-p)."""
    if not training or p == 0.0:
        return x
    if p >= 1.0:
        return x * 0.0
    # autograd's own nodes: where's backward keeps the boolean mask, as PyTorch's dropout does
    return torch.where(keep_mask(x.shape, p, x.device), x, 0).mul_(1.0 / (1.0 - p))


class FastDropout(nn.Dropout):
    """``nn.Dropout`` drawing its mask with :func:`keep_mask`."""

    def forward(self, x: Tensor) -> Tensor:
        return fast_dropout(x, self.p, self.training)


def attention_with_fast_dropout(
    module: nn.Module,
    query: Tensor,  # [batch, heads, q_len, head_dim]
    key: Tensor,  # [batch, heads, k_len, head_dim]
    value: Tensor,  # [batch, heads, k_len, head_dim]
    attention_mask: Tensor | None,  # bool (True: attend) or additive, [batch, 1, q_len, k_len]
    scaling: float | None = None,
    dropout: float = 0.0,
    **kwargs,
) -> tuple[Tensor, None]:
    """Softmax attention with :func:`fast_dropout` on the probabilities; SDPA when no dropout."""
    from transformers.integrations.sdpa_attention import sdpa_attention_forward

    if dropout >= 1.0 and module.training:
        return torch.zeros_like(query).transpose(1, 2).contiguous(), None
    if dropout == 0.0 or not module.training:
        return sdpa_attention_forward(
            module, query, key, value, attention_mask, scaling=scaling, dropout=0.0, **kwargs
        )
    if key.shape[1] != query.shape[1]:  # grouped-query attention: each KV head serves a group
        groups = query.shape[1] // key.shape[1]
        key, value = key.repeat_interleave(groups, 1), value.repeat_interleave(groups, 1)
    if attention_mask is None and _causal(module, query.shape[2], kwargs.get("is_causal")):
        attention_mask = _causal_mask(query.shape[2], key.shape[2], query.device)
    scale = query.size(-1) ** -0.5 if scaling is None else scaling
    scores = torch.matmul(query * scale, key.transpose(2, 3))  # [b, h, q, k]
    if attention_mask is not None:
        if attention_mask.dtype == torch.bool:  # [b, 1, q, k]: small next to the scores
            bias = torch.zeros(attention_mask.shape, dtype=scores.dtype, device=scores.device)
            attention_mask = bias.masked_fill_(~attention_mask, torch.finfo(scores.dtype).min)
        scores.add_(attention_mask)
    probs = torch.softmax(scores, dim=-1)
    kept = torch.where(keep_mask(probs.shape, dropout, probs.device), probs, 0)
    out = torch.matmul(kept, value).mul_(1.0 / (1.0 - dropout))  # scaled after the product
    return out.transpose(1, 2).contiguous(), None  # [b, q, h, d]


def _causal(module: nn.Module, q_len: int, given: bool | None) -> bool:
    """Whether attention without a mask is causal, decided as transformers' SDPA decides it."""
    causal = given if given is not None else getattr(module, "is_causal", True)
    return bool(causal) and q_len > 1


def _causal_mask(q_len: int, k_len: int, device: torch.device) -> Tensor:
    """[1, 1, q_len, k_len] bool, True where a query may attend (keys up to its own position):
    what SDPA's ``is_causal`` does where transformers leaves a decoder's mask to it (no
    padding)."""
    full = torch.ones(q_len, k_len, dtype=torch.bool, device=device)
    return full.tril(k_len - q_len)[None, None]


def use_fast_dropout(towers: list[nn.Module]) -> int:
    """Swap every ``nn.Dropout`` of ``towers`` (transformers models) for :class:`FastDropout` and
    their attention for :func:`attention_with_fast_dropout`; return the modules swapped."""
    from transformers.masking_utils import sdpa_mask

    register(ATTENTION_NAME, attention_with_fast_dropout, sdpa_mask)  # the CPU has no waits
    swapped = 0
    for tower in distinct(towers):
        for child in list(tower.modules()):
            for attr, sub in list(child.named_children()):
                if type(sub) is nn.Dropout:
                    fast = FastDropout(sub.p, sub.inplace)
                    fast.train(sub.training)
                    setattr(child, attr, fast)
                    swapped += 1
        tower.set_attn_implementation(ATTENTION_NAME)
    return swapped
