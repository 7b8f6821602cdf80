"""The engine's speed and memory savings: rows chunked by length, padding trimmed per chunk, the
memory release hook."""

from __future__ import annotations

import functools

import pytest
import torch

from dpr_cache.core.accumulate import Accumulate
from dpr_cache.core.engine import GradCache
from dpr_cache.core.inputs import cut_chunks, row_spans, token_chunk_sizes
from dpr_cache.core.loss import contrastive_loss
from dpr_cache.model.biencoder import BiEncoder
from dpr_cache.runtime import memory
from tests.support.fixtures import bert_config, random_inputs


def _widths_into(seen: list[int], encode):
    """``encode``, appending the width of each input it is given to ``seen``."""
    return lambda inputs: (seen.append(inputs["input_ids"].shape[1]), encode(inputs))[1]


def test_trim_drops_only_columns_no_row_attends_to():
    mask = torch.tensor([[1, 1, 0, 0, 0], [1, 1, 1, 0, 0]])
    chunk = {"input_ids": mask * 7, "attention_mask": mask, "extra": torch.arange(2)}
    (out,) = cut_chunks(chunk, 2, length_order=False).parts
    assert out["input_ids"].shape == (2, 3) and out["attention_mask"].shape == (2, 3)
    assert torch.equal(out["input_ids"], chunk["input_ids"][:, :3])
    assert out["extra"].shape == (2,)
    full = {"input_ids": torch.ones(2, 4, dtype=torch.long)}
    assert cut_chunks(full, 2).parts[0]["input_ids"].shape == (2, 4)  # no mask: uncut
    ones = {"attention_mask": torch.ones(2, 4)}
    assert cut_chunks(ones, 2).parts[0]["attention_mask"].shape == (2, 4)
    untrimmed = cut_chunks(chunk, 2, length_order=False, trim=False).parts[0]
    assert untrimmed["input_ids"].shape == (2, 5)  # negative control: trim off keeps the width


def test_trim_keeps_a_column_attended_after_a_gap_and_buckets_round_up():
    """The width runs to the last attended column (a mask with a hole is not cut at the hole);
    a bucket rounds it up to its multiple, never past the inputs' width."""
    mask = torch.tensor([[1, 0, 0, 1, 0, 0, 0, 0, 0, 0], [1, 1, 0, 0, 0, 0, 0, 0, 0, 0]])
    inputs = {"input_ids": mask * 3, "attention_mask": mask}
    spans = row_spans(inputs)
    assert spans.lengths.tolist() == [2, 2] and spans.ends.tolist() == [4, 2]
    widths = {
        bucket: cut_chunks(inputs, 2, length_bucket=bucket).parts[0]["input_ids"].shape[1]
        for bucket in (None, 1, 3, 8, 64)
    }
    assert widths == {None: 4, 1: 4, 3: 6, 8: 8, 64: 10}
    with pytest.raises(ValueError, match="length_bucket"):
        cut_chunks(inputs, 2, length_bucket=0)


def test_chunk_shapes_repeat_with_a_bucket():
    """Ragged rows (lengths 3..20): without a bucket the chunks take many widths, with a bucket
    of 8 only multiples of 8 (and the inputs' width)."""
    lengths = torch.tensor([3, 20, 7, 12, 5, 17, 9, 14, 11, 4, 19, 6])
    mask = (torch.arange(20)[None] < lengths[:, None]).long()
    inputs = {"input_ids": mask * 5, "attention_mask": mask}
    free = [c["input_ids"].shape[1] for c in cut_chunks(inputs, 2).parts]
    bucketed = [c["input_ids"].shape[1] for c in cut_chunks(inputs, 2, length_bucket=8).parts]
    assert len(set(free)) == 6 and free == [20, 17, 12, 9, 6, 4]
    assert bucketed == [20, 20, 16, 16, 8, 8]


def expected_releases(n_q_chunks: int, n_p_chunks: int, every: int) -> int:
    """The engine's documented schedule, counted independently: with the last chunk of each
    tower kept, ``g`` chunks are encoded graph-less and ``g`` re-forwarded; one call after the
    first pass when ``g >= every``, then one before each re-forwarded chunk n (n = 1..g-1) with
    ``n % every == 0``."""
    g = n_q_chunks + n_p_chunks - 2
    return int(g >= every) + sum(1 for n in range(1, g) if n % every == 0)


# expected calls: (4, 8) none, (1, 8) 2, (1, 3) 4, (2, 2) 2, (6, 1) none (no graph-less chunk)
@pytest.mark.parametrize(("chunk", "every"), [(4, 8), (1, 8), (1, 3), (2, 2), (6, 1)])
def test_release_hook_follows_its_schedule_and_gradients_stay_exact(
    float64, monkeypatch, chunk, every
):
    """6 questions, 6 passages: the hook is called as often as the schedule says for several
    ``RELEASE_EVERY`` values (so the count depends on the constant, not on a literal), and the
    gradient equals plain autograd's whatever the hook does."""
    from dpr_cache.core import engine as engine_module

    monkeypatch.setattr(engine_module, "RELEASE_EVERY", every)
    torch.manual_seed(0)
    model = BiEncoder.from_config(bert_config(), shared=True).double().train()
    q, p = random_inputs(6, 9, seed=1), random_inputs(6, 12, seed=2)
    model.zero_grad()
    contrastive_loss(model.encode_query(q), model.encode_passage(p)).backward()
    ref = [x.grad.clone() for x in model.parameters() if x.grad is not None]
    seen = []
    engine = GradCache(
        model.encode_query,
        model.encode_passage,
        functools.partial(contrastive_loss),
        chunk,
        release_memory=lambda: seen.append(memory.trim()),
    )
    model.zero_grad()
    engine.step(q, p)
    got = [x.grad for x in model.parameters() if x.grad is not None]
    n_chunks = -(-6 // chunk)
    assert len(seen) == expected_releases(n_chunks, n_chunks, every)
    scale = max(a.abs().max() for a in ref)  # relative to the largest gradient, as elsewhere
    for a, b in zip(ref, got, strict=True):
        assert (a - b).abs().max() <= 1e-10 * scale


def test_length_order_puts_longest_rows_first_ties_in_batch_order():
    mask = torch.tensor([[1, 1, 0, 0], [1, 1, 1, 1], [1, 0, 0, 0], [1, 1, 1, 1], [1, 1, 0, 0]])
    inputs = {"input_ids": mask, "attention_mask": mask}
    chunks = cut_chunks(inputs, 1, trim=False)
    assert [int(r) for r in chunks.rows] == [1, 3, 0, 4, 2]
    assert [c["input_ids"][0].sum() for c in chunks.parts] == [4, 4, 2, 2, 1]
    ordered = {k: v[[1, 3, 0, 4, 2]] for k, v in inputs.items()}
    assert cut_chunks(ordered, 1).rows is None  # already ordered: consecutive rows
    assert cut_chunks({"input_ids": mask}, 1).rows is None  # no mask: nothing to order by
    assert cut_chunks(inputs, 1, length_order=False).rows is None  # negative control


def test_chunking_reads_the_mask_once_a_tower():
    """The plan reads the mask from the device once; every chunk's width comes from it (a
    trim that asked the device per chunk would read it once a chunk)."""
    lengths = torch.tensor([3, 9, 7, 12, 5, 11])
    mask = (torch.arange(12)[None] < lengths[:, None]).long()
    reads = []

    class Counted(torch.Tensor):
        def cpu(self, *args, **kwargs):
            reads.append(1)
            return super().cpu(*args, **kwargs)

    counted = {"input_ids": mask * 2, "attention_mask": mask.as_subclass(Counted)}
    parts = cut_chunks(counted, 2).parts
    assert len(reads) == 1
    assert [p["attention_mask"].shape[1] for p in parts] == [12, 9, 5]
    assert row_spans(counted).ends.tolist() == lengths.tolist()
    reads.clear()  # the control: a plan made chunk by chunk reads the mask once a chunk
    for rows in (slice(0, 2), slice(2, 4), slice(4, 6)):
        cut_chunks({k: v[rows] for k, v in counted.items()}, 2)
    assert len(reads) == 3


def _padded_tokens(tower) -> int:
    return sum(c["input_ids"].numel() for c in tower.chunks)


@pytest.mark.parametrize("chunk", [2, 3])  # 3: an uneven last chunk of each tower
def test_length_order_pads_less_and_changes_no_gradient(float64, chunk):
    """Chunked longest first, each chunk is at most as wide as the one before and the step
    encodes fewer padded tokens; the gradient equals the batch-order chunks' and plain
    autograd's. Lengths are spread wide (2..24 tokens) so the order matters."""
    torch.manual_seed(0)
    model = BiEncoder.from_config(bert_config(), shared=False).double().train()
    q, p = random_inputs(7, 24, seed=3), random_inputs(14, 24, seed=4)
    q["attention_mask"][1, 3:] = 0  # a short question in the first chunk of batch order
    q["input_ids"] *= q["attention_mask"]
    model.zero_grad()
    contrastive_loss(model.encode_query(q), model.encode_passage(p)).backward()
    want = [x.grad.clone() for x in model.parameters() if x.grad is not None]
    result = {}
    for ordered in (True, False):
        engine = GradCache(
            model.encode_query,
            model.encode_passage,
            contrastive_loss,
            chunk,
            length_order=ordered,
        )
        towers = engine.split(q, p)
        widths = [c["input_ids"].shape[1] for c in towers[0].chunks]
        model.zero_grad()
        loss = engine.step(q, p)
        grads = [x.grad.clone() for x in model.parameters() if x.grad is not None]
        result[ordered] = (widths, sum(_padded_tokens(t) for t in towers), loss, grads)
    widths, tokens, loss, got = result[True]
    assert widths == sorted(widths, reverse=True)
    assert tokens < result[False][1]  # the saving is real on ragged rows
    assert result[False][0] != sorted(result[False][0], reverse=True)  # batch order is not sorted
    assert loss.item() == pytest.approx(result[False][2].item(), rel=1e-12)
    scale = max(a.abs().max() for a in want)
    for grads in (got, result[False][3]):
        for a, b in zip(want, grads, strict=True):
            assert (a - b).abs().max() <= 1e-10 * scale


def test_accumulate_trims_each_micro_batch_and_changes_no_gradient(float64):
    """Micro-batches of 3 questions (3 + 3 + 1: an uneven last one): each is encoded at its own
    longest row, not the batch's, and the gradient and loss equal the untrimmed run's."""
    torch.manual_seed(0)
    model = BiEncoder.from_config(bert_config(), shared=False).double().train()
    q, p = random_inputs(7, 16, seed=5), random_inputs(14, 20, seed=6)
    for inputs, rows, width in ((q, slice(0, 3), 5), (p, slice(0, 6), 7)):
        inputs["attention_mask"][rows, width:] = 0  # the first micro-batch is short
        inputs["input_ids"] *= inputs["attention_mask"]
    result = {}
    for trim in (True, False):
        seen: list[int] = []
        step = Accumulate(
            _widths_into(seen, model.encode_query),
            _widths_into(seen, model.encode_passage),
            contrastive_loss,
            3,
            trim_padding=trim,
        )
        model.zero_grad()
        loss = step.step(q, p)
        grads = [x.grad.clone() for x in model.parameters() if x.grad is not None]
        result[trim] = (seen, loss, grads)
    (trimmed, loss, got), (untrimmed, want_loss, want) = result[True], result[False]
    assert untrimmed == [16, 20] * 3  # negative control: every micro-batch at the batch's width
    longest = [
        int(inputs["attention_mask"][rows].sum(1).max())
        for q_rows, p_rows in (
            (slice(0, 3), slice(0, 6)),
            (slice(3, 6), slice(6, 12)),
            (slice(6, 7), slice(12, 14)),
        )
        for inputs, rows in ((q, q_rows), (p, p_rows))
    ]
    assert trimmed == longest and trimmed[:2] == [5, 7]
    assert loss.item() == pytest.approx(want_loss.item(), rel=1e-12)
    scale = max(a.abs().max() for a in want)
    for a, b in zip(want, got, strict=True):
        assert (a - b).abs().max() <= 1e-10 * scale


@pytest.mark.parametrize("bucket", [3, 5])
def test_bucketed_widths_leave_the_gradient_exact(float64, bucket):
    """Chunk widths rounded up to a bucket between the rows' lengths and the batch's width
    (10): the gradient equals plain autograd's, and the widths seen are the bucket's multiples
    (or the batch's width), which differ from the unbucketed ones."""
    torch.manual_seed(0)
    model = BiEncoder.from_config(bert_config(), shared=False).double().train()
    q, p = random_inputs(6, 10, seed=7), random_inputs(12, 10, seed=8)
    for inputs, rows in ((q, slice(3, 6)), (p, slice(6, 12))):
        inputs["attention_mask"][rows, 4:] = 0  # short rows: chunks narrower than the batch
        inputs["input_ids"] *= inputs["attention_mask"]
    model.zero_grad()
    contrastive_loss(model.encode_query(q), model.encode_passage(p)).backward()
    want = [x.grad.clone() for x in model.parameters() if x.grad is not None]
    engine = GradCache(
        model.encode_query, model.encode_passage, contrastive_loss, 2, length_bucket=bucket
    )
    widths = {c["input_ids"].shape[1] for t in engine.split(q, p) for c in t.chunks}
    free = GradCache(model.encode_query, model.encode_passage, contrastive_loss, 2)
    assert widths != {c["input_ids"].shape[1] for t in free.split(q, p) for c in t.chunks}
    assert all(w % bucket == 0 or w == 10 for w in widths)
    model.zero_grad()
    engine.step(q, p)
    got = [x.grad for x in model.parameters() if x.grad is not None]
    scale = max(a.abs().max() for a in want)
    for a, b in zip(want, got, strict=True):
        assert (a - b).abs().max() <= 1e-10 * scale


@pytest.mark.parametrize(("length_order", "cap"), [(True, 100), (False, 100), (True, 3)])
def test_token_budget_chunks_hold_the_budget_and_every_row_once(length_order, cap):
    """Each chunk holds at most the budget's attended tokens (a longer row alone) and at most
    ``cap`` rows, takes rows longest first when asked, and every row lands in one chunk."""
    inputs = random_inputs(23, 12, seed=4)
    lengths = inputs["attention_mask"].sum(1)
    chunks = cut_chunks(inputs, cap, length_order=length_order, max_tokens=30)
    sizes = [len(part["input_ids"]) for part in chunks.parts]
    rows = chunks.rows or list(torch.arange(23).split(sizes))
    seen = torch.cat(rows)
    assert sorted(seen.tolist()) == list(range(23))
    for part, r in zip(chunks.parts, rows, strict=True):
        assert len(r) <= cap
        assert int(lengths[r].sum()) <= 30 or len(r) == 1
        assert torch.equal(
            part["input_ids"], inputs["input_ids"][r][:, : part["input_ids"].shape[1]]
        )
    if length_order:
        assert torch.equal(lengths[seen], lengths.sort(descending=True, stable=True).values)
    assert len(chunks.parts) > 23 * int(lengths.float().mean()) // 30  # the budget binds


def test_token_chunk_sizes_take_rows_while_they_fit():
    assert token_chunk_sizes([9, 9, 5, 5, 5, 2], 14, 10) == [1, 2, 3]
    assert token_chunk_sizes([40, 3, 3], 10, 10) == [1, 2]  # a longer row alone
    assert token_chunk_sizes([1] * 7, 100, 3) == [3, 3, 1]  # the rows' cap


@pytest.mark.parametrize("mode", ["gradcache", "accumulate"])
def test_make_stepper_passes_trim_padding_on(mode):
    """``make_stepper(trim_padding=False)`` reaches the engine (the default trims): the widths
    each encoder sees are the batch's, not each chunk's longest row."""
    from dpr_cache.core.steppers import Towers, make_stepper

    torch.manual_seed(0)
    model = BiEncoder.from_config(bert_config(), shared=False)
    q, p = random_inputs(4, 12, seed=1), random_inputs(8, 12, seed=2)
    for inputs in (q, p):
        inputs["attention_mask"][:, 6:] = 0
        inputs["input_ids"] *= inputs["attention_mask"]
    widths = {}
    for trim in (True, False):
        seen: list[int] = []
        towers = Towers(
            _widths_into(seen, model.encode_query), _widths_into(seen, model.encode_passage)
        )
        step = make_stepper(mode, towers, contrastive_loss, chunk_size=2, trim_padding=trim)
        step.step(q, p)
        widths[trim] = set(seen)
    assert widths == {True: {6}, False: {12}}
