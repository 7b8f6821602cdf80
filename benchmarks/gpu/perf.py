"""A step's peak memory by batch, pairs per second against the full batch and the peers
(interleaved), which savings pay, the rates of ``encode`` and of the teacher's scoring."""

from __future__ import annotations

import collections
import csv
import functools
import gc
import inspect
import itertools
import json
import statistics
import sys
import time
import warnings
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import NamedTuple

import torch

from benchmarks.gpu.cli import child
from benchmarks.harness import option_args
from dpr_cache.data.collate import Batch


def free_device(device: torch.device) -> None:
    """Objects held in cycles (a stopped section's trainer) and the CUDA cache handed back."""
    gc.collect()
    if device.type == "cuda":
        torch.cuda.empty_cache()
        torch.cuda.reset_peak_memory_stats(device)


def _timed(run: Callable[[], object], device: torch.device) -> float:
    """Seconds of ``run``, the device synchronized before and after."""
    if device.type == "cuda":
        torch.cuda.synchronize()
    start = time.perf_counter()
    run()
    if device.type == "cuda":
        torch.cuda.synchronize()
    return time.perf_counter() - start


def synthetic_pairs(vocab: int, n_q: int, q_len: int, p_len: int, tokenizer=None) -> Batch:
    """``n_q`` questions of random full-length tokens, a positive and a hard negative each."""
    from dpr_cache.data.synthetic import synthetic_batch

    return Batch(*synthetic_batch(tokenizer, vocab, n_q, 2 * n_q, q_len, p_len, seed=0), n_q, 2)


def step_row(trainer, batch: Batch, device: torch.device) -> dict:
    """Peak memory, seconds and loss of one ``Trainer.step`` (AdamW included), or that it ran
    out."""
    from dpr_cache.runtime.memory import peak_memory_bytes

    try:
        result = trainer.step(batch)
    except torch.OutOfMemoryError:
        return {"peak_bytes": None, "step_s": None, "fits": False}
    peak = peak_memory_bytes(device)
    return {"peak_bytes": peak, "step_s": result.seconds, "fits": True, "loss": result.loss}


def trainer_step_peak(model_dir: Path, work: Path, device: torch.device, **train) -> dict:
    """:func:`step_row` for ``model_dir``: CLS pooling, one hard negative, 32 + 256 tokens."""
    from dpr_cache.config import load_config
    from dpr_cache.runtime.distributed import DistEnv
    from dpr_cache.train.trainer import build_trainer

    sets = [f"output_dir={work}", f"model.name_or_path={model_dir}", "model.pooling=cls"]
    sets += ["model.max_query_length=32", "model.max_passage_length=256", "train.lr=1e-5"]
    train |= {"device": device, "hard_negatives": 1}
    config = load_config(None, sets + [f"train.{k}={v}" for k, v in train.items()])
    free_device(device)
    trainer = build_trainer(config, DistEnv(device=device), total_steps=10)
    vocab, tok = int(trainer.model.query_encoder.config.vocab_size), trainer.model.tokenizer
    row = step_row(trainer, synthetic_pairs(vocab, config.train.batch_size, 32, 256, tok), device)
    del trainer
    free_device(device)
    return row


def memory_by_batch(model_dir, work, device, batches, *, chunk=32, precision="bf16", tile=4096):
    """One GradCache step's peak at each batch size (one hard negative, tiled loss)."""
    train = {"precision": precision, "loss_tile_size": tile}
    peak = functools.partial(trainer_step_peak, model_dir, work, device, **train)
    rows = [{"batch": b, "chunk": min(chunk, b), "precision": precision} for b in batches]
    return [row | peak(batch_size=row["batch"], chunk_size=row["chunk"]) for row in rows]


def largest_full_batch(model_dir, work, device, *, precision="bf16", start=64) -> dict:
    """The largest full batch (``train.mode: full``) whose step fits, to 16 questions."""
    train = {"mode": "full", "precision": precision}
    peak = functools.partial(trainer_step_peak, model_dir, work, device, **train)
    found = search_largest(
        lambda b: peak(batch_size=b), start, 16, time_ok=lambda b, _: b > 1 << 16 and "past 65,536"
    )
    tried = {k: v["fits"] for k, v in sorted(found["tried"].items(), key=lambda kv: int(kv[0]))}
    peak = found["tried"].get(str(found["batch"]), {}).get("peak_bytes")
    return {"batch": found["batch"], "peak_bytes": peak, "precision": precision, "tried": tried}


def search_largest(fits, start: int, granularity: int, *, predict=None, time_ok=None) -> dict:
    """The largest batch ``fits(b)["fits"]``, to ``granularity``: doubling from ``start``, then
    bisection, ``predict(tried)`` capping a doubling; ``time_ok(b, tried)``: why ``b`` is not."""
    tried: dict[int, dict] = {}
    good = bad = stopped = None
    b: int | None = start
    while b is not None:
        why = time_ok and time_ok(b, tried)
        if why:
            stopped = f"B={b} not tried: {why}"
            break
        tried[b] = fits(b)
        good, bad = (b, bad) if tried[b]["fits"] else (good, b)
        b = _next_try(good, bad, granularity, predict(tried) if predict else None)
    resolution = None if good is None or bad is None else bad - good
    found = {"batch": good, "first_too_large": bad, "resolution": resolution}
    return found | {"tried": {str(k): v for k, v in tried.items()}, "stopped": stopped}


def _next_try(good: int | None, bad: int | None, step: int, predicted: int | None) -> int | None:
    """The search's next batch (None: done), on the grid of ``step``."""
    if good is None:  # the first try did not fit: halve down to one step
        return None if bad <= step else max(step, bad // 2 // step * step)
    capped = None if predicted is None else predicted // step * step
    if bad is None:  # doubling, capped by the prediction
        if capped is None:
            return 2 * good
        return good + step if capped <= good else min(2 * good, capped)
    if bad - good <= step:
        return None
    if capped is not None and good + step <= capped <= bad - step:
        return capped
    return max(good + step, (good + bad) // 2 // step * step)


def squad_batch(model, squad_gz: Path, work: Path, batch: int, hard_negatives: int = 1):
    """``train``'s step-0 batch of SQuAD's training questions (32 + 256 tokens)."""
    from dpr_cache.data.batches import TrainBatches
    from dpr_cache.data.collate import build_batch
    from dpr_cache.data.squad import build_squad
    from dpr_cache.data.training import load_training_set

    if not (work / "train.jsonl").exists():
        build_squad(squad_gz, work)
    dataset = load_training_set(work / "train.jsonl", work / "cache")
    indices = TrainBatches(len(dataset), batch, 0, source="squad").batch_indices(0)
    rows = [dataset[i] for i in indices]
    lengths = {"max_query_length": 32, "max_passage_length": 256, "seed": 0, "epoch": 0}
    options = {"hard_negatives": hard_negatives, "pool_for_padding": dataset, "indices": indices}
    return build_batch(rows, tokenizer=model.tokenizer, **lengths, **options)


def _own_stepper(model, chunk, p_chunk=None, *, towers=None, **options):
    """dpr-cache's GradCache (``make_stepper``'s ``options``) or the full batch (``chunk`` None)."""
    from dpr_cache.core.loss import InfoNCE
    from dpr_cache.core.objective import Objective, make_loss_fn
    from dpr_cache.core.steppers import Towers, make_stepper

    loss_fn, on = make_loss_fn(Objective(2, InfoNCE(1.0))), model if towers is None else towers
    encoders = Towers(on.encode_query, on.encode_passage)
    if chunk is None:
        return make_stepper("full", encoders, loss_fn, chunk_size=1)
    return make_stepper(
        "gradcache", encoders, loss_fn, chunk_size=chunk, p_chunk_size=p_chunk, **options
    )


def _cmnrl(model, rows: int | None = None, tokens: int | None = None, folder: str | None = None):
    """CachedMNRL by ``rows`` or a ``tokens`` budget (None where this version has none)."""
    from benchmarks.peers import CachedMNRLStep

    step = CachedMNRLStep(model, rows or 32, folder)
    if tokens is not None:
        if "mini_batch_num_tokens" not in inspect.signature(type(step.loss).__init__).parameters:
            return None
        step.loss.mini_batch_num_tokens = tokens
    return step


def count_syncs(step: Callable[[], object], device, precision: str) -> dict:
    """How often one call of ``step`` made the host wait for the device, and the top 3 lines."""
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
    waits = [w for w in caught if "synchroniz" in str(w.message)]
    sources = collections.Counter(f"{Path(w.filename).name}:{w.lineno}" for w in waits)
    return {"count": sum(sources.values()), "top": dict(sources.most_common(3))}


STEP_ERRORS = (RuntimeError, ValueError, TypeError, NotImplementedError, AssertionError)
"""What a setting's step may raise, reported in its row (out of memory, a compiler's error)."""


def _interleave(steppers, batch, model, precision, rounds, host_waits=(), *, warmups=None, **more):
    """Each stepper's step timed once a round, rounds interleaved, after its warm-ups (by name, 1
    if not named); one that fails is dropped with the reason; on CUDA ``host_waits`` counted."""
    device, warmups = model.device, warmups or {}

    def zero_grad() -> None:
        for m in (model, *more.get("others", ())):
            m.zero_grad(set_to_none=True)

    zero_grad()
    if more.get("fresh_cache", True):
        free_device(device)
    b, warm = batch.to(device), {n: warmups.get(n, 1) for n in steppers}
    first = max(warm.values(), default=0)
    runs = {n: {"times": [], "warmup_s": []} for n in steppers}
    for r in range(first + rounds):
        for name, stepper in steppers.items():
            run = runs[name]
            if "failed" in run or r < first - warm[name]:
                continue
            zero_grad()
            waits = r == first - 1 and device.type == "cuda" and name in host_waits
            step = _attempt(stepper, b, precision, waits)
            if "failed" in step:
                run["failed"] = step["failed"]
                print(f"    {name}: {step['failed']}", flush=True)
                zero_grad()
                free_device(device)
                continue
            run.update({"syncs": step["syncs"]} if "syncs" in step else {})
            run["times" if r >= first else "warmup_s"].append(step["seconds"])
            if r < first:
                print(f"    {name}: warm-up {step['seconds']:.1f} s", flush=True)
    return {n: _timed_row(run, batch) for n, run in runs.items()}


def _attempt(stepper, b: Batch, precision: str, count_waits: bool) -> dict:
    """One step's seconds (and host waits); or why it failed."""
    from dpr_cache.runtime.device import autocast

    device = b.q_inputs["input_ids"].device
    step = functools.partial(stepper.step, b.q_inputs, b.p_inputs, p_ids=b.p_ids)
    try:
        with autocast(device, precision):
            out = {"seconds": _timed(step, device)}
        if count_waits:
            out["syncs"] = count_syncs(step, device, precision)
        return out
    except STEP_ERRORS as exc:
        oom = isinstance(exc, torch.OutOfMemoryError)
        return {"failed": "out of memory" if oom else f"{type(exc).__name__}: {exc}"[:300]}


def _timed_row(run: dict, batch: Batch) -> dict:
    """One stepper's median step, rate, times and warm-ups; or why none."""
    ts, warmup_s = run["times"], run["warmup_s"]
    if "failed" in run or not ts:
        row = {"failed": run.get("failed", "not timed")}
        return row | {"warmup_s": warmup_s} if warmup_s else row
    median = statistics.median(ts)
    row = {"step_s": median, "pairs_per_s": batch.n_questions / median, "times_s": ts}
    return row | {"warmup_s": warmup_s} | ({"syncs": run["syncs"]} if "syncs" in run else {})


Chunk = int | tuple[int, int]  # rows of both towers, or (questions, passages) a chunk


def chunk_settings(chunks: list[Chunk], n_questions: int, n_passages: int) -> dict[str, tuple]:
    """Each chunk's name and (questions, passages) a chunk at this batch, repeats left out."""
    out: dict[str, tuple[int, int]] = {}
    for c in chunks:
        q, p = c if isinstance(c, tuple) else (c, c)
        shape = (min(q, n_questions), min(p, n_passages))
        if shape not in out.values():
            out[f"chunk {q}/{p}" if isinstance(c, tuple) else f"chunk {c}"] = shape
    return out


class Variant(NamedTuple):
    """dpr-cache at one chunk, widths rounded up to ``length_bucket``, compiled or not."""

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


COMPILED_WARMUPS = 2  # a compiled setting's: the first compiles, the second records CUDA graphs
_FAMILIES = ("dpr-cache", "full batch", "CachedMNRL", "GradCache library")


def speed_comparison(model, batch, precision, *, rounds=3, warmups=1, batch_of=None, **settings):
    """dpr-cache, the full batch and the peers (:func:`_comparison_specs`) interleaved; with
    ``batch_of``, a full batch out of memory is timed at the largest half that fits."""
    specs = _comparison_specs(model, batch, settings)
    rows = {name: {"engine": e, "chunk": c, "chunks": n} for name, _, e, c, n in specs}
    compiled = {v.name for v in settings.get("variants", ()) if v.compile_mode}
    warm = {n: max(warmups, COMPILED_WARMUPS) if n in compiled else warmups for n in rows}
    options = {k: settings[k] for k in ("fresh_cache", "others", "host_waits") if k in settings}
    steppers = {name: make() for name, make, *_ in specs}
    timed = _interleave(steppers, batch, model, precision, rounds, warmups=warm, **options)
    for name, row in timed.items():
        rows[name].update(row)
    out = {"batch": batch.n_questions, "precision": precision, "rounds": rounds, "warmups": warmups}
    out |= {"rows": rows, "best": {family: _best(rows, family) for family in _FAMILIES}}
    out |= {"peer_min_chunk": settings["peer_min_chunk"]} if "peer_min_chunk" in settings else {}
    if batch_of is None or not settings.get("full_batch", True):
        return out
    return add_fitting_full_batch(model, out, batch_of, rounds)


def _comparison_specs(model, batch, s: dict) -> list[tuple]:
    """(name, make, engine, chunk, chunks a step) of each setting :func:`speed_comparison` times."""
    from benchmarks.peers import GradCacheLibStep

    n_q, n_p = batch.n_questions, int(batch.p_inputs["input_ids"].shape[0])
    part, cmnrl = functools.partial, functools.partial(_cmnrl, model, folder=s.get("cmnrl_folder"))

    def counts(q: int, p: int) -> list[int]:  # chunks a step: of questions, of passages
        return [-(-n_q // q), -(-n_p // p)]

    specs = [
        (f"dpr-cache {name}", part(_own_stepper, model, q, p), "dpr-cache", name[6:], counts(q, p))
        for name, (q, p) in chunk_settings(s.get("chunks", ()), n_q, n_p).items()
    ]
    for v in s.get("variants", ()):
        make = part(_variant_stepper, model, v, s.get("compiled"))
        specs.append((v.name, make, v.engine, str(v.chunk), counts(v.chunk, v.chunk)))
    if s.get("full_batch", True):
        specs.append(("full batch", part(_own_stepper, model, None), "full batch", None, [1, 1]))
    least = s.get("peer_min_chunk") or 0  # the peers' chunks below it left out
    for m in [m for m in s.get("cmnrl_rows", ()) if least <= m <= n_p]:
        per_column = -(-n_q // m)  # questions, positives, each hard negative: a column each
        made = [per_column, n_p // n_q * per_column]
        specs.append((f"CachedMNRL rows {m}", part(cmnrl, rows=m), "CachedMNRL", str(m), made))
    for t in s.get("cmnrl_tokens", ()):
        step = cmnrl(tokens=t)
        if step is not None:  # where this version has a token budget
            name = f"CachedMNRL tokens {t}"
            specs.append((name, lambda made=step: made, "CachedMNRL tokens", None, None))
        make = part(_own_stepper, model, n_q, n_p, chunk_tokens=t)
        specs.append((f"dpr-cache tokens {t}", make, "dpr-cache tokens", None, None))
    lib = [c for c in s.get("lib_chunks", ()) if min(c if isinstance(c, tuple) else [c]) >= least]
    for name, (q, p) in chunk_settings(lib, n_q, n_p).items():
        make, made = part(GradCacheLibStep, model, [q, p]), counts(q, p)
        specs.append((f"GradCache library {name}", make, "GradCache library", name[6:], made))
    return specs


def _variant_stepper(model, variant: Variant, compiled=None):
    """dpr-cache in ``variant``, on ``compiled`` where it is compiled."""
    if variant.compile_mode and compiled is None:
        raise ValueError(f"{variant.name}: no compiled towers given")
    towers = compiled if variant.compile_mode else None
    return _own_stepper(model, variant.chunk, length_bucket=variant.length_bucket, towers=towers)


def add_fitting_full_batch(model, comparison, batch_of, rounds=3) -> dict:
    """Where the full batch ran out of memory: the largest half, quarter, ... that fits, added."""
    if "pairs_per_s" in comparison["rows"].get("full batch", {}):
        return comparison
    size = comparison["batch"] // 2
    while size >= 1:
        name, precision = f"full batch B={size}", comparison["precision"]
        stepper = {name: _own_stepper(model, None)}
        timed = _interleave(stepper, batch_of(size), model, precision, rounds, ())
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


_SAVINGS = {"without length order": "length_order", "without padding trim": "trim_padding"}
_SAVINGS |= {"without kept last graph": "keep_last_graph"}


def savings(model, batch: Batch, precision: str, chunk: int, rounds: int = 3) -> dict:
    """dpr-cache with every saving on, then each one off in turn; fast dropout last (it patches)."""
    from dpr_cache.model.fast_dropout import use_fast_dropout

    steppers = {"all savings": _own_stepper(model, chunk)}
    steppers |= {name: _own_stepper(model, chunk, **{s: False}) for name, s in _SAVINGS.items()}
    timed = _interleave(steppers, batch, model, precision, rounds)
    use_fast_dropout([model.query_encoder, model.passage_encoder])
    fast = {"with fast dropout": _own_stepper(model, chunk)}
    timed |= _interleave(fast, batch, model, precision, rounds)
    rate = {name: row.get("pairs_per_s") for name, row in timed.items()}
    pays = {s: _ratio(rate["all savings"], rate[name]) for name, s in _SAVINGS.items()}
    pays["fast_dropout"] = _ratio(rate["with fast dropout"], rate["all savings"])
    sizes = {"batch": batch.n_questions, "precision": precision, "chunk": chunk}
    return sizes | {"rows": timed, "speedup_of_each": pays}


def _ratio(a: float | None, b: float | None) -> float | None:
    return round(a / b, 3) if a and b else None


PASSAGE_WORDS = 100  # words a passage, as DPR cut Wikipedia for NQ's 21,015,324 passages


def _passages_tsv(squad_dir: Path, out: Path, rows: int) -> Path:
    """``rows`` passages of SQuAD's articles cut every 100 words, repeated with fresh ids."""
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
        writer.writerows([i + 1, *pieces[i % len(pieces)][::-1]] for i in range(rows))
    return out


def _read_passages(tsv: Path, rows: int | None = None) -> list[tuple[str, str]]:
    """The (title, text) of the first ``rows`` passages of ``tsv`` (all with None)."""
    with open(tsv, newline="") as f:
        read = itertools.islice(csv.DictReader(f, delimiter="\t"), rows)
        return [(r["title"], r["text"]) for r in read]


def passages_path(work: Path, rows: int) -> Path:
    """Where :func:`encode_rate` writes the first ``rows`` SQuAD passages, in DPR's TSV."""
    return work / f"passages_{rows}.tsv"


def encode_rate(model_dir, squad_dir, work, device, rows, *, precision, batch_size, workers):
    """``dpr-cache encode``'s rate past start-up (``encode.json``): reading plus encoding."""
    tsv = _passages_tsv(squad_dir, passages_path(work, rows), rows)
    out = work / f"vectors_{rows}"
    options = {"--model": model_dir, "--passages": tsv, "--out": out, "--device": device}
    options |= {"--precision": precision, "--batch-size": batch_size, "--num-workers": workers}
    options |= {"--max-length": 256, "--cache-dir": work / "cache"}
    run = child([sys.executable, "-m", "dpr_cache", "encode", *option_args(options), "-q"], 150)
    if run["rc"] != 0:
        lines = run["stderr"].strip().splitlines()
        return {"error": lines[-40:] if run["rc"] is None else lines[-1:] or ["failed"]}
    t = json.loads((out / "encode.json").read_text())["timings"]
    n, first = t["encoded_passages"], t["first_batch_passages"]
    past_first = (t["encode_seconds"] - t["first_batch_seconds"]) / (n - first)
    seconds_a_passage = t["open_seconds"] / n + past_first
    rate = {"passages": n, "seconds": run["seconds"], "timings": t}
    rate |= {"passages_per_s": 1 / seconds_a_passage, "precision": precision}
    return rate | {"batch_size": batch_size, "max_length": 256, "length_sorted": True}


def model_encode_rate(model, feats_source, device, precision, batch_size=512, rows=20000) -> dict:
    """The encoder alone on pre-tokenized passages (the second of two runs timed)."""
    from dpr_cache.data.tokenize import tokenize_passages
    from dpr_cache.retrieval.dense.encode import encode_tokenized

    titles, texts = zip(*_read_passages(feats_source, rows), strict=True)
    feats = tokenize_passages(model.tokenizer, list(titles), list(texts), 256, model.passage_prefix)
    model.eval()
    options = {"max_length": 256, "batch_size": batch_size, "device": device}
    run = functools.partial(encode_tokenized, model, feats, precision=precision, **options)
    run()
    seconds = _timed(run, device)
    model.train()
    n, tokens = len(titles), sum(len(s) for s in feats["input_ids"])
    rate = {"passages": n, "seconds": seconds, "passages_per_s": n / seconds}
    return rate | {"mean_tokens": tokens / n, "mean_words": sum(len(t.split()) for t in texts) / n}


def passage_flops(model, tokens: float) -> float:
    """Forward FLOPs of a passage: 2 a weight a token, plus attention's 4 * tokens^2 * hidden."""
    config = model.passage_encoder.config
    h, layers = config.hidden_size, config.num_hidden_layers
    per_layer = 4 * h * h + 2 * h * config.intermediate_size
    return 2 * layers * per_layer * tokens + 4 * layers * tokens * tokens * h


def matmul_tflops(device: torch.device, dtype: torch.dtype, n: int = 8192, reps: int = 10) -> float:
    """A large square matrix product's rate on ``device`` (random data, median of ``reps``)."""
    a, b = (torch.randn(n, n, device=device, dtype=dtype) for _ in range(2))
    for _ in range(3):
        a @ b
    times = [_timed(lambda: a @ b, device) for _ in range(reps)]
    return 2 * n**3 / statistics.median(times) / 1e12


NQ_SCORE_PAIRS = 58_880 * (1 + 30)  # DPR's NQ training questions, a positive and 30 negatives


def teacher_score_rate(plan, tokenizer, squad_dir, work, device, out: dict) -> dict:
    """``score``'s loop on a random cross-encoder of ``plan.score_shape`` (layers, width) at each
    precision, projected to NQ; the tokenization alone; the model alone; into ``out``."""
    from dpr_cache.data.tokenize import pad
    from dpr_cache.model.cross_encoder import load_cross_encoder, score_pairs, tokenize_pairs

    n_pairs, batch_size, shape = plan.score_pairs, plan.score_batch, plan.score_shape
    precisions = plan.score_precisions
    folder = _random_cross_encoder(tokenizer, work, shape)
    encoder = load_cross_encoder(folder, max_length=256, device=device)
    pairs, start = _score_sample(squad_dir, work, n_pairs), time.perf_counter()
    features = tokenize_pairs(encoder.tokenizer, pairs, encoder.max_length)
    out["tokenize_s"] = time.perf_counter() - start
    lengths = [len(ids) for ids in features["input_ids"]]
    out.update(mean_tokens=sum(lengths) / n_pairs, batch_size=batch_size, max_length=256)
    out.update(model={"layers": shape[0], "hidden": shape[1]}, nq_pairs=NQ_SCORE_PAIRS, rows=[])
    order = sorted(range(n_pairs), key=lambda i: -lengths[i])
    starts = range(0, n_pairs, batch_size)
    padded = (pad(encoder.tokenizer, features, order[s : s + batch_size]) for s in starts)
    batches = [{k: v.to(device) for k, v in batch.items()} for batch in padded]
    alone = functools.partial(_alone, encoder, device)
    _first_pass(out, alone, batches, precisions)
    for r, precision in _alternating(precisions, plan.score_rounds):
        run = functools.partial(score_pairs, encoder, pairs, batch_size=batch_size)
        seconds = _timed(functools.partial(run, precision=precision), device)
        row = {"round": r + 1, "precision": precision, "pairs": n_pairs, "seconds": seconds}
        rate = row["pairs_a_second"] = n_pairs / seconds
        out["rows"].append(row | {"nq_hours": NQ_SCORE_PAIRS / rate / 3600})
    _model_alone(out, alone, batches, precisions, plan.score_rounds)
    return out


def _alone(encoder, device: torch.device, precision: str, batches: list[dict]) -> float:
    """Seconds of the cross-encoder alone on ``batches``, already padded on the device."""
    from dpr_cache.runtime.device import autocast

    def run() -> None:
        with torch.inference_mode(), autocast(device, precision):
            for batch in batches:
                encoder.model(**batch).logits.float()

    return _timed(run, device)


def _first_pass(out: dict, alone, batches: list[dict], precisions: list[str]) -> None:
    """Each precision's start on the longest batch, then its first pass over the others."""
    longest, rest = batches[:1], batches[1:]
    new = {b["input_ids"].shape[1] for b in rest} - {longest[0]["input_ids"].shape[1]}
    pairs = sum(len(b["input_ids"]) for b in rest)
    first = out["first_pass"] = {"order": precisions[::-1], "batches": len(rest), "pairs": pairs}
    first |= {"new_lengths": len(new), "seconds": {}, "again_seconds": {}}
    for precision in precisions:
        alone(precision, longest)
    for precision in first["order"]:  # each figure kept as it is measured
        first["seconds"][precision] = alone(precision, rest)


def _model_alone(out: dict, alone, batches: list[dict], precisions: list[str], rounds) -> None:
    """The model alone, best of ``rounds`` at each precision; the first pass's batches again."""
    best: dict[str, float] = {}
    for _, precision in _alternating(precisions, rounds):
        seconds = alone(precision, batches)
        best[precision] = min(seconds, best.get(precision, seconds))
    n = sum(len(b["input_ids"]) for b in batches)
    out["model_alone"] = [
        {"precision": p, "seconds": best[p], "pairs_a_second": n / best[p]} for p in precisions
    ]
    for precision in out["first_pass"]["order"]:
        out["first_pass"]["again_seconds"][precision] = alone(precision, batches[1:])


def _random_cross_encoder(tokenizer_dir: str, work: Path, shape: tuple[int, int]) -> Path:
    """A BERT cross-encoder of ``shape`` (layers, width) with random weights, written once."""
    from transformers import AutoTokenizer, BertForSequenceClassification

    from benchmarks.gpu.exact import Shape, bert_config

    layers, width = shape
    folder = work / f"cross-encoder-{layers}x{width}"
    if not folder.exists():
        tokenizer = AutoTokenizer.from_pretrained(tokenizer_dir)
        bert = Shape(width, layers, width // 32, tokenizer.vocab_size, q_len=0, p_len=512)
        torch.manual_seed(0)
        BertForSequenceClassification(bert_config(bert, 0.1, num_labels=1)).save_pretrained(folder)
        tokenizer.save_pretrained(folder)
    return folder


def _score_sample(squad_dir: Path, work: Path, n_pairs: int) -> list:
    """``n_pairs`` pairs of SQuAD dev questions and 100-word passages."""
    from dpr_cache.data.qas import read_qas
    from dpr_cache.model.cross_encoder import Pair

    questions = [q for q, _ in read_qas(squad_dir / "dev.qa.tsv")]
    passages = _read_passages(_passages_tsv(squad_dir, work / "score_passages.tsv", 5_000))
    n_q, n_p = len(questions), len(passages)
    return [Pair(questions[i % n_q], *passages[(i * 7) % n_p]) for i in range(n_pairs)]


def _alternating(items: list[str], rounds: int) -> Iterator[tuple[int, str]]:
    """(round, item) for ``rounds`` rounds of ``items``, every other round in reverse order."""
    for r in range(rounds):
        for item in items if r % 2 == 0 else items[::-1]:
            yield r, item
