"""What a GPU gives a user of dpr-cache: one training step's peak memory as the batch grows, pairs
per second against the full batch and the peers (one process, interleaved), which of GradCache's
savings pay on the device, and the passages per second of ``encode``.

Every figure comes from the product's own code path: a training step is
:meth:`dpr_cache.train.trainer.Trainer.step` of the trainer ``build_trainer`` makes from a config
(optimizer and all); a timed step is the steppers' ``.step`` (forward, loss, backward); encoding
is the ``dpr-cache encode`` command.
"""

from __future__ import annotations

import collections
import functools
import gc
import inspect
import json
import statistics
import sys
import time
import warnings
from collections.abc import Callable, Collection, Iterator
from dataclasses import dataclass
from pathlib import Path

import torch

from benchmarks.gpu_cli import child
from benchmarks.harness import option_args
from dpr_cache.data.collate import Batch

__all__ = [
    "memory_by_batch",
    "largest_full_batch",
    "squad_batch",
    "speed_comparison",
    "savings",
    "encode_rate",
    "matmul_tflops",
]


def _config(model_dir: Path, out: Path, **train):
    """A run config for ``model_dir`` (shared towers off, CLS pooling, 32 + 256 tokens)."""
    from dpr_cache.config import load_config

    sets = [
        f"output_dir={out}",
        f"model.name_or_path={model_dir}",
        "model.pooling=cls",
        "model.max_query_length=32",
        "model.max_passage_length=256",
        "train.lr=1e-5",
    ] + [f"train.{k}={v}" for k, v in train.items()]
    return load_config(None, sets)


def free_device(device: torch.device) -> None:
    """What this process no longer uses handed back: objects held in cycles (a section stopped
    mid-step leaves a trainer in its traceback's frames) and the CUDA allocator's cache."""
    gc.collect()
    if device.type == "cuda":
        torch.cuda.empty_cache()
        torch.cuda.reset_peak_memory_stats(device)


def _synthetic(model, n_q: int, group: int, q_len: int, p_len: int) -> Batch:
    """Full-length rows (no padding, every position attended): the worst case for memory."""
    from dpr_cache.data.synthetic import synthetic_batch

    vocab = int(model.query_encoder.config.vocab_size)
    q, p, ids = synthetic_batch(model.tokenizer, vocab, n_q, n_q * group, q_len, p_len, seed=0)
    return Batch(q, p, ids, n_q, group)


def trainer_step_peak(model_dir: Path, work: Path, device: torch.device, **train) -> dict:
    """Peak memory and seconds of the first training step of the config ``train`` describes
    (the model, its gradients and AdamW's moments included)."""
    from dpr_cache.runtime.distributed import DistEnv
    from dpr_cache.runtime.memory import peak_memory_bytes
    from dpr_cache.train.trainer import build_trainer

    config = _config(model_dir, work, **train, device=device)
    free_device(device)
    trainer = build_trainer(config, DistEnv(device=device), total_steps=10)
    cfg = config.train
    batch = _synthetic(trainer.model, cfg.batch_size, 1 + cfg.hard_negatives, 32, 256)
    try:
        result = trainer.step(batch)
        row = {"peak_bytes": peak_memory_bytes(device), "step_s": result.seconds, "fits": True}
    except torch.OutOfMemoryError:
        row = {"peak_bytes": None, "step_s": None, "fits": False}
    del trainer, batch
    free_device(device)
    return row


def memory_by_batch(
    model_dir: Path,
    work: Path,
    device: torch.device,
    batches: list[int],
    *,
    chunk: int = 32,
    precision: str = "bf16",
    tile: int = 4096,
) -> list[dict]:
    """One GradCache step's peak at each batch size (one hard negative, tiled loss)."""
    rows = []
    for b in batches:
        row = trainer_step_peak(
            model_dir,
            work,
            device,
            batch_size=b,
            chunk_size=min(chunk, b),
            hard_negatives=1,
            precision=precision,
            loss_tile_size=tile,
        )
        rows.append({"batch": b, "chunk": min(chunk, b), "precision": precision, **row})
    return rows


def largest_full_batch(
    model_dir: Path, work: Path, device: torch.device, *, precision: str = "bf16", start: int = 64
) -> dict:
    """The largest full batch (``train.mode: full``) whose step fits, to 16 questions: doubling
    from ``start`` until a step runs out of memory, then bisection."""

    def fits(b: int) -> dict:
        return trainer_step_peak(
            model_dir,
            work,
            device,
            batch_size=b,
            mode="full",
            hard_negatives=1,
            precision=precision,
        )

    tried, good, bad = {}, None, None
    b = start
    while bad is None and b <= 1 << 16:
        tried[b] = fits(b)
        if tried[b]["fits"]:
            good, b = b, 2 * b
        else:
            bad = b
    while good is not None and bad is not None and bad - good > 16:
        mid = (good + bad) // 32 * 16
        tried[mid] = fits(mid)
        good, bad = (mid, bad) if tried[mid]["fits"] else (good, mid)
    best = tried.get(good, {}) if good else {}
    return {
        "batch": good,
        "peak_bytes": best.get("peak_bytes"),
        "precision": precision,
        "tried": {str(k): v["fits"] for k, v in sorted(tried.items())},
    }


def squad_batch(model, squad_gz: Path, work: Path, batch: int, hard_negatives: int = 1):
    """The trainer's step-0 batch of SQuAD's training questions (real text at natural lengths:
    questions cut at 32 tokens, passages at 256), as ``train`` would build it."""
    from dpr_cache.data.batches import TrainBatches
    from dpr_cache.data.collate import build_batch
    from dpr_cache.data.squad import build_squad
    from dpr_cache.data.training import load_training_set

    if not (work / "train.jsonl").exists():
        build_squad(squad_gz, work)
    dataset = load_training_set(work / "train.jsonl", work / "cache")
    indices = TrainBatches(len(dataset), batch, 0, source="squad").batch_indices(0)
    return build_batch(
        [dataset[i] for i in indices],
        tokenizer=model.tokenizer,
        hard_negatives=hard_negatives,
        max_query_length=32,
        max_passage_length=256,
        seed=0,
        epoch=0,
        pool_for_padding=dataset,
        indices=indices,
    )


def _own_stepper(
    model,
    chunk: int | None,
    p_chunk: int | None = None,
    *,
    length_bucket: int | None = None,
    towers=None,
    **savings,
):
    """dpr-cache's GradCache (``chunk`` questions, ``p_chunk`` passages a chunk, by default
    ``chunk``; trimmed widths rounded up to a multiple of ``length_bucket`` where given) or the
    plain full batch (``chunk`` None), on ``towers`` (an object with ``encode_query`` and
    ``encode_passage``; default ``model``)."""
    from dpr_cache.core.loss import InfoNCE
    from dpr_cache.core.objective import Objective, make_loss_fn
    from dpr_cache.core.steppers import Towers, make_stepper

    loss_fn = make_loss_fn(Objective(2, InfoNCE(1.0)))
    on = model if towers is None else towers
    encoders = Towers(on.encode_query, on.encode_passage)
    if chunk is None:
        return make_stepper("full", encoders, loss_fn, chunk_size=1)
    options = {
        "p_chunk_size": p_chunk,
        "keep_last_graph": savings.get("keep_last_graph", True),
        "length_order": savings.get("length_order", True),
        "length_bucket": length_bucket,
        "chunk_tokens": savings.get("chunk_tokens"),
    }
    stepper = make_stepper("gradcache", encoders, loss_fn, chunk_size=chunk, **options)
    if "trim_padding" in savings:
        stepper.trim_padding = savings["trim_padding"]
    return stepper


def _cmnrl(model, rows: int | None = None, tokens: int | None = None):
    """sentence-transformers' CachedMNRL, mini-batches of ``rows`` or of a ``tokens`` budget
    (when the installed version has one; None otherwise)."""
    from benchmarks.peers import CachedMNRLStep

    step = CachedMNRLStep(model, rows or 32)
    if tokens is not None:
        if "mini_batch_num_tokens" not in inspect.signature(type(step.loss).__init__).parameters:
            return None
        step.loss.mini_batch_num_tokens = tokens
    return step


def _gradcache_lib(model, chunk: int | list[int]):
    from benchmarks.peers import GradCacheLibStep, import_gradcache_lib

    import_gradcache_lib()
    return GradCacheLibStep(model, chunk)


def count_syncs(step: Callable[[], object], device, precision: str) -> dict:
    """One call of ``step`` with CUDA's synchronization warnings on: how many times the host
    waited for the device, and the three source lines that made it wait most often."""
    from dpr_cache.runtime.device import autocast

    previous = torch.cuda.get_sync_debug_mode()
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        torch.cuda.set_sync_debug_mode("warn")
        try:
            with autocast(device, precision):
                step()
            torch.cuda.synchronize()
        finally:
            torch.cuda.set_sync_debug_mode(previous)
    sources = collections.Counter(
        f"{Path(w.filename).name}:{w.lineno}" for w in caught if "synchroniz" in str(w.message)
    )
    return {"count": sum(sources.values()), "top": dict(sources.most_common(3))}


STEP_ERRORS = (RuntimeError, ValueError, TypeError, NotImplementedError, AssertionError)
"""What a setting's step may raise and its row report (out of memory, a compiler's error), the
other settings still timed; a section's timeout is none of these."""


def _interleave(
    steppers: dict[str, object],
    batch: Batch,
    model,
    precision: str,
    rounds: int,
    host_waits: bool | Collection[str] = True,
    *,
    warmups: int | dict[str, int] = 1,
    fresh_cache: bool = True,
    others: Collection = (),
) -> dict[str, dict]:
    """Each stepper's step timed once a round, rounds interleaved, after its ``warmups`` (one
    count, or by name: one with fewer starts later, so the timed rounds line up); one that fails
    (out of memory, say) is dropped with the reason. Median seconds, pairs per second, each
    warm-up's seconds (printed as it ends), and on CUDA the host's waits in one more step (for
    ``host_waits``' names, or all with True). ``fresh_cache``: start from an emptied CUDA cache.
    ``others``: more models some steppers train, their gradients reset as ``model``'s are."""
    device = model.device
    cuda = device.type == "cuda"
    zero_grad = functools.partial(_zero_grad, (model, *others))
    zero_grad()
    if fresh_cache:  # each group starts from an empty cache, not another group's leftovers
        free_device(device)
    b = batch.to(device)
    warm = {n: warmups.get(n, 1) if isinstance(warmups, dict) else warmups for n in steppers}
    first = max(warm.values(), default=0)
    waits = set(steppers) if host_waits is True else set(host_waits or ())
    times, warmup_s = ({name: [] for name in steppers} for _ in range(2))
    failed, syncs = {}, {}  # by name: why a stepper failed; its waits for the device
    allocator: dict[str, collections.Counter] = {name: collections.Counter() for name in steppers}
    for r in range(first + rounds):
        for name, stepper in steppers.items():
            if name in failed or r < first - warm[name]:
                continue
            timed = r >= first
            zero_grad()
            step = _attempt(stepper, b, precision, r == first - 1 and cuda and name in waits)
            if "failed" in step:
                failed[name] = step["failed"]
                print(f"    {name}: {failed[name]}", flush=True)
                zero_grad()
                free_device(device)
                continue
            if "syncs" in step:
                syncs[name] = step["syncs"]
            if timed:
                allocator[name].update(step["allocator"])
            (times if timed else warmup_s)[name].append(step["seconds"])
            if not timed:
                print(f"    {name}: warm-up {step['seconds']:.1f} s", flush=True)
    known = torch.cuda.memory_stats(device) if cuda else {}
    per_step = {
        n: {k: c[k] / max(1, len(times[n])) if k in known else None for k in _ALLOCATOR_COUNTS}
        for n, c in allocator.items()
    }
    return {
        n: _timed_row(ts, warmup_s[n], failed.get(n), syncs.get(n), batch, cuda and per_step[n])
        for n, ts in times.items()
    }


def _zero_grad(models) -> None:
    for m in models:
        m.zero_grad(set_to_none=True)


def _attempt(stepper, b: Batch, precision: str, count_waits: bool) -> dict:
    """One step: its seconds and the allocator's counts over it, with ``count_waits`` the
    host's waits in one more step; or why it failed (out of memory, say)."""
    device = b.q_inputs["input_ids"].device
    before = _allocator_counts(device)
    try:
        out = {"seconds": _one_step(stepper, b, precision)}
        out["allocator"] = _allocator_counts(device) - before
        if count_waits:  # after the warm-ups, one step
            step = functools.partial(stepper.step, b.q_inputs, b.p_inputs, p_ids=b.p_ids)
            out["syncs"] = count_syncs(step, device, precision)
        return out
    except STEP_ERRORS as exc:
        oom = isinstance(exc, torch.OutOfMemoryError)
        return {"failed": "out of memory" if oom else f"{type(exc).__name__}: {exc}"[:300]}


def _one_step(stepper, b: Batch, precision: str) -> float:
    """Seconds of one step of ``stepper`` on the device's batch ``b``, the device synchronized
    before and after."""
    from dpr_cache.runtime.device import autocast

    device = b.q_inputs["input_ids"].device
    _sync(device)
    start = time.perf_counter()
    with autocast(device, precision):
        stepper.step(b.q_inputs, b.p_inputs, p_ids=b.p_ids)
    _sync(device)
    return time.perf_counter() - start


def _timed_row(ts, warmup_s, failed, syncs, batch, allocator) -> dict:
    """One stepper's figures: its median step, rate, times and warm-ups, or why it has none."""
    if failed or not ts:
        row = {"failed": failed or "not timed"}
        if warmup_s:
            row["warmup_s"] = warmup_s
        return row
    median = statistics.median(ts)
    row = {"step_s": median, "pairs_per_s": batch.n_questions / median, "times_s": ts}
    row["warmup_s"] = warmup_s
    if syncs is not None:
        row["syncs"] = syncs
    if allocator:
        row["allocator"] = allocator
    return row


_ALLOCATOR_COUNTS = ("num_alloc_retries", "num_device_alloc", "num_device_free")
"""CUDA caching allocator counters: cache flushes after a failed cudaMalloc, cudaMalloc and
cudaFree calls (a cudaFree waits for the device). Per timed step, a setting that needs them
is timed partly on the allocator."""


def _allocator_counts(device) -> collections.Counter:
    if device.type != "cuda":
        return collections.Counter()
    stats = torch.cuda.memory_stats(device)
    return collections.Counter({k: int(stats.get(k, 0)) for k in _ALLOCATOR_COUNTS})


Chunk = int | tuple[int, int]
"""A GradCache chunk: rows of both towers, or (questions, passages) a chunk."""


def chunk_settings(chunks: list[Chunk], n_questions: int, n_passages: int) -> dict[str, tuple]:
    """Each chunk's name and its (questions, passages) a chunk at this batch, in order, without
    those equal at this batch to one before (a chunk past a tower's rows is all of them)."""
    out: dict[str, tuple[int, int]] = {}
    for c in chunks:
        q, p = c if isinstance(c, tuple) else (c, c)
        shape = (min(q, n_questions), min(p, n_passages))
        if shape not in out.values():
            out[f"chunk {q}/{p}" if isinstance(c, tuple) else f"chunk {c}"] = shape
    return out


@dataclass(frozen=True)
class Variant:
    """dpr-cache at one chunk with an option beyond its defaults: each chunk's trimmed width
    rounded up to a multiple of ``length_bucket`` (so that shapes repeat), the towers compiled
    with ``torch.compile`` in ``compile_mode``."""

    chunk: int
    length_bucket: int | None = None
    compile_mode: str | None = None

    @property
    def engine(self) -> str:
        """Its row's engine: the settings that differ only by chunk share one."""
        compiled = " compiled" if self.compile_mode else ""
        bucket = f" bucket {self.length_bucket}" if self.length_bucket else ""
        return f"dpr-cache{compiled}{bucket}"

    @property
    def name(self) -> str:
        return self.engine.replace("dpr-cache", f"dpr-cache chunk {self.chunk}", 1)


COMPILED_WARMUPS = 2
"""Warm-up steps of a compiled setting: the first compiles, the second records what the first
left (a shape first seen in it, CUDA graphs recorded on a second call)."""


def chunk_counts(n_q: int, n_p: int, q: int, p: int) -> list[int]:
    """Chunks a step: of questions and of passages, ``q`` and ``p`` rows a chunk."""
    return [-(-n_q // q), -(-n_p // p)]


def speed_comparison(
    model,
    batch: Batch,
    precision: str,
    *,
    chunks: list[Chunk],
    cmnrl_rows: list[int],
    cmnrl_tokens: list[int],
    lib_chunks: list[Chunk],
    variants: list[Variant] = (),
    compiled=None,
    full_batch: bool = True,
    rounds: int = 3,
    warmups: int = 1,
    host_waits: bool | Collection[str] = True,
    fresh_cache: bool = True,
    others: Collection = (),
) -> dict:
    """At one batch and precision: dpr-cache at each chunk and in each variant, the full batch
    (with ``full_batch``), CachedMNRL at each mini-batch (rows, token budget) and the GradCache
    library at each chunk, in one process on one shared-tower model, interleaved. A chunk
    ``(q, p)`` encodes ``q`` questions and ``p`` passages at a time (``train.chunk_size``,
    ``train.p_chunk_size``; the library's ``chunk_sizes=[q, p]``); CachedMNRL has one
    mini-batch for every column (its token budget packs more of the short questions in one);
    dpr-cache at each of CachedMNRL's token budgets too (``train.chunk_tokens``, rows uncapped). A
    chunk equal at this batch to one before it (past a tower's rows it is all of them) is left
    out. A variant runs on ``compiled`` (a model whose towers
    :func:`dpr_cache.model.compiled.compile_towers` compiled in place) where it is compiled,
    with :data:`COMPILED_WARMUPS` warm-ups. Each row names its engine, its chunk and its chunks
    a step (of questions and of passages; None where a token budget decides). ``host_waits``: the
    settings (all, with True) whose waits for the device are counted (one more step each);
    ``fresh_cache`` and ``others`` as :func:`_interleave` takes them."""
    specs = _comparison_specs(
        model, batch, chunks, variants, compiled, full_batch, cmnrl_rows, cmnrl_tokens, lib_chunks
    )
    rows = {name: {"engine": e, "chunk": c, "chunks": n} for name, _, e, c, n in specs}
    steppers = {name: make() for name, make, *_ in specs}
    compiled_names = {v.name for v in variants if v.compile_mode}
    warm = {n: max(warmups, COMPILED_WARMUPS) if n in compiled_names else warmups for n in steppers}
    timed = _interleave(
        steppers,
        batch,
        model,
        precision,
        rounds,
        host_waits,
        warmups=warm,
        fresh_cache=fresh_cache,
        others=others,
    )
    for name, row in timed.items():
        rows[name].update(row)
    return {
        "batch": batch.n_questions,
        "precision": precision,
        "rounds": rounds,
        "warmups": warmups,
        "rows": rows,
        "best": {family: _best(rows, family) for family in _FAMILIES},
    }


def _comparison_specs(
    model, batch, chunks, variants, compiled, full_batch, cmnrl_rows, cmnrl_tokens, lib_chunks
) -> list[tuple]:
    """(name, make, engine, chunk, chunks a step) of every setting :func:`speed_comparison`
    times."""
    n_q, n_p = batch.n_questions, int(batch.p_inputs["input_ids"].shape[0])
    specs = []  # (name, make, engine, chunk, chunks a step)
    for name, (q, p) in chunk_settings(chunks, n_q, n_p).items():
        make = functools.partial(_own_stepper, model, q, p)
        specs.append(
            (f"dpr-cache {name}", make, "dpr-cache", name[6:], chunk_counts(n_q, n_p, q, p))
        )
    for v in variants:
        make = functools.partial(_variant_stepper, model, v, compiled)
        counts = chunk_counts(n_q, n_p, v.chunk, v.chunk)
        specs.append((v.name, make, v.engine, str(v.chunk), counts))
    if full_batch:
        specs.append(("full batch", lambda: _own_stepper(model, None), "full batch", None, [1, 1]))
    for m in [m for m in cmnrl_rows if m <= n_p]:
        make = functools.partial(_cmnrl, model, rows=m)
        per_column = -(-n_q // m)  # questions, positives, each hard negative: a column each
        counts = [per_column, n_p // n_q * per_column]
        specs.append((f"CachedMNRL rows {m}", make, "CachedMNRL", str(m), counts))
    for t in cmnrl_tokens:
        step = _cmnrl(model, tokens=t)
        if step is not None:  # where this version has a token budget
            specs.append(
                (f"CachedMNRL tokens {t}", lambda s=step: s, "CachedMNRL tokens", None, None)
            )
        make = functools.partial(_own_stepper, model, n_q, n_p, chunk_tokens=t)
        specs.append((f"dpr-cache tokens {t}", make, "dpr-cache tokens", None, None))
    for name, (q, p) in chunk_settings(lib_chunks, n_q, n_p).items():
        make = functools.partial(_gradcache_lib, model, [q, p])
        counts = chunk_counts(n_q, n_p, q, p)
        specs.append((f"GradCache library {name}", make, "GradCache library", name[6:], counts))
    return specs


def _variant_stepper(model, variant: Variant, compiled=None):
    """dpr-cache in ``variant``, on ``compiled`` where it is compiled."""
    if variant.compile_mode and compiled is None:
        raise ValueError(f"{variant.name}: no compiled towers given")
    towers = compiled if variant.compile_mode else None
    return _own_stepper(model, variant.chunk, length_bucket=variant.length_bucket, towers=towers)


_FAMILIES = ("dpr-cache", "full batch", "CachedMNRL", "GradCache library")


def add_fitting_full_batch(
    model,
    comparison: dict,
    batch_of: Callable[[int], Batch],
    rounds: int = 3,
    host_waits: bool = True,
) -> dict:
    """Where the full batch ran out of memory at the comparison's batch: the full batch at the
    largest half, quarter, ... of it that fits (the fastest full batch that fits, which the
    goal measures GradCache against), timed on its own and added to the family's rows."""
    if "pairs_per_s" in comparison["rows"].get("full batch", {}):
        return comparison
    size = comparison["batch"] // 2
    while size >= 1:
        name = f"full batch B={size}"
        timed = _interleave(
            {name: _own_stepper(model, None)},
            batch_of(size),
            model,
            comparison["precision"],
            rounds,
            host_waits,
        )
        comparison["rows"][name] = {**timed[name], "engine": "full batch", "chunks": [1, 1]}
        if "pairs_per_s" in timed[name]:
            break
        size //= 2
    comparison["best"]["full batch"] = _best(comparison["rows"], "full batch")
    return comparison


def _best(timed: dict[str, dict], family: str) -> dict | None:
    rows = [(n, r) for n, r in timed.items() if n.startswith(family) and "pairs_per_s" in r]
    if not rows:
        return None
    name, row = max(rows, key=lambda item: item[1]["pairs_per_s"])
    return {"setting": name, "pairs_per_s": row["pairs_per_s"]}


def savings(model, batch: Batch, precision: str, chunk: int, rounds: int = 3) -> dict:
    """dpr-cache with every saving on, then each one off in turn (interleaved); fast dropout
    (a CPU saving) measured last, on the same model, since it patches its dropout modules."""
    steppers = {
        "all savings": _own_stepper(model, chunk),
        "without length order": _own_stepper(model, chunk, length_order=False),
        "without padding trim": _own_stepper(model, chunk, trim_padding=False),
        "without kept last graph": _own_stepper(model, chunk, keep_last_graph=False),
    }
    timed = _interleave(steppers, batch, model, precision, rounds, host_waits=False)
    from dpr_cache.model.fast_dropout import use_fast_dropout

    use_fast_dropout([model.query_encoder, model.passage_encoder])
    fast = _interleave(
        {"with fast dropout": _own_stepper(model, chunk)},
        batch,
        model,
        precision,
        rounds,
        host_waits=False,
    )
    timed.update(fast)
    base = timed["all savings"].get("pairs_per_s")
    pays = {}
    for name, saving in (
        ("without length order", "length_order"),
        ("without padding trim", "trim_padding"),
        ("without kept last graph", "keep_last_graph"),
    ):
        other = timed[name].get("pairs_per_s")
        pays[saving] = round(base / other, 3) if base and other else None
    with_fast = timed["with fast dropout"].get("pairs_per_s")
    pays["fast_dropout"] = round(with_fast / base, 3) if base and with_fast else None
    return {
        "batch": batch.n_questions,
        "precision": precision,
        "chunk": chunk,
        "rows": timed,
        "speedup_of_each": pays,
    }


PASSAGE_WORDS = 100
"""Words a passage, as DPR cut Wikipedia for NQ's 21,015,324 passages."""


def _passages_tsv(squad_dir: Path, out: Path, rows: int) -> Path:
    """``rows`` passages of :data:`PASSAGE_WORDS` words each, NQ's length: each SQuAD article's
    paragraphs joined in order and cut every 100 words (an article's shorter tail left out, so
    that every passage has 100), repeated with fresh ids to reach ``rows``."""
    import csv

    articles: dict[str, list[str]] = {}
    with open(squad_dir / "passages.tsv", newline="") as f:
        for row in csv.DictReader(f, delimiter="\t"):
            articles.setdefault(row["title"], []).extend(row["text"].split())
    n = PASSAGE_WORDS
    pieces = [
        (title, " ".join(words[i : i + n]))
        for title, words in articles.items()
        for i in range(0, len(words) - n + 1, n)
    ]
    with open(out, "w", newline="") as f:
        writer = csv.writer(f, delimiter="\t")
        writer.writerow(["id", "text", "title"])
        for i in range(rows):
            title, text = pieces[i % len(pieces)]
            writer.writerow([i + 1, text, title])
    return out


def encode_rate(
    model_dir: Path,
    squad_dir: Path,
    work: Path,
    device: str,
    rows: int,
    *,
    precision: str = "fp16",
    batch_size: int = 512,
    workers: int = 4,
    timeout: float = 150,
) -> dict:
    """``dpr-cache encode`` on ``rows`` passages (``timeout`` seconds at most) and its rate
    after start-up, from the timings its ``encode.json`` records: the seconds reading the TSV
    into Arrow, a passage's share, plus the encoding past its first batch (the tokenizing
    workers' start, the first rows tokenized, the first kernels), as a 21M-passage run, whose
    start-up is lost in its hours, would run."""
    tsv = _passages_tsv(squad_dir, work / f"passages_{rows}.tsv", rows)
    out = work / f"vectors_{rows}"
    options = {"--model": model_dir, "--passages": tsv, "--out": out, "--device": device}
    options |= {"--precision": precision, "--batch-size": batch_size, "--num-workers": workers}
    options |= {"--max-length": 256, "--cache-dir": work / "cache"}
    cmd = [sys.executable, "-m", "dpr_cache", "encode", *option_args(options), "-q"]
    run = child(cmd, timeout)
    if run["rc"] != 0:
        lines = run["stderr"].strip().splitlines()
        return {"error": lines[-40:] if run["rc"] is None else lines[-1:] or ["failed"]}
    try:
        t = json.loads((out / "encode.json").read_text())["timings"]
        n, first = t["encoded_passages"], t["first_batch_passages"]
        past_first = (t["encode_seconds"] - t["first_batch_seconds"]) / (n - first)
        seconds_a_passage = t["open_seconds"] / n + past_first
    except (OSError, ValueError, KeyError, TypeError, ZeroDivisionError) as exc:
        return {"error": [f"encode.json's timings: {type(exc).__name__}: {exc}"]}
    return {
        "passages": n,
        "seconds": run["seconds"],
        "timings": t,
        "passages_per_s": 1 / seconds_a_passage,
        "precision": precision,
        "batch_size": batch_size,
        "max_length": 256,
        "length_sorted": True,
    }


NQ_SCORE_PAIRS = 58_880 * (1 + 30)  # DPR's NQ training questions, a positive and 30 negatives


def teacher_score_rate(
    tokenizer_dir: str,
    squad_dir: Path,
    work: Path,
    device: torch.device,
    n_pairs: int,
    precisions: list[str],
    batch_size: int,
    rounds: int,
    into: dict | None = None,
    shape: tuple[int, int] = (6, 384),
) -> dict:
    """``score``'s cross-encoder loop (length-sorted batches of tokenized pairs) on ``n_pairs``
    pairs of SQuAD dev questions and 100-word passages, with a cross-encoder of ``shape``
    (layers, width; all-MiniLM-L6-v2's by default; random weights: the cost is the shape's), at
    each precision, over ``rounds`` rounds whose order alternates (the second reversed), each
    precision run on every batch's shape before any timed run; projected to NQ's training set
    (58,880 questions x 31 passages). Beside it, the model alone (the best of as many rounds,
    alternating too): the same batches already padded on the device, so the difference is the
    host's share (tokenizing, padding, copying). What a new shape costs: the first pass at each
    precision (in the rounds' order reversed) over every batch but the longest, on shapes not
    yet run at that precision (its one-time start paid first on the longest batch, which needs
    the most memory), against the same batches again at the end. And the longest batch under
    torch's profiler at each precision. The pairs' tokenization (on the CPU, part of every
    loop's seconds) is also timed alone. The figures go into ``into`` (returned) as they are
    measured, so that a section stopped part way keeps them."""
    from dpr_cache.model.cross_encoder import load_cross_encoder, tokenize_pairs

    folder = _random_cross_encoder(tokenizer_dir, work, shape)
    encoder = load_cross_encoder(folder, max_length=256, device=device)
    pairs = _score_sample(squad_dir, work, n_pairs)
    start = time.perf_counter()
    features = tokenize_pairs(encoder.tokenizer, pairs, encoder.max_length)
    tokenize_s = time.perf_counter() - start
    lengths = [len(ids) for ids in features["input_ids"]]
    out = {} if into is None else into
    out.update(
        tokenize_s=tokenize_s,
        mean_tokens=sum(lengths) / n_pairs,
        batch_size=batch_size,
        max_length=256,
        model={"layers": shape[0], "hidden": shape[1]},
        nq_pairs=NQ_SCORE_PAIRS,
        rows=[],
    )
    alone = _ModelAlone(encoder, device, features, lengths, batch_size)
    first = out["first_pass"] = alone.first_pass_record(precisions)
    alone.first_passes(precisions, first)  # filled as it goes: a section stopped keeps it
    out["rows"] = _score_rounds(encoder, pairs, device, precisions, rounds, batch_size, out["rows"])
    out["model_alone"] = alone.best(precisions, rounds)
    for precision in first["seconds"]:  # the first pass's batches again, all shapes run
        first["again_seconds"][precision] = alone.timed(precision, alone.batches[1:])
    longest = alone.batches[:1]
    _profiled(lambda: alone.run(precisions[0], longest), device)  # the profiler's own start
    profiles = out["profiles"] = {}
    for precision in precisions:
        profiles[precision] = _profiled(lambda p=precision: alone.run(p, longest), device)
    return out


def _random_cross_encoder(tokenizer_dir: str, work: Path, shape: tuple[int, int]) -> Path:
    """A BERT cross-encoder of ``shape`` (layers, width) with random weights, written once."""
    from transformers import AutoTokenizer, BertConfig, BertForSequenceClassification

    layers, width = shape
    folder = work / f"cross-encoder-{layers}x{width}"
    if not folder.exists():
        tokenizer = AutoTokenizer.from_pretrained(tokenizer_dir)
        config = BertConfig(
            vocab_size=tokenizer.vocab_size,
            hidden_size=width,
            num_hidden_layers=layers,
            num_attention_heads=width // 32,
            intermediate_size=4 * width,
            num_labels=1,
        )
        torch.manual_seed(0)
        BertForSequenceClassification(config).save_pretrained(folder)
        tokenizer.save_pretrained(folder)
    return folder


def _score_sample(squad_dir: Path, work: Path, n_pairs: int) -> list:
    """``n_pairs`` pairs of SQuAD dev questions and 100-word passages."""
    import csv

    from dpr_cache.data.qas import read_qas
    from dpr_cache.model.cross_encoder import Pair

    questions = [q for q, _ in read_qas(squad_dir / "dev.qa.tsv")]
    tsv = _passages_tsv(squad_dir, work / "score_passages.tsv", 5_000)
    with open(tsv, newline="") as f:
        passages = [(r["title"], r["text"]) for r in csv.DictReader(f, delimiter="\t")]
    return [
        Pair(questions[i % len(questions)], *passages[(i * 7) % len(passages)])
        for i in range(n_pairs)
    ]


def _score_rounds(encoder, pairs, device, precisions, rounds, batch_size, rows) -> list[dict]:
    """``score``'s whole loop at each precision, the rounds' order alternating."""
    from dpr_cache.model.cross_encoder import score_pairs

    for r, precision in _alternating(precisions, rounds):
        start = time.perf_counter()
        score_pairs(encoder, pairs, batch_size=batch_size, precision=precision)
        _sync(device)
        seconds = time.perf_counter() - start
        rate = len(pairs) / seconds
        rows.append(
            {
                "round": r + 1,
                "precision": precision,
                "pairs": len(pairs),
                "seconds": seconds,
                "pairs_a_second": rate,
                "nq_hours": NQ_SCORE_PAIRS / rate / 3600,
            }
        )
    return rows


def _sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize()


class _ModelAlone:
    """The cross-encoder alone on length-sorted batches already padded on the device."""

    def __init__(self, encoder, device, features, lengths, batch_size):
        from dpr_cache.data.tokenize import pad

        self.encoder, self.device, self.n = encoder, device, len(lengths)
        order = sorted(range(self.n), key=lambda i: -lengths[i])
        self.batches = [
            {
                k: v.to(device)
                for k, v in pad(encoder.tokenizer, features, order[s : s + batch_size]).items()
            }
            for s in range(0, self.n, batch_size)
        ]

    def run(self, precision: str, some: list[dict] | None = None) -> None:
        from dpr_cache.runtime.device import autocast

        with torch.inference_mode(), autocast(self.device, precision):
            for batch in self.batches if some is None else some:
                self.encoder.model(**batch).logits.float()
        _sync(self.device)

    def timed(self, precision: str, some: list[dict] | None = None) -> float:
        start = time.perf_counter()
        self.run(precision, some)
        return time.perf_counter() - start

    def first_pass_record(self, precisions: list[str]) -> dict:
        """What :meth:`first_passes` fills: every batch but the longest, and its new lengths."""
        rest = self.batches[1:]
        lengths = {b["input_ids"].shape[1] for b in rest} - {self.batches[0]["input_ids"].shape[1]}
        return {
            "order": precisions[::-1],
            "batches": len(rest),
            "pairs": sum(len(b["input_ids"]) for b in rest),
            "new_lengths": len(lengths),
            "seconds": {},
            "again_seconds": {},
        }

    def first_passes(self, precisions: list[str], first: dict) -> None:
        """Each precision's first pass over every batch but the longest (whose shape, and
        one-time start, each precision pays first), in the rounds' order reversed, into
        ``first``."""
        rest = self.batches[1:]
        for precision in precisions:
            self.run(precision, self.batches[:1])  # one-time start: the most memory, the handles
        for precision in first["order"]:  # every other shape, once, before the rounds
            seconds = self.timed(precision, rest)
            if rest:
                first["seconds"][precision] = seconds

    def best(self, precisions: list[str], rounds: int) -> list[dict]:
        """The best of ``rounds`` alternating rounds at each precision."""
        best: dict[str, float] = {}
        for _, precision in _alternating(precisions, rounds):
            seconds = self.timed(precision)
            best[precision] = min(seconds, best.get(precision, seconds))
        return [
            {"precision": p, "seconds": best[p], "pairs_a_second": self.n / best[p]}
            for p in precisions
        ]


def _alternating(items: list[str], rounds: int) -> Iterator[tuple[int, str]]:
    """(round, item) for ``rounds`` rounds of ``items``, every other round in reverse order."""
    for r in range(rounds):
        for item in items if r % 2 == 0 else items[::-1]:
            yield r, item


def _profiled(run: Callable[[], None], device: torch.device, top: int = 6) -> dict:
    """``run`` once under torch's profiler: its wall time, the time of what ran on the device
    (the CPU's operators when there is no device) and the ``top`` of those by time. What the
    profiler itself raises (a device's build without it) is returned as the error; what
    ``run`` raises is raised."""
    from torch.profiler import ProfilerActivity, profile

    cuda = device.type == "cuda"
    activities = [ProfilerActivity.CPU] + ([ProfilerActivity.CUDA] if cuda else [])
    profiler_errors = (RuntimeError, AttributeError)
    try:
        prof = profile(activities=activities)
        prof.start()
    except profiler_errors as e:
        return {"error": f"{type(e).__name__}: {e}"}
    failed = None
    try:
        start = time.perf_counter()
        run()  # ends with a sync
        wall_ms = (time.perf_counter() - start) * 1e3
    finally:
        try:
            prof.stop()
            times = operator_times(prof.key_averages(), cuda)
        except profiler_errors as e:
            failed = f"{type(e).__name__}: {e}"
    if failed is not None:
        return {"error": failed}
    if not times:
        return {"error": "the profiler recorded no time on the " + ("device" if cuda else "cpu")}
    return {
        "on": "device" if cuda else "cpu",
        "wall_ms": wall_ms,
        "self_ms": sum(us for _, _, us in times) / 1e3,
        "top": [{"op": key, "calls": n, "ms": us / 1e3} for key, n, us in times[:top]],
    }


def operator_times(events, cuda: bool) -> list[tuple[str, int, float]]:
    """(name, calls, microseconds) of each kernel on the device, or with no device each CPU
    operator's own time, longest first; user annotations are left out. A kernel's time is also
    on the operator that launched it: only the kernels' own events are counted, each once, and
    where the profiler fell back to timing operators on the device (no CUPTI), those."""
    from torch.autograd import DeviceType

    kept = []
    for e in events:
        if getattr(e, "is_user_annotation", False):
            continue
        if not cuda:
            kept.append((e.key, e.count, e.self_cpu_time_total))
        elif e.device_type == DeviceType.CUDA or getattr(e, "is_legacy", False):
            kept.append((e.key, e.count, e.self_device_time_total))
    return sorted(kept, key=lambda t: t[2], reverse=True)


def model_encode_rate(
    model,
    feats_source: Path,
    device: torch.device,
    precision: str,
    batch_size: int = 512,
    rows: int = 20000,
) -> dict:
    """The encoder alone on pre-tokenized passages (length-sorted batches): passages per second
    and their mean length in tokens (for the compute-bound limit) and in words."""
    import csv

    from dpr_cache.data.tokenize import tokenize_passages
    from dpr_cache.retrieval.dense.encode import encode_tokenized

    titles, texts = [], []
    with open(feats_source, newline="") as f:
        for i, row in enumerate(csv.DictReader(f, delimiter="\t")):
            if i == rows:
                break
            titles.append(row["title"])
            texts.append(row["text"])
    feats = tokenize_passages(model.tokenizer, titles, texts, 256, model.passage_prefix)
    tokens = sum(len(s) for s in feats["input_ids"]) / len(titles)
    words = sum(len(t.split()) for t in texts) / len(texts)
    model.eval()
    encode_tokenized(
        model, feats, max_length=256, batch_size=batch_size, device=device, precision=precision
    )
    _sync(device)
    start = time.perf_counter()
    encode_tokenized(
        model, feats, max_length=256, batch_size=batch_size, device=device, precision=precision
    )
    _sync(device)
    seconds = time.perf_counter() - start
    model.train()
    return {
        "passages": len(titles),
        "seconds": seconds,
        "passages_per_s": len(titles) / seconds,
        "mean_tokens": tokens,
        "mean_words": words,
    }


def passage_flops(model, tokens: float) -> float:
    """Forward FLOPs of one passage of ``tokens`` tokens: 2 per weight per token in the
    encoder's matrices, plus attention's two products (4 * tokens^2 * hidden a layer)."""
    config = model.passage_encoder.config
    h, layers = config.hidden_size, config.num_hidden_layers
    per_layer = 4 * h * h + 2 * h * config.intermediate_size
    return 2 * layers * per_layer * tokens + 4 * layers * tokens * tokens * h


def matmul_tflops(device: torch.device, dtype: torch.dtype, n: int = 8192, reps: int = 10) -> float:
    """A large square matrix product's rate on ``device`` (random data, median of ``reps``)."""
    a = torch.randn(n, n, device=device, dtype=dtype)
    b = torch.randn(n, n, device=device, dtype=dtype)
    for _ in range(3):
        a @ b
    times = []
    for _ in range(reps):
        _sync(device)
        start = time.perf_counter()
        a @ b
        _sync(device)
        times.append(time.perf_counter() - start)
    return 2 * n**3 / statistics.median(times) / 1e12
