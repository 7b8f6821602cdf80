"""``train.chunk_size: auto``: candidates, the choice under a budget, the probe, the trainer."""

from __future__ import annotations

import json

import pytest

from dpr_cache.config import ModelConfig, TrainConfig, load_config
from dpr_cache.errors import InputError
from dpr_cache.model.biencoder import BiEncoder
from dpr_cache.runtime.distributed import DistEnv
from dpr_cache.train.autochunk import (
    CHOICE_FILE,
    SAFETY_MARGIN,
    BatchShape,
    ProbeSpec,
    batch_extras_bytes,
    candidate_chunks,
    pick_chunk_size,
    probe_cpu,
)
from tests.support.fixtures import TOY

TINY = str(TOY / "tiny-bert")
PROBE = ProbeSpec(
    ModelConfig(name_or_path=TINY, pooling="mean", max_query_length=32, max_passage_length=64),
    TrainConfig(),
)


def toy_config(tmp_path, batch: int = 8, **extra):
    sets = [
        f"output_dir={tmp_path / 'run'}",
        f"model.name_or_path={TINY}",
        f"data.train={TOY / 'train.jsonl'}",
        f"data.cache_dir={tmp_path / 'cache'}",
        f"train.batch_size={batch}",
        "train.chunk_size=auto",
        "train.memory_budget=100GB",
        "model.max_passage_length=64",
    ] + [f"{k}={v}" for k, v in extra.items()]
    return load_config(TOY.parent.parent / "configs" / "toy.yaml", sets)


@pytest.fixture(scope="module")
def tiny_model():
    return BiEncoder.from_pretrained(TINY, shared=False, pooling="mean").train()


@pytest.mark.parametrize(
    ("batch", "expected"), [(1, [1]), (6, [1, 2, 4, 6]), (8, [1, 2, 4, 8]), (9, [1, 2, 4, 8, 9])]
)
def test_candidates_are_powers_of_two_then_the_local_batch(batch, expected):
    assert candidate_chunks(batch) == expected


def test_picks_the_largest_chunk_that_fits_and_records_it(tmp_path, tiny_model, capsys):
    out, shape = tmp_path / "run", BatchShape(batch_size=64, hard_negatives=1)
    extras = batch_extras_bytes(tiny_model, shape, 64)
    peak = {c: 1_000_000 * c for c in candidate_chunks(64)}  # a fake probe: 1 MB per row
    budget = int((peak[16] + extras + 1) / (1 - SAFETY_MARGIN))  # 16 fits, 32 does not
    seen = []

    def measure(chunk):
        seen.append(chunk)
        return peak[chunk]

    chunk = pick_chunk_size(PROBE, shape, tiny_model, DistEnv(), budget, out, measure=measure)
    assert chunk == 16
    assert len(seen) <= 4  # bisection over 7 candidates, not a scan
    record = json.loads((out / CHOICE_FILE).read_text())
    assert record["chunk_size"] == 16 and record["budget_bytes"] == budget
    assert {p["chunk"]: p["fits"] for p in record["probes"]}[16] is True
    assert all(not p["fits"] for p in record["probes"] if p["chunk"] > 16)
    assert "chunk_size auto: 16" in capsys.readouterr().err


def test_budget_below_the_smallest_chunk_is_a_clear_error(tmp_path, tiny_model):
    with pytest.raises(InputError, match="memory_budget.*too small"):
        pick_chunk_size(
            PROBE, BatchShape(8), tiny_model, DistEnv(), 10**6, tmp_path, measure=lambda c: 10**9
        )


def test_real_probe_on_the_tiny_bert_with_a_small_budget(tmp_path, tiny_model):
    """The CPU probe (a fresh process per candidate): a budget just above what chunk 1 needs
    picks a chunk whose measured total fits, and every larger probed chunk was measured over."""
    shape = BatchShape(batch_size=4, hard_negatives=1)
    big = pick_chunk_size(PROBE, shape, tiny_model, DistEnv(), 10**11, tmp_path)
    assert big == 4  # everything fits in 100 GB
    need_1 = probe_cpu(PROBE.payload(1)) + batch_extras_bytes(tiny_model, shape, 4)
    small = int(1.05 * need_1 / (1 - SAFETY_MARGIN))  # 5% for RSS jitter between runs
    chunk = pick_chunk_size(PROBE, shape, tiny_model, DistEnv(), small, tmp_path)
    record = json.loads((tmp_path / CHOICE_FILE).read_text())
    chosen = {p["chunk"]: p for p in record["probes"]}
    assert chunk in chosen and chosen[chunk]["total_bytes"] <= record["limit_bytes"]
    assert all(
        p["total_bytes"] > record["limit_bytes"] for p in chosen.values() if p["chunk"] > chunk
    )
    with pytest.raises(InputError, match="too small"):
        pick_chunk_size(PROBE, shape, tiny_model, DistEnv(), 10**6, tmp_path)


def test_trainer_resolves_auto_and_writes_the_choice(tmp_path):
    from dpr_cache.train.loop import train

    config = toy_config(tmp_path, batch=8, **{"train.max_steps": 1, "train.epochs": 1})
    train(config, progress=False)
    record = json.loads((config.output_path / CHOICE_FILE).read_text())
    assert record["chunk_size"] == 8 and record["local_batch"] == 8
    assert (config.output_path / "train_log.jsonl").is_file()


def test_a_multi_vector_models_batch_holds_every_token_vector(tiny_model):
    """The cache, its leaf and its gradient of every question and passage token, and the
    tiled loss's block of token scores, beside AdamW's moments (the single-vector count as a
    control: one vector a text)."""
    from dpr_cache.core.similarity import TOKEN_BLOCK_ELEMENTS

    multi = BiEncoder.from_pretrained(TINY, vectors="multi", multi_dim=16)
    shape = BatchShape(batch_size=8, hard_negatives=1, lengths=(32, 256))
    moments = 8 * sum(p.numel() for p in multi.parameters())
    tokens = 8 * 32 + 16 * 256
    expected = moments + 12 * tokens * 16 + 12 * TOKEN_BLOCK_ELEMENTS
    assert batch_extras_bytes(multi, shape, 8) == expected
    single_moments = 8 * sum(p.numel() for p in tiny_model.parameters())
    single = single_moments + 12 * (8 + 16) * tiny_model.dim + 12 * 8 * 16
    assert batch_extras_bytes(tiny_model, shape, 8) == single
