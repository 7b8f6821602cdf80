"""Small random models and inputs for the tests: a tiny BERT config and ragged token batches."""

from __future__ import annotations

from pathlib import Path

import torch

__all__ = [
    "REPO",
    "TOY",
    "SQUAD_SOURCE",
    "bert_config",
    "random_inputs",
    "saved_weights",
    "index_vectors",
]

REPO = Path(__file__).resolve().parents[2]
"""The checkout holding this package (configs/, data/ and tests/ beside it)."""
TOY = REPO / "data" / "toy"
SQUAD_SOURCE = REPO / "data" / "squad" / "dev-v1.1.json.gz"
"""The official SQuAD v1.1 dev file, shipped (``dpr-cache data squad`` builds from it)."""


def bert_config(dropout: float = 0.0, vocab: int = 97, hidden: int = 32, layers: int = 2):
    """A two-layer BERT config small enough for float64 gradient checks."""
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


def saved_weights(model_dir: Path) -> dict[str, torch.Tensor]:
    """Every tensor of a saved BiEncoder folder, keyed ``tower/name``: each tower's weights, or
    its adapters where it saved those alone (LoRA)."""
    from safetensors.torch import load_file

    def weights(tower: Path) -> Path:
        whole = tower / "model.safetensors"
        return whole if whole.is_file() else tower / "adapter_model.safetensors"

    return {
        f"{tower}/{name}": tensor
        for tower in ("query_encoder", "passage_encoder")
        for name, tensor in load_file(weights(Path(model_dir) / tower)).items()
    }


def index_vectors(index_dir: Path):
    """(every vector of an index folder as float32 [rows, dim], their ids): small indexes only."""
    import numpy as np

    from dpr_cache.retrieval.dense.index import open_index

    store = open_index(index_dir).store
    vectors = np.concatenate([block.copy() for _, block in store.blocks(4096)])
    return vectors, store.ids_of(np.arange(store.rows)).tolist()


def plant_another_runs_part(parts: Path) -> None:
    """A parts folder (``score``'s, ``mine``'s) holding a finished part of another run: its
    inputs' digest is not this run's, so a resume must not take it."""
    parts.mkdir()
    (parts / "inputs.sha256").write_text("another run")
    (parts / "part-000000.jsonl").write_text("{}\n")
    (parts / "part-000000.json").write_text("{}")
