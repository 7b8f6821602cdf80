"""The cost of a chunk: what each chunk of a GradCache step costs on the CPU, with a deep, narrow
BERT (12 layers of width 64, one thread) where per-chunk Python, dispatch and autograd show::

    python -m benchmarks.chunk_cost --out docs/bench             # writes chunk_cost.json and .md
    python -m benchmarks.chunk_cost --dry-run --out /tmp/cc      # 2 layers, 2 rounds: seconds

Each engine of :data:`ENGINES` (a variant: one more entry) runs one ragged batch cut into 1, 2,
4, ... question chunks in shuffled rounds; a line ``step = a + b x chunks`` fits its medians.
"""

from __future__ import annotations

import functools
import gc
import random
import statistics
import sys
import tempfile
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import torch

from benchmarks import harness, point
from benchmarks.harness import cpu_text, markdown_table, record_run, run_text
from benchmarks.peers import make_peer, peer_available
from dpr_cache.core.engine import RELEASE_EVERY
from dpr_cache.runtime.atomic import write_text_atomic

PAGE = "chunk_cost.md"
TOKENIZER_DIR = Path(__file__).resolve().parents[1] / "data" / "toy" / "tiny-bert"


@dataclass(kw_only=True)
class CostPlan:
    """The model, the batch and the timing of one run (JSON-serialisable)."""

    layers: int = point.opt(12, "Encoder layers.")
    hidden: int = 64
    heads: int = 2
    intermediate: int = 256
    dropout: float = 0.1
    questions: int = point.opt(64, "B, questions a step.")
    hard_negatives: int = 1  # passages a step: questions x (1 + hard_negatives)
    q_len: int = 16  # mean question tokens (each row drawn from half to 1.5 times this)
    p_len: int = 32  # mean passage tokens (likewise)
    chunks: list[int] = point.opt([1, 2, 4, 8, 16], "Question chunks a step.")
    rounds: int = point.opt(9, "Timed steps of every case.")
    threads: int = point.opt(1, "torch threads.")
    seed: int = 0
    dry_run: bool = point.opt(False, "Seconds: a small model, two rounds.")


DRY_RUN = {"layers": 2, "questions": 16, "chunks": [1, 2, 4], "rounds": 2}


@dataclass(frozen=True)
class Engine:
    """``make(model, chunk_rows, group_size)`` gives a step object (``.step(q, p, p_ids=...)``);
    dpr-cache's fast CPU dropout or PyTorch's; the peer it needs; towers compiled or not."""

    make: Callable[..., Any]
    fast_dropout: bool = True
    peer: str | None = None
    compiled: bool = False


def dpr_cache_stepper(model, chunk: int, group_size: int, **options):
    """dpr-cache's GradCache step as the trainer builds it, ``chunk`` rows in both towers."""
    return point.own_stepper(model, "gradcache", chunk, group_size, **options)


def _peer(name: str) -> Engine:
    return Engine(lambda model, chunk, group: make_peer(name, model, chunk), False, name)


COMPILED_WIDTH = 64  # the compiled variant's length bucket: one graph a chunk count and tower
_compiled_stepper = functools.partial(dpr_cache_stepper, length_bucket=COMPILED_WIDTH)
ENGINES: dict[str, Engine] = {
    "dpr-cache": Engine(dpr_cache_stepper),
    "dpr-cache-torch-dropout": Engine(dpr_cache_stepper, fast_dropout=False),
    "dpr-cache-compiled": Engine(_compiled_stepper, fast_dropout=False, compiled=True),
    "st-cmnrl": _peer("st-cmnrl"),
    "gradcache-lib": _peer("gradcache-lib"),
}


def available_engines(names: list[str]) -> tuple[list[str], list[dict]]:
    """The engines of ``names`` that can run here, and the skipped ones with why."""
    if unknown := [n for n in names if n not in ENGINES]:
        raise SystemExit(f"error: unknown engine(s) {unknown}; known: {list(ENGINES)}")
    peers = {n: ENGINES[n].peer for n in names}
    skipped = [n for n, peer in peers.items() if peer is not None and not peer_available(peer)]
    why = [{"engine": n, "why": f"{peers[n]}'s package is not installed"} for n in skipped]
    return [n for n in names if n not in skipped], why


def build_model_dir(plan: CostPlan, folder: Path) -> Path:
    """A random BERT of the plan's shape and the toy tokenizer, saved in ``folder``."""
    from transformers import AutoTokenizer, BertConfig, BertModel

    tokenizer = AutoTokenizer.from_pretrained(TOKENIZER_DIR)
    tokenizer.save_pretrained(folder)
    shape = dict(hidden_size=plan.hidden, num_hidden_layers=plan.layers)
    shape.update(num_attention_heads=plan.heads, intermediate_size=plan.intermediate)
    shape.update(hidden_dropout_prob=plan.dropout, attention_probs_dropout_prob=plan.dropout)
    config = BertConfig(vocab_size=len(tokenizer), pad_token_id=tokenizer.pad_token_id, **shape)
    config.max_position_embeddings = max(512, 2 * plan.p_len)
    torch.manual_seed(plan.seed)
    BertModel(config).save_pretrained(str(folder))
    return folder


def load_model(folder: Path, engine: Engine):
    """The saved BERT as a shared-tower BiEncoder in train mode, with the engine's dropout."""
    cpu = torch.device("cpu")
    model = point.load_model(folder, cpu, engine.fast_dropout, shared=True, pooling="cls")
    if engine.compiled:
        from dpr_cache.model.compiled import compile_mode_for, compile_towers

        compile_towers([model.query_encoder], compile_mode_for(cpu))
    return model


def ragged_batch(plan: CostPlan, tokenizer) -> tuple[dict, dict, torch.Tensor]:
    """Random-token questions and passages (grouped by question: positive, hard negatives), each
    row 0.5 to 1.5 times the plan's mean long, [CLS] first, [SEP] last, padded to the longest."""
    gen = torch.Generator().manual_seed(plan.seed)

    def rows(n: int, mean: int) -> dict:
        lengths = torch.randint(max(2, mean // 2), mean + mean // 2 + 1, (n,), generator=gen)
        mask = (torch.arange(int(lengths.max()))[None, :] < lengths[:, None]).long()
        ids = torch.randint(5, len(tokenizer), mask.shape, generator=gen)
        ids[:, 0] = tokenizer.cls_token_id
        ids[torch.arange(n), lengths - 1] = tokenizer.sep_token_id
        ids = ids * mask + tokenizer.pad_token_id * (1 - mask)
        return {"input_ids": ids, "attention_mask": mask, "token_type_ids": torch.zeros_like(ids)}

    n_p = plan.questions * (1 + plan.hard_negatives)
    return rows(plan.questions, plan.q_len), rows(n_p, plan.p_len), torch.arange(n_p)


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
        q, p, ids = batch
        self.model.zero_grad(set_to_none=True)
        self.stepper.step(q, p, p_ids=ids)


def warm_up(case: Case, batch: tuple) -> None:
    """One untimed step counting the forwards and their tokens; compiled towers take a second,
    hook-less one."""
    sizes, hooks = point.count_tokens(case.model)
    try:
        case.run(batch)
    finally:
        for hook in hooks:
            hook.remove()
    case.forwards, case.tokens = len(sizes), sum(sizes)
    if ENGINES[case.engine].compiled:
        case.run(batch)


def time_rounds(cases: list[Case], batch: tuple, plan: CostPlan) -> None:
    """``plan.rounds`` timed steps of every case in a new shuffled order each round, garbage
    collected before each step so that no step pays for another's."""
    order = random.Random(plan.seed)
    gc.collect()
    gc.freeze()  # what is alive now is left alone: a collection before each step is cheap
    try:
        for r in range(plan.rounds):
            start = time.perf_counter()
            for case in order.sample(cases, len(cases)):
                gc.collect()
                t0 = time.perf_counter()
                case.run(batch)
                case.times.append(time.perf_counter() - t0)
            print(f"round {r + 1}/{plan.rounds}: {time.perf_counter() - start:.1f} s", flush=True)
    finally:
        gc.unfreeze()


def fit_line(xs: list[float], ys: list[float]) -> dict:
    """Least squares ``y = a + b x``: intercept, slope, the slope's standard error (None with
    two points), the residuals' root mean square and the largest residual over its y."""
    x, y = np.asarray(xs, dtype=float), np.asarray(ys, dtype=float)
    if len(set(xs)) < 2:
        raise ValueError("a line needs at least two distinct x")
    (a, b), *_ = np.linalg.lstsq(np.stack([np.ones_like(x), x], axis=1), y, rcond=None)
    residuals = y - (a + b * x)
    rss = float(residuals @ residuals)
    spread = float(((x - x.mean()) ** 2).sum())
    return {
        "a_s": float(a),
        "b_s": float(b),
        "b_stderr_s": float(np.sqrt(rss / (len(x) - 2) / spread)) if len(x) > 2 else None,
        "residual_rms_s": float(np.sqrt(rss / len(x))),
        "max_relative_residual": float(np.max(np.abs(residuals) / np.abs(y))),
    }


def _lengths(mask: torch.Tensor) -> dict:
    lengths = mask.sum(1)
    extremes = dict(shortest=int(lengths.min()), longest=int(lengths.max()))
    return dict(rows=int(mask.shape[0]), **extremes, mean=float(lengths.float().mean()))


def _engine_result(own: list[Case]) -> dict:
    """An engine's fitted line and its points."""
    fit = fit_line([c.chunks for c in own], [statistics.median(c.times) for c in own])
    keys = ("chunk_rows", "question_chunks", "chunks", "forwards", "tokens")
    points = [{k: getattr(c, k) for k in keys} | {"times_s": c.times} for c in own]
    for pt in points:
        pt["step_s"] = statistics.median(pt["times_s"])
        pt["fitted_s"] = fit["a_s"] + fit["b_s"] * pt["chunks"]
    return {"fit": fit, "points": points}


def measure(plan: CostPlan, names: list[str], folder: Path) -> tuple[dict, dict]:
    """Every engine timed at every chunk count on the model in ``folder``: the engines' results
    and the batch's lengths."""
    from transformers import AutoTokenizer

    batch = ragged_batch(plan, AutoTokenizer.from_pretrained(folder))
    lengths = {
        k: _lengths(x["attention_mask"])
        for k, x in zip(("questions", "passages"), batch[:2], strict=True)
    }
    torch.manual_seed(plan.seed)
    group, cases = 1 + plan.hard_negatives, []
    for name in names:  # each engine on its own copy of the saved model
        model = load_model(folder, ENGINES[name])
        for n in plan.chunks:
            stepper = ENGINES[name].make(model, plan.questions // n, group)
            cases.append(Case(name, model, stepper, plan.questions // n, n, n * (1 + group)))
    for case in cases:
        warm_up(case, batch)
    time_rounds(cases, batch, plan)
    engines = {n: _engine_result([c for c in cases if c.engine == n]) for n in names}
    return engines, lengths


def run_chunk_cost(plan: CostPlan, names: list[str], out: Path, command: str = "") -> dict:
    """Time every engine of ``names`` that can run; write and return the result."""
    from dpr_cache.runtime.quiet import quiet_libraries

    quiet_libraries()
    names, skipped = available_engines(names)
    if any(plan.questions % n for n in plan.chunks) or len(set(plan.chunks)) < 2:
        raise SystemExit(
            f"error: chunks {plan.chunks}: two or more, each dividing {plan.questions} questions"
        )
    plan.chunks = sorted(set(plan.chunks))
    torch.set_num_threads(plan.threads)

    def figures(_: Path) -> dict:
        with tempfile.TemporaryDirectory(prefix="chunk-cost-") as tmp:
            engines, lengths = measure(plan, names, build_model_dir(plan, Path(tmp)))
        b = {n: e["fit"]["b_s"] for n, e in engines.items()}
        own, peers = ([n for n in b if (ENGINES[n].peer is None) == m] for m in (True, False))
        ratios = [
            {"engine": o, "peer": p, "ratio": b[o] / b[p]} for o in own for p in peers if b[p] > 0
        ]
        return {"batch": lengths, "engines": engines, "ratios": ratios, "skipped": skipped}

    return record_run(out, "chunk_cost", plan, command, figures, render)


def parse_args(argv: list[str] | None) -> tuple[CostPlan, list[str], Path]:
    """The plan, the engines and the output folder from the command line."""
    parser = point.plan_parser(CostPlan, __doc__.splitlines()[0], reuse=False, out=None)
    engines = f"Of {', '.join(ENGINES)} (default: all; a dry run leaves out compiled ones)."
    parser.add_argument("--engines", type=point.comma_list(str), default=None, help=engines)
    if "--dry-run" in (sys.argv[1:] if argv is None else argv):
        parser.set_defaults(**DRY_RUN)
    args = parser.parse_args(argv)
    plan = point.plan_of(CostPlan, args)
    names = [n for n, e in ENGINES.items() if not (plan.dry_run and e.compiled)]
    return plan, args.engines or names, args.out


def main(argv: list[str] | None = None) -> None:
    plan, names, out = parse_args(argv)
    result = run_chunk_cost(plan, names, out, point.command_line("benchmarks.chunk_cost", argv))
    for name, engine in result["engines"].items():
        print(f"{name}: {1e3 * engine['fit']['b_s']:.2f} ms a chunk")


def setup_text(result: dict) -> str:
    """The model, the batch, the chunking, the timing and the `malloc_trim` disclosure."""
    plan, q, p = result["plan"], result["batch"]["questions"], result["batch"]["passages"]
    return (
        f"Model: a random BERT of {plan['layers']} layers, hidden {plan['hidden']},"
        f" {plan['heads']} heads, intermediate {plan['intermediate']}; one tower, [CLS] pooling,"
        f" fp32, train mode, dropout {plan['dropout']:g} (dpr-cache's fast CPU dropout; PyTorch's"
        f" for the peers). Batch: B = {q['rows']} questions of {q['shortest']} to {q['longest']}"
        f" tokens (mean {q['mean']:.1f}), {p['rows']} passages ({plan['hard_negatives']} hard"
        f" negative a question) of {p['shortest']} to {p['longest']} (mean {p['mean']:.1f});"
        " random ids padded to the longest row. Chunks:"
        f" {', '.join(map(str, plan['chunks']))} question chunks of the same rows in both towers:"
        f" {2 + plan['hard_negatives']} x the question chunks a step (as CachedMNRL's columns)."
        f" Step = zero_grad + the engine's step; {plan['rounds']} shuffled rounds after one"
        " warm-up step each; each point the median.\n\n"
        "dpr-cache's step, as the trainer's, hands freed heap pages back (glibc's `malloc_trim`)"
        f" after every {RELEASE_EVERY} graph-less chunks; the peers do not: that cost is in"
        " dpr-cache's figures."
    )


def equal_chunks(result: dict) -> list:
    """Each engine's step at every chunk count all ran, own engines' over peers' alongside."""
    engines, pairs = result["engines"], [(r["engine"], r["peer"]) for r in result["ratios"]]
    steps = {n: {pt["chunks"]: pt["step_s"] for pt in e["points"]} for n, e in engines.items()}
    counts = sorted(set.intersection(*(set(v) for v in steps.values()))) if steps else []
    header = ["chunks a step", *(f"`{e}` s" for e in engines)]
    header += [f"`{a}` / `{b}`" for a, b in pairs]
    rows = [
        [n, *(f"{steps[e][n]:.3f}" for e in engines)]
        + [f"{steps[a][n] / steps[b][n]:.2f}" for a, b in pairs]
        for n in counts
    ]
    intro = "Median step seconds at equal chunk counts, and own engine over peer at each:"
    return [intro, markdown_table(header, rows)]


def fits(result: dict) -> list:
    """Each engine's line with the slope's standard error and its tokens; the slopes' ratios."""
    rows, falling = [], []
    for name, e in result["engines"].items():
        f, first, last = e["fit"], e["points"][0]["tokens"], e["points"][-1]["tokens"]
        se = "" if f["b_stderr_s"] is None else f" ± {1e3 * f['b_stderr_s']:.2f}"
        rows.append([f"`{name}`", f"**{1e3 * f['b_s']:.2f}**{se}", f"{f['a_s']:.3f}"])
        rows[-1].append(f"{first:,} → {last:,} ({last / first:.2f})")
        if last < first:
            falling.append(f" `{name}`'s fall {100 * (1 - last / first):.0f}% as chunks grow.")
    header = ["engine", "b (ms) ± standard error", "a (s)", "tokens a step, fewest → most chunks"]
    points = len(e["points"]) if rows else 0
    ratios = [f"- `{r['engine']}` / `{r['peer']}`: **{r['ratio']:.2f}**" for r in result["ratios"]]
    return [
        "Least squares, step seconds = a + b x chunks a step, over each engine's medians:",
        markdown_table(header, rows),
        f"±: the slope's standard error over {points} medians ({points - 2} degrees of freedom),"
        " a rough guide. Tokens: every pass's, padding included; dpr-cache re-encodes all but"
        f" each tower's last chunk and cuts each chunk to its longest row.{''.join(falling)} A"
        " slope holds the tokens' arithmetic too: compare at equal chunk counts (above) first.",
        *(["Ratios of the cost of a chunk:", ratios] if ratios else []),
    ]


def markdown(result: dict) -> str:
    """chunk_cost.md from ``chunk_cost.json``."""
    m, dry = result["machine"], "**A dry run** (`--dry-run`): a small model, two rounds."
    return harness.page(
        "The cost of a chunk, on the CPU",
        *([dry] if result["plan"].get("dry_run") else []),
        f"Machine: {cpu_text(m)}; torch {m['torch']} ({m['threads']} threads), {m['device']}. "
        f"{run_text(result)}",
        f"Command: `{result['command']}`",
        setup_text(result),
        "## The step at equal chunk counts",
        *equal_chunks(result),
        "## The cost of a chunk, fitted",
        *fits(result),
        *(f"Not run: `{s['engine']}`, {s['why']}." for s in result.get("skipped") or []),
    )


def render(result: dict, folder: Path, source: Path | None = None) -> Path:
    return write_text_atomic(Path(folder) / PAGE, markdown(result))


if __name__ == "__main__":
    main()
