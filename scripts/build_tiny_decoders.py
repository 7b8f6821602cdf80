"""Build data/toy/tiny-llama and data/toy/tiny-qwen2: tiny random-init decoder LLMs whose
byte-level BPE tokenizers are learned on the toy corpus (its passages, titles and train
questions, the texts tiny-bert's vocabulary is learned on), for the toy LLM config
(configs/toy_llm.yaml) and the tests. Run from the repo root:
    python scripts/build_tiny_decoders.py [--toy DIR]
Re-running gives the same files; each folder is replaced whole.
"""

from __future__ import annotations

import argparse
import csv
import functools
import json
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))  # the builder lives with the tests that check it

from dpr_cache.runtime.atomic import write_dir_atomic  # noqa: E402
from tests.support.tiny_decoder import KINDS, build_tiny_decoder  # noqa: E402

DEFAULT_TOY = ROOT / "data" / "toy"


def toy_texts(toy: Path) -> list[str]:
    """The toy corpus's passages, its titles (each once, in order) and its train questions."""
    with (toy / "passages.tsv").open(encoding="utf-8", newline="") as f:
        rows = list(csv.DictReader(f, delimiter="\t"))
    titles = list(dict.fromkeys(row["title"] for row in rows))
    with (toy / "train.jsonl").open(encoding="utf-8") as f:
        questions = [json.loads(line)["question"] for line in f]
    return [row["text"] for row in rows] + titles + questions


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--toy", type=Path, default=DEFAULT_TOY)
    args = parser.parse_args(argv)
    texts = toy_texts(args.toy)
    for kind in KINDS:
        out = args.toy / f"tiny-{kind}"
        write_dir_atomic(out, functools.partial(_build, texts, kind))
        size = sum(p.stat().st_size for p in out.iterdir())
        print(f"{out}: {size / 1024:.0f} KiB")


def _build(texts: list[str], kind: str, tmp: Path) -> None:
    build_tiny_decoder(texts, tmp, kind=kind)


if __name__ == "__main__":
    main()
