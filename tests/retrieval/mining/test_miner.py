"""``dpr-cache mine``: the mined negatives against a reference written here (a numpy search over
the index's stored vectors, DPR's answer rule as its paper's code defines it, the margins below
the positive's score), every rule and its count, the file's own negatives kept, resuming, and
bad input as one line."""

from __future__ import annotations

import csv
import json
import time
from pathlib import Path

import numpy as np
import pytest
import torch

from dpr_cache.model.loading import load_encoder
from dpr_cache.retrieval.dense.encode import encode_question_texts
from tests.support.cli import index_toy, run_cli
from tests.support.dpr_answers import dpr_has_answer
from tests.support.fixtures import TOY, index_vectors, plant_another_runs_part

TINY = TOY / "tiny-bert"
TRAIN = TOY / "train.jsonl"
RECORDS = [json.loads(line) for line in TRAIN.read_text().splitlines()]


@pytest.fixture(scope="module")
def index(tmp_path_factory) -> Path:
    """The toy passages indexed by the tiny BERT (an HF folder: both towers)."""
    root = tmp_path_factory.mktemp("mine")
    index_toy(root, TINY)
    return root / "index"


def _mine(index: Path, out: Path, *extra: str, check: bool = True, train: Path = TRAIN):
    """``mine`` of ``train`` by the tiny BERT over ``index`` into ``out``, ``extra`` flags
    last."""
    return run_cli(
        "mine",
        "--model",
        str(TINY),
        "--index",
        str(index),
        "--train",
        str(train),
        "--out",
        str(out),
        "--cache-dir",
        str(index.parent / "cache"),
        "-q",
        *extra,
        check=check,
    )


def _reference(
    index: Path, negatives: int, depth: int, skip: int, relative_margin: float | None = None
) -> tuple[list[list[str]], list[dict[str, float]]]:
    """Each question's negatives: all passages by the score of the stored vectors (ties by row),
    the window [skip, skip + depth), positives (id or text), answer-bearing passages and, with
    ``relative_margin``, those scoring at least positive - margin x |positive| left out, the
    first ``negatives`` kept; and every passage's score, per question."""
    vectors, ids = index_vectors(index)  # [n, d] float32 of the stored float16
    row_of = {pid: r for r, pid in enumerate(ids)}
    with open(TOY / "passages.tsv", encoding="utf-8", newline="") as f:
        texts = {pid: text for pid, text, _ in list(csv.reader(f, delimiter="\t"))[1:]}
    model = load_encoder(TINY, pooling="mean", query_only=True)  # as the toy config indexed
    q = encode_question_texts(
        model, [r["question"] for r in RECORDS], max_length=32, device=torch.device("cpu")
    )
    out, every = [], []
    for record, scores in zip(RECORDS, q @ vectors.T, strict=True):
        order = np.lexsort((np.arange(len(scores)), -scores))[skip : skip + depth]
        pos_ids = {c["passage_id"] for c in record["positive_ctxs"]}
        pos_texts = {c["text"] for c in record["positive_ctxs"]}
        ceiling = np.inf
        if relative_margin is not None:
            pos = float(scores[row_of[record["positive_ctxs"][0]["passage_id"]]])
            ceiling = pos - relative_margin * abs(pos)
        kept = [
            ids[r]
            for r in order
            if ids[r] not in pos_ids
            and texts[ids[r]] not in pos_texts
            and not dpr_has_answer(record["answers"], texts[ids[r]])
            and scores[r] < ceiling
        ]
        out.append(kept[:negatives])
        every.append(dict(zip(ids, scores.tolist(), strict=True)))
    return out, every


def _equal_up_to_ties(got: list[list[str]], reference) -> None:
    """``got`` is the reference's negatives, except that two passages whose reference scores
    differ by less than float32 rounding (1e-5) may stand in for each other: the search sums
    in blocks, the reference in one product."""
    want, scores = reference
    assert len(got) == len(want)
    for q, (mine, ref) in enumerate(zip(got, want, strict=True)):
        assert len(mine) == len(ref), (q, mine, ref)
        for a, b in zip(mine, ref, strict=True):
            assert a == b or abs(scores[q][a] - scores[q][b]) < 1e-5, (q, mine, ref)


def test_the_reference_answer_rule_is_dprs() -> None:
    """The test's own answer rule on DPR's cases: whole tokens, case and accents folded."""
    assert dpr_has_answer(["Denver Broncos"], "the denver broncos won")
    assert not dpr_has_answer(["Denver"], "Denverites cheered")  # a token, not a prefix
    assert dpr_has_answer(["Café"], "a CAFÉ opened")
    assert not dpr_has_answer(["50"], "Super Bowl 500")


def _pids(record: dict) -> list[str]:
    return [c["passage_id"] for c in record["hard_negative_ctxs"]]


def _read(out: Path) -> list[dict]:
    return [json.loads(line) for line in out.read_text().splitlines()]


def test_mined_negatives_equal_the_reference(index, tmp_path) -> None:
    out = tmp_path / "mined.jsonl"
    start = time.perf_counter()
    done = _mine(index, out, "--negatives", "5", "--depth", "30", "--skip", "2")
    wall = time.perf_counter() - start
    mined = _read(out)
    reference = _reference(index, 5, 30, 2)
    got = [[c["passage_id"] for c in r["hard_negative_ctxs"]] for r in mined]
    _equal_up_to_ties(got, reference)
    pairs = zip(got, reference[0], strict=True)
    swapped = sum(a != b for g, w in pairs for a, b in zip(g, w, strict=True))
    assert swapped <= 3  # near ties are rare: the lists are the reference's
    for record, original in zip(mined, RECORDS, strict=True):  # every other key as it was
        assert {k: v for k, v in record.items() if k != "hard_negative_ctxs"} == {
            k: v for k, v in original.items() if k != "hard_negative_ctxs"
        }
        assert all(
            set(c) == {"passage_id", "title", "text", "score"} for c in record["hard_negative_ctxs"]
        )
        scores = [c["score"] for c in record["hard_negative_ctxs"]]
        assert scores == sorted(scores, reverse=True)
    summary = json.loads((tmp_path / "mined.summary.json").read_text())
    assert summary["questions"] == 300 and summary["negatives"] == sum(map(len, got))
    assert summary["candidates"] == summary["negatives"] + sum(summary["dropped"].values())
    assert summary["skipped_top"] == 2 * 300 and summary["dropped"]["answer"] > 0
    assert summary["mined_by"]["type"] == "flat" and summary["settings"]["skip"] == 2
    assert summary["mined_by"]["ranker"] == "model" and set(summary["answer_in_top"]) == {
        "top1",
        "top5",
        "top20",
    }
    assert f"dropped, answer: {summary['dropped']['answer']}" in done.stdout
    assert not (tmp_path / "mined.jsonl.parts").exists()  # the parts go once joined
    stages = summary["seconds_by_stage"]
    assert {"encode questions", "search", "read the candidates"} <= set(stages)
    assert 0 < summary["seconds"] < wall  # the command's own stages, within its process's life
    assert stages["encode questions"] > 0 and stages["search"] > 0


def test_the_files_own_negatives_qrels_and_margins(index, tmp_path) -> None:
    _mine(index, tmp_path / "plain.jsonl", "--negatives", "3", "--depth", "20")
    plain = _read(tmp_path / "plain.jsonl")
    _mine(index, tmp_path / "both.jsonl", "--negatives", "3", "--depth", "20", "--keep-bm25")
    for mined, both, original in zip(plain, _read(tmp_path / "both.jsonl"), RECORDS, strict=True):
        seen = {c["passage_id"] for c in mined["hard_negative_ctxs"]}
        own = [c for c in original["hard_negative_ctxs"] if c["passage_id"] not in seen]
        assert both["hard_negative_ctxs"] == mined["hard_negative_ctxs"] + own
    first = plain[0]["hard_negative_ctxs"][0]["passage_id"]  # judged relevant: dropped
    qrels = tmp_path / "qrels.trec"
    qrels.write_text(f"{RECORDS[0]['id']} 0 {first} 1\n")
    _mine(
        index, tmp_path / "judged.jsonl", "--negatives", "3", "--depth", "20", "--qrels", str(qrels)
    )
    judged = _read(tmp_path / "judged.jsonl")
    assert first not in {c["passage_id"] for c in judged[0]["hard_negative_ctxs"]}
    assert judged[1:] == plain[1:]
    summary = json.loads((tmp_path / "judged.summary.json").read_text())
    assert summary["dropped"]["judged"] == 1
    _mine(index, tmp_path / "margin.jsonl", "--negatives", "3", "--depth", "20", "--margin", "9")
    summary = json.loads((tmp_path / "margin.summary.json").read_text())
    assert summary["negatives"] == 0 and summary["short"] == 300  # none is 9 below its positive
    _mine(
        index,
        tmp_path / "rel.jsonl",
        "--negatives",
        "3",
        "--depth",
        "20",
        "--relative-margin",
        "0.05",
    )
    got = [
        [c["passage_id"] for c in r["hard_negative_ctxs"]] for r in _read(tmp_path / "rel.jsonl")
    ]
    _equal_up_to_ties(got, _reference(index, 3, 20, 0, relative_margin=0.05))
    rel = json.loads((tmp_path / "rel.summary.json").read_text())
    assert rel["dropped"]["margin"] > 0 and got != [
        [c["passage_id"] for c in r["hard_negative_ctxs"]] for r in plain
    ]


def test_an_unset_budget_is_fixed_at_the_first_search(index, monkeypatch) -> None:
    """Unset, the ranker's budget is 4 GB over what the process holds at its first search (not
    when the ranker is made), and every later part searches under that same number however the
    process grows since."""
    from dpr_cache.retrieval.dense.index import open_index
    from dpr_cache.retrieval.mining import rankers
    from dpr_cache.runtime import memory
    from dpr_cache.runtime.laps import Laps

    budgets, search = [], rankers.search_index

    def searched(opened, queries, k, memory_bytes, **kw):
        budgets.append(memory_bytes)
        return search(opened, queries, k, memory_bytes, **kw)

    monkeypatch.setattr(rankers, "search_index", searched)
    questions = [r["question"] for r in RECORDS[:4]]
    for memory_gb, want in ((None, 10**9 + 4 * 10**9), (2.5, 2_500_000_000)):
        ranker = rankers.ModelRanker(
            TINY.resolve(),
            open_index(index),
            None,
            cache_dir=index.parent / "cache",
            memory_gb=memory_gb,
            device=torch.device("cpu"),
        )
        readings = iter(range(10**9, 10**10, 10**8))  # the process grows at every reading
        monkeypatch.setattr(memory, "rss_bytes", lambda readings=readings: next(readings))
        for _ in range(3):
            assert ranker.rank(questions, np.full(4, -1), 5, Laps()) is not None
        assert budgets == [want] * 3, memory_gb
        budgets.clear()


def test_a_cut_run_resumes_its_parts(index, tmp_path, monkeypatch) -> None:
    from dpr_cache.retrieval.dense.index import open_index
    from dpr_cache.retrieval.mining import miner
    from dpr_cache.retrieval.mining.rankers import ModelRanker
    from dpr_cache.retrieval.mining.rules import MineSpec

    out = tmp_path / "m.jsonl"
    spec = MineSpec(negatives=4, depth=20, batch=100)
    ranker = ModelRanker(
        TINY.resolve(),
        open_index(index),
        None,
        cache_dir=index.parent / "cache",
        memory_gb=2.0,
        device=torch.device("cpu"),
    )

    def run() -> None:
        miner.mine(ranker, TRAIN, out, spec, progress=False)

    run()
    whole = out.read_bytes()
    out.unlink()
    real, calls = miner.mine_part, []

    def cut_after_two(ranks, batch, *args):
        if len(calls) == 2:
            raise KeyboardInterrupt  # the run is cut: parts 0 and 1 are on disk
        calls.append(batch[0][0])
        return real(ranks, batch, *args)

    monkeypatch.setattr(miner, "mine_part", cut_after_two)
    with pytest.raises(KeyboardInterrupt):
        run()
    parts = tmp_path / "m.jsonl.parts"
    assert (
        sorted(p.name for p in parts.glob("part-*.jsonl"))
        == ["part-000000.jsonl", "part-000001.jsonl"]
        and not out.exists()
    )
    calls.clear()
    monkeypatch.setattr(
        miner, "mine_part", lambda ranks, b, *args: calls.append(b[0][0]) or real(ranks, b, *args)
    )
    run()
    assert calls == ["line 201"] and out.read_bytes() == whole  # only the third part was mined
    plant_another_runs_part(parts)  # parts of other inputs are not taken
    out.unlink()
    calls.clear()
    run()
    assert calls == ["line 1", "line 101", "line 201"] and out.read_bytes() == whole


def test_bad_input_is_one_line(index, tmp_path) -> None:
    bad = tmp_path / "bad.jsonl"
    record = dict(
        RECORDS[0], positive_ctxs=[dict(RECORDS[0]["positive_ctxs"][0], passage_id="nowhere")]
    )
    bad.write_text(json.dumps(RECORDS[1]) + "\n" + json.dumps(record) + "\n")
    cases = [
        (["--train", str(bad)], f"{bad} line 2: positive passage 'nowhere' is not among"),
        (["--negatives", "50", "--depth", "20"], "is more than the --depth 20"),
        (["--margin", "0.1", "--relative-margin", "0.1"], "not both"),
        (["--skip", "-1"], "--skip >= 0"),
        (["--match", "fuzzy"], "--match: 'fuzzy' is not one of"),
    ]
    no_answers = tmp_path / "noans.jsonl"
    no_answers.write_text(json.dumps(dict(RECORDS[0], answers=[])) + "\n")
    cases.append((["--train", str(no_answers)], "has no answers to match"))
    for extra, message in cases:
        args = [
            "mine",
            "--model",
            str(TINY),
            "--index",
            str(index),
            "--out",
            str(tmp_path / "o.jsonl"),
            "--cache-dir",
            str(index.parent / "cache"),
            "-q",
        ]
        if "--train" not in extra:
            args += ["--train", str(TRAIN)]
        done = run_cli(*args, *extra, check=False)
        assert done.returncode == 2, (extra, done.stderr[-500:])
        lines = done.stderr.strip().splitlines()
        assert len(lines) == 1 and message in lines[0], (extra, lines)
    assert not (tmp_path / "o.jsonl").exists()
    ok = _mine(index, tmp_path / "o.jsonl", "--match", "none", train=no_answers)
    assert ok.returncode == 0
    from dpr_cache.model.biencoder import BiEncoder

    moved = BiEncoder.from_pretrained(TINY)
    with torch.no_grad():
        next(moved.parameters()).add_(0.01)
    moved.save_pretrained(tmp_path / "other")
    other = run_cli(
        "mine",
        "--model",
        str(tmp_path / "other"),
        "--index",
        str(index),
        "--train",
        str(TRAIN),
        "--out",
        str(tmp_path / "x.jsonl"),
        check=False,
    )
    assert other.returncode == 2 and "not the model the index" in other.stderr


def test_the_questions_are_encoded_in_the_precision_asked(index, tmp_path) -> None:
    """--precision auto (the default) is fp32 on the CPU, recorded as fp32; bf16 asked is bf16
    used: the candidates' scores differ."""
    scores = {}
    for extra in ([], ["--precision", "bf16"]):
        out = tmp_path / f"mined-{len(extra)}.jsonl"
        _mine(index, out, "--negatives", "3", "--depth", "10", *extra)
        summary = json.loads(out.with_suffix(".summary.json").read_text())
        mined = [c["score"] for r in _read(out) for c in r["hard_negative_ctxs"]]
        scores[summary["mined_by"]["precision"]] = np.array(mined)
    assert set(scores) == {"fp32", "bf16"}
    assert scores["fp32"].size and not np.array_equal(scores["fp32"], scores["bf16"])
