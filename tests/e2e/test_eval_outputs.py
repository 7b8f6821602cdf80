"""What eval writes, read by other tools, and eval on BEIR data: metrics.json says what it measured
and its figures equal ir-measures on run.trec; overrides that contradict the index are errors;
the SQuAD dev set evaluated directly and through a BEIR folder gives the same numbers."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest

from dpr_cache.data.beir import read_beir, write_beir
from dpr_cache.data.squad import build_squad
from dpr_cache.retrieval.metrics import read_qrels, write_qrels
from tests.support.cli import run_cli, toy_overrides
from tests.support.fixtures import SQUAD_SOURCE, TOY

ir_measures = pytest.importorskip("ir_measures")
TINY = str(TOY / "tiny-bert")


def _metrics(path: Path) -> dict:
    return {k: v for k, v in json.loads(path.read_text()).items() if k != "measured"}


@pytest.fixture(scope="module")
def evaluated(tmp_path_factory) -> Path:
    """The toy index evaluated once: its eval folder, and the answer judgments as TREC qrels
    (``answers.qrels`` beside it) for the other tools."""
    tmp_path = tmp_path_factory.mktemp("evaluated")
    args = ["--config", "configs/toy.yaml", "--model", TINY, "-q", *toy_overrides(tmp_path)]
    run_cli("index", *args)
    run_cli("eval", *args, "--out", str(tmp_path / "ev"))
    entries = json.loads((tmp_path / "ev" / "retrieval.json").read_text())
    qrels = {
        str(i): {c["id"]: int(c["has_answer"]) for c in e["ctxs"]} for i, e in enumerate(entries)
    }
    write_qrels(tmp_path / "answers.qrels", qrels)
    return tmp_path / "ev"


def test_metrics_say_what_they_measured_and_equal_ir_measures(evaluated: Path) -> None:
    metrics = json.loads((evaluated / "metrics.json").read_text())
    measured = metrics["measured"]
    assert len(measured["model"]["fingerprint"]) == 64 and measured["index"]["type"] == "flat"
    assert measured["data"]["dev_qa"].endswith("dev.qa.tsv") and "eval" in measured["command"]
    assert measured["relevance"].startswith("answers") and measured["judged_questions"] == 263
    assert not any(k.startswith("top") for k in measured)
    # the run file and the answer-match judgments, read by ir-measures (trec_eval's code)
    run = list(ir_measures.read_trec_run(str(evaluated / "run.trec")))
    ir_qrels = list(ir_measures.read_trec_qrels(str(evaluated.parent / "answers.qrels")))
    names = {ir_measures.RR @ 10: "mrr@10", ir_measures.nDCG @ 10: "ndcg@10"}
    names |= {ir_measures.Success @ k: f"top{k}" for k in (1, 5, 20, 100)}
    names |= {ir_measures.R @ k: f"recall@{k}" for k in (1, 5, 20, 100)}
    want = ir_measures.calc_aggregate(list(names), ir_qrels, run)
    for measure, name in names.items():
        assert metrics[name] == pytest.approx(100 * want[measure], abs=0.006), name
    assert len(run) == 263 * 100 and {r.query_id for r in run} == {str(i) for i in range(263)}


def test_ranx_reads_the_run(evaluated: Path) -> None:
    ranx = pytest.importorskip("ranx")
    metrics = json.loads((evaluated / "metrics.json").read_text())
    run = ranx.Run.from_file(str(evaluated / "run.trec"), kind="trec")
    qrels = ranx.Qrels.from_file(str(evaluated.parent / "answers.qrels"), kind="trec")
    names = {"mrr@10": "mrr@10", "ndcg@10": "ndcg@10"}
    names |= {f"hit_rate@{k}": f"top{k}" for k in (1, 5, 20, 100)}
    names |= {f"recall@{k}": f"recall@{k}" for k in (1, 5, 20, 100)}
    got = ranx.evaluate(qrels, run, list(names), make_comparable=True)
    for theirs, ours in names.items():
        assert metrics[ours] == pytest.approx(100 * got[theirs], abs=0.006), ours
    assert 0 < metrics["top100"] < 100 and metrics["top1"] < metrics["top100"]  # not degenerate


def test_pyserini_form_holds_the_run_and_dpr_judgments(evaluated: Path) -> None:
    """retrieval.pyserini.json is pyserini's DPR results form (question id -> question, answers,
    contexts best first with docid, score, has_answer): the same passages as the run, the same
    judgments as retrieval.json, and the top-k hit rates that pyserini's evaluator counts."""
    metrics = json.loads((evaluated / "metrics.json").read_text())
    theirs = json.loads((evaluated / "retrieval.pyserini.json").read_text())
    dpr = json.loads((evaluated / "retrieval.json").read_text())
    run: dict[str, list[tuple[str, float]]] = {}
    for line in (evaluated / "run.trec").read_text().splitlines():
        qid, _, pid, _, score, _ = line.split()
        run.setdefault(qid, []).append((pid, float(score)))
    assert list(theirs) == [str(i) for i in range(len(dpr))]
    for qid, entry in theirs.items():
        e = dpr[int(qid)]
        assert (entry["question"], entry["answers"]) == (e["question"], e["answers"])
        assert [(c["docid"], c["has_answer"]) for c in entry["contexts"]] == [
            (c["id"], c["has_answer"]) for c in e["ctxs"]
        ]
        ranked = [(c["docid"], c["score"]) for c in entry["contexts"]]
        assert [p for p, _ in ranked] == [p for p, _ in run[qid]]
        np.testing.assert_allclose([s for _, s in ranked], [s for _, s in run[qid]], rtol=1e-6)
    for k in (1, 5, 20, 100):
        hits = [any(c["has_answer"] for c in e["contexts"][:k]) for e in theirs.values()]
        assert 100 * np.mean(hits) == pytest.approx(metrics[f"top{k}"], abs=0.006)
    _assert_ir_measures_success(theirs, evaluated / "run.trec", metrics)
    try:  # pyserini itself, when installed
        from pyserini.eval.evaluate_dpr_retrieval import evaluate_retrieval
    except ImportError:
        return
    import contextlib
    import io

    printed = io.StringIO()
    with contextlib.redirect_stdout(printed):
        evaluate_retrieval(str(evaluated / "retrieval.pyserini.json"), [20, 100])
    for line in printed.getvalue().splitlines():
        k, value = line.split("\taccuracy: ")
        assert 100 * float(value) == pytest.approx(metrics[k.lower()], abs=0.006)


def _assert_ir_measures_success(theirs: dict, run_file: Path, metrics: dict) -> None:
    """ir-measures' Success@k over the TREC run, with the answer-bearing passages as relevant
    (every question judged, an unanswered one by a passage no run holds): the top-k accuracy
    that metrics.json reports, as pyserini's evaluate_dpr_retrieval computes it."""
    import ir_measures
    from ir_measures import Success

    qrels = [ir_measures.Qrel(qid, "no passage", 0) for qid in theirs]
    qrels += [
        ir_measures.Qrel(qid, c["docid"], 1)
        for qid, entry in theirs.items()
        for c in entry["contexts"]
        if c["has_answer"]
    ]
    run = list(ir_measures.read_trec_run(str(run_file)))
    found = ir_measures.calc_aggregate([Success @ k for k in (1, 5, 20, 100)], qrels, run)
    for k in (1, 5, 20, 100):
        assert 100 * found[Success @ k] == pytest.approx(metrics[f"top{k}"], abs=0.006), k


def test_overrides_that_contradict_the_index(tmp_path: Path) -> None:
    args = ["--config", "configs/toy.yaml", "--model", TINY, "-q", *toy_overrides(tmp_path)]
    run_cli("index", *args)
    proc = run_cli("eval", *args, "--set", "index.type=hnsw", check=False)
    assert proc.returncode == 2 and "index.type: 'hnsw', but the index" in proc.stderr
    proc = run_cli("eval", *args, "--set", "model.pooling=cls", check=False)  # toy.yaml: mean
    assert proc.returncode == 2 and "model.pooling" in proc.stderr
    proc = run_cli("eval", *args, "--set", "train.lr=0.5")
    assert "train.lr: eval does not use it" in proc.stderr


def test_qrels_judge_only_the_questions_evaluated(tmp_path: Path) -> None:
    """Judgments of other questions are dropped and unjudged questions left out of the means
    (trec_eval's way); qrels that judge none of the questions are a one-line error."""
    args = ["--config", "configs/toy.yaml", "--model", TINY, "-q", *toy_overrides(tmp_path)]
    run_cli("index", *args)
    run_cli("eval", *args, "--out", str(tmp_path / "all"))
    run = {}
    for line in (tmp_path / "all" / "run.trec").read_text().splitlines():
        qid, _, pid, rank, *_ = line.split()
        run.setdefault(qid, []).append(pid)
    # questions 0-9 judged by their own top passage, plus 5 questions that do not exist
    qrels = {str(i): {run[str(i)][0]: 1} for i in range(10)}
    qrels |= {f"other{i}": {"x": 1} for i in range(5)}
    write_qrels(tmp_path / "some.qrels", qrels)
    proc = run_cli(
        "eval",
        *args,
        "--set",
        f"data.qrels={tmp_path / 'some.qrels'}",
        "--out",
        str(tmp_path / "some"),
    )
    assert "10 of 263 questions judged (5 qrels questions not evaluated)" in proc.stderr
    metrics = json.loads((tmp_path / "some" / "metrics.json").read_text())
    assert metrics["measured"]["judged_questions"] == 10
    assert metrics["measured"]["unjudged_questions"] == 253
    assert metrics["top1"] == 100.0 and metrics["mrr@10"] == 100.0
    write_qrels(tmp_path / "none.qrels", {f"other{i}": {"x": 1} for i in range(5)})
    proc = run_cli("eval", *args, "--set", f"data.qrels={tmp_path / 'none.qrels'}", check=False)
    assert proc.returncode == 2 and "judges none of the 263 questions" in proc.stderr
    assert "judges none" in proc.stderr.splitlines()[-1] and "Traceback" not in proc.stderr


def test_squad_directly_and_through_beir_give_the_same_numbers(tmp_path: Path) -> None:
    squad = tmp_path / "squad"
    build_squad(SQUAD_SOURCE, squad)
    dev = [json.loads(line) for line in (squad / "dev.jsonl").read_text().splitlines()]
    write_qrels(
        squad / "dev.qrels",
        {str(i): {e["positive_ctxs"][0]["passage_id"]: 1} for i, e in enumerate(dev)},
    )
    write_beir(squad / "passages.tsv", squad / "dev.jsonl", tmp_path / "beir")
    read_beir(tmp_path / "beir", tmp_path / "back")
    assert read_qrels(tmp_path / "back" / "qrels.trec") == read_qrels(squad / "dev.qrels")
    results = []
    for name, data in (
        (
            "direct",
            {
                "passages": squad / "passages.tsv",
                "dev_qa": squad / "dev.qa.tsv",
                "qrels": squad / "dev.qrels",
            },
        ),
        (
            "beir",
            {
                "passages": tmp_path / "back" / "passages.tsv",
                "dev_qa": tmp_path / "back" / "questions.tsv",
                "qrels": tmp_path / "back" / "qrels.trec",
            },
        ),
    ):
        sets = toy_overrides(tmp_path / name, **{f"data.{k}": v for k, v in data.items()})
        args = ["--config", "configs/toy.yaml", "--model", TINY, "-q", *sets]
        args += ["--set", "model.max_passage_length=64"]
        run_cli("index", *args)
        run_cli("eval", *args)
        results.append(_metrics(tmp_path / name / "run" / "eval" / "metrics.json"))
    assert results[0] == results[1]
    assert results[0]["n_questions"] == 2777
