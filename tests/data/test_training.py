"""DPR training files: JSON array and JSON Lines, gzip, validation errors, the Arrow cache."""

from __future__ import annotations

import gzip
import json
from pathlib import Path

import pytest

from dpr_cache.data import training
from dpr_cache.data.ids import derived_passage_id
from dpr_cache.data.training import load_training_set
from dpr_cache.errors import InputError


def ctx(pid: str | None, title: str = "T", text: str = "x") -> dict:
    out = {"title": title, "text": text, "score": 1000, "title_score": 0}
    if pid is not None:
        out["passage_id"] = pid
    return out


RECORDS = [
    {
        "dataset": "nq",
        "question": "who wrote hamlet?",
        "answers": ["Shakespeare"],
        "positive_ctxs": [ctx("7", "Hamlet", "Hamlet is a tragedy by Shakespeare.")],
        "negative_ctxs": [ctx("9", "Paris", "Paris is in France.")],
        "hard_negative_ctxs": [ctx(None, "Macbeth", "Macbeth is a play.")],
    },
    {
        "question": "dropped: no positive",
        "answers": ["x"],
        "positive_ctxs": [],
        "negative_ctxs": [],
        "hard_negative_ctxs": [],
    },
    {
        "question": "capital of france?",
        "answers": ["Paris"],
        "positive_ctxs": [ctx(12, "Paris", "Paris is the capital of France.")],
        "negative_ctxs": [],
        "hard_negative_ctxs": [],
    },
]
EXPECTED = [
    {
        "question": "who wrote hamlet?",
        "answers": ["Shakespeare"],
        "positive_ctxs": [
            {
                "title": "Hamlet",
                "text": "Hamlet is a tragedy by Shakespeare.",
                "passage_id": "7",
                "teacher_score": None,
            }
        ],
        "hard_negative_ctxs": [
            {
                "title": "Macbeth",
                "text": "Macbeth is a play.",
                "passage_id": derived_passage_id("Macbeth", "Macbeth is a play."),
                "teacher_score": None,
            }
        ],
        "negative_ctxs": [
            {
                "title": "Paris",
                "text": "Paris is in France.",
                "passage_id": "9",
                "teacher_score": None,
            }
        ],
    },
    {
        "question": "capital of france?",
        "answers": ["Paris"],
        "positive_ctxs": [
            {
                "title": "Paris",
                "text": "Paris is the capital of France.",
                "passage_id": "12",
                "teacher_score": None,
            }
        ],
        "hard_negative_ctxs": [],
        "negative_ctxs": [],
    },
]


def write_json(path: Path, records: list) -> Path:
    path.write_text(json.dumps(records, indent=2))
    return path


def write_jsonl(path: Path, records: list) -> Path:
    path.write_text("".join(json.dumps(r) + "\n" for r in records))
    return path


def rows(ds) -> list[dict]:
    return [ds[i] for i in range(len(ds))]


def test_json_array_and_jsonl_load_the_same(tmp_path: Path) -> None:
    stats: dict = {}
    a = load_training_set(write_json(tmp_path / "t.json", RECORDS), tmp_path / "c", stats=stats)
    b = load_training_set(write_jsonl(tmp_path / "t.jsonl", RECORDS), tmp_path / "c")
    assert rows(a) == rows(b) == EXPECTED  # extra keys (dataset, score) are dropped
    assert stats["read"] == 3 and stats["kept"] == 2 and stats["dropped_no_positive"] == 1


def test_gzip_is_accepted(tmp_path: Path) -> None:
    path = tmp_path / "t.json.gz"
    path.write_bytes(gzip.compress(json.dumps(RECORDS).encode()))
    assert rows(load_training_set(path, tmp_path / "c")) == EXPECTED
    path = tmp_path / "t.jsonl.gz"
    path.write_bytes(gzip.compress("".join(json.dumps(r) + "\n" for r in RECORDS).encode()))
    assert rows(load_training_set(path, tmp_path / "c")) == EXPECTED


def test_second_load_reuses_the_cache(tmp_path: Path, monkeypatch) -> None:
    path = write_jsonl(tmp_path / "t.jsonl", RECORDS)
    first: dict = {}
    load_training_set(path, tmp_path / "c", stats=first)
    arrow = Path(first["cache_file"])
    mtime = arrow.stat().st_mtime_ns

    def no_parse(*args, **kwargs):
        raise AssertionError("the training file was parsed again")

    monkeypatch.setattr(training, "iter_training_examples", no_parse)
    second: dict = {}
    ds = load_training_set(path, tmp_path / "c", stats=second)
    assert second["from_cache"] and not first["from_cache"]
    assert second["dropped_no_positive"] == 1 and rows(ds) == EXPECTED
    assert arrow.stat().st_mtime_ns == mtime


def test_changed_file_is_parsed_again(tmp_path: Path) -> None:
    path = write_jsonl(tmp_path / "t.jsonl", RECORDS)
    assert len(load_training_set(path, tmp_path / "c")) == 2
    write_jsonl(path, RECORDS + RECORDS)
    assert len(load_training_set(path, tmp_path / "c")) == 4


def test_malformed_jsonl_line_is_named(tmp_path: Path) -> None:
    path = tmp_path / "t.jsonl"
    lines = [json.dumps(r) for r in RECORDS]
    lines.insert(2, '{"question": "q", "positive_ctxs": [] "answers": []}')
    path.write_text("\n".join(lines) + "\n")
    with pytest.raises(InputError, match=r"t\.jsonl line 3: not valid JSON \(Expecting ','"):
        load_training_set(path, tmp_path / "c")


def test_a_cut_jsonl_line_says_what_is_wrong_and_where(tmp_path: Path) -> None:
    path = tmp_path / "t.jsonl"
    cut = json.dumps(RECORDS[1])[:40]  # ends inside a string that opens at column 38
    path.write_text(json.dumps(RECORDS[0]) + "\n" + cut + "\n")
    with pytest.raises(InputError) as err:
        load_training_set(path, tmp_path / "c")
    assert str(err.value).endswith(
        "t.jsonl line 2: not valid JSON (Unterminated string starting at column 38)"
    ), str(err.value)


def test_malformed_json_array_names_the_item(tmp_path: Path) -> None:
    path = tmp_path / "t.json"
    path.write_text(json.dumps(RECORDS[:1])[:-1] + ', {"question": "q",, }]')
    with pytest.raises(InputError, match=r"t\.json item 1: not valid JSON"):
        load_training_set(path, tmp_path / "c")


@pytest.mark.parametrize("key", ["question", "positive_ctxs"])
def test_missing_key_is_named_with_line_or_item(tmp_path: Path, key: str) -> None:
    broken = [dict(r) for r in RECORDS]
    del broken[2][key]
    with pytest.raises(InputError, match=rf"t\.jsonl line 3: missing key '{key}'"):
        load_training_set(write_jsonl(tmp_path / "t.jsonl", broken), tmp_path / "c")
    with pytest.raises(InputError, match=rf"t\.json item 2: missing key '{key}'"):
        load_training_set(write_json(tmp_path / "t.json", broken), tmp_path / "c")


def test_ctx_without_text_and_bad_files(tmp_path: Path) -> None:
    broken = [dict(RECORDS[0], positive_ctxs=[{"title": "no text"}])]
    with pytest.raises(InputError, match=r"line 1: positive_ctxs\[0\] must be an object"):
        load_training_set(write_jsonl(tmp_path / "t.jsonl", broken), tmp_path / "c")
    with pytest.raises(InputError, match=r"nope\.json: no such file"):
        load_training_set(tmp_path / "nope.json", tmp_path / "c")
    (tmp_path / "e.json").write_text("  \n")
    with pytest.raises(InputError, match="empty file"):
        load_training_set(tmp_path / "e.json", tmp_path / "c")
    with pytest.raises(InputError, match="no question with a positive passage"):
        load_training_set(write_jsonl(tmp_path / "n.jsonl", RECORDS[1:2]), tmp_path / "c")


def test_several_training_files_read_as_one(tmp_path: Path) -> None:
    """data.train as a list: the files' questions in the order given, each file's own cache."""
    from dpr_cache.data.sources import Source, load_sources
    from tests.support.fixtures import TOY

    def load_training_sets(paths, cache):
        return load_sources([Source(p, p.stem) for p in paths], cache).dataset

    lines = (TOY / "train.jsonl").read_text().splitlines()
    (tmp_path / "a.jsonl").write_text("\n".join(lines[:10]) + "\n")
    (tmp_path / "b.jsonl").write_text("\n".join(lines[10:25]) + "\n")
    both = load_training_sets([tmp_path / "a.jsonl", tmp_path / "b.jsonl"], tmp_path / "cache")
    assert len(both) == 25
    assert [both[i]["question"] for i in (0, 9, 10, 24)] == [
        json.loads(lines[i])["question"] for i in (0, 9, 10, 24)
    ]
    one = load_training_sets([tmp_path / "a.jsonl"], tmp_path / "cache")
    assert len(one) == 10 and len(list((tmp_path / "cache").glob("*.arrow"))) == 2


def test_a_config_takes_one_training_file_or_a_list(tmp_path: Path) -> None:
    from dpr_cache.config import load_config

    one = load_config(None, ["data.train=a.jsonl"])
    many = load_config(None, ["data.train=[a.jsonl, b.jsonl]"])
    assert one.train_files == [Path("a.jsonl")]
    assert many.train_files == [Path("a.jsonl"), Path("b.jsonl")]
    assert load_config(None, []).train_files == []
    with pytest.raises(InputError, match="data.train"):
        load_config(None, ["data.train=[1, [2]]"])


def scored(question: str, scores: list, n_hard: int | None = None) -> dict:
    """A record whose positive and hard negatives carry ``scores`` (None: no teacher_score)."""
    ctxs = []
    for j, score in enumerate(scores):
        c = ctx(f"{question}-{j}", text=f"passage {j}")
        if score is not None:
            c["teacher_score"] = score
        ctxs.append(c)
    return {
        "question": question,
        "answers": ["a"],
        "positive_ctxs": ctxs[:1],
        "hard_negative_ctxs": ctxs[1:],
        "negative_ctxs": [ctx("n", text="neg")],
    }


def test_teacher_scores_are_read_from_json_and_jsonl(tmp_path: Path) -> None:
    records = [scored("q0", [9.5, 1, -2.25]), scored("q1", [3.0, 2.5])]
    stats: dict = {}
    a = load_training_set(write_json(tmp_path / "t.json", records), tmp_path / "c", stats=stats)
    b = load_training_set(write_jsonl(tmp_path / "t.jsonl", records), tmp_path / "c")
    assert rows(a) == rows(b)
    first = rows(a)[0]
    assert [c["teacher_score"] for c in first["positive_ctxs"]] == [9.5]
    assert [c["teacher_score"] for c in first["hard_negative_ctxs"]] == [1.0, -2.25]
    assert first["negative_ctxs"][0]["teacher_score"] is None  # not needed: never checked
    assert stats["unscored"] is None and stats["fewest_hard_negatives"] == 1
    training.check_teacher_scores(stats, 1)  # enough for H = 1
    with pytest.raises(InputError, match=r"t.json item 1: 1 hard negatives.*hard_negatives is 2"):
        training.check_teacher_scores(stats, 2)


@pytest.mark.parametrize(
    ("records", "where"),
    [
        ([scored("q0", [1.0, 2.0]), scored("q1", [None, 2.0])], "line 2: positive_ctxs[0]"),
        ([scored("q0", [1.0, 2.0, None])], "line 1: hard_negative_ctxs[1]"),
    ],
)
def test_a_missing_teacher_score_is_named_with_file_and_record(tmp_path, records, where):
    stats: dict = {}
    load_training_set(write_jsonl(tmp_path / "t.jsonl", records), tmp_path / "c", stats=stats)
    with pytest.raises(InputError) as err:
        training.check_teacher_scores(stats, 1)
    assert f"t.jsonl {where} has no teacher_score" in str(err.value)
    assert "\n" not in str(err.value)


@pytest.mark.parametrize("bad", ["NaN", "Infinity", '"high"', "true", "1" + "0" * 400])
def test_a_bad_teacher_score_is_named(tmp_path: Path, bad: str) -> None:
    path = tmp_path / "t.jsonl"
    good = json.dumps(scored("q0", [1.0, 0.5]))
    broken = json.dumps(scored("q1", [1.0, 12345.0])).replace("12345.0", bad)
    path.write_text(good + "\n" + broken + "\n")
    with pytest.raises(InputError, match=r"t.jsonl line 2: hard_negative_ctxs\[0\]: teacher_score"):
        load_training_set(path, tmp_path / "c")


def test_a_teacher_score_is_kept_while_float32_holds_it() -> None:
    """float32's largest as numpy prints it (3.4028235e38, just above the exact largest) rounds
    to a finite float32 and is kept; from the halfway point to 2**128 on, it would round to
    infinity and is refused naming where, as a control."""
    import numpy as np

    kept = [3.4028234663852886e38, 3.4028235e38, -3.4028235e38]
    assert [training._teacher_score(x, "f line 1: ctx") for x in kept] == kept
    assert np.isfinite(np.array(kept, dtype=np.float64).astype(np.float32)).all()
    for refused in (2.0**128 - 2.0**103, -(2.0**128), 1e300):
        with pytest.raises(InputError, match=r"^f line 1: ctx: teacher_score .* float32's range"):
            training._teacher_score(refused, "f line 1: ctx")
