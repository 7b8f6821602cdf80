"""Shared fixtures: offline settings, a tiny random BERT config and random tokenized batches."""

from __future__ import annotations

import os
from pathlib import Path

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")
os.environ.setdefault("HF_DATASETS_OFFLINE", "1")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")

import pytest  # noqa: E402
import torch  # noqa: E402

REPO = Path(__file__).resolve().parents[1]
SHARED = REPO.parent / "shared"
TOY = REPO / "data" / "toy"


def bert_config(dropout: float = 0.0, vocab: int = 97, hidden: int = 32, layers: int = 2):
    from transformers import BertConfig

    return BertConfig(
        vocab_size=vocab,
        hidden_size=hidden,
        num_hidden_layers=layers,
        num_attention_heads=2,
        intermediate_size=2 * hidden,
        max_position_embeddings=64,
        hidden_dropout_prob=dropout,
        attention_probs_dropout_prob=dropout,
    )


def random_inputs(rows: int, length: int, vocab: int = 97, seed: int = 0) -> dict:
    """Token ids with ragged padding (attention_mask zeros at the end of some rows)."""
    gen = torch.Generator().manual_seed(seed)
    ids = torch.randint(5, vocab, (rows, length), generator=gen)
    lengths = torch.randint(max(2, length // 2), length + 1, (rows,), generator=gen)
    mask = (torch.arange(length)[None, :] < lengths[:, None]).long()
    ids = ids * mask
    ids[:, 0] = 2  # [CLS]-like first token
    return {"input_ids": ids, "attention_mask": mask, "token_type_ids": torch.zeros_like(ids)}


@pytest.fixture
def float64():
    previous = torch.get_default_dtype()
    torch.set_default_dtype(torch.float64)
    yield
    torch.set_default_dtype(previous)
