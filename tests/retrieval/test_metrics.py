"""Ranking metrics against ir-measures (trec_eval's code through pytrec_eval) on the same runs
and judgments: graded qrels, unjudged passages, questions without any relevant passage, ties."""

from __future__ import annotations

import numpy as np
import pytest

from dpr_cache.retrieval.metrics import (
    answer_qrels,
    first_relevant_rank,
    hit_metrics,
    ranking_metrics,
    read_qrels,
    write_qrels,
)

ir_measures = pytest.importorskip("ir_measures")

KS = (1, 5, 20)


def _random_case(seed: int):
    rng = np.random.default_rng(seed)
    run, qrels = {}, {}
    for q in range(40):
        docs = [f"d{i}" for i in rng.permutation(60)[:25]]
        run[f"q{q}"] = docs
        judged = rng.choice(60, size=int(rng.integers(0, 6)), replace=False)
        qrels[f"q{q}"] = {f"d{i}": int(rng.integers(0, 3)) for i in judged}  # grades 0, 1, 2
        if not qrels[f"q{q}"]:
            qrels[f"q{q}"] = {"d999": 0}  # judged, nothing relevant
    return run, qrels


def _reference(run, qrels) -> dict[str, float]:
    """ir-measures on the same run, its scores decreasing with the rank."""
    ir_run = [
        ir_measures.ScoredDoc(q, d, float(100 - r))
        for q, docs in run.items()
        for r, d in enumerate(docs)
    ]
    ir_qrels = [ir_measures.Qrel(q, d, g) for q, docs in qrels.items() for d, g in docs.items()]
    names = {ir_measures.RR @ 10: "mrr@10", ir_measures.nDCG @ 10: "ndcg@10"}
    for k in KS:
        names[ir_measures.R @ k] = f"recall@{k}"
        names[ir_measures.Success @ k] = f"top{k}"
    scores = ir_measures.calc_aggregate(list(names), ir_qrels, ir_run)
    return {names[m]: 100.0 * v for m, v in scores.items()}


@pytest.mark.parametrize("seed", [0, 1, 2])
def test_equals_ir_measures(seed: int) -> None:
    run, qrels = _random_case(seed)
    got, want = ranking_metrics(run, qrels, KS), _reference(run, qrels)
    assert set(got) == set(want)
    for name in want:
        assert got[name] == pytest.approx(want[name], abs=1e-9), name


def test_negative_control_another_run_scores_otherwise() -> None:
    run, qrels = _random_case(0)
    shuffled = {q: list(reversed(docs)) for q, docs in run.items()}
    assert ranking_metrics(shuffled, qrels, KS) != _reference(run, qrels)


def test_answer_match_as_qrels_judges_every_question(tmp_path) -> None:
    """DPR's relevance: retrieved passages with an answer are grade 1; a question without any
    counts as a miss (not dropped), so the hit rate equals DPR's top-k."""
    pids = [["a", "b", "c"], ["d", "e", "f"], ["g", "h", "i"]]
    flags = [[False, True, False], [False, False, False], [True, True, False]]
    qrels = answer_qrels(["0", "1", "2"], pids, flags)
    metrics = ranking_metrics(dict(zip(["0", "1", "2"], pids, strict=True)), qrels, (1, 2))
    assert metrics["top1"] == pytest.approx(100 / 3) and metrics["top2"] == pytest.approx(200 / 3)
    assert metrics["mrr@10"] == pytest.approx(100 * (0.5 + 0 + 1) / 3)
    write_qrels(tmp_path / "q.trec", qrels)
    assert read_qrels(tmp_path / "q.trec") == qrels
    want = _reference(dict(zip(["0", "1", "2"], pids, strict=True)), qrels)
    assert metrics["mrr@10"] == pytest.approx(want["mrr@10"])


def test_a_judged_question_missing_from_the_run_counts_as_a_miss() -> None:
    """As trec_eval -c: a judged question the run lacks scores 0 (ir-measures, which skips it,
    agrees once the question has a run of only an unjudged passage)."""
    run, qrels = _random_case(1)
    relevant = next(
        q
        for q, docs in qrels.items()  # a question the run answers in its top 1
        if docs.get(run.get(q, [""])[0], 0) > 0
    )
    partial = {q: docs for q, docs in run.items() if q != relevant}
    got = ranking_metrics(partial, qrels, KS)
    want = _reference({**partial, relevant: ["not-judged"]}, qrels)
    for name in want:
        assert got[name] == pytest.approx(want[name], abs=1e-9), name
    assert got != ranking_metrics(run, qrels, KS)  # the question did count before


def test_hit_rates_and_mrr_per_question_by_hand() -> None:
    flags = [
        [True, False, False, False],  # hit at rank 1
        [False, False, True, False],  # hit at rank 3
        [False, False, False, False],  # no hit
        [False, True, True, False],  # hit at rank 2
        [False, False, False, True],  # hit at rank 4
    ]
    ranks = [first_relevant_rank(f) for f in flags]
    assert ranks == [0, 2, np.inf, 1, 3]
    per = hit_metrics(ranks, [1, 2, 3, 5])
    assert {k: float(v.mean()) for k, v in per.items() if k.startswith("top")} == {
        "top1": 20.0,
        "top2": 40.0,
        "top3": 60.0,
        "top5": 80.0,
    }
    assert per["mrr@10"].tolist() == pytest.approx([100.0, 100 / 3, 0.0, 50.0, 25.0])
    assert hit_metrics([], [1])["top1"].size == 0
    with pytest.raises(ValueError):
        hit_metrics([0.0], [0])


def test_a_hit_past_ten_counts_for_top_k_but_not_mrr() -> None:
    per = hit_metrics([10.0, 9.0], [20])
    assert per["top20"].tolist() == [100.0, 100.0] and per["mrr@10"].tolist() == [0.0, 10.0]
