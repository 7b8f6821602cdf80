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

from benchmarks.harness import cpu_text, load_average, machine_info, markdown_table, run_text
from dpr_cache.core.engine import RELEASE_EVERY
from dpr_cache.runtime.atomic import write_json_atomic, write_text_atomic

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
    "PAGE",
    "markdown",
    "render",
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
    render(result, out)
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


# The page.


PAGE = "chunk_cost.md"

PARTS = [
    ("aten_ops", "aten ops dispatched", "{:,.0f}", 1),
    ("aten_self_s", "aten ops' own time (ms)", "{:.2f}", 1e3),
    (
        "other_ops_self_s",
        "other recorded ops' own time: autograd nodes and the like (ms)",
        "{:.2f}",
        1e3,
    ),
    (
        "unrecorded_s",
        "outside any recorded op: Python, module calls, the profiler (ms)",
        "{:.2f}",
        1e3,
    ),
    ("wall_s", "profiled wall time (ms)", "{:.2f}", 1e3),
    ("autograd_nodes", "autograd nodes run in the backward", "{:,.0f}", 1),
    ("allocations", "allocations (profiler's memory events)", "{:,.0f}", 1),
    ("module_forwards", "nn.Module forwards", "{:,.0f}", 1),
    ("python_calls", "Python function calls (cProfile)", "{:,.0f}", 1),
    ("host_syncs", "host waits on the GPU (CUDA only)", "{:,.1f}", 1),
]
"""(key, label, format, scale) of each row of the parts table."""


def _ms(seconds: float | None, digits: int = 2) -> str:
    """Seconds as milliseconds ("–" for None)."""
    return "–" if seconds is None else f"{1e3 * seconds:.{digits}f}"


def _count(value: float) -> str:
    """A count a chunk: whole from 10 up, one decimal below (a call every few chunks shows)."""
    return f"{value:,.0f}" if abs(value) >= 10 else f"{value:.1f}"


def token_lines(result: dict) -> list[str]:
    """How much the tokens an engine encodes change from the fewest chunks to the most: that
    arithmetic is in its slope too."""
    engines = result["engines"]
    points = len(next(iter(engines.values()))["points"]) if engines else 0
    shares = {n: e["points"][-1]["tokens"] / e["points"][0]["tokens"] for n, e in engines.items()}
    falling = [f"`{n}`'s tokens fall {100 * (1 - r):.0f}%" for n, r in shares.items() if r < 1]
    fall = (
        f" {' and '.join(falling)} as the chunks grow, which lowers that slope." if falling else ""
    )
    return [
        f"The ± is the slope's standard error from the {points} medians ({points - 2} degrees of "
        "freedom): a rough guide at so few points. Tokens: every pass's, padding included. "
        "dpr-cache re-encodes all but the last chunk of each tower (one chunk a tower: nothing is "
        "encoded twice), and cuts each chunk to its longest row (smaller chunks of rows ordered by "
        f"length carry less padding).{fall} A slope includes the arithmetic of the tokens that "
        "change with the chunks, so compare engines at equal chunk counts (above) before their "
        "slopes.",
    ]


def setup_text(result: dict) -> list[str]:
    """The model, the batch, the chunking and the timing, in words."""
    plan, batch = result["plan"], result["batch"]
    q, p = batch["questions"], batch["passages"]
    chunks = ", ".join(str(n) for n in plan["chunks"])
    group = 1 + plan["hard_negatives"]
    return [
        f"Model: a random BERT of {plan['layers']} layers, hidden {plan['hidden']}, "
        f"{plan['heads']} heads, intermediate {plan['intermediate']}, one tower for questions and"
        f" passages, [CLS] pooling, fp32, train mode with dropout {plan['dropout']:g}: dpr-cache "
        "with its fast CPU dropout (as the trainer runs it), the peers with PyTorch's.",
        "",
        f"Batch: B = {q['rows']} questions of {q['shortest']} to {q['longest']} tokens (mean "
        f"{q['mean']:.1f}) and {p['rows']} passages ({plan['hard_negatives']} hard negative a "
        f"question) of {p['shortest']} to {p['longest']} tokens (mean {p['mean']:.1f}), random "
        "token ids, padded to the longest row; the same batch at every chunk count.",
        "",
        f"Chunks: {chunks} question chunks a step, each chunk of the same rows in both towers, so"
        f" {group} times as many passage chunks (sentence-transformers' CachedMNRL chunks each of"
        f" its {1 + group} columns, questions, positives and negatives, alike): a step holds "
        f"{1 + group} x the question chunks. Step = zero_grad + the engine's step (no optimizer);"
        f" {plan['rounds']} rounds, every engine and chunk count once a round in a shuffled "
        "order, after one warm-up step each; each point is its median over the rounds.",
        "",
        "dpr-cache's step is built as the trainer builds it: after every "
        f"{RELEASE_EVERY} graph-less chunks it hands freed heap pages back to the system "
        "(glibc's `malloc_trim`, which bounds a CPU run's resident memory); the peers do not, "
        "and that cost is in dpr-cache's figures.",
    ]


def equal_chunks_lines(result: dict) -> list[str]:
    """Each engine's step at every chunk count all engines ran, and each ratio's pair over the
    same count: what was measured, before any fit."""
    engines = result["engines"]
    steps = {n: {pt["chunks"]: pt["step_s"] for pt in e["points"]} for n, e in engines.items()}
    counts = sorted(set.intersection(*(set(v) for v in steps.values()))) if steps else []
    pairs = [(r["engine"], r["peer"]) for r in result["ratios"]]
    rows = [
        [
            n,
            *(f"{steps[e][n]:.3f}" for e in engines),
            *(f"{steps[a][n] / steps[b][n]:.2f}" for a, b in pairs),
        ]
        for n in counts
    ]
    header = [
        "chunks a step",
        *(f"`{e}` s" for e in engines),
        *(f"`{a}` / `{b}`" for a, b in pairs),
    ]
    return [
        "Each engine's step (median seconds) at the same number of chunks a step, and each own "
        "engine's step over each peer's at that count:",
        "",
        *markdown_table(header, rows),
        *crossing_lines(result, counts),
    ]


def crossing_lines(result: dict, counts: list[int]) -> list[str]:
    """Where each pair's fitted lines cross, and whether that lies inside the measured counts."""
    lines = []
    for r in result["ratios"]:
        a, b = result["engines"][r["engine"]]["fit"], result["engines"][r["peer"]]["fit"]
        if a["b_s"] == b["b_s"]:
            continue
        cross = (b["a_s"] - a["a_s"]) / (a["b_s"] - b["b_s"])
        if cross <= 0:
            continue
        inside = counts and counts[0] <= cross <= counts[-1]
        where = "inside the counts measured" if inside else "outside the counts measured"
        lines.append(f"- `{r['engine']}` and `{r['peer']}`: near {cross:.0f} chunks, {where}")
    if not lines:
        return []
    return ["", "Where the fitted lines below cross (an extrapolation where outside):", "", *lines]


def fit_table(result: dict) -> list[str]:
    """Each engine's fitted line: the cost of a chunk, the fixed cost and the residuals."""
    rows = []
    for name, e in result["engines"].items():
        f = e["fit"]
        se = f" ± {_ms(f['b_stderr_s'])}" if f["b_stderr_s"] is not None else ""
        worst = f"{100 * f['max_relative_residual']:.1f}%"
        first, last = e["points"][0]["tokens"], e["points"][-1]["tokens"]
        tokens = f"{first:,} → {last:,} ({last / first:.2f})"
        rows.append(
            [
                f"`{name}`",
                f"**{_ms(f['b_s'])}**{se}",
                f"{f['a_s']:.3f}",
                _ms(f["residual_rms_s"]),
                worst,
                tokens,
            ]
        )
    header = [
        "engine",
        "cost of a chunk b (ms) ± its standard error",
        "fixed a (s)",
        "residual RMS (ms)",
        "largest residual",
        "tokens a step, fewest → most chunks",
    ]
    return markdown_table(header, rows)


def ratio_lines(result: dict) -> list[str]:
    """The own engines' cost of a chunk over each peer's, one line each."""
    return [f"- `{r['engine']}` / `{r['peer']}`: **{r['ratio']:.2f}**" for r in result["ratios"]]


def points_table(engine: dict) -> list[str]:
    """An engine's steps by chunk count: the chunking, what it encodes, measured and fitted."""
    rows = []
    for pt in engine["points"]:
        times = pt["times_s"]
        rows.append(
            [
                pt["question_chunks"],
                pt["chunk_rows"],
                pt["chunks"],
                pt["forwards"],
                f"{pt['tokens']:,}",
                f"{pt['step_s']:.3f}",
                f"{min(times):.3f} – {max(times):.3f}",
                f"{pt['fitted_s']:.3f}",
            ]
        )
    header = [
        "question chunks",
        "rows a chunk",
        "chunks a step",
        "encoder forwards",
        "tokens encoded",
        "step s (median)",
        "min – max",
        "fitted s",
    ]
    return markdown_table(header, rows)


def parts_table(result: dict) -> list[str]:
    """A chunk's parts, one column per engine profiled."""
    engines = {n: e for n, e in result["engines"].items() if e.get("parts")}
    rows = []
    for key, label, fmt, scale in PARTS:
        values = [e["parts"]["per_chunk"].get(key) for e in engines.values()]
        cells = ["n/a" if v is None else fmt.format(scale * v) for v in values]
        rows.append([label, *cells])
    rows.append(
        [
            "timed cost of a chunk b, unprofiled (ms)",
            *(_ms(e["fit"]["b_s"]) for e in engines.values()),
        ]
    )
    return markdown_table(["a chunk's", *(f"`{n}`" for n in engines)], rows)


def dearest_lines(name: str, parts: dict) -> list[str]:
    """An engine's dearest aten ops and modules (by count) and Python functions (by own time),
    per chunk."""
    ops = ", ".join(f"`{k}` {_count(v)}" for k, v in parts["aten_by_count"])
    modules = ", ".join(f"`{k}` {_count(v)}" for k, v in parts["modules_by_count"])
    functions = ", ".join(
        f"`{k}` {1e6 * v[1]:,.0f} us ({_count(v[0])} calls)"
        for k, v in parts["functions_by_own_time"]
    )
    return [
        f"**`{name}`**, a chunk: aten ops by count: {ops}.",
        "",
        f"Modules by count: {modules}.",
        "",
        f"Python functions by own time (under cProfile): {functions}.",
    ]


def parts_text(result: dict) -> list[str]:
    """The parts section: how they were measured, the table and the dearest lists."""
    engines = {n: e for n, e in result["engines"].items() if e.get("parts")}
    if not engines:
        return []
    spans = {tuple(e["parts"]["chunks"]) for e in engines.values()}
    span = " and ".join(f"{a} and {b} chunks" for a, b in sorted(spans))
    out = [
        "## A chunk's parts",
        "",
        f"One step of each engine profiled at {span} a step, the difference divided by the "
        "difference in chunks. `torch.profiler` (CPU ops, memory events) gives the ops, their own"
        " time, the autograd nodes and the allocations; a second step under cProfile with a "
        "global module hook gives the Python calls and the module forwards. The profiler "
        "slows every op, so the profiled wall time exceeds the timed cost of a chunk; the counts"
        " are exact. Host waits on the GPU are counted on CUDA only "
        "(`torch.cuda.set_sync_debug_mode`).",
        "",
        *parts_table(result),
    ]
    for name, e in engines.items():
        out += ["", *dearest_lines(name, e["parts"])]
    return out


def markdown(result: dict) -> str:
    """chunk_cost.md from ``chunk_cost.json``."""
    m = result["machine"]
    out = ["# The cost of a chunk, on the CPU", ""]
    if result["plan"].get("dry_run"):
        out += [
            "**A dry run** (`--dry-run`): a small model and two rounds check the code; its "
            "figures are no measurement of this machine.",
            "",
        ]
    out += [
        f"Machine: {cpu_text(m)}; torch {m['torch']} ({m['threads']} threads), {m['device']}. "
        f"{run_text(result)}",
        "",
        f"Command: `{result['command']}`",
        "",
        *setup_text(result),
        "",
        "## The step at equal chunk counts",
        "",
        *equal_chunks_lines(result),
        "",
        "## The cost of a chunk, fitted",
        "",
        "A least-squares line, step seconds = a + b x chunks a step, over each engine's medians:",
        "",
        *fit_table(result),
        "",
        *token_lines(result),
    ]
    if result["ratios"]:
        out += ["", "Ratios of the cost of a chunk:", "", *ratio_lines(result)]
    for skip in result.get("skipped") or []:
        out += ["", f"Not run: `{skip['engine']}`, {skip['why']}."]
    out += ["", "## Step seconds by chunk count"]
    for name, engine in result["engines"].items():
        out += ["", f"`{name}`:", "", *points_table(engine)]
    parts = parts_text(result)
    return "\n".join([*out, *([""] + parts if parts else []), ""])


def render(result: dict, folder: Path, source: Path | None = None) -> Path:
    """Write :data:`PAGE` from ``result`` into ``folder``."""
    return write_text_atomic(Path(folder) / PAGE, markdown(result))


if __name__ == "__main__":
    main()
