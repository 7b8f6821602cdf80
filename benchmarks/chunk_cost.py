"""The cost of a chunk: what each chunk of a GradCache step costs whatever its size, measured on
the CPU with a deep, narrow BERT (12 layers of width 64, one thread), where the per-chunk work
of Python, op dispatch and the autograd engine is a visible share of the step::

    python -m benchmarks.chunk_cost --out docs/bench             # writes chunk_cost.json and .md
    python -m benchmarks.chunk_cost --dry-run --out /tmp/cc      # 2 layers, 2 rounds: seconds

Every engine runs the same batch (questions and passages of ragged lengths, one hard negative)
cut into 1, 2, 4, ... question chunks (passage chunks: the same rows a chunk, so twice as many),
so the arithmetic stays the same and only the number of chunks changes. Steps (``zero_grad`` +
the engine's step, no optimizer) are timed in rounds, engines and chunk counts shuffled within
each round; each point's figure is its median over the rounds. A least-squares line
``step = a + b x chunks`` (chunks of both towers a step) per engine gives ``b``, the cost of a
chunk.

Then one step at the fewest and at the most chunks is profiled, and the difference divided by
the difference in chunks gives a chunk's parts: aten ops dispatched, their own (self) CPU time
against the profiled wall time, autograd nodes run in the backward, allocations, nn.Module
forwards by type and Python function calls (cProfile), the dearest first. On CUDA, host waits
per chunk are counted with ``torch.cuda.set_sync_debug_mode`` (:func:`host_syncs`); on the CPU
there are none to count and the figure is left out.

Engines are data: :data:`ENGINES` maps a name to an :class:`Engine` (a factory of step objects
and which dropout its model runs). A dpr-cache variant is one more entry, e.g.
``ENGINES["dpr-cache-batch-order"] = Engine(functools.partial(dpr_cache_stepper,
length_order=False))``, and ``--engines`` picks the ones to run.
"""

from __future__ import annotations

import argparse
import cProfile
import dataclasses
import datetime
import functools
import gc
import pstats
import random
import shlex
import shutil
import statistics
import sys
import tempfile
import time
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import torch

from benchmarks.machine import load_average, machine_info
from dpr_cache.runtime.atomic import write_json_atomic

__all__ = [
    "ENGINES",
    "DRY_RUN",
    "CostPlan",
    "Engine",
    "available_engines",
    "dpr_cache_stepper",
    "fit_line",
    "host_syncs",
    "parse_args",
    "per_chunk",
    "peer_stepper",
    "ragged_batch",
    "run_chunk_cost",
]

RESULT_FILE = "chunk_cost.json"
TOKENIZER_DIR = Path(__file__).resolve().parents[1] / "data" / "toy" / "tiny-bert"
TOKENIZER_FILES = (
    "tokenizer.json",
    "tokenizer_config.json",
    "special_tokens_map.json",
    "vocab.txt",
)
TOP = 10  # rows of each "dearest" list on the page


@dataclass(kw_only=True)
class CostPlan:
    """The model, the batch and the timing of one run (JSON-serialisable)."""

    layers: int = 12
    hidden: int = 64
    heads: int = 2
    intermediate: int = 256
    dropout: float = 0.1
    questions: int = 64  # B: questions a step
    hard_negatives: int = 1  # passages a step: questions x (1 + hard_negatives)
    q_len: int = 16  # mean question tokens (each row drawn from half to 1.5 times this)
    p_len: int = 32  # mean passage tokens (likewise)
    chunks: list[int] = field(default_factory=lambda: [1, 2, 4, 8, 16])  # question chunks
    rounds: int = 9
    threads: int = 1
    device: str = "cpu"
    seed: int = 0
    profile: bool = True
    dry_run: bool = False

    @property
    def group(self) -> int:
        """Passages a question: its positive and its hard negatives."""
        return 1 + self.hard_negatives


DRY_RUN = {"layers": 2, "questions": 16, "chunks": [1, 2, 4], "rounds": 2}
"""What ``--dry-run`` changes: a run of seconds that checks the code, not the machine."""


# -- engines ------------------------------------------------------------------------------------


Factory = Callable[..., Any]
"""``factory(model, chunk_rows, group_size) -> step object`` with ``.step(q, p, p_ids=...)``."""


@dataclass(frozen=True)
class Engine:
    """One engine to time: its step factory, whether its model runs dpr-cache's fast CPU dropout
    (as the trainer does; peers keep PyTorch's), and the peer package it needs, if any."""

    make: Factory
    fast_dropout: bool = True
    peer: str | None = None  # a name of benchmarks.peers.PEERS: skipped when not installed
    compiled: bool = False  # towers compiled in place (dpr_cache.model.compiled), eager dropout


def dpr_cache_stepper(model, chunk: int, group_size: int, **options):
    """dpr-cache's GradCache step as the trainer builds it (``release_memory`` included), chunk
    ``chunk`` rows in both towers; ``options`` go to :func:`make_stepper` (a variant's
    settings, e.g. ``length_order=False``)."""
    from dpr_cache.core.loss import InfoNCE
    from dpr_cache.core.objective import Objective, make_loss_fn
    from dpr_cache.core.steppers import Towers, make_stepper
    from dpr_cache.runtime.memory import trim

    loss_fn = make_loss_fn(Objective(group_size, InfoNCE(1.0)))
    towers = Towers(model.encode_query, model.encode_passage)
    options = {"release_memory": trim, **options}
    return make_stepper("gradcache", towers, loss_fn, chunk_size=chunk, **options)


def peer_stepper(name: str, model, chunk: int, group_size: int):
    """The peer ``name``'s step (:mod:`benchmarks.peers`), ``chunk`` rows a mini-batch."""
    from benchmarks.peers import make_peer

    return make_peer(name, model, chunk)


COMPILED_WIDTH = 64
"""The compiled variant's length bucket: at least the plan's longest row, so every chunk of a
tower has the batch's width and each chunk count compiles one graph a tower and grad mode."""

ENGINES: dict[str, Engine] = {
    "dpr-cache": Engine(dpr_cache_stepper),
    "dpr-cache-torch-dropout": Engine(dpr_cache_stepper, fast_dropout=False),
    "dpr-cache-compiled": Engine(
        functools.partial(dpr_cache_stepper, length_bucket=COMPILED_WIDTH),
        fast_dropout=False,
        compiled=True,
    ),
    "st-cmnrl": Engine(
        functools.partial(peer_stepper, "st-cmnrl"), fast_dropout=False, peer="st-cmnrl"
    ),
    "gradcache-lib": Engine(
        functools.partial(peer_stepper, "gradcache-lib"), fast_dropout=False, peer="gradcache-lib"
    ),
}
"""Engine name -> :class:`Engine`; ``--engines`` picks from these, in this order."""


def available_engines(names: list[str]) -> tuple[list[str], list[dict]]:
    """The engines of ``names`` that can run here, and the skipped ones with why."""
    from benchmarks.peers import peer_available

    unknown = [n for n in names if n not in ENGINES]
    if unknown:
        raise SystemExit(f"error: unknown engine(s) {unknown}; known: {list(ENGINES)}")
    kept, skipped = [], []
    for name in names:
        peer = ENGINES[name].peer
        if peer is not None and not peer_available(peer):
            skipped.append({"engine": name, "why": f"{peer}'s package is not installed"})
        else:
            kept.append(name)
    return kept, skipped


# -- model and batch ----------------------------------------------------------------------------


def build_model_dir(plan: CostPlan, folder: Path) -> Path:
    """Write a random BERT of the plan's shape and the toy tokenizer to ``folder`` (a folder,
    since sentence-transformers loads its Transformer module from the model's path)."""
    from transformers import AutoTokenizer, BertConfig, BertModel

    folder.mkdir(parents=True, exist_ok=True)
    for name in TOKENIZER_FILES:
        if (TOKENIZER_DIR / name).is_file():
            shutil.copyfile(TOKENIZER_DIR / name, folder / name)
    tokenizer = AutoTokenizer.from_pretrained(folder)
    config = BertConfig(
        vocab_size=len(tokenizer),
        hidden_size=plan.hidden,
        num_hidden_layers=plan.layers,
        num_attention_heads=plan.heads,
        intermediate_size=plan.intermediate,
        max_position_embeddings=max(512, 2 * plan.p_len),
        hidden_dropout_prob=plan.dropout,
        attention_probs_dropout_prob=plan.dropout,
        pad_token_id=tokenizer.pad_token_id,
    )
    torch.manual_seed(plan.seed)
    BertModel(config).save_pretrained(str(folder))
    return folder


def load_model(folder: Path, engine: Engine, device: torch.device):
    """The saved BERT as a shared-tower BiEncoder in train mode, with the engine's dropout."""
    from dpr_cache.model.biencoder import BiEncoder

    model = BiEncoder.from_pretrained(folder, shared=True, pooling="cls").to(device).train()
    if engine.fast_dropout and device.type == "cpu":  # as the trainer: fast dropout on CPU only
        from dpr_cache.model.fast_dropout import use_fast_dropout

        use_fast_dropout([model.query_encoder])
    if engine.compiled:
        from dpr_cache.model.compiled import compile_mode_for, compile_towers

        compile_towers([model.query_encoder], compile_mode_for(device))
    return model


def ragged_batch(plan: CostPlan, tokenizer) -> tuple[dict, dict, torch.Tensor]:
    """Questions and passages of random tokens, each row's length drawn between half and 1.5
    times the plan's mean, padded to the longest row ([CLS] first, [SEP] last, then [PAD]);
    passage rows are grouped by question (positive, then its hard negatives); distinct ids."""
    gen = torch.Generator().manual_seed(plan.seed)
    vocab = len(tokenizer)

    def rows(n: int, mean: int) -> dict:
        lengths = torch.randint(max(2, mean // 2), mean + mean // 2 + 1, (n,), generator=gen)
        width = int(lengths.max())
        mask = (torch.arange(width)[None, :] < lengths[:, None]).long()
        ids = torch.randint(5, vocab, (n, width), generator=gen)
        ids[:, 0] = tokenizer.cls_token_id
        ids[torch.arange(n), lengths - 1] = tokenizer.sep_token_id
        ids = ids * mask + tokenizer.pad_token_id * (1 - mask)
        return {"input_ids": ids, "attention_mask": mask, "token_type_ids": torch.zeros_like(ids)}

    n_p = plan.questions * plan.group
    return rows(plan.questions, plan.q_len), rows(n_p, plan.p_len), torch.arange(n_p)


# -- one case: an engine at one chunk count -----------------------------------------------------


@dataclass(eq=False)
class Case:
    """An engine's step object at one chunk size, and what was measured on it."""

    engine: str
    model: Any
    stepper: Any
    chunk_rows: int
    question_chunks: int
    chunks: int  # chunks of both towers a step (the fit's x)
    times: list[float] = field(default_factory=list)
    forwards: int = 0  # encoder forwards a step (every pass)
    tokens: int = 0  # token positions those forwards encode, padding included

    def run(self, batch: tuple) -> None:
        """One step: zero_grad, then the engine's forward, loss and backward."""
        q, p, ids = batch
        self.model.zero_grad(set_to_none=True)
        self.stepper.step(q, p, p_ids=ids)


class ForwardCounter:
    """Counts the encoder's forwards and the token positions they are given, whoever calls
    them (a hook on the embeddings: a peer may call the tower's forward directly)."""

    def __init__(self, model) -> None:
        self.forwards = self.tokens = 0
        embeddings = getattr(model.query_encoder, "embeddings", model.query_encoder)
        self.handle = embeddings.register_forward_pre_hook(self._hook, with_kwargs=True)

    def _hook(self, module, args, kwargs) -> None:
        ids = kwargs.get("input_ids", args[0] if args else None)
        self.forwards += 1
        self.tokens += ids.numel() if ids is not None else 0


def make_cases(plan, names, folder, device) -> list[Case]:
    """One case per engine and chunk count, each engine on its own copy of the saved model."""
    cases = []
    for name in names:
        engine = ENGINES[name]
        model = load_model(folder, engine, device)
        for n in plan.chunks:
            rows = plan.questions // n
            stepper = engine.make(model, rows, plan.group)
            cases.append(Case(name, model, stepper, rows, n, n * (1 + plan.group)))
    return cases


def warm_up(case: Case, batch: tuple, sync: Callable[[], None]) -> None:
    """One untimed step that also counts the case's forwards and tokens; compiled towers take
    a second one without the counting hook, whose removal changes what they compiled."""
    counter = ForwardCounter(case.model)
    try:
        case.run(batch)
        sync()
    finally:
        counter.handle.remove()
    case.forwards, case.tokens = counter.forwards, counter.tokens
    if ENGINES[case.engine].compiled:
        case.run(batch)
        sync()


def time_rounds(cases: list[Case], batch: tuple, plan: CostPlan, sync) -> None:
    """``plan.rounds`` timed steps of every case, the cases shuffled anew each round; garbage is
    collected before each step, so that no step pays for another's."""
    order = random.Random(plan.seed)
    gc.collect()
    gc.freeze()  # what is alive now is left alone: a collection before each step is cheap
    try:
        for r in range(plan.rounds):
            start = time.perf_counter()
            for case in order.sample(cases, len(cases)):
                gc.collect()
                sync()
                t0 = time.perf_counter()
                case.run(batch)
                sync()
                case.times.append(time.perf_counter() - t0)
            print(f"round {r + 1}/{plan.rounds}: {time.perf_counter() - start:.1f} s", flush=True)
    finally:
        gc.unfreeze()


# -- the fit ------------------------------------------------------------------------------------


def fit_line(xs: list[float], ys: list[float]) -> dict:
    """Least squares ``y = a + b x``: intercept, slope, the slope's standard error (None with
    two points), the residuals' root mean square and the largest residual over its y."""
    x, y = np.asarray(xs, dtype=float), np.asarray(ys, dtype=float)
    if len(set(xs)) < 2:
        raise ValueError("a line needs at least two distinct x")
    design = np.stack([np.ones_like(x), x], axis=1)
    (a, b), *_ = np.linalg.lstsq(design, y, rcond=None)
    residuals = y - (a + b * x)
    rss = float(residuals @ residuals)
    se = None
    if len(x) > 2:
        se = float(np.sqrt(rss / (len(x) - 2) / float(((x - x.mean()) ** 2).sum())))
    return {
        "a_s": float(a),
        "b_s": float(b),
        "b_stderr_s": se,
        "residual_rms_s": float(np.sqrt(rss / len(x))),
        "max_relative_residual": float(np.max(np.abs(residuals) / np.abs(y))),
    }


def ratios(fits: dict[str, dict]) -> list[dict]:
    """Every own engine's cost of a chunk over every peer's that ran."""
    peers = [n for n in fits if ENGINES[n].peer is not None]
    own = [n for n in fits if ENGINES[n].peer is None]
    return [
        {"engine": o, "peer": p, "ratio": fits[o]["b_s"] / fits[p]["b_s"]}
        for o in own
        for p in peers
        if fits[p]["b_s"] > 0
    ]


# -- a chunk's parts ----------------------------------------------------------------------------


def host_syncs(run: Callable[[], None], device: torch.device) -> int | None:
    """The host waits on the GPU that ``run`` causes, from ``torch.cuda.set_sync_debug_mode``'s
    warnings; None on a device other than CUDA (nothing to wait on)."""
    if device.type != "cuda":
        return None
    import warnings

    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        torch.cuda.set_sync_debug_mode("warn")
        try:
            run()
            torch.cuda.synchronize()
        finally:
            torch.cuda.set_sync_debug_mode("default")
    return sum("synchroniz" in str(w.message) for w in caught)


def _self_times_ns(events: list) -> dict[int, int]:
    """Each op event's own time (its duration less its nested ops'), by position in ``events``,
    from the nesting of start and end times on each thread."""
    own: dict[int, int] = {}
    stacks: dict[int, list[tuple[int, int]]] = {}  # thread -> [(index, end_ns)]
    for i in sorted(range(len(events)), key=lambda i: (events[i].start_ns(), -events[i].end_ns())):
        e = events[i]
        stack = stacks.setdefault(e.start_thread_id(), [])
        while stack and stack[-1][1] <= e.start_ns():
            stack.pop()
        own[i] = e.duration_ns()
        if stack:
            own[stack[-1][0]] -= e.duration_ns()
        stack.append((i, e.end_ns()))
    return own


def profiled_step(case: Case, batch: tuple, sync) -> dict:
    """One step under ``torch.profiler`` (CPU ops, allocations): aten ops and their own time,
    other recorded ops (autograd nodes and the like) and theirs, autograd nodes run, allocations,
    the profiled wall time, and aten op counts by name."""
    from torch.profiler import ProfilerActivity, profile

    with profile(activities=[ProfilerActivity.CPU], profile_memory=True) as prof:
        start = time.perf_counter()
        case.run(batch)
        sync()
        wall = time.perf_counter() - start
    events = list(prof.profiler.kineto_results.events())
    memory = [e for e in events if e.name() == "[memory]"]
    ops = [e for e in events if e.name() != "[memory]" and e.device_type().name == "CPU"]
    own = _self_times_ns(ops)
    aten = [i for i, e in enumerate(ops) if e.name().startswith("aten::")]
    aten_self = sum(own[i] for i in aten) / 1e9
    all_self = sum(own.values()) / 1e9
    return {
        "wall_s": wall,
        "aten_ops": len(aten),
        "aten_self_s": aten_self,
        "other_ops_self_s": all_self - aten_self,
        "unrecorded_s": wall - all_self,
        "autograd_nodes": sum(
            e.name().startswith("autograd::engine::evaluate_function") for e in ops
        ),
        "allocations": sum(e.nbytes() > 0 for e in memory),
        "aten_by_name": dict(Counter(ops[i].name() for i in aten)),
    }


def python_step(case: Case, batch: tuple, sync) -> dict:
    """One step under cProfile with a global module hook: Python function calls (and each
    function's calls and own seconds) and nn.Module forwards by type."""
    modules: Counter[str] = Counter()
    hook = torch.nn.modules.module.register_module_forward_pre_hook(
        lambda module, args: modules.update([type(module).__name__])
    )
    profiler = cProfile.Profile()
    try:
        profiler.enable()
        case.run(batch)
        sync()
        profiler.disable()
    finally:
        hook.remove()
    functions = {}
    for (file, line, name), (_, calls, own, _, _) in pstats.Stats(profiler).stats.items():
        label = name if file == "~" else f"{Path(file).name}:{line}({name})"
        functions[label] = (calls, own)
    return {
        "python_calls": sum(calls for calls, _ in functions.values()),
        "module_forwards": sum(modules.values()),
        "modules_by_type": dict(modules),
        "functions": functions,
    }


def per_chunk(small, large, chunks: int):
    """``(large - small) / chunks``, through dicts key by key and lists element-wise; a key or
    number missing on one side counts 0, and None on both sides stays None."""
    if isinstance(small, dict) or isinstance(large, dict):
        small, large = small or {}, large or {}
        return {k: per_chunk(small.get(k), large.get(k), chunks) for k in sorted(large | small)}
    if isinstance(small, list | tuple) or isinstance(large, list | tuple):
        n = len(large if large is not None else small)
        small, large = small or [0] * n, large or [0] * n
        return [per_chunk(s, b, chunks) for s, b in zip(small, large, strict=True)]
    if small is None and large is None:
        return None
    return ((large or 0) - (small or 0)) / chunks


def _dearest(values: dict, key=lambda v: v) -> list:
    """The :data:`TOP` entries of ``values`` with the largest ``key``, as [name, value]."""
    ranked = sorted(values.items(), key=lambda kv: (-key(kv[1]), kv[0]))
    return [[k, v] for k, v in ranked[:TOP]]


def chunk_parts(small: Case, large: Case, batch: tuple, sync, device) -> dict:
    """One chunk's parts: the profiles of one step at the fewest and the most chunks, their
    difference over the difference in chunks, with the dearest ops, modules and functions."""
    measured = {}
    for label, case in (("fewest", small), ("most", large)):
        gc.collect()
        measured[label] = {**profiled_step(case, batch, sync), **python_step(case, batch, sync)}
        measured[label]["host_syncs"] = host_syncs(lambda c=case: c.run(batch), device)
    d = per_chunk(measured["fewest"], measured["most"], large.chunks - small.chunks)
    scalars = {k: v for k, v in d.items() if not isinstance(v, dict)}
    return {
        "chunks": [small.chunks, large.chunks],
        "per_chunk": scalars,
        "steps": {
            k: {n: v for n, v in m.items() if not isinstance(v, dict)} for k, m in measured.items()
        },
        "aten_by_count": _dearest(d["aten_by_name"]),
        "modules_by_count": _dearest(d["modules_by_type"]),
        "functions_by_own_time": _dearest(d["functions"], key=lambda v: v[1]),
    }


# -- the run ------------------------------------------------------------------------------------


def _point(case: Case, fit: dict) -> dict:
    """A case's row: its chunking, what it encodes, its round times and their median."""
    return {
        "chunk_rows": case.chunk_rows,
        "question_chunks": case.question_chunks,
        "chunks": case.chunks,
        "forwards": case.forwards,
        "tokens": case.tokens,
        "times_s": case.times,
        "step_s": statistics.median(case.times),
        "fitted_s": fit["a_s"] + fit["b_s"] * case.chunks,
    }


def _lengths(mask: torch.Tensor) -> dict:
    """The rows' real lengths (shortest, longest, mean) and the padded width of a mask."""
    lengths = mask.sum(1)
    return {
        "rows": int(mask.shape[0]),
        "shortest": int(lengths.min()),
        "longest": int(lengths.max()),
        "mean": float(lengths.float().mean()),
    }


def measure(plan: CostPlan, names: list[str], folder: Path) -> tuple[dict, dict]:
    """Build the batch and the cases from the model in ``folder``, time the rounds, fit each
    engine's line and profile its parts; the engines' results and the batch's lengths."""
    from transformers import AutoTokenizer

    device = torch.device(plan.device)
    sync = torch.cuda.synchronize if device.type == "cuda" else (lambda: None)
    q, p, ids = ragged_batch(plan, AutoTokenizer.from_pretrained(folder))
    lengths = {
        "questions": _lengths(q["attention_mask"]),
        "passages": _lengths(p["attention_mask"]),
    }
    batch = (
        {k: v.to(device) for k, v in q.items()},
        {k: v.to(device) for k, v in p.items()},
        ids.to(device),
    )
    torch.manual_seed(plan.seed)
    cases = make_cases(plan, names, folder, device)
    for case in cases:
        warm_up(case, batch, sync)
    time_rounds(cases, batch, plan, sync)
    engines = {}
    for name in names:
        own = [c for c in cases if c.engine == name]
        fit = fit_line([c.chunks for c in own], [statistics.median(c.times) for c in own])
        parts = chunk_parts(own[0], own[-1], batch, sync, device) if plan.profile else None
        engines[name] = {"fit": fit, "points": [_point(c, fit) for c in own], "parts": parts}
    return engines, lengths


def run_chunk_cost(plan: CostPlan, names: list[str], out: Path, command: str = "") -> dict:
    """Time and profile every engine of ``names`` that can run; write and return the result."""
    from benchmarks.chunk_cost_report import write_page
    from dpr_cache.runtime.quiet import quiet_libraries

    quiet_libraries()
    names, skipped = available_engines(names)
    if any(plan.questions % n for n in plan.chunks) or len(set(plan.chunks)) < 2:
        raise SystemExit(
            f"error: chunks {plan.chunks}: two or more, each dividing {plan.questions} questions"
        )
    plan.chunks = sorted(set(plan.chunks))
    torch.set_num_threads(plan.threads)
    started = datetime.datetime.now().isoformat(timespec="seconds")
    clock, load_start = time.time(), load_average()
    with tempfile.TemporaryDirectory(prefix="chunk-cost-") as tmp:
        engines, lengths = measure(plan, names, build_model_dir(plan, Path(tmp) / "bert"))
    result = {
        "command": command,
        "started": started,
        "seconds": time.time() - clock,
        "load_average_at_start": load_start,
        "machine": machine_info(plan.device, plan.threads),
        "plan": dataclasses.asdict(plan),
        "batch": lengths,
        "engines": engines,
        "ratios": ratios({n: e["fit"] for n, e in engines.items()}),
        "skipped": skipped,
    }
    out.mkdir(parents=True, exist_ok=True)
    write_json_atomic(out / RESULT_FILE, result)
    write_page(result, out)
    return result


def parse_args(argv: list[str]) -> tuple[CostPlan, list[str], Path]:
    """The plan, the engines and the output folder from the command line."""
    default = CostPlan()
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=Path, required=True, help="Folder for the json and page.")
    parser.add_argument(
        "--engines",
        default=None,
        help=f"Of {', '.join(ENGINES)} (default: all; a dry run leaves out compiled ones).",
    )
    parser.add_argument("--chunks", default=None, help="Question chunks a step, e.g. 1,2,4,8,16.")
    parser.add_argument("--rounds", type=int, default=None, help="Timed steps of every case.")
    parser.add_argument("--layers", type=int, default=None, help="Encoder layers.")
    parser.add_argument("--questions", type=int, default=None, help="B, questions a step.")
    parser.add_argument("--threads", type=int, default=default.threads, help="torch threads.")
    parser.add_argument("--device", default=default.device, help="cpu | cuda.")
    parser.add_argument("--no-profile", action="store_true", help="Skip the parts of a chunk.")
    parser.add_argument("--dry-run", action="store_true", help=f"Seconds: {DRY_RUN}.")
    args = parser.parse_args(argv)
    values = dict(DRY_RUN) if args.dry_run else {}
    for key in ("rounds", "layers", "questions"):
        if getattr(args, key) is not None:
            values[key] = getattr(args, key)
    if args.chunks:
        values["chunks"] = [int(n) for n in args.chunks.split(",")]
    plan = CostPlan(
        **values,
        threads=args.threads,
        device=args.device,
        profile=not args.no_profile,
        dry_run=args.dry_run,
    )
    if args.engines is None:
        names = [n for n, e in ENGINES.items() if not (args.dry_run and e.compiled)]
    else:
        names = [n.strip() for n in args.engines.split(",") if n.strip()]
    return plan, names, args.out


def main(argv: list[str] | None = None) -> None:
    """Run the benchmark from the command line and say where the page went."""
    argv = sys.argv[1:] if argv is None else argv
    plan, names, out = parse_args(argv)
    command = shlex.join(["python", "-m", "benchmarks.chunk_cost", *argv])
    result = run_chunk_cost(plan, names, out, command)
    for name, engine in result["engines"].items():
        print(f"{name}: {1e3 * engine['fit']['b_s']:.2f} ms a chunk")
    print(f"written to {out / RESULT_FILE} and {out / 'chunk_cost.md'}")


if __name__ == "__main__":
    main()
