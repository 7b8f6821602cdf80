"""``dpr-cache mine --teacher``: the teacher rule drops exactly the candidates that a reference
written here drops (the candidates mined without the rule, scored by transformers run directly,
kept unless the teacher scores them within the margin of the positive), counted in the summary;
its options checked as one line."""

from __future__ import annotations

import functools
import json
from pathlib import Path

import pytest
import torch
from transformers import AutoModelForSequenceClassification, AutoTokenizer

from tests.support.cli import run_cli
from tests.support.fixtures import TOY

CROSS = TOY / "tiny-cross-encoder"
PASSAGES = TOY / "passages.tsv"
KEEP, DEPTH = 3, 15


@pytest.fixture(scope="module")
def train(tmp_path_factory) -> Path:
    path = tmp_path_factory.mktemp("teacher") / "train30.jsonl"
    path.write_text("".join((TOY / "train.jsonl").read_text().splitlines(True)[:30]))
    return path


def _mine(train: Path, out: Path, *extra: str, check: bool = True, world: int = 1):
    """``mine --ranker bm25`` of ``train`` over the toy passages into ``out`` (on ``world``
    ranks), ``extra`` flags after the usual ones."""
    return run_cli(
        "mine",
        "--ranker",
        "bm25",
        "--passages",
        str(PASSAGES),
        "--train",
        str(train),
        "--out",
        str(out),
        "--cache-dir",
        str(train.parent / "cache"),
        "--depth",
        str(DEPTH),
        "-q",
        *extra,
        check=check,
        world=world,
    )


def _read(path: Path) -> list[dict]:
    return [json.loads(line) for line in path.read_text().splitlines()]


@functools.cache
def _cross_encoder():
    return (
        AutoTokenizer.from_pretrained(CROSS),
        AutoModelForSequenceClassification.from_pretrained(CROSS).eval(),
    )


def _teacher(question: str, ctx: dict) -> float:
    """The tiny cross-encoder's logit for (question, title + " " + text), transformers alone."""
    tokenizer, model = _cross_encoder()
    passage = f"{ctx['title']} {ctx['text']}" if ctx["title"] else ctx["text"]
    inputs = tokenizer(
        question, passage, truncation="only_second", max_length=256, return_tensors="pt"
    )
    with torch.no_grad():
        return float(model(**inputs).logits[0, 0])


def _reference(every: list[dict], near) -> tuple[list[list[str]], int]:
    """Each question's first KEEP candidates (of those no other rule drops, best first) that
    the teacher does not score near its positive, and how many the rule dropped on the way."""
    kept_all, dropped = [], 0
    for record in every:
        positive = _teacher(record["question"], record["positive_ctxs"][0])
        kept = []
        for ctx in record["hard_negative_ctxs"]:
            if len(kept) == KEEP:
                break
            if near(_teacher(record["question"], ctx), positive):
                dropped += 1
            else:
                kept.append(ctx["passage_id"])
        kept_all.append(kept)
    return kept_all, dropped


@pytest.mark.parametrize(
    ("flag", "value", "near"),
    [
        ("--teacher-margin", "0.1", lambda s, p: s >= p - 0.1),
        ("--teacher-relative", "0.95", lambda s, p: s >= p - 0.05 * abs(p)),
    ],
)
def test_the_teacher_rule_drops_what_the_reference_drops(train, tmp_path, flag, value, near):
    _mine(train, tmp_path / "all.jsonl", "--negatives", str(DEPTH))  # every candidate kept
    every = _read(tmp_path / "all.jsonl")
    done = _mine(
        train, tmp_path / "t.jsonl", "--negatives", str(KEEP), "--teacher", str(CROSS), flag, value
    )
    got = [[c["passage_id"] for c in r["hard_negative_ctxs"]] for r in _read(tmp_path / "t.jsonl")]
    want, dropped = _reference(every, near)
    assert got == want
    summary = json.loads((tmp_path / "t.summary.json").read_text())
    assert (
        summary["dropped"]["teacher"] == dropped and f"dropped, teacher: {dropped}" in done.stdout
    )
    plain = _read(tmp_path / "all.jsonl")
    untaught = [[c["passage_id"] for c in r["hard_negative_ctxs"][:KEEP]] for r in plain]
    assert 0 < dropped and got != untaught  # negative control: the rule changed the lists
    assert summary["mined_by"]["teacher"]["teacher"] == "cross-encoder"
    assert summary["settings"]["rules"][flag[2:].replace("-", "_")] == float(value)


def test_teacher_options_are_checked_in_one_line(train, tmp_path) -> None:
    cases = [
        (["--teacher", "bm25"], "--teacher needs --teacher-margin or --teacher-relative"),
        (["--teacher-margin", "1"], "--teacher-margin and --teacher-relative need --teacher"),
        (["--teacher", "bm25", "--teacher-relative", "1.5"], "must be in (0, 1]"),
        (["--teacher", "bm25", "--teacher-margin", "-1"], "--teacher-margin -1.0 must be >= 0"),
        (["--fusion-weight", "2"], "--fusion-weight is the hybrid teacher's: give --teacher"),
        (["--precision", "bf16"], "--precision bf16: mine --ranker bm25 runs a model only as"),
        (
            ["--teacher", "bm25", "--teacher-margin", "1", "--precision", "fp32"],
            "--precision fp32: mine --ranker bm25 runs a model only as a cross-encoder",
        ),
        (["--precision", "fp8"], "--precision: 'fp8' is not one of auto, fp32, bf16, fp16"),
        (["--teacher", str(TOY / "tiny-bert"), "--teacher-margin", "1"], "not a cross-encoder"),
        (["--teacher", "hybrid", "--teacher-margin", "1"], "hybrid: give --model DIR and --index"),
    ]
    for extra, message in cases:
        done = _mine(train, tmp_path / "o.jsonl", "--negatives", "3", *extra, check=False)
        lines = done.stderr.strip().splitlines()
        assert done.returncode == 2 and len(lines) == 1, (extra, lines)
        assert lines[0].startswith("error: ") and message in lines[0], (extra, lines)
    assert not (tmp_path / "o.jsonl").exists()


def test_two_ranks_clean_as_one_process(train, tmp_path) -> None:
    """The teacher scores on rank 0 alone; the other rank waits and the file is the same."""
    extra = [
        "--negatives",
        "3",
        "--teacher",
        "bm25",
        "--teacher-relative",
        "0.9",
        "--device",
        "cpu",
    ]
    _mine(train, tmp_path / "one.jsonl", *extra)
    _mine(train, tmp_path / "two.jsonl", *extra, world=2)
    one = (tmp_path / "one.jsonl").read_bytes()
    assert one and (tmp_path / "two.jsonl").read_bytes() == one
    summaries = [json.loads((tmp_path / f"{n}.summary.json").read_text()) for n in ("one", "two")]
    assert summaries[0]["dropped"] == summaries[1]["dropped"]
    assert summaries[0]["dropped"]["teacher"] > 0
