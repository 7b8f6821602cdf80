"""The CLI's ``--help``: each command's summary reads as whole sentences (the docstring's first
paragraph on one line, never broken where the source wraps), and a boolean flag shows no value."""

from __future__ import annotations

import inspect

import pytest
import torch
from typer.main import get_command
from typer.testing import CliRunner

from dpr_cache.cli import app

WIDE = {"COLUMNS": "400", "TERMINAL_WIDTH": "400"}  # no wrapping by the terminal's width


def _commands() -> dict[str, object]:
    group = get_command(app)
    return {name: command for name, command in group.commands.items() if name != "data"}


def _summary(command) -> str:
    """The docstring's first paragraph, its line breaks as spaces."""
    first = inspect.cleandoc(command.callback.__doc__ or "").split("\n\n")[0]
    return " ".join(first.split())


def test_the_command_list_shows_each_summary_whole() -> None:
    shown = CliRunner().invoke(app, ["--help"], env=WIDE).output
    lines = [" ".join(line.strip("│ ").split()) for line in shown.splitlines()]
    for name, command in _commands().items():
        summary = _summary(command)
        assert "\n" not in summary and len(summary.split()) > 3, name
        assert any(line == f"{name} {summary}" for line in lines), (name, summary)


def _command(words: list[str]):
    """The click command that ``words`` name (``["data", "beir"]``)."""
    command = get_command(app)
    for word in words:
        command = command.commands[word]
    return command


def _every_command() -> list[list[str]]:
    """Each command's words: the top-level ones and each ``data`` subcommand."""
    group = get_command(app)
    data = group.commands["data"]
    return [[name] for name in _commands()] + [["data", name] for name in data.commands]


@pytest.mark.parametrize("words", _every_command(), ids=" ".join)
def test_a_boolean_flag_shows_no_value(words: list[str]) -> None:
    shown = CliRunner().invoke(app, [*words, "--help"], env=WIDE).output
    assert "--help" in shown
    assert "<bool>" not in shown
    assert "<int>" in shown or "<path>" in shown or "<str>" in shown  # control: values shown


def test_score_help_names_the_cross_encoders_own_defaults(monkeypatch) -> None:
    """The CLI's help cannot import the torch modules that hold these defaults (it would slow
    every ``--help``), so it writes them out: this holds the two in step."""
    from dpr_cache.model.cross_encoder import PAIRS_A_FORWARD
    from dpr_cache.retrieval.teacher import precision_for

    shown = " ".join(CliRunner().invoke(app, ["score", "--help"], env=WIDE).output.split())
    assert f"pairs a forward (default {PAIRS_A_FORWARD})" in shown, shown
    gpus = []
    for major in (8, 7):
        monkeypatch.setattr(torch.cuda, "get_device_capability", lambda *a, m=major: (m, 0))
        gpus.append(precision_for("auto", torch.device("cuda")))
    cpu = precision_for("auto", torch.device("cpu"))
    assert f"auto ({gpus[0]} on a GPU that has it, else {gpus[1]}; {cpu} on CPU)" in shown, shown


def test_version_and_a_bare_command_exit_0() -> None:
    """What a newcomer types first: ``dpr-cache --version``, ``dpr-cache``, ``dpr-cache data``."""
    from dpr_cache import __version__

    done = CliRunner().invoke(app, ["--version"], env=WIDE)
    assert done.exit_code == 0 and done.output.strip() == f"dpr-cache {__version__}"
    for words in ([], ["data"]):
        done = CliRunner().invoke(app, words, env=WIDE)
        assert done.exit_code == 0, (words, done.output)
        assert "Commands" in done.output and "Usage" in done.output, done.output
    assert CliRunner().invoke(app, ["no-such-command"], env=WIDE).exit_code == 2  # control


@pytest.mark.parametrize("words", _every_command(), ids=" ".join)
def test_help_shows_each_value_by_name_and_an_example(words: list[str]) -> None:
    """No Python type for a value (``<list[str]>``) nor a parameter's name in braces
    (``{folder}``); ``--set`` shows KEY=VALUE; every command's help ends with an example."""
    shown = CliRunner().invoke(app, [*words, "--help"], env=WIDE).output
    [usage] = [line for line in shown.splitlines() if "Usage:" in line]
    assert "<list[" not in shown and "{" not in usage, shown
    if any(param.name == "set_" for param in _command(words).params):
        assert "KEY=VALUE" in shown, shown
    assert "Example" in shown, (words, shown)
