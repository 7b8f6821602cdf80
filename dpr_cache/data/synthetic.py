"""Synthetic tokenized batches: random token ids, every row exactly the asked length."""

from __future__ import annotations

import torch

__all__ = ["synthetic_batch"]


def synthetic_batch(
    tokenizer, vocab_size: int, n_q: int, n_p: int, q_len: int, p_len: int, seed: int
) -> tuple[dict, dict, torch.Tensor]:
    """Random questions [n_q, q_len] and passages [n_p, p_len], no padding; distinct ids."""
    gen = torch.Generator().manual_seed(seed)
    low = 1000 if vocab_size > 2000 else min(5, vocab_size - 1)
    cls = getattr(tokenizer, "cls_token_id", None)
    sep = getattr(tokenizer, "sep_token_id", None)

    def rows(n: int, length: int) -> dict:
        ids = torch.randint(low, vocab_size, (n, length), generator=gen)
        if cls is not None:
            ids[:, 0] = cls
        if sep is not None:
            ids[:, -1] = sep
        ones = torch.ones_like(ids)
        return {"input_ids": ids, "attention_mask": ones, "token_type_ids": torch.zeros_like(ids)}

    return rows(n_q, q_len), rows(n_p, p_len), torch.arange(n_p)
