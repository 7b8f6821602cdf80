"""The ``dpr-cache`` command line: each command is a thin wrapper around a plain function.

Bad input prints one ``error: ...`` line on stderr and exits with code 2 (no traceback).
"""

from __future__ import annotations

import functools
import os
import sys
from pathlib import Path
from typing import Annotated

import typer

from dpr_cache.errors import InputError

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


def _offline() -> None:
    """Nothing is fetched from a model hub at run time unless the user asks for it."""
    for key in ("HF_HUB_OFFLINE", "TRANSFORMERS_OFFLINE", "HF_DATASETS_OFFLINE"):
        os.environ.setdefault(key, "1")
    os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
    import transformers

    transformers.logging.set_verbosity_error()  # e.g. "unused pooler weights" on every load
    transformers.logging.disable_progress_bar()


def _fail(message: str, code: int = 2) -> None:
    print(f"error: {message}", file=sys.stderr)
    raise typer.Exit(code)


def guarded(func):
    """Turn bad input into a one-line error and a non-zero exit."""

    @functools.wraps(func)
    def wrapper(*args, **kwargs):
        _offline()
        from dpr_cache.train import Interrupted

        try:
            return func(*args, **kwargs)
        except InputError as exc:
            _fail(str(exc))
        except (FileNotFoundError, IsADirectoryError, PermissionError) as exc:
            name = exc.filename or ""
            _fail(f"{name}: {exc.strerror or exc}" if name else str(exc))
        except OSError as exc:
            if getattr(exc, "filename", None):  # e.g. a model folder that is not one
                _fail(f"{exc.filename}: {exc}")
            _fail(str(exc).splitlines()[0] if str(exc) else type(exc).__name__)
        except Interrupted as exc:
            print(str(exc), file=sys.stderr)
            raise typer.Exit(130) from None

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
    from dpr_cache.train import train as run

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
    from dpr_cache import distributed
    from dpr_cache.index import build_index

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
    from dpr_cache.evaluate import evaluate, format_metrics_table

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
    from dpr_cache.verify import verify as run

    report = run(_config(config, set_), double=double)
    for key, value in report.items():
        print(f"{key:>28}: {value}")


@data_app.command("squad")
@guarded
def data_squad(
    source: Annotated[Path, typer.Option(help="SQuAD v1.1 dev JSON (.gz ok).")] = Path(
        "data/squad/dev-v1.1.json.gz"
    ),
    out: Annotated[Path, typer.Option(help="Output folder.")] = Path("data/squad"),
) -> None:
    """DPR-format files (passages.tsv, train/dev.jsonl, dev.qa.tsv) from SQuAD v1.1 dev."""
    from dpr_cache.data import build_squad

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


def main() -> None:  # pragma: no cover - console entry
    app()
