"""Batch indices per step and rank, and collation of passage groups with passage ids."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from dpr_cache.data.batches import TrainBatches
from dpr_cache.data.collate import build_batch
from dpr_cache.data.ids import passage_hash
from dpr_cache.errors import InputError

WORDS = "who what wrote paris france hamlet play city river is the a of in".split()


@pytest.fixture(scope="module")
def tokenizer(tmp_path_factory):
    from transformers import BertTokenizerFast

    folder = tmp_path_factory.mktemp("tok")
    special = ["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]"]
    (folder / "vocab.txt").write_text("\n".join(special + WORDS) + "\n")
    return BertTokenizerFast.from_pretrained(str(folder))


def ctx(pid: str, text: str = "the city") -> dict:
    return {"title": f"title {pid}", "text": text, "passage_id": pid}


def example(i: int, hard: int = 0, neg: int = 0, pos: str | None = None) -> dict:
    return {
        "question": f"who wrote {i}",
        "answers": [],
        "positive_ctxs": [ctx(pos or f"p{i}")],
        "hard_negative_ctxs": [ctx(f"h{i}.{j}") for j in range(hard)],
        "negative_ctxs": [ctx(f"n{i}.{j}") for j in range(neg)],
    }


def row_ids(batch) -> list[int]:
    return batch.p_ids.tolist()


def build(examples, tokenizer, **kw):
    args = dict(
        tokenizer=tokenizer,
        hard_negatives=2,
        max_query_length=16,
        max_passage_length=16,
        seed=0,
        epoch=0,
    )
    return build_batch(examples, **{**args, **kw})


def test_epochs_shuffle_differently_and_deterministically() -> None:
    batches = TrainBatches(10, 3, seed=5)
    assert batches.steps_per_epoch == 3
    epoch0 = [batches.batch_indices(s) for s in range(3)]
    epoch1 = [batches.batch_indices(s) for s in range(3, 6)]
    assert epoch0 != epoch1
    for epoch in (epoch0, epoch1):  # drop_last: 9 distinct indices per epoch
        flat = [i for b in epoch for i in b]
        assert len(set(flat)) == 9 and all(0 <= i < 10 for i in flat)
    again = TrainBatches(10, 3, seed=5)
    assert [again.batch_indices(s) for s in (4, 0, 5)] == [epoch1[1], epoch0[0], epoch1[2]]
    assert TrainBatches(10, 3, seed=6).batch_indices(0) != epoch0[0]


def test_seeds_do_not_share_epoch_orders() -> None:
    # ``seed + epoch`` would give seed 2's epoch 0 the order of seed 1's epoch 1
    one, two = TrainBatches(100, 10, seed=1), TrainBatches(100, 10, seed=2)
    assert two.permutation(0) != one.permutation(1)
    assert sorted(two.permutation(0)) == list(range(100))


def test_batch_larger_than_dataset_is_an_input_error() -> None:
    with pytest.raises(InputError, match=r"train\.batch_size=8 is larger than t\.jsonl \(5 q"):
        TrainBatches(5, 8, seed=0, source="t.jsonl")


def test_rank_slices_concatenate_to_the_global_batch() -> None:
    indices = TrainBatches(100, 12, seed=1).batch_indices(7)
    for world in (1, 2, 3, 4):
        parts = [TrainBatches.rank_slice(indices, r, world) for r in range(world)]
        assert sum(parts, []) == indices and {len(p) for p in parts} == {12 // world}
    with pytest.raises(InputError, match="not divisible by the 5 ranks"):
        TrainBatches.rank_slice(indices, 0, 5)


def test_rows_are_positive_then_hard_negatives(tokenizer) -> None:
    examples = [example(0, hard=3), example(1, hard=2)]
    batch = build(examples, tokenizer)
    assert (batch.n_questions, batch.group_size) == (2, 3)
    assert batch.q_inputs["input_ids"].shape[0] == 2
    assert batch.p_inputs["input_ids"].shape[0] == 6
    ids = row_ids(batch)
    assert ids[0] == passage_hash("p0") and ids[3] == passage_hash("p1")
    assert {ids[1], ids[2]} < {passage_hash(f"h0.{j}") for j in range(3)}
    assert {ids[4], ids[5]} == {passage_hash("h1.0"), passage_hash("h1.1")}
    # deterministic for a (seed, epoch), and the shuffle depends on them
    assert row_ids(build(examples, tokenizer)) == ids
    picks = {tuple(row_ids(build(examples, tokenizer, epoch=e))[1:3]) for e in range(20)}
    assert len(picks) > 1


def test_passages_are_title_text_pairs(tokenizer) -> None:
    batch = build([example(0)], tokenizer, hard_negatives=0)
    tokens = tokenizer.convert_ids_to_tokens(batch.p_inputs["input_ids"][0])
    assert tokens == ["[CLS]", "[UNK]", "[UNK]", "[SEP]", "the", "city", "[SEP]"]
    assert batch.p_inputs["token_type_ids"][0].tolist() == [0, 0, 0, 0, 1, 1, 1]
    long = build([example(0)], tokenizer, hard_negatives=0, max_passage_length=6)
    assert long.p_inputs["input_ids"].shape[1] == 6  # text truncated, title kept
    tiny = build([example(0)], tokenizer, hard_negatives=0, max_passage_length=4)
    assert tiny.p_inputs["input_ids"].shape[1] == 4  # title too long: longest_first fallback
    pad8 = build([example(0)], tokenizer, hard_negatives=0, pad_to_multiple_of=8)
    assert pad8.p_inputs["input_ids"].shape[1] == 8


def test_hard_negatives_fall_back_to_negative_ctxs(tokenizer) -> None:
    batch = build([example(0, hard=0, neg=4)], tokenizer)
    assert set(row_ids(batch)[1:]) < {passage_hash(f"n0.{j}") for j in range(4)}
    batch = build([example(0, hard=1, neg=4)], tokenizer)  # hard ones exist: no fallback
    negatives = row_ids(batch)[1:]
    assert negatives[0] == passage_hash("h0.0")
    assert passage_hash("n0.0") not in negatives


def test_too_few_negatives_are_filled_with_other_positives(tokenizer) -> None:
    pool = [example(i) for i in range(10)]
    batch = build(
        [example(0, hard=1)], tokenizer, hard_negatives=3, pool_for_padding=pool, indices=[0]
    )
    ids = row_ids(batch)
    assert ids[1] == passage_hash("h0.0")
    others = {passage_hash(f"p{i}") for i in range(1, 10)}
    assert set(ids[2:]) <= others and len(set(ids[2:])) == 2  # not its own, no repeats
    # without a pool the fill comes from the batch itself
    batch = build([example(0), example(1)], tokenizer, hard_negatives=1)
    assert row_ids(batch)[1] == passage_hash("p1") and row_ids(batch)[3] == passage_hash("p0")


def test_rank_batches_are_slices_of_the_global_batch(tokenizer) -> None:
    pool = [example(i, hard=i % 2, neg=3) for i in range(12)]
    indices = TrainBatches(12, 4, seed=3).batch_indices(2)
    kw = dict(pool_for_padding=pool, hard_negatives=2, seed=3, epoch=2)
    whole = build([pool[i] for i in indices], tokenizer, indices=indices, **kw)
    parts = []
    for rank in range(2):
        local = TrainBatches.rank_slice(indices, rank, 2)
        parts += row_ids(build([pool[i] for i in local], tokenizer, indices=local, **kw))
    assert parts == row_ids(whole)


def test_duplicate_passages_share_an_id(tokenizer) -> None:
    batch = build([example(0, pos="same"), example(1, pos="same")], tokenizer, hard_negatives=0)
    assert row_ids(batch)[0] == row_ids(batch)[1]
    assert batch.p_ids.dtype.is_signed and batch.p_ids.dtype.itemsize == 8
    assert passage_hash("same") >= 0 and passage_hash("same") != passage_hash("same ")


def test_digest_names_the_examples_and_their_order(tokenizer) -> None:
    pool = [example(i, hard=1) for i in range(4)]
    digest = build(pool, tokenizer, hard_negatives=1).digest()
    assert len(digest) == 16 and build(pool, tokenizer, hard_negatives=1).digest() == digest
    assert build(pool[::-1], tokenizer, hard_negatives=1).digest() != digest  # order counts
    other_positive = [*pool[:3], example(3, hard=1, pos="p9")]
    assert build(other_positive, tokenizer, hard_negatives=1).digest() != digest
    other_question = [*pool[:3], {**pool[3], "question": "who wrote hamlet"}]
    assert build(other_question, tokenizer, hard_negatives=1).digest() != digest


def test_works_on_a_cached_dataset(tokenizer, tmp_path: Path) -> None:
    import json

    from dpr_cache.data.training import load_training_set

    path = tmp_path / "t.jsonl"
    path.write_text("".join(json.dumps(example(i, neg=i % 3)) + "\n" for i in range(6)))
    ds = load_training_set(path, tmp_path / "cache")
    indices = TrainBatches(len(ds), 3, seed=0).batch_indices(0)
    batch = build([ds[i] for i in indices], tokenizer, pool_for_padding=ds, indices=indices)
    assert batch.p_inputs["input_ids"].shape[0] == 9
    assert [row_ids(batch)[3 * k] for k in range(3)] == [passage_hash(f"p{i}") for i in indices]


def test_many_hard_negatives_are_drawn_per_epoch_seeded(tokenizer) -> None:
    """H = 15 of a list of 30: distinct, the question's own, the same for a (seed, epoch, index)
    whatever the batch around it, another draw in another epoch or under another seed."""
    examples = [example(i, hard=30) for i in range(3)]

    def negatives(epoch: int, seed: int = 0, who: list[int] = (0, 1, 2)) -> list[list[int]]:
        batch = build(
            [examples[i] for i in who],
            tokenizer,
            hard_negatives=15,
            epoch=epoch,
            seed=seed,
            indices=list(who),
        )
        ids = row_ids(batch)
        return [ids[k * 16 + 1 : (k + 1) * 16] for k in range(len(who))]

    first = negatives(0)
    for i, drawn in enumerate(first):
        assert len(set(drawn)) == 15 and set(drawn) < {passage_hash(f"h{i}.{j}") for j in range(30)}
    assert negatives(0) == first
    assert negatives(0, who=[2])[0] == first[2]  # its own draw, alone in a batch or not
    assert all(negatives(1)[i] != first[i] for i in range(3))
    assert all(negatives(0, seed=1)[i] != first[i] for i in range(3))


def scored_example(i: int, hard: int) -> dict:
    out = example(i, hard=hard)
    for j, c in enumerate([*out["positive_ctxs"], *out["hard_negative_ctxs"]]):
        c["teacher_score"] = 10.0 * i + j
    return out


def test_teacher_scores_follow_their_passage_rows(tokenizer) -> None:
    examples = [scored_example(i, hard=5) for i in range(3)]
    batch = build(examples, tokenizer, hard_negatives=3, teacher_scores=True, epoch=4)
    assert batch.teacher_scores.dtype == torch.float64 and batch.teacher_scores.shape == (12,)
    by_id = {
        passage_hash(c["passage_id"]): c["teacher_score"]
        for e in examples
        for c in [*e["positive_ctxs"], *e["hard_negative_ctxs"]]
    }
    assert batch.teacher_scores.tolist() == [by_id[pid] for pid in row_ids(batch)]
    assert batch.teacher_scores[::4].tolist() == [0.0, 10.0, 20.0]  # the positives
    assert set(batch.loss_inputs()) == {"p_ids", "teacher_scores"}
    assert build(examples, tokenizer, hard_negatives=3).teacher_scores is None
    assert set(build(examples, tokenizer, hard_negatives=3).loss_inputs()) == {"p_ids"}


def test_a_fill_from_other_questions_has_no_teacher_score(tokenizer) -> None:
    examples = [scored_example(i, hard=1) for i in range(3)]
    with pytest.raises(ValueError, match="no teacher score"):
        build(examples, tokenizer, hard_negatives=2, teacher_scores=True)


def test_the_recipe_draws_a_step_s_negatives_from_its_epoch(tokenizer) -> None:
    """The trainer's batches: a question's negatives are its epoch's draw, whichever step and
    batch size bring it, and another epoch draws again."""
    from dpr_cache.train.recipe import BatchRecipe

    pool = [example(i, hard=30) for i in range(6)]
    recipe = BatchRecipe(hard_negatives=15, max_query_length=16, max_passage_length=16, seed=3)

    def groups(batch_size: int, step: int) -> dict[int, list[int]]:
        batches = TrainBatches(6, batch_size, seed=3)
        ids = row_ids(recipe.batch(pool, batches, tokenizer, step))
        who = batches.batch_indices(step)
        return {q: ids[k * 16 + 1 : (k + 1) * 16] for k, q in enumerate(who)}

    epoch0 = {**groups(3, 0), **groups(3, 1)}
    assert epoch0 == groups(6, 0)  # one batch of 6 or two of 3: the same draws
    epoch1 = {**groups(3, 2), **groups(3, 3)}
    assert all(epoch1[q] != epoch0[q] for q in range(6))
    assert epoch1 == groups(6, 1)


@pytest.mark.parametrize("multiple", [8, 16])
def test_the_recipe_pads_each_side_to_the_engine_s_length_bucket(tokenizer, multiple) -> None:
    """With the engine's length bucket, both sides are padded to a multiple of it (so a
    bucketed chunk's width repeats from step to step); the rows' tokens are unchanged and the
    added columns are padding. The control: without it, the batch keeps its longest row."""
    from dpr_cache.train.recipe import BatchRecipe

    pool = [example(i, hard=2) for i in range(4)]
    batches = TrainBatches(4, 4, seed=3)
    kwargs = {"hard_negatives": 1, "max_query_length": 32, "max_passage_length": 64, "seed": 3}
    plain = BatchRecipe(**kwargs).batch(pool, batches, tokenizer, 0)
    padded = BatchRecipe(**kwargs, pad_to_multiple_of=multiple).batch(pool, batches, tokenizer, 0)
    for side in ("q_inputs", "p_inputs"):
        want, got = getattr(plain, side), getattr(padded, side)
        width = want["input_ids"].shape[1]
        assert width % multiple != 0  # the control: the plain batch is not a multiple already
        assert got["input_ids"].shape[1] == -(-width // multiple) * multiple
        assert torch.equal(got["input_ids"][:, :width], want["input_ids"])
        assert not got["attention_mask"][:, width:].any()
