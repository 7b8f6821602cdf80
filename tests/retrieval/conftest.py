"""The retrieval tests' corpus: 50 made-up passages, 13 questions, tiny random BERTs, and a
flat index with its evaluation."""

from __future__ import annotations

import csv
import json
import shutil
from pathlib import Path

import numpy as np
import pytest

from dpr_cache.config import Config
from dpr_cache.model.biencoder import BiEncoder
from dpr_cache.retrieval.drivers.eval import evaluate
from dpr_cache.retrieval.drivers.index import build_index
from tests.support.tiny_bert import build_tiny_bert

N_PASSAGES = 50
SHARD = 16  # shards of 16, 16, 16, 2 passages
WORDS = "river stone castle music engine forest harbor winter garden bridge planet signal".split()


@pytest.fixture(scope="package")
def corpus(tmp_path_factory) -> dict[str, Path]:
    """passages.tsv, dev.qa.tsv, two tiny random BERT folders and a saved BiEncoder."""
    root = tmp_path_factory.mktemp("corpus")
    rng = np.random.default_rng(0)
    rows = []
    for i in range(N_PASSAGES):
        words = rng.choice(WORDS, size=int(rng.integers(3, 40))).tolist()
        rows.append((f"p{i}", " ".join(words + [f"code{i}"]), f"Title {WORDS[i % len(WORDS)]}"))
    with open(root / "passages.tsv", "w", encoding="utf-8", newline="") as f:
        writer = csv.writer(f, delimiter="\t", lineterminator="\n")
        writer.writerow(["id", "text", "title"])
        writer.writerows(rows)
    with open(root / "dev.qa.tsv", "w", encoding="utf-8") as f:
        for i in range(0, N_PASSAGES, 4):
            f.write(
                f"where is code{i} near the {WORDS[i % len(WORDS)]}?\t{json.dumps([f'code{i}'])}\n"
            )
    texts = [f"{t} {x}" for _, x, t in rows] + ["where is near the"]
    kw = dict(vocab_size=300, hidden=32, layers=1, heads=2, intermediate=64, max_positions=128)
    tiny = build_tiny_bert(texts, root / "tiny", seed=0, **kw)
    other = build_tiny_bert(texts, root / "other", seed=1, **kw)
    BiEncoder.from_pretrained(tiny).save_pretrained(root / "saved")
    return {
        "root": root,
        "tiny": tiny,
        "other": other,
        "saved": root / "saved",
        "n_passages": N_PASSAGES,
        "shard": SHARD,
        "words": WORDS,
    }


def _make_config(corpus: dict[str, Path], out: Path, with_model: bool = True, **index) -> Config:
    if with_model and not (out / "model").exists():
        shutil.copytree(corpus["saved"], out / "model")
    return Config.model_validate(
        {
            "output_dir": str(out),
            "model": {"max_query_length": 16, "max_passage_length": 48},
            "data": {
                "passages": str(corpus["root"] / "passages.tsv"),
                "dev_qa": str(corpus["root"] / "dev.qa.tsv"),
                "cache_dir": str(corpus["root"] / "cache"),
            },
            "train": {"device": "cpu"},
            "index": {"shard_size": SHARD, "batch_size": 5, **index},
            "eval": {"top_k": [1, 5, 20], "batch_size": 4},
        }
    )


@pytest.fixture(scope="package")
def make_config():
    """``make_config(corpus, out, with_model=True, **index)``: a Config over the test corpus
    writing under ``out`` (with a copy of the saved BiEncoder as its model)."""
    return _make_config


@pytest.fixture(scope="package")
def built(corpus, tmp_path_factory) -> Config:
    """A flat index and an evaluation of the saved BiEncoder."""
    config = _make_config(corpus, tmp_path_factory.mktemp("run"))
    build_index(config, progress=False)
    evaluate(config, progress=False)
    return config
