"""studies/squad_teachers/saved.py: the study's state saved small enough to commit and put back
so that the study's script skips what was done: the training files packed without their texts
and unpacked byte for byte from the passages file, each run's per-question ranks read as its DPR
results file reads, and only finished runs saved."""

from __future__ import annotations

import gzip
import json
import math
from pathlib import Path

import numpy as np

from dpr_cache.retrieval.metrics import first_relevant_rank, hit_metrics
from studies.squad_hard_negatives.collect import KS, RANKS_NAME, first_ranks, per_question
from studies.squad_teachers.saved import SETUP, load_passages, pack, restore, save, unpack

PASSAGES = [("1", "Denver won the game 24–10.", "Super Bowl 50"), ("2", 'Tab\tand "quote"', "T")]


def _passages(path: Path, rows=PASSAGES) -> Path:
    lines = ["id\ttext\ttitle"]
    for pid, text, title in rows:
        quoted = '"' + text.replace('"', '""') + '"' if ("\t" in text or '"' in text) else text
        lines.append(f"{pid}\t{quoted}\t{title}")
    path.write_text("\n".join(lines) + "\n", encoding="utf-8")
    return path


def _training_file(path: Path) -> Path:
    ctx = {pid: {"passage_id": pid, "title": t, "text": x} for pid, x, t in PASSAGES}
    records = [
        {
            "id": "q1",
            "question": "Who won?",
            "answers": ["Denver"],
            "positive_ctxs": [{**ctx["1"], "teacher_score": 3.25}],
            "hard_negative_ctxs": [{**ctx["2"], "teacher_score": -1.0000000000000002}],
        },
        {  # its positive's text is not the passages file's, a negative's id is not there at all
            "question": "Ünïcode?",
            "answers": ["x"],
            "positive_ctxs": [{"title": "Super Bowl 50", "text": "other", "passage_id": "1"}],
            "hard_negative_ctxs": [{"passage_id": "9", "title": "t", "text": "y"}, ctx["2"]],
        },
    ]
    path.write_text("".join(json.dumps(r, ensure_ascii=False) + "\n" for r in records) + "\n")
    return path


def test_a_packed_training_file_unpacks_byte_for_byte(tmp_path: Path) -> None:
    passages = load_passages(_passages(tmp_path / "passages.tsv"))
    train = _training_file(tmp_path / "train.jsonl")
    whole = pack(train, tmp_path / "train.ids.jsonl.gz", passages)
    assert whole == 0  # every line packs and comes back
    packed = gzip.decompress((tmp_path / "train.ids.jsonl.gz").read_bytes()).decode()
    assert "Denver won" not in packed and '"text": 0' in packed
    assert '"text": "other"' in packed and '"text": "y"' in packed  # not the passages file's
    unpack(tmp_path / "train.ids.jsonl.gz", tmp_path / "back.jsonl", passages)
    assert (tmp_path / "back.jsonl").read_bytes() == train.read_bytes()
    # the same bytes each time: saving again changes nothing for git
    pack(train, tmp_path / "again.ids.jsonl.gz", passages)
    assert (tmp_path / "again.ids.jsonl.gz").read_bytes() == (
        tmp_path / "train.ids.jsonl.gz"
    ).read_bytes()
    # negative control: the texts come from the passages file, not from the packed one
    other = load_passages(_passages(tmp_path / "p2.tsv", [("1", "changed", "Super Bowl 50")]))
    unpack(tmp_path / "train.ids.jsonl.gz", tmp_path / "wrong.jsonl", {**passages, **other})
    assert (tmp_path / "wrong.jsonl").read_bytes() != train.read_bytes()


def test_a_line_that_would_not_come_back_is_kept_whole(tmp_path: Path) -> None:
    passages = load_passages(_passages(tmp_path / "passages.tsv"))
    record = {
        "positive_ctxs": [
            {"passage_id": "1", "title": "Super Bowl 50", "text": "Denver won the game 24–10."}
        ]
    }
    train = tmp_path / "train.jsonl"
    train.write_text(json.dumps(record) + "\n")  # ASCII escapes: not how the unpacker writes
    assert pack(train, tmp_path / "p.gz", passages) == 1
    unpack(tmp_path / "p.gz", tmp_path / "back.jsonl", passages)
    assert (tmp_path / "back.jsonl").read_bytes() == train.read_bytes()


def _results(path: Path, flags: list[list[bool]]) -> Path:
    entries = [
        {
            "question": f"q{i}",
            "answers": ["a"],
            "ctxs": [{"id": str(j), "text": "t", "has_answer": f} for j, f in enumerate(row)],
        }
        for i, row in enumerate(flags)
    ]
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(entries))
    return path


def _finished_run(run: Path, flags: list[list[bool]], hybrids: bool = True) -> None:
    run.mkdir(parents=True)
    (run / "run.json").write_text('{"seed": 1}')
    (run / "train_log.jsonl").write_text('{"step": 1}\n')
    (run / "model").mkdir()
    (run / "model" / "config.json").write_text("{}")
    _results(run / "eval" / "retrieval.json", flags)
    (run / "eval" / "metrics.json").write_text('{"top1": 50.0}')
    (run / "eval" / "run.trec").write_text("q1 Q0 1 1 2.0 x\n")
    (run / "loss_curve.png").write_bytes(b"png")
    if hybrids:
        for h in ("eval-rrf", "eval-linear-a", "eval-linear-b"):
            _results(run / h / "retrieval.json", flags)
            (run / h / "metrics.json").write_text("{}")


def _set_up(out: Path, passages: Path) -> None:
    """Every set-up step's marker and the two training files the students read."""
    for name in SETUP:
        (out / name).parent.mkdir(parents=True, exist_ok=True)
        (out / name).write_text("{}")
    for name in ("scored", "cleaned"):
        _training_file(out / f"train.{name}.jsonl")


def test_saved_ranks_read_as_the_results_file(tmp_path: Path) -> None:
    flags = [[False, True, False], [False, False, False], [True, True, False]]
    results = _results(tmp_path / "run" / "eval" / "retrieval.json", flags)
    want = [first_relevant_rank(f) for f in flags]
    assert want == [1.0, math.inf, 0.0]
    save_dir = tmp_path / "saved"
    _set_up(tmp_path, _passages(tmp_path / "passages.tsv"))
    (tmp_path / "run" / "run.json").write_text("{}")
    save(tmp_path, save_dir, passages_file=tmp_path / "passages.tsv")
    ranks = save_dir / "run" / "eval" / RANKS_NAME
    assert json.loads(ranks.read_text()) == [1, None, 0]
    assert first_ranks(ranks.with_name("retrieval.json")) == want  # no results file: the ranks
    by_hand = hit_metrics(want, KS)
    got = per_question(ranks.with_name("retrieval.json"))
    assert all(np.array_equal(got[m], by_hand[m]) for m in by_hand)
    # the results file, where it is there, is read before the ranks beside it
    ranks.with_name("retrieval.json").write_text(results.read_text().replace("true", "false"))
    assert first_ranks(ranks.with_name("retrieval.json")) == [math.inf] * 3


def test_save_keeps_finished_runs_and_restore_puts_them_back(tmp_path: Path) -> None:
    out, saved, back = tmp_path / "out", tmp_path / "saved", tmp_path / "back"
    flags = [[False, True], [True, False]]
    _finished_run(out / "control" / "gradcache-b128-s1", flags)
    _finished_run(out / "distill" / "gradcache-b128-s1", flags, hybrids=False)  # not fused yet
    _finished_run(out / "references" / "bm25", flags, hybrids=False)  # no fusion asked
    cut = out / "cleaned" / "gradcache-b128-s1"  # cut mid-training
    (cut / "checkpoints").mkdir(parents=True)
    (cut / "train_log.jsonl").write_text('{"step": 1}\n')
    passages = _passages(tmp_path / "passages.tsv")
    (out / "train.mined.jsonl").parent.mkdir(parents=True, exist_ok=True)
    (out / "train.mined.jsonl").write_text("{}\n")  # a training file no student reads
    (out / "teacher" / "weight").mkdir(parents=True)
    (out / "teacher" / "weight" / "fusion.json").write_text('{"weight": 2.0}')
    (out / "train.scored.parts").mkdir()
    (out / "train.scored.parts" / "00000.json").write_text("{}")  # an unfinished command's part
    (out / "big.json").write_bytes(b" " * (2 << 20))
    (out / "study.log").write_text("log")
    (out / SETUP[-1]).parent.mkdir(parents=True, exist_ok=True)
    (out / SETUP[-1]).write_text("{}")
    for name in ("scored", "cleaned"):
        _training_file(out / f"train.{name}.jsonl")
    # the set-up not all done: nothing saved (a half set-up, restored, could not go on)
    assert save(out, saved, passages_file=passages) == []
    assert not saved.exists()

    _set_up(out, passages)
    done = dict(save(out, saved, passages_file=passages))
    files = sorted(str(p.relative_to(saved)) for p in saved.rglob("*") if p.is_file())
    assert [f for f in files if f not in SETUP] == [
        "control/gradcache-b128-s1/eval-linear-a/metrics.json",
        "control/gradcache-b128-s1/eval-linear-a/retrieval.ranks.json",
        "control/gradcache-b128-s1/eval-linear-b/metrics.json",
        "control/gradcache-b128-s1/eval-linear-b/retrieval.ranks.json",
        "control/gradcache-b128-s1/eval-rrf/metrics.json",
        "control/gradcache-b128-s1/eval-rrf/retrieval.ranks.json",
        "control/gradcache-b128-s1/eval/metrics.json",
        "control/gradcache-b128-s1/eval/retrieval.ranks.json",
        "control/gradcache-b128-s1/run.json",
        "control/gradcache-b128-s1/train_log.jsonl",
        "references/bm25/eval/metrics.json",
        "references/bm25/eval/retrieval.ranks.json",
        "references/bm25/run.json",
        "references/bm25/train_log.jsonl",
        "teacher/weight/fusion.json",
        "train.cleaned.ids.jsonl.gz",
        "train.scored.ids.jsonl.gz",
    ]
    assert all(f in files for f in SETUP)
    assert done[Path("big.json")].startswith("left out")
    assert save(out, saved, passages_file=passages) == [(Path("big.json"), done[Path("big.json")])]

    (back / "teacher" / "weight").mkdir(parents=True)
    (back / "teacher" / "weight" / "fusion.json").write_text("mine")  # there already: kept
    (saved / "control" / ".tmp-gradcache-b128-s2-9").mkdir()  # a save cut mid-run: not put back
    (saved / "control" / ".tmp-gradcache-b128-s2-9" / "run.json").write_text("{}")
    restored = restore(saved, back, passages)
    assert restored[:2] == [Path("train.cleaned.jsonl"), Path("train.scored.jsonl")]  # first
    assert (back / "train.scored.jsonl").read_bytes() == (out / "train.scored.jsonl").read_bytes()
    assert (back / "teacher" / "weight" / "fusion.json").read_text() == "mine"
    run = back / "control" / "gradcache-b128-s1"
    assert (run / "run.json").is_file() and not (run / "model").exists()
    assert first_ranks(run / "eval-rrf" / "retrieval.json") == [1.0, 0.0]
    assert not (back / "distill").exists() and not (back / "cleaned").exists()
    assert not list(back.rglob(".tmp*"))
    # a saved set-up without one of its markers (a save cut short): nothing restored
    (saved / SETUP[0]).unlink()
    assert restore(saved, tmp_path / "again", passages) == []
