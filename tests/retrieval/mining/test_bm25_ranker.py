"""`mine --ranker bm25`: DPR's exclusion rules, BM25 order (checked by hand), the hit rates of
the window, determinism, and bad input as one line."""

from __future__ import annotations

import csv
import json
import math
import os
import re
from collections import Counter
from pathlib import Path

import numpy as np
import pytest
from bm25s.stopwords import STOPWORDS_EN
from typer.testing import CliRunner

from dpr_cache.cli import app
from dpr_cache.data.answers import has_answer
from dpr_cache.errors import InputError
from dpr_cache.retrieval.drivers.mine import RankerSpec, format_summary, mine_file
from dpr_cache.retrieval.lexical import K1, B, top_rows
from dpr_cache.retrieval.mining.rules import MineSpec, NegativeRules

PASSAGES = [  # id, text, title
    ("p1", "The Seine flows through Paris and into the English Channel.", "Seine"),
    ("p2", "River cruises on the Seine start in central Paris.", "Paris"),
    ("p3", "Paris is the capital of France, a city on a river with many bridges.", "Paris"),
    ("p4", "The Danube is a long river in central Europe.", "Danube"),
    ("p5", "Paris has many museums, bridges and parks along the river.", "Paris sights"),
    ("p6", "Paris has many museums, bridges and parks along the river.", "Paris sights"),
    ("p7", "The tower in Paris was finished in the year of the world fair.", "Eiffel Tower"),
    ("p8", "The tower in Paris was finished in the year of the world fair.", "Eiffel Tower"),
    ("p9", "Gustave Eiffel built the tower for the 1889 fair in Paris.", "Eiffel Tower"),
    ("p10", "Bread and cheese are common foods in France.", "French food"),
]
RECORDS = [
    {
        "id": "q1",
        "question": "Which river flows through Paris?",
        "answers": ["Seine", "the Seine"],
        "positive_ctxs": [{"passage_id": "p1", "title": "Seine", "text": PASSAGES[0][1]}],
        "hard_negative_ctxs": [{"title": "old", "text": "replaced"}],
        "negative_ctxs": [{"title": "kept", "text": "as is"}],
        "extra": {"nested": [1, 2.5, None], "unicode": "Beyoncé"},
    },
    {  # the positive holds no answer token: it must be excluded by id (p7) and by text (p8)
        "question": "When was the tower in Paris finished?",
        "extra_first": True,
        "answers": ["1889"],
        "positive_ctxs": [{"passage_id": "p7", "title": "Eiffel Tower", "text": PASSAGES[6][1]}],
    },
    {  # no positive: mined too, as every record is
        "question": "Which bridges and parks does Paris have?",
        "answers": ["nothing here"],
        "positive_ctxs": [],
    },
]


def _write_passages(path: Path, rows=PASSAGES) -> Path:
    with open(path, "w", encoding="utf-8", newline="") as f:
        writer = csv.writer(f, delimiter="\t", lineterminator="\n")
        writer.writerow(["id", "text", "title"])
        writer.writerows(rows)
    return path


@pytest.fixture
def files(tmp_path) -> dict[str, Path]:
    train = tmp_path / "train.jsonl"
    train.write_text("".join(json.dumps(r, ensure_ascii=False) + "\n" for r in RECORDS))
    return {"train": train, "passages": _write_passages(tmp_path / "passages.tsv")}


def _mine(files, out: Path, rules: NegativeRules = NegativeRules(), **kw):
    """BM25's negatives of ``files``; the summary and the records written."""
    summary = mine_file(
        RankerSpec("bm25", passages=files["passages"]),
        files["train"],
        out,
        MineSpec(rules=rules, **kw),
        qrels=None,
        cache_dir=out.parent / "cache",
        progress=False,
    )
    return summary, [json.loads(line) for line in out.read_text(encoding="utf-8").splitlines()]


def _tokens(text: str) -> list[str]:
    """The documented tokenization, written out independently of bm25s."""
    return [w for w in re.findall(r"\b\w\w+\b", text.lower()) if w not in STOPWORDS_EN]


def _lucene_bm25(question: str) -> dict[str, float]:
    """Lucene BM25 (k1=0.9, b=0.4) of every passage's title + text, computed by hand."""
    docs = {pid: Counter(_tokens(f"{title} {text}")) for pid, text, title in PASSAGES}
    avgdl = sum(sum(c.values()) for c in docs.values()) / len(docs)
    out = {}
    for pid, tf in docs.items():
        dl, score = sum(tf.values()), 0.0
        for word in _tokens(question):
            df = sum(1 for c in docs.values() if word in c)
            if tf[word]:
                idf = math.log(1 + (len(docs) - df + 0.5) / (df + 0.5))
                score += idf * tf[word] / (tf[word] + K1 * (1 - B + B * dl / avgdl))
        out[pid] = score
    return out


def test_negatives_follow_dpr_rules_and_bm25_order(files, tmp_path) -> None:
    summary, out = _mine(files, tmp_path / "out.jsonl", negatives=30)
    assert len(out) == len(RECORDS) == summary["questions"]
    texts = {pid: text for pid, text, _ in PASSAGES}
    order = [pid for pid, _, _ in PASSAGES]
    for record, mined in zip(RECORDS, out, strict=True):
        negs = mined["hard_negative_ctxs"]
        assert negs and all(set(c) == {"passage_id", "title", "text", "score"} for c in negs)
        pos_ids = {c["passage_id"] for c in record["positive_ctxs"]}
        pos_texts = {c["text"] for c in record["positive_ctxs"]}
        for ctx in negs:
            assert not has_answer(record["answers"], ctx["text"])
            assert ctx["passage_id"] not in pos_ids and ctx["text"] not in pos_texts
            assert ctx["text"] == texts[ctx["passage_id"]]
        # exactly the eligible passages that share a word with the question, by BM25 score, ties
        # in file order
        bm25 = _lucene_bm25(record["question"])
        eligible = [
            pid
            for pid in order
            if not has_answer(record["answers"], texts[pid])
            and pid not in pos_ids
            and texts[pid] not in pos_texts
            and bm25[pid] > 0.0
        ]
        expected = sorted(eligible, key=lambda p: (-round(bm25[p], 4), order.index(p)))
        got = [c["passage_id"] for c in negs]
        assert got == expected
        np.testing.assert_allclose([c["score"] for c in negs], [bm25[p] for p in got], atol=2e-4)

    q1, q2, _ = (m["hard_negative_ctxs"] for m in out)
    assert {"p1", "p2"}.isdisjoint(c["passage_id"] for c in q1)  # answer-bearing
    assert {"p7", "p8"}.isdisjoint(c["passage_id"] for c in q2)  # the positive and its copy
    assert "p10" not in {c["passage_id"] for c in q1}  # no word in common: not retrieved
    assert [c["passage_id"] for c in q1].index("p5") < [c["passage_id"] for c in q1].index("p6")


def test_other_keys_are_kept_unchanged(files, tmp_path) -> None:
    _, out = _mine(files, tmp_path / "out.jsonl")
    for record, mined in zip(RECORDS, out, strict=True):
        expected = {k: v for k, v in record.items() if k != "hard_negative_ctxs"}
        assert {k: v for k, v in mined.items() if k != "hard_negative_ctxs"} == expected
        keys = [k for k in record if k != "hard_negative_ctxs"]
        assert [k for k in mined if k != "hard_negative_ctxs"] == keys  # order kept too
    assert list(out[0]).index("hard_negative_ctxs") == list(RECORDS[0]).index("hard_negative_ctxs")


def test_negatives_cap_the_list_and_hit_rates_use_the_ranking(files, tmp_path) -> None:
    summary, out = _mine(files, tmp_path / "out.jsonl", negatives=1)
    assert all(len(m["hard_negative_ctxs"]) == 1 for m in out)
    # q1: p1 (its positive, with the answer) ranks first; q2: p9 (with 1889) is below the tower
    # copies, in the top 5; q3: no passage has "nothing here".
    rates = summary["answer_in_top"]
    assert rates["top1"] == pytest.approx(100 / 3, abs=0.01)
    assert rates["top5"] == rates["top100"] == pytest.approx(200 / 3, abs=0.01)
    assert summary["mined_by"] == {
        "ranker": "bm25",
        "passages": str(files["passages"]),
        "qrels": None,
    }
    text = format_summary(summary)
    assert "questions: 3" in text and "window's top-1/5/20/100 (%): 33.3 / 66.7" in text


def test_deterministic_and_json_array_input(files, tmp_path) -> None:
    _mine(files, tmp_path / "a.jsonl", batch=1)
    _mine(files, tmp_path / "b.jsonl", batch=2)
    array = tmp_path / "train.json"
    array.write_text(json.dumps(RECORDS, ensure_ascii=False, indent=1), encoding="utf-8")
    _mine({**files, "train": array}, tmp_path / "c.jsonl")
    first = (tmp_path / "a.jsonl").read_bytes()
    assert first == (tmp_path / "b.jsonl").read_bytes() == (tmp_path / "c.jsonl").read_bytes()


def test_top_rows_breaks_ties_by_position() -> None:
    scores = np.array([1.0, 3.0, 3.0, 2.0, 3.0, 0.0])
    assert top_rows(scores, 2).tolist() == [1, 2]
    assert top_rows(scores, 4).tolist() == [1, 2, 4, 3]
    assert top_rows(scores, 99).tolist() == [1, 2, 4, 3, 0, 5]


def test_bad_input_names_file_and_line(files, tmp_path) -> None:
    bad = tmp_path / "bad.jsonl"
    bad.write_text(json.dumps(RECORDS[0]) + "\n" + json.dumps({"answers": []}) + "\n")
    out = tmp_path / "out.jsonl"
    with pytest.raises(InputError, match=r"bad.jsonl line 2: missing key 'question'"):
        _mine({**files, "train": bad}, out)
    assert not out.exists() and not list(tmp_path.glob("*.tmp"))
    with pytest.raises(InputError, match="must not overwrite"):
        _mine(files, files["train"])
    empty = _write_passages(tmp_path / "empty.tsv", rows=[])
    with pytest.raises(InputError, match="empty.tsv: no passages"):
        _mine({**files, "passages": empty}, out)


def test_cli_prints_summary_and_one_line_errors(files, tmp_path) -> None:
    args = ["mine", "--ranker", "bm25", "--train", str(files["train"])]
    args += ["--passages", str(files["passages"]), "-q", "--cache-dir", str(tmp_path / "cache")]
    out = tmp_path / "o.jsonl"
    result = CliRunner().invoke(app, [*args, "--out", str(out), "--negatives", "2"])
    assert result.exit_code == 0, result.output
    assert "questions: 3" in result.output and 'mined by: bm25 "' in result.output
    assert json.loads(out.with_suffix(".summary.json").read_text())["negatives"] == 6
    before = files["passages"].read_bytes()
    linked = tmp_path / "linked.tsv"  # the passages under a second name (a hard link)
    os.link(files["passages"], linked)
    for extra, message in [
        (["--out", str(linked)], "must not overwrite the passages file"),
        (["--out", str(files["train"])], "must not overwrite the training file"),
        (["--out", str(files["passages"])], "must not overwrite the passages file"),
        (["--out", str(tmp_path)], f"{tmp_path}: a folder: give the path of the file to write"),
        (["--out", str(out), "--model", "m"], "--ranker bm25: ranks with no --model"),
        (["--out", str(out), "--ranker", "bm26"], "--ranker: 'bm26' is not one of model, bm25"),
    ]:
        result = CliRunner().invoke(app, [*args, *extra])
        assert result.exit_code == 2 and message in result.output, result.output
        assert files["passages"].read_bytes() == before


def test_margins_apply_to_bm25_scores(files, tmp_path) -> None:
    """The one loop gives BM25 the model's rules too: with a margin of 0 every candidate scoring
    at least its positive's BM25 score is dropped."""
    summary, out = _mine(files, tmp_path / "m.jsonl", NegativeRules(margin=0.0))
    plain = _mine(files, tmp_path / "p.jsonl")[1]
    bm25 = _lucene_bm25(RECORDS[0]["question"])
    kept = [c["passage_id"] for c in out[0]["hard_negative_ctxs"]]
    assert kept and all(bm25[p] < bm25["p1"] for p in kept)
    dropped = [
        c["passage_id"] for c in plain[0]["hard_negative_ctxs"] if c["passage_id"] not in kept
    ]
    assert all(bm25[p] >= bm25["p1"] for p in dropped)
    assert summary["dropped"]["margin"] == sum(len(m["hard_negative_ctxs"]) for m in plain) - sum(
        len(m["hard_negative_ctxs"]) for m in out
    )


def test_margins_hold_below_a_negative_positive_score() -> None:
    """Absolute and relative margins drop what scores at or above the line below the positive,
    whatever the positive's sign (a relative margin of a negative score still lies below it)."""
    from dpr_cache.retrieval.mining.rules import NegativeRules, drop_reason

    example = {"positive_ctxs": [{"passage_id": "p", "text": "positive"}], "answers": []}
    rel = NegativeRules(match=None, relative_margin=0.1)
    absolute = NegativeRules(match=None, margin=0.5)
    for positive in (2.0, -2.0):
        line = positive - 0.1 * abs(positive)  # 1.8, then -2.2
        assert drop_reason(example, "n", "t", line, rel, positive_score=positive) == "margin"
        assert drop_reason(example, "n", "t", line - 1e-3, rel, positive_score=positive) is None
        line = positive - 0.5
        assert drop_reason(example, "n", "t", line, absolute, positive_score=positive) == "margin"
        assert (
            drop_reason(example, "n", "t", line - 1e-3, absolute, positive_score=positive) is None
        )
    assert drop_reason(example, "n", "t", 9.0, rel) is None  # no positive score: no margin


def test_teacher_rules_hold_below_a_negative_positive_score() -> None:
    """The teacher's rules drop a candidate the teacher scores at or above its line below the
    teacher's positive: 95% of a positive 2.0 is 1.9, and of a positive -2.0 it is -2.1 (below
    the positive, not above it); the ranker's own score plays no part."""
    from dpr_cache.retrieval.mining.rules import NegativeRules, drop_reason

    example = {"positive_ctxs": [{"passage_id": "p", "text": "positive"}], "answers": []}
    rel = NegativeRules(match=None, teacher_relative=0.95)
    absolute = NegativeRules(match=None, teacher_margin=0.5)
    for positive, line in ((2.0, 1.9), (-2.0, -2.1)):
        for rules, at in ((rel, line), (absolute, positive - 0.5)):
            assert drop_reason(example, "n", "t", 0.0, rules, teacher=(at, positive)) == "teacher"
            assert drop_reason(example, "n", "t", 0.0, rules, teacher=(at - 1e-3, positive)) is None
            above = drop_reason(example, "n", "t", 0.0, rules, teacher=(positive + 1.0, positive))
            assert above == "teacher"
    both = NegativeRules(match=None, teacher_margin=0.01, teacher_relative=0.5)
    assert drop_reason(example, "n", "t", 0.0, both, teacher=(1.5, 2.0)) == "teacher"  # either
    assert drop_reason(example, "n", "t", 0.0, rel) is None  # no teacher scores: no rule
