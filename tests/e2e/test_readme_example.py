"""The README's Python example runs as printed (the tiny BERT in place of bert-base-uncased, one
toy batch as ``batches``) and trains: every tower gets a gradient and its weights move."""

from __future__ import annotations

import json
import re

import torch

from dpr_cache.data.collate import build_batch
from dpr_cache.model.biencoder import BiEncoder
from dpr_cache.model.towers import load_tokenizer
from tests.support.fixtures import REPO, TOY


def _example() -> str:
    readme = (REPO / "README.md").read_text(encoding="utf-8")
    section = readme.split("## Use the engine in your own training loop", 1)[1]
    return re.search(r"```python\n(.*?)```", section, re.S).group(1)


def test_the_readme_example_runs_and_steps() -> None:
    code = _example()
    assert '"bert-base-uncased"' in code and "engine.step(" in code
    code = code.replace('"bert-base-uncased"', repr(str(TOY / "tiny-bert")))
    with open(TOY / "train.jsonl", encoding="utf-8") as f:
        examples = [json.loads(line) for line in f][:8]
    batch = build_batch(
        examples,
        tokenizer=load_tokenizer(TOY / "tiny-bert"),
        hard_negatives=1,
        max_query_length=16,
        max_passage_length=32,
        seed=0,
        epoch=0,
    )
    scope = {"batches": [(batch.q_inputs, batch.p_inputs, batch.p_ids)]}
    torch.manual_seed(0)
    exec(compile(code, "README.md", "exec"), scope)  # noqa: S102
    model, loss = scope["model"], scope["loss"]
    assert torch.isfinite(loss) and loss.item() > 0
    start = BiEncoder.from_pretrained(TOY / "tiny-bert", shared=False)
    for tower in ("query_encoder", "passage_encoder"):
        new = dict(getattr(model, tower).named_parameters())
        old = dict(getattr(start, tower).named_parameters())
        assert all(p.grad is not None for p in new.values() if p.requires_grad), tower
        assert not torch.equal(
            new["embeddings.word_embeddings.weight"], old["embeddings.word_embeddings.weight"]
        ), tower
