"""Ctrl-C outside ``train`` (whose own handler saves a checkpoint first, ``tests/e2e/test_resume``)
ends a command with one line saying what it keeps, exit 130, no traceback. The command's work
raises ``KeyboardInterrupt`` here, as Python does at a Ctrl-C; that ``score`` and ``mine`` go on
from their kept parts is ``tests/retrieval``'s."""

from __future__ import annotations

import pytest
from typer.testing import CliRunner

from dpr_cache.cli import app

TOY = ["--train", "data/toy/train.jsonl", "--passages", "data/toy/passages.tsv"]
PARTS = "its finished parts are kept, and the same command goes on from them"


@pytest.mark.parametrize(
    ("work", "words", "line"),
    [
        ("score.score_file", ["score", "--teacher", "bm25", *TOY], f"score: interrupted: {PARTS}"),
        ("mine.mine_file", ["mine", "--ranker", "bm25", *TOY], f"mine: interrupted: {PARTS}"),
        ("eval.eval_command", ["eval", "--config", "configs/toy.yaml"], "eval: interrupted"),
        (
            "encode.encode_file",
            ["encode", "--model", "data/toy/tiny-bert", "--passages", "data/toy/passages.tsv"],
            "encode: interrupted: the passages' finished shards are kept (questions are encoded "
            "whole), and the same command goes on from them",
        ),
    ],
    ids=lambda value: value if isinstance(value, str) and " " not in value else None,
)
def test_ctrl_c_is_one_line_saying_what_is_kept(monkeypatch, tmp_path, work, words, line):
    def interrupted(*args, **kwargs):
        raise KeyboardInterrupt

    monkeypatch.setattr(f"dpr_cache.retrieval.drivers.{work}", interrupted)
    if words[0] != "eval":
        words = [*words, "--out", str(tmp_path / "out")]
    else:  # an index and a model to evaluate: eval refuses a run without them first
        (tmp_path / "index").mkdir()
        (tmp_path / "index" / "meta.json").write_text('{"format": 2}')
        words = [*words, "--set", f"output_dir={tmp_path}", "--model", "data/toy/tiny-bert"]
    result = CliRunner().invoke(app, words)
    assert result.exit_code == 130, result.output
    assert result.output.strip().splitlines() == [line]
