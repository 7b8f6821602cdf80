"""`dpr-cache mine`: hard negatives mined by a model over its index."""

from __future__ import annotations

import json
import shlex
import sys
from pathlib import Path
from typing import Annotated

import typer

from dpr_cache.cli.app import app, guarded, rank_and_world
from dpr_cache.errors import InputError


@app.command()
@guarded
def mine(
    model: Annotated[str, typer.Option("--model", help="The model that encoded --index.")],
    index: Annotated[Path, typer.Option("--index", help="Its index folder (dpr-cache index).")],
    train: Annotated[Path, typer.Option(help="A DPR training file (JSON or JSON Lines).")],
    out: Annotated[Path, typer.Option(help="The mined training file (JSON Lines).")],
    passages: Annotated[
        Path | None, typer.Option(help="The index's passages TSV (default: as it records).")
    ] = None,
    negatives: Annotated[int, typer.Option(help="Hard negatives kept per question.")] = 30,
    depth: Annotated[int, typer.Option(help="Candidates ranked per question.")] = 100,
    skip: Annotated[int, typer.Option(help="The model's top ranks left out first.")] = 0,
    keep_bm25: Annotated[
        bool, typer.Option("--keep-bm25", help="Keep the file's own hard negatives after these.")
    ] = False,
    match: Annotated[
        str, typer.Option(help="Answer check: string | regex | none (DPR's has_answer).")
    ] = "string",
    qrels: Annotated[
        Path | None, typer.Option(help="TREC qrels: a passage judged relevant is dropped.")
    ] = None,
    margin: Annotated[
        float | None, typer.Option(help="Drop a candidate scoring at least positive - MARGIN.")
    ] = None,
    relative_margin: Annotated[
        float | None,
        typer.Option(help="Drop a candidate scoring at least positive - MARGIN x |positive|."),
    ] = None,
    batch: Annotated[int, typer.Option(help="Questions per part (resumable unit).")] = 2048,
    memory_gb: Annotated[float, typer.Option("--memory-gb", help="Peak memory, in GB.")] = 4.0,
    nprobe: Annotated[int, typer.Option(help="IVF lists searched (an IVF index).")] = 16,
    ef_search: Annotated[int, typer.Option(help="HNSW search breadth (an HNSW index).")] = 128,
    device: Annotated[str, typer.Option(help="auto | cpu | cuda.")] = "auto",
    cache_dir: Annotated[Path | None, typer.Option(help="Arrow caches.")] = None,
    quiet: Annotated[bool, typer.Option("--quiet", "-q")] = False,
) -> None:
    """The model's own hard negatives for a training file: its best-ranked passages that are not
    positives, hold no answer and are not judged relevant (DPR's second round).

    Writes OUT (every key kept) and OUT's summary beside it (what mined it, what each rule
    dropped); resumable. Under torchrun the index's shards are split over the ranks.

    Example: dpr-cache mine --model runs/toy/model --index runs/toy/index
    --train data/toy/train.jsonl --out runs/toy/train.mined.jsonl
    """
    from dpr_cache.data.arrow_cache import default_cache_dir
    from dpr_cache.model.loading import resolve_model_dir
    from dpr_cache.retrieval.dense.index import open_index, search_spec
    from dpr_cache.retrieval.mining.miner import mine as run
    from dpr_cache.retrieval.mining.rules import MineSpec, NegativeRules
    from dpr_cache.runtime import distributed

    if match not in ("string", "regex", "none"):
        raise InputError(f"--match: {match!r} is not one of string, regex, none")
    rules = NegativeRules(None if match == "none" else match, margin, relative_margin)
    spec = MineSpec(negatives, depth, skip, keep_bm25, rules, batch)
    model_dir = resolve_model_dir(model, Path("."))
    opened = open_index(index, search_spec(index, nprobe, ef_search))
    env = distributed.setup(device, "--device") if rank_and_world()[1] > 1 else None
    if env is None:
        from dpr_cache.runtime.device import resolve_device
        from dpr_cache.runtime.distributed import DistEnv

        env = DistEnv(device=resolve_device(device, key="--device"))
    try:
        summary = run(
            model_dir, opened, train, out, spec, passages=passages, qrels=qrels,
            cache_dir=cache_dir or default_cache_dir(), memory_bytes=int(memory_gb * 1e9),
            device=env.device, rank=env.rank, world_size=env.world_size, progress=not quiet,
            command=shlex.join(["dpr-cache", *sys.argv[1:]]),
        )  # fmt: skip
    finally:
        distributed.teardown()
    if summary is not None:
        print(format_summary(summary))
        print(f"written to {out}")


def format_summary(summary: dict) -> str:
    """What a mining run did, a line a figure."""
    n = max(summary.get("questions", 0), 1)
    lines = [
        f"questions: {summary.get('questions', 0)}",
        f"hard negatives: {summary.get('negatives', 0)} ({summary.get('negatives', 0) / n:.1f} "
        f"a question; {summary.get('short', 0)} questions with fewer than asked)",
        f"candidates looked at: {summary.get('candidates', 0)} (top {summary['settings']['skip']}"
        f" skipped: {summary.get('skipped_top', 0)})",
    ]
    lines += [f"dropped, {rule}: {count}" for rule, count in summary["dropped"].items()]
    if summary["settings"]["keep_bm25"]:
        lines.append(f"the file's own kept: {summary.get('kept_bm25', 0)}")
    lines.append(f"mined by: {json.dumps(summary['mined_by']['model'])}")
    stages = ", ".join(f"{name} {s:.1f}" for name, s in summary["seconds_by_stage"].items())
    lines.append(f"seconds: {summary['seconds']:.1f} ({stages})")
    return "\n".join(lines)
