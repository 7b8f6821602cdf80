"""Several training sources: one source a batch, in the proportions or turns asked, each source's
rows once an epoch of its own; every batch a function of its step (resume, ranks); sources that
disagree on a passage refused."""

from __future__ import annotations

import json
from collections import Counter

import numpy as np
import pytest

from dpr_cache.config import load_config
from dpr_cache.data.batches import SourceBatches, TrainBatches
from dpr_cache.data.sources import Source, load_sources
from dpr_cache.errors import InputError
from tests.support.fixtures import TOY

SIZES = [70, 45, 130]
B = 8


def source_rows(batches: SourceBatches, indices: list[int]) -> set[int]:
    return set(batches.sources_of(indices))


def test_every_batch_comes_from_one_source():
    batches = SourceBatches(SIZES, B, seed=3, batching="proportional")
    for step in range(500):
        indices = batches.batch_indices(step)
        assert len(indices) == B and source_rows(batches, indices) == {batches.source_of(step)}


def test_default_proportional_is_each_batch_once_an_epoch():
    """Weights from the sizes: an epoch holds every source's batches once (sentence-transformers'
    PROPORTIONAL), each source's rows at most once, in a shuffled order of sources."""
    batches = SourceBatches(SIZES, B, seed=1, batching="proportional")
    per_source = [n // B for n in SIZES]
    assert batches.steps_per_epoch == sum(per_source)
    for epoch in range(2):
        steps = range(epoch * batches.steps_per_epoch, (epoch + 1) * batches.steps_per_epoch)
        rows = [i for s in steps for i in batches.batch_indices(s)]
        assert len(rows) == len(set(rows))
        assert Counter(batches.source_of(s) for s in steps) == dict(enumerate(per_source))
    order = [batches.source_of(s) for s in range(batches.steps_per_epoch)]
    assert order != sorted(order)  # shuffled, not source after source


def test_weights_set_the_proportions_within_two_percent_over_10000_batches():
    weights = [0.6, 0.3, 0.1]
    batches = SourceBatches(SIZES, B, seed=7, batching="proportional", weights=weights)
    counts = Counter(batches.source_of(s) for s in range(10_000))
    shares = np.array([counts[i] for i in range(3)]) / 10_000
    assert np.abs(shares - weights).max() < 0.02, shares
    # a source drawn past its own batches starts its next epoch: rows repeat only then
    first = [batches.batch_indices(s) for s in range(10_000) if batches.source_of(s) == 0]
    own = SIZES[0] // B
    assert len({i for b in first[:own] for i in b}) == own * B


def test_round_robin_takes_the_sources_in_turn():
    batches = SourceBatches(SIZES, B, seed=0, batching="round_robin")
    assert [batches.source_of(s) for s in range(7)] == [0, 1, 2, 0, 1, 2, 0]
    assert batches.steps_per_epoch == 3 * min(n // B for n in SIZES)


def test_a_batch_is_a_function_of_its_step_alone():
    """A resumed run (a fresh object, asked at step 1234 first) and each rank see the batch an
    uninterrupted run sees; the rank slices split one source's batch."""
    run = SourceBatches(SIZES, B, seed=5, batching="proportional", weights=[1, 2, 3])
    walked = [run.batch_indices(s) for s in range(1300)]
    resumed = SourceBatches(SIZES, B, seed=5, batching="proportional", weights=[1, 2, 3])
    assert [resumed.batch_indices(s) for s in range(1234, 1300)] == walked[1234:]
    other_seed = SourceBatches(SIZES, B, seed=6, batching="proportional", weights=[1, 2, 3])
    assert [other_seed.batch_indices(s) for s in range(20)] != walked[:20]
    halves = [TrainBatches.rank_slice(walked[77], r, 2) for r in range(2)]
    assert halves[0] + halves[1] == walked[77]


def test_a_source_smaller_than_a_batch_is_refused():
    with pytest.raises(InputError, match=r"source tiny has 5 questions, fewer than"):
        SourceBatches([40, 5], B, 0, batching="proportional", names=["big", "tiny"])


def toy_records(n: int, start: int = 0) -> list[str]:
    return (TOY / "train.jsonl").read_text().splitlines()[start : start + n]


def test_sources_joined_in_order_with_their_rows(tmp_path):
    (tmp_path / "a.jsonl").write_text("\n".join(toy_records(30)) + "\n")
    (tmp_path / "b.jsonl").write_text("\n".join(toy_records(20, 30)) + "\n")
    loaded = load_sources([Source(tmp_path / "a.jsonl", "a"), Source(tmp_path / "b.jsonl", "b")],
                          tmp_path / "c")  # fmt: skip
    assert loaded.sizes == [30, 20] and loaded.offsets == [0, 30]
    batches = loaded.batches(B, 0, "round_robin")
    assert source_rows(batches, batches.batch_indices(1)) == {1}
    mixed = loaded.batches(B, 0, "mixed")
    assert isinstance(mixed, TrainBatches) and mixed.source_of(0) is None


def test_two_sources_giving_one_id_different_texts_are_refused(tmp_path):
    records = [json.loads(line) for line in toy_records(10)]
    (tmp_path / "a.jsonl").write_text("".join(json.dumps(r) + "\n" for r in records))
    changed = json.loads(json.dumps(records[4]))
    changed["positive_ctxs"][0]["text"] += " (edited)"
    (tmp_path / "b.jsonl").write_text(json.dumps(changed) + "\n")
    pid = changed["positive_ctxs"][0]["passage_id"]
    first = next(
        i
        for i, r in enumerate(records)
        if pid in {c["passage_id"] for k in ("positive_ctxs", "hard_negative_ctxs") for c in r[k]}
    )
    sources = [Source(tmp_path / "a.jsonl", "a"), Source(tmp_path / "b.jsonl", "b")]
    where = rf"passage id '{pid}' has one text in .*a\.jsonl record {first} and another in .*b"
    with pytest.raises(InputError, match=where):
        load_sources(sources, tmp_path / "c")
    # the same passage, same text, in both: accepted
    (tmp_path / "b.jsonl").write_text(json.dumps(records[4]) + "\n")
    assert load_sources(sources, tmp_path / "c").sizes == [10, 1]


@pytest.mark.parametrize(
    ("sets", "message"),
    [
        (["data.train=[{path: a.jsonl, weight: -1}]"], "data.train"),
        (
            [
                "data.batching=proportional",
                "data.train=[{path: a, weight: 0}, {path: b, weight: 0}]",
            ],
            "every source's weight is 0",
        ),
        (
            ["data.train=[{path: a, weight: 2}, {path: b}]"],
            r"data.train\[0\].weight: weights choose the source of each batch under data.batching "
            "proportional, not mixed",
        ),
        (["data.train=[{path: x/a.jsonl}, {path: y/a.jsonl}]"], r"a second source named 'a'"),
        (
            ["data.train=[{path: a, hard_negatives: 1}, {path: b}]"],
            r"data.train\[0\].hard_negatives: under data.batching mixed",
        ),
        (
            ["data.batching=round_robin", "data.train=[{path: a, hard_negatives: 3}, {path: b}]"],
            r"3 is more than train.hard_negatives \(1\)",
        ),
        (["data.train=[{path: a, format: xml}]"], "data.train"),
        (["data.train=[{path: a, colums: {}}]"], "colums"),
    ],
)
def test_bad_source_settings_are_one_line(sets, message):
    with pytest.raises(InputError, match=message) as err:
        load_config(None, sets)
    assert "\n" not in str(err.value)
