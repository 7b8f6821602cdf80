"""``mine``'s flags that mirror a setting of :class:`MineSpec` take its default: the spec is the
one place each is written."""

from __future__ import annotations

import dataclasses

import typer

from dpr_cache.cli import app
from dpr_cache.retrieval.mining.rules import MineSpec, NegativeRules

MIRRORED = {"negatives", "depth", "skip", "keep_bm25", "batch"}  # MineSpec's fields as flags


def _flag_defaults() -> dict[str, object]:
    command = typer.main.get_command(app).commands["mine"]
    return {param.name: param.default for param in command.params}


def test_mines_flags_take_the_specs_defaults() -> None:
    flags = _flag_defaults()
    spec = {f.name: f.default for f in dataclasses.fields(MineSpec) if f.name in MIRRORED}
    assert len(spec) == len(MIRRORED)  # control: every mirrored flag is a field of the spec
    assert {name: flags[name] for name in MIRRORED} == spec
    assert flags["match"] == NegativeRules().match  # the answer check: a rule's default
    # negative control: a default the spec does not hold is told apart
    assert {**spec, "depth": spec["depth"] + 1} != {name: flags[name] for name in MIRRORED}
