"""The cost of a chunk: what each chunk of a GradCache step costs whatever its size, on the CPU
with a deep, narrow BERT (12 layers of width 64, one thread), where the per-chunk work of Python,
op dispatch and autograd is a visible share of the step::

    python -m benchmarks.chunk_cost --out docs/bench             # writes chunk_cost.json and .md
    python -m benchmarks.chunk_cost --dry-run --out /tmp/cc      # 2 layers, 2 rounds: seconds

Each engine of :data:`ENGINES` (``--engines``) runs one ragged batch cut into 1, 2, 4, ...
question chunks, timed in shuffled rounds; a least-squares line ``step = a + b x chunks`` over its
medians gives ``b``, the cost of a chunk. A variant is one more entry, e.g.
``Engine(functools.partial(dpr_cache_stepper, length_order=False))``.
"""

from __future__ import annotations

import argparse
import datetime
import functools
import gc
import random
import shlex
import statistics
import sys
import tempfile
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import torch

from benchmarks.harness import cpu_text, load_average, machine_info, markdown_table, run_text
from dpr_cache.core.engine import RELEASE_EVERY
from dpr_cache.runtime.atomic import write_json_atomic, write_text_atomic

__all__ = ["ENGINES", "DRY_RUN", "CostPlan", "Engine", "available_engines", "dpr_cache_stepper"]
__all__ += ["fit_line", "parse_args", "ragged_batch", "run_chunk_cost", "PAGE", "markdown"]

RESULT_FILE, PAGE = "chunk_cost.json", "chunk_cost.md"
TOKENIZER_DIR = Path(__file__).resolve().parents[1] / "data" / "toy" / "tiny-bert"


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
    dry_run: bool = False


DRY_RUN = {"layers": 2, "questions": 16, "chunks": [1, 2, 4], "rounds": 2}
"""What ``--dry-run`` changes: a run of seconds that checks the code, not the machine."""


@dataclass(frozen=True)
class Engine:
    """An engine to time: ``make(model, chunk_rows, group_size)`` gives its step object (with
    ``.step(q, p, p_ids=...)``); whether its model runs dpr-cache's fast CPU dropout (as the
    trainer does; peers keep PyTorch's); the peer of ``benchmarks.peers`` it needs (skipped
    when not installed); whether its towers are compiled (``dpr_cache.model.compiled``)."""

    make: Callable[..., Any]
    fast_dropout: bool = True
    peer: str | None = None
    compiled: bool = False


def dpr_cache_stepper(model, chunk: int, group_size: int, **options):
    """dpr-cache's GradCache step as the trainer builds it (``release_memory`` included),
    ``chunk`` rows in both towers; ``options`` (a variant's settings) go to ``make_stepper``."""
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


def _peer(name: str) -> Engine:
    return Engine(functools.partial(peer_stepper, name), fast_dropout=False, peer=name)


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
    "st-cmnrl": _peer("st-cmnrl"),
    "gradcache-lib": _peer("gradcache-lib"),
}


def available_engines(names: list[str]) -> tuple[list[str], list[dict]]:
    """The engines of ``names`` that can run here, and the skipped ones with why."""
    from benchmarks.peers import peer_available

    if unknown := [n for n in names if n not in ENGINES]:
        raise SystemExit(f"error: unknown engine(s) {unknown}; known: {list(ENGINES)}")
    peers = {n: ENGINES[n].peer for n in names}
    skipped = [n for n, peer in peers.items() if peer is not None and not peer_available(peer)]
    why = [{"engine": n, "why": f"{peers[n]}'s package is not installed"} for n in skipped]
    return [n for n in names if n not in skipped], why


def build_model_dir(plan: CostPlan, folder: Path) -> Path:
    """Write a random BERT of the plan's shape and the toy tokenizer to ``folder`` (a folder,
    since sentence-transformers loads its Transformer module from the model's path)."""
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
        """One step: zero_grad, then the engine's forward, loss and backward (all of it done,
        on CUDA too)."""
        q, p, ids = batch
        self.model.zero_grad(set_to_none=True)
        self.stepper.step(q, p, p_ids=ids)
        if torch.cuda.is_initialized():
            torch.cuda.synchronize()


def warm_up(case: Case, batch: tuple) -> None:
    """One untimed step that counts the encoder's forwards and the token positions they get (a
    hook on the embeddings: a peer may call the tower's forward directly); compiled towers take
    a second step without the hook, whose removal changes what they compiled."""
    sizes: list[int] = []

    def count(module, args, kwargs) -> None:
        ids = kwargs.get("input_ids", args[0] if args else None)
        sizes.append(0 if ids is None else ids.numel())

    tower = case.model.query_encoder
    hook = getattr(tower, "embeddings", tower).register_forward_pre_hook(count, with_kwargs=True)
    try:
        case.run(batch)
    finally:
        hook.remove()
    case.forwards, case.tokens = len(sizes), sum(sizes)
    if ENGINES[case.engine].compiled:
        case.run(batch)


def time_rounds(cases: list[Case], batch: tuple, plan: CostPlan) -> None:
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
    """The rows' count and real lengths (shortest, longest, mean) of a mask."""
    lengths = mask.sum(1)
    extremes = dict(shortest=int(lengths.min()), longest=int(lengths.max()))
    return dict(rows=int(mask.shape[0]), **extremes, mean=float(lengths.float().mean()))


def measure(plan: CostPlan, names: list[str], folder: Path) -> tuple[dict, dict]:
    """Build the batch and the cases from the model in ``folder``, time the rounds and fit each
    engine's line; the engines' results and the batch's lengths."""
    from transformers import AutoTokenizer

    device = torch.device(plan.device)
    q, p, ids = ragged_batch(plan, AutoTokenizer.from_pretrained(folder))
    lengths = {k: _lengths(x["attention_mask"]) for k, x in (("questions", q), ("passages", p))}
    batch = tuple({k: v.to(device) for k, v in x.items()} for x in (q, p)) + (ids.to(device),)
    torch.manual_seed(plan.seed)
    group, cases = 1 + plan.hard_negatives, []
    for name in names:  # each engine on its own copy of the saved model
        model = load_model(folder, ENGINES[name], device)
        for n in plan.chunks:
            stepper = ENGINES[name].make(model, plan.questions // n, group)
            cases.append(Case(name, model, stepper, plan.questions // n, n, n * (1 + group)))
    for case in cases:
        warm_up(case, batch)
    time_rounds(cases, batch, plan)
    engines = {}
    for name in names:
        own = [c for c in cases if c.engine == name]
        fit = fit_line([c.chunks for c in own], [statistics.median(c.times) for c in own])
        keys = ("chunk_rows", "question_chunks", "chunks", "forwards", "tokens")
        points = [{k: getattr(c, k) for k in keys} | {"times_s": c.times} for c in own]
        for pt in points:
            pt["step_s"] = statistics.median(pt["times_s"])
            pt["fitted_s"] = fit["a_s"] + fit["b_s"] * pt["chunks"]
        engines[name] = {"fit": fit, "points": points}
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
    started = datetime.datetime.now().isoformat(timespec="seconds")
    clock, load_start = time.time(), load_average()
    with tempfile.TemporaryDirectory(prefix="chunk-cost-") as tmp:
        engines, lengths = measure(plan, names, build_model_dir(plan, Path(tmp)))
    fits = {n: e["fit"] for n, e in engines.items()}
    own, peers = ([n for n in fits if (ENGINES[n].peer is None) == mine] for mine in (True, False))
    result = {
        "command": command,
        "started": started,
        "seconds": time.time() - clock,
        "load_average_at_start": load_start,
        "machine": machine_info(plan.device, plan.threads),
        "plan": asdict(plan),
        "batch": lengths,
        "engines": engines,
        "ratios": [
            {"engine": o, "peer": p, "ratio": fits[o]["b_s"] / fits[p]["b_s"]}
            for o in own
            for p in peers
            if fits[p]["b_s"] > 0
        ],
        "skipped": skipped,
    }
    out.mkdir(parents=True, exist_ok=True)
    write_json_atomic(out / RESULT_FILE, result)
    render(result, out)
    return result


def parse_args(argv: list[str]) -> tuple[CostPlan, list[str], Path]:
    """The plan, the engines and the output folder from the command line."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=Path, required=True, help="Folder for the json and page.")
    engines = f"Of {', '.join(ENGINES)} (default: all; a dry run leaves out compiled ones)."
    parser.add_argument("--engines", default=None, help=engines)
    parser.add_argument("--chunks", default=None, help="Question chunks a step, e.g. 1,2,4,8,16.")
    parser.add_argument("--rounds", type=int, default=None, help="Timed steps of every case.")
    parser.add_argument("--layers", type=int, default=None, help="Encoder layers.")
    parser.add_argument("--questions", type=int, default=None, help="B, questions a step.")
    parser.add_argument("--threads", type=int, default=1, help="torch threads.")
    parser.add_argument("--device", default="cpu", help="cpu | cuda.")
    parser.add_argument("--dry-run", action="store_true", help=f"Seconds: {DRY_RUN}.")
    args = parser.parse_args(argv)
    values = dict(DRY_RUN) if args.dry_run else {}
    for key in ("rounds", "layers", "questions"):
        if getattr(args, key) is not None:
            values[key] = getattr(args, key)
    if args.chunks:
        values["chunks"] = [int(n) for n in args.chunks.split(",")]
    plan = CostPlan(**values, threads=args.threads, device=args.device, dry_run=args.dry_run)
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
    print(f"written to {out / RESULT_FILE} and {out / PAGE}")


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
    """Each engine's step at every chunk count all engines ran, each own engine's over each
    peer's at that count, and where their fitted lines cross."""
    engines, pairs = result["engines"], [(r["engine"], r["peer"]) for r in result["ratios"]]
    steps = {n: {pt["chunks"]: pt["step_s"] for pt in e["points"]} for n, e in engines.items()}
    counts = sorted(set.intersection(*(set(v) for v in steps.values()))) if steps else []
    header = ["chunks a step", *(f"`{e}` s" for e in engines)]
    rows = [
        [n, *(f"{steps[e][n]:.3f}" for e in engines)]
        + [f"{steps[a][n] / steps[b][n]:.2f}" for a, b in pairs]
        for n in counts
    ]
    crossings = []
    for a, b in pairs:
        fa, fb = engines[a]["fit"], engines[b]["fit"]
        cross = (fb["a_s"] - fa["a_s"]) / (fa["b_s"] - fb["b_s"]) if fa["b_s"] != fb["b_s"] else 0
        where = "inside" if counts and counts[0] <= cross <= counts[-1] else "outside"
        if cross > 0:
            crossings.append(
                f"- `{a}` and `{b}`: near {cross:.0f} chunks, {where} the counts measured"
            )
    intro = ["", "Where the fitted lines below cross (an extrapolation where outside):", ""]
    return [
        "Each engine's step (median seconds) at the same number of chunks a step, and each own "
        "engine's step over each peer's at that count:",
        "",
        *markdown_table(header + [f"`{a}` / `{b}`" for a, b in pairs], rows),
        *(intro + crossings if crossings else []),
    ]


def fit_lines(result: dict) -> list[str]:
    """Each engine's fitted line (the cost of a chunk, the fixed cost, the residuals and the
    tokens), what the slope's error and tokens mean, and the ratios of the costs."""
    rows = []
    for name, e in result["engines"].items():
        f, first, last = e["fit"], e["points"][0]["tokens"], e["points"][-1]["tokens"]
        se = "" if f["b_stderr_s"] is None else f" ± {1e3 * f['b_stderr_s']:.2f}"
        rows.append([f"`{name}`", f"**{1e3 * f['b_s']:.2f}**{se}", f"{f['a_s']:.3f}"])
        rows[-1] += [f"{1e3 * f['residual_rms_s']:.2f}", f"{100 * f['max_relative_residual']:.1f}%"]
        rows[-1].append(f"{first:,} → {last:,} ({last / first:.2f})")
    header = ["engine", "cost of a chunk b (ms) ± its standard error", "fixed a (s)"]
    header += ["residual RMS (ms)", "largest residual", "tokens a step, fewest → most chunks"]
    points = len(next(iter(result["engines"].values()))["points"]) if result["engines"] else 0
    falling = [
        f"`{n}`'s tokens fall {100 * (1 - r):.0f}%"
        for n, e in result["engines"].items()
        if (r := e["points"][-1]["tokens"] / e["points"][0]["tokens"]) < 1
    ]
    fall = (
        f" {' and '.join(falling)} as the chunks grow, which lowers that slope." if falling else ""
    )
    ratios = [f"- `{r['engine']}` / `{r['peer']}`: **{r['ratio']:.2f}**" for r in result["ratios"]]
    return [
        "A least-squares line, step seconds = a + b x chunks a step, over each engine's medians:",
        "",
        *markdown_table(header, rows),
        "",
        f"The ± is the slope's standard error from the {points} medians ({points - 2} degrees of "
        "freedom): a rough guide at so few points. Tokens: every pass's, padding included. "
        "dpr-cache re-encodes all but the last chunk of each tower (one chunk a tower: nothing is "
        "encoded twice), and cuts each chunk to its longest row (smaller chunks of rows ordered by "
        f"length carry less padding).{fall} A slope includes the arithmetic of the tokens that "
        "change with the chunks, so compare engines at equal chunk counts (above) before their "
        "slopes.",
        *(["", "Ratios of the cost of a chunk:", "", *ratios] if ratios else []),
    ]


def points_table(engine: dict) -> list[str]:
    """An engine's steps by chunk count: the chunking, what it encodes, measured and fitted."""
    header = ["question chunks", "rows a chunk", "chunks a step", "encoder forwards"]
    header += ["tokens encoded", "step s (median)", "min – max", "fitted s"]
    rows = [
        [pt["question_chunks"], pt["chunk_rows"], pt["chunks"], pt["forwards"], f"{pt['tokens']:,}"]
        + [f"{pt['step_s']:.3f}", f"{min(pt['times_s']):.3f} – {max(pt['times_s']):.3f}"]
        + [f"{pt['fitted_s']:.3f}"]
        for pt in engine["points"]
    ]
    return markdown_table(header, rows)


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
        *fit_lines(result),
    ]
    for skip in result.get("skipped") or []:
        out += ["", f"Not run: `{skip['engine']}`, {skip['why']}."]
    out += ["", "## Step seconds by chunk count"]
    for name, engine in result["engines"].items():
        out += ["", f"`{name}`:", "", *points_table(engine)]
    return "\n".join([*out, ""])


def render(result: dict, folder: Path, source: Path | None = None) -> Path:
    """Write :data:`PAGE` from ``result`` into ``folder``."""
    return write_text_atomic(Path(folder) / PAGE, markdown(result))


if __name__ == "__main__":
    main()
