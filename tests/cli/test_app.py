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
