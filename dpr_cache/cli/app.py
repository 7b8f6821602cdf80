"""The ``dpr-cache`` command line: each command is a thin wrapper around a plain function.

Bad input (:class:`~dpr_cache.errors.InputError`) prints one ``error: ...`` line on stderr and
exits with code 2; an interrupted run exits 130 once its checkpoint is saved; an unexpected
operating-system error (a full disk, a permission denied) prints its own message, errno and path
on one line and exits 1, and so does a GPU out of memory, with what the GPU holds and the setting
to lower. None of them prints a traceback.
"""

from __future__ import annotations

import functools
import os
import signal
import sys
import threading
from pathlib import Path
from typing import Annotated

import typer
from typer.core import TyperCommand, TyperGroup

from dpr_cache.errors import Diverged, InputError, Interrupted, OutOfDeviceMemory
from dpr_cache.runtime.quiet import quiet_libraries

__all__ = [
    "Command",
    "app",
    "data_app",
    "guarded",
    "check_config_files",
    "check_inputs",
    "check_matches",
    "check_model_and_index",
    "check_search_flags",
    "load",
    "rank_and_world",
    "main",
]


class _BareFlags:
    """--help shows a boolean flag (``--quiet``, ``--help``) with no value: it takes none; the
    usage line shows a required argument by its name (``FOLDER``), not in braces (``{FOLDER}``),
    which read as a placeholder left unfilled."""

    def get_params(self, ctx):
        params = super().get_params(ctx)
        for param in params:
            if getattr(param, "is_bool_flag", False):
                param.metavar = ""
        return params

    def collect_usage_pieces(self, ctx):
        pieces = super().collect_usage_pieces(ctx)
        return [p[1:-1] if p.startswith("{") and p.endswith("}") else p for p in pieces]


class Command(_BareFlags, TyperCommand):
    """A command of the app (``@app.command(cls=Command)``)."""


class _Group(_BareFlags, TyperGroup):
    """A group of commands: given no words, it prints its help and exits 0 (click's own exits 2,
    a usage error, which a newcomer's first ``dpr-cache`` is not)."""

    def parse_args(self, ctx, args):
        if not args and self.no_args_is_help and not ctx.resilient_parsing:
            typer.echo(ctx.get_help(), color=ctx.color)
            ctx.exit(0)
        return super().parse_args(ctx, args)


# markdown: a help paragraph is one flowing text, never broken where the docstring wraps
app = typer.Typer(
    cls=_Group,
    add_completion=False,
    no_args_is_help=True,
    help="Dense Passage Retrieval with huge simulated batches (GradCache) on small hardware.",
    pretty_exceptions_enable=False,
    rich_markup_mode="markdown",
)
data_app = typer.Typer(
    cls=_Group,
    no_args_is_help=True,
    help="Build or fetch data in DPR's formats.",
    rich_markup_mode="markdown",
)
app.add_typer(data_app, name="data")


def _print_version(asked: bool) -> None:
    """``--version``: the package's version on one line, then exit 0."""
    if asked:
        from dpr_cache import __version__

        typer.echo(f"dpr-cache {__version__}")
        raise typer.Exit()


@app.callback()
def _top_level(
    version: Annotated[
        bool,
        typer.Option(
            "--version", callback=_print_version, is_eager=True, help="Print the version and exit."
        ),
    ] = False,
) -> None:
    # the app's own options (--version); each command's are its own
    pass


def _fail(message: str, code: int = 2) -> None:
    _say(f"error: {message}")
    raise typer.Exit(code)


def _say(line: str) -> None:
    """The one line a failed command ends with. Under torchrun a SIGTERM after it is ignored:
    the agent ends this rank once a peer has failed too, and the line already says why."""
    if rank_and_world()[1] > 1 and threading.current_thread() is threading.main_thread():
        signal.signal(signal.SIGTERM, signal.SIG_IGN)
    print(line, file=sys.stderr)


def guarded(func):
    """Map the project's errors and unexpected OS errors to one line and an exit code."""

    @functools.wraps(func)
    def wrapper(*args, **kwargs):
        quiet_libraries()
        try:
            return func(*args, **kwargs)
        except InputError as exc:
            _fail(str(exc), 2)
        except Diverged as exc:
            _fail(str(exc), 3)
        except OutOfDeviceMemory as exc:  # the work's own advice: the setting to lower
            _fail(f"{func.__name__.rstrip('_')}: {exc}", 1)
        except Interrupted as exc:
            _say(str(exc))
            raise typer.Exit(130) from None
        except KeyboardInterrupt:  # Ctrl-C outside train's own handler
            name = func.__name__.rstrip("_").replace("_", " ")
            _say(f"{name}: interrupted{_KEPT.get(name, '')}")
            raise typer.Exit(130) from None
        except OSError as exc:  # not bad input: the message keeps its errno and path
            _fail(" ".join(str(exc).split()) or type(exc).__name__, 1)
        except RuntimeError as exc:  # the GPU's memory is full, or a rank is gone: say which
            message = _out_of_device_memory(exc, func.__name__.rstrip("_"))
            if message is None:
                from dpr_cache.runtime.distributed import lost_rank

                message = lost_rank(exc)
            if message is None:
                raise
            _fail(message, 1)

    return wrapper


# what an interrupted command keeps for the same command to go on from
_PARTS = ": its finished parts are kept, and the same command goes on from them"
_KEPT = {
    "score": _PARTS,
    "mine": _PARTS,
    "encode": ": the passages' finished shards are kept (questions are encoded whole), and the "
    "same command goes on from them",
    "index": ": the shards it finished encoding are kept, and the same command goes on from them",
    "data nq": ": the bytes downloaded are kept, and the same command goes on from them",
}


def _out_of_device_memory(error: RuntimeError, command: str) -> str | None:
    """One line for ``command`` run out of GPU memory outside the work that names its own
    setting to lower (:func:`~dpr_cache.runtime.device.advises_on_out_of_memory`); None for
    any other error."""
    if "torch" not in sys.modules:
        return None
    from dpr_cache.runtime.device import out_of_memory_state

    state = out_of_memory_state(error)
    if state is None:
        return None
    return f"{command}: {state}: free the GPU of other processes"


def check_inputs(**options: Path | None) -> None:
    """Each input file given exists, checked before a command's heavy imports: a wrong path is
    named with its option in a second, not after torch, FAISS and datasets have loaded."""
    from dpr_cache.data.files import check_file

    for name, path in options.items():
        if path is not None:
            try:
                check_file(path)
            except InputError as e:
                raise InputError(f"--{name.replace('_', '-')} {e}") from None


def check_config_files(files: dict[str, str | Path | None]) -> None:
    """Each input file a config key names (``{key: path}``; None: not given) exists, checked
    before a command's heavy imports and named by its key."""
    from dpr_cache.data.files import check_file

    for key, path in files.items():
        if path is not None:
            try:
                check_file(Path(path))
            except InputError as e:
                raise InputError(f"{key}: {e}") from None


def check_model_and_index(model: str | None, index: Path | None) -> None:
    """A model folder and an index given to search with (``mine``, ``score --teacher hybrid``)
    are there, checked before the heavy imports."""
    from dpr_cache.model.hub import resolve_model_dir
    from dpr_cache.retrieval.dense.layout import read_meta

    if model is not None:
        resolve_model_dir(model, Path("."))
    if index is not None:
        read_meta(index)


def check_matches(pattern: str) -> None:
    """A glob of input files matches one at least (``index --embeddings``), before the heavy
    imports."""
    import glob

    if not glob.glob(os.path.expanduser(pattern)):
        raise InputError(f"{pattern}: matches no file")


def check_search_flags(memory_gb: float | None, nprobe: int, ef_search: int):
    """A search's budget and index knobs (``search``, ``mine``), checked as their config keys:
    the ``index`` section that holds them."""
    from dpr_cache.config import check_flags

    return check_flags(
        "index",
        {
            "--memory-gb": ("memory_gb", memory_gb),
            "--nprobe": ("ivf_nprobe", nprobe),
            "--ef-search": ("hnsw_ef_search", ef_search),
        },
    )


def load(config: Path | None, overrides: list[str] | None):
    """The config file (defaults without one) with ``--set`` overrides, validated."""
    from dpr_cache.config import load_config

    return load_config(config, overrides or [])


def overridden(overrides: list[str] | None) -> list[str]:
    """The keys that ``--set`` overrides."""
    return [item.split("=", 1)[0].strip() for item in overrides or []]


def rank_and_world() -> tuple[int, int]:
    """This process's rank and world size under torchrun (0, 1 otherwise), without torch."""
    return int(os.environ.get("RANK", "0")), int(os.environ.get("WORLD_SIZE", "1"))


def main() -> None:  # pragma: no cover - console entry
    app()
