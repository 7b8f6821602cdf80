"""SDPA attention whose padding mask is built without the host waiting for the device.

transformers' SDPA mask skips building a mask when no row of a chunk is padded, which it learns
by reading ``attention_mask.all()`` back from the device: on CUDA a host wait in every forward,
which stalls the queue of kernels behind it. Here the mask is always built when a padding mask
is given (SDPA then attends with it; a chunk without padding gets the same outputs, to
rounding, from an all-true mask, with which CUDA may pick another kernel), and skipped, as
before, only when none is given. Nothing saved changes: the
implementation's name is not written to ``config.json``.
"""

from __future__ import annotations

from torch import nn

__all__ = ["SDPA_NAME", "distinct", "mask_without_wait", "register", "use_sdpa_without_wait"]

SDPA_NAME = "dpr_cache_sdpa"


def mask_without_wait(*args, attention_mask=None, allow_is_bidirectional_skip=False, **kwargs):
    """transformers' ``sdpa_mask``, skipping the mask only when no padding mask is given (the
    one case it decides without reading the device)."""
    from transformers.masking_utils import sdpa_mask

    skip = allow_is_bidirectional_skip and attention_mask is None
    return sdpa_mask(
        *args, attention_mask=attention_mask, allow_is_bidirectional_skip=skip, **kwargs
    )


def register(name: str, attention, mask=mask_without_wait) -> None:
    """Register ``attention`` under ``name``, its padding mask built by ``mask``."""
    from transformers import AttentionInterface
    from transformers.masking_utils import AttentionMaskInterface

    AttentionInterface.register(name, attention)
    AttentionMaskInterface.register(name, mask)


def distinct(towers: list[nn.Module]) -> list[nn.Module]:
    """``towers`` without repeats (a shared tower is listed twice), in order."""
    return list({id(t): t for t in towers}.values())


def use_sdpa_without_wait(towers: list[nn.Module]) -> int:
    """Switch every tower of ``towers`` that attends with SDPA to :data:`SDPA_NAME`; return
    how many were switched (eager, flash or other implementations are left as they are)."""
    from transformers.integrations.sdpa_attention import sdpa_attention_forward

    register(SDPA_NAME, sdpa_attention_forward)
    switched = 0
    for tower in distinct(towers):
        if getattr(tower.config, "_attn_implementation", None) == "sdpa":
            tower.set_attn_implementation(SDPA_NAME)
            switched += 1
    return switched
