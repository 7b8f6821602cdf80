"""BM25 + dense fusion: DPR's linear combination and RRF against hand computations and ranx's
own RRF; the missing side's score is computed, not guessed; through eval and search, a weight of
0 gives BM25's ranking and a huge one the dense ranking; a BM25 run fuses like BM25 built here;
the weight tuned on held-out questions is the best of its grid."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest

from dpr_cache.config import EvalConfig
from dpr_cache.retrieval.fusion import fuse, fuse_linear, fuse_rrf
from dpr_cache.retrieval.results import read_trec_run
from tests.support.cli import run_cli, toy_overrides
from tests.support.fixtures import TOY


def _r(rows, scores):
    return np.array(rows, np.int64), np.array(scores, np.float32)


def test_linear_fusion_by_hand() -> None:
    dense = _r([3, 1, 7], [0.9, 0.8, 0.1])
    sparse = _r([1, 5, 3], [12.0, 11.0, 2.0])
    asked = {"dense": [], "sparse": []}

    def dense_of(rows):  # passage 5: the only one BM25 alone ranked
        asked["dense"].append(rows.tolist())
        return np.array([0.5] * len(rows))

    def sparse_of(rows):  # passage 7: the only one the dense side alone ranked
        asked["sparse"].append(rows.tolist())
        return np.array([4.0] * len(rows))

    (rows, scores), (zero, _) = fuse_linear(dense, sparse, [2.0, 0.0], dense_of, sparse_of, k=10)
    # 1: 12 + 2*0.8 = 13.6; 5: 11 + 2*0.5 = 12; 3: 2 + 2*0.9 = 3.8; 7: 4 + 2*0.1 = 4.2
    assert rows.tolist() == [1, 5, 7, 3]
    np.testing.assert_allclose(scores, [13.6, 12.0, 4.2, 3.8], rtol=1e-6)
    # computed, never guessed, and once for every weight
    assert asked == {"dense": [[5]], "sparse": [[7]]}
    assert zero.tolist() == [1, 5, 7, 3]  # weight 0: BM25's order (7 scored 4 > 3's 2)


def test_rrf_by_hand_and_against_ranx() -> None:
    dense, sparse = _r([3, 1, 7, -1], [0.9, 0.8, 0.1, -np.inf]), _r([1, 5, 3], [12, 11, 2])
    rows, scores = fuse_rrf([sparse, dense], k=10, rrf_k=60)
    want = {1: 1 / 61 + 1 / 62, 3: 1 / 63 + 1 / 61, 5: 1 / 62, 7: 1 / 63}
    assert rows.tolist() == sorted(want, key=lambda r: (-want[r], r))
    np.testing.assert_allclose(scores, [want[r] for r in rows.tolist()])
    ranx = pytest.importorskip("ranx")
    runs = [
        ranx.Run({"q": {f"d{r}": float(s) for r, s in zip(*pair, strict=True) if r >= 0}})
        for pair in (sparse, dense)
    ]
    theirs = ranx.fuse(runs=runs, method="rrf", params={"k": 60}).to_dict()["q"]
    assert {int(d[1:]): v for d, v in theirs.items()} == pytest.approx(want)


def test_fuse_pads_short_rankings_and_refuses_an_unknown_method() -> None:
    [(scores, rows)] = fuse(EvalConfig(fusion="rrf"), [_r([2], [1.0])], [_r([], [])], k=3)
    assert rows.tolist() == [[2, -1, -1]] and np.isinf(scores[0, 1:]).all()
    with pytest.raises(ValueError, match="fusion"):
        fuse(EvalConfig(fusion="max"), [_r([2], [1.0])], [_r([], [])], k=3)


@pytest.fixture(scope="module")
def toy_run(tmp_path_factory) -> tuple[Path, list[str]]:
    """A toy model trained a few steps, its index, and the toy's eval arguments."""
    root = tmp_path_factory.mktemp("fusion")
    args = [
        "--config",
        "configs/toy.yaml",
        "-q",
        *toy_overrides(root, **{"train.max_steps": 4, "eval.top_k": "[1,5,20]"}),
    ]
    run_cli("train", *args)
    run_cli("index", *args)
    return root, args


def _run(out: Path) -> dict[str, list[str]]:
    return {q: [p for p, _ in ranked] for q, ranked in read_trec_run(out / "run.trec").items()}


def test_eval_weights_zero_and_huge_give_bm25_and_dense(toy_run) -> None:
    root, args = toy_run
    run_cli("eval", *args, "--out", str(root / "dense"))
    fused = {}
    for weight in (0, 1e6):
        out = root / f"linear-{weight:g}"
        fusion = ["--set", "eval.fusion=linear", "--set", f"eval.fusion_weight={weight}"]
        run_cli("eval", *args, "--out", str(out), *fusion, "--set", "eval.fusion_depth=50")
        fused[weight] = _run(out)
        record = json.loads((out / "fusion.json").read_text())
        assert record["method"] == "linear" and record["weight"] == weight
        assert json.loads((out / "metrics.json").read_text())["measured"]["fusion"] == record
    search = root / "bm25.trec"
    run_cli(
        "search",
        "--index",
        str(root / "run" / "index"),
        "--questions",
        str(TOY / "dev.qa.tsv"),
        "--model",
        str(root / "run" / "model"),
        "--k",
        "20",
        "--out",
        str(search),
        "--fusion",
        "linear",
        "--fusion-weight",
        "0",
        "--fusion-depth",
        "50",
        "--cache-dir",
        str(root / "cache"),
    )
    assert {q: [p for p, _ in r] for q, r in read_trec_run(search).items()} == fused[0]
    from dpr_cache.data.passages import load_passages, passage_columns
    from dpr_cache.data.qas import read_qas
    from dpr_cache.retrieval.lexical import Bm25Index

    bm25 = Bm25Index.open(TOY / "passages.tsv", root / "cache")
    ids = passage_columns(load_passages(TOY / "passages.tsv", root / "cache"), range(bm25.rows))
    questions = [q for q, _ in read_qas(TOY / "dev.qa.tsv")]
    short = 0
    for qid, (rows, _) in enumerate(bm25.search(questions, 20)):  # BM25 alone, here
        # BM25 retrieves only passages sharing a word; the rest of the 20 score 0 on its side
        got = fused[0][str(qid)]
        assert got[: len(rows)] == [ids["id"][r] for r in rows.tolist()], qid
        short += len(rows) < 20
    assert short > 0  # the toy has questions BM25 retrieves fewer than 20 passages for
    dense = _run(root / "dense")
    agree = sum(fused[1e6][q][:5] == dense[q][:5] for q in dense) / len(dense)
    assert agree > 0.95  # huge weight: the dense order (BM25 only breaks exact dense ties)
    assert fused[0] != dense


def test_a_bm25_run_fuses_like_bm25_built_here(toy_run) -> None:
    root, args = toy_run
    built = root / "rrf-built"
    run_cli(
        "eval",
        *args,
        "--out",
        str(built),
        "--set",
        "eval.fusion=rrf",
        "--set",
        "eval.fusion_depth=30",
    )
    from dpr_cache.data.passages import load_passages, passage_columns
    from dpr_cache.data.qas import read_qas
    from dpr_cache.retrieval.lexical import Bm25Index

    bm25 = Bm25Index.open(TOY / "passages.tsv", root / "cache")
    ids = passage_columns(load_passages(TOY / "passages.tsv", root / "cache"), range(bm25.rows))
    questions = [q for q, _ in read_qas(TOY / "dev.qa.tsv")]
    search = root / "bm25-30.trec"  # BM25's own top 30, written as pyserini writes a run
    search.write_text(
        "".join(
            f"{qid} Q0 {ids['id'][r]} {rank} {score:.4f} bm25\n"
            for qid, (rows, scores) in enumerate(bm25.search(questions, 30))
            for rank, (r, score) in enumerate(zip(rows.tolist(), scores.tolist(), strict=True), 1)
        )
    )
    from_run = root / "rrf-run"
    run_cli(
        "eval",
        *args,
        "--out",
        str(from_run),
        "--set",
        "eval.fusion=rrf",
        "--set",
        f"eval.bm25_run={search}",
        "--set",
        "eval.fusion_depth=30",
    )
    assert _run(from_run) == _run(built)
    bad = _eval_refused(args, "eval.fusion=linear", f"eval.bm25_run={search}")
    assert bad.returncode == 2 and "use rrf with a run" in bad.stderr


def _eval_refused(args: list[str], *settings: str):
    """``eval`` with each ``key=value`` of ``settings`` set, expected to fail: the process."""
    sets = [arg for setting in settings for arg in ("--set", setting)]
    return run_cli("eval", *args, *sets, check=False)


def _tuned(root: Path, args: list[str], out: Path, tune: Path, *extra: str) -> dict:
    run_cli(
        "eval",
        *args,
        "--out",
        str(out),
        "--set",
        "eval.fusion=linear",
        "--set",
        "eval.fusion_weight=auto",
        "--set",
        f"eval.fusion_tune_qa={tune}",
        "--set",
        "eval.fusion_depth=50",
        *extra,
    )
    return json.loads((out / "fusion.json").read_text())


def _mrr_at(root: Path, args: list[str], tune: Path, weight: str, *extra: str) -> float:
    """MRR@10 of the held-out questions scored by eval itself at a fixed weight."""
    out = root / f"fixed-{tune.stem}-{weight}"
    run_cli(
        "eval",
        *args,
        "--out",
        str(out),
        "--set",
        f"data.dev_qa={tune}",
        "--set",
        "eval.fusion=linear",
        "--set",
        f"eval.fusion_weight={weight}",
        "--set",
        "eval.fusion_depth=50",
        *extra,
    )
    return json.loads((out / "metrics.json").read_text())["mrr@10"]


def test_an_auto_weight_is_the_best_of_its_grid_on_held_out_questions(toy_run) -> None:
    root, args = toy_run
    held_out = root / "tune.qa.tsv"
    lines = [json.loads(line) for line in (TOY / "train.jsonl").read_text().splitlines()[:40]]
    held_out.write_text("".join(f"{r['question']}\t{json.dumps(r['answers'])}\n" for r in lines))
    record = _tuned(root, args, root / "auto", held_out)
    best = max(record["grid"].values())
    assert record["grid"][f"{record['weight']:g}"] == best and record["tune_metric"] == "mrr@10"
    assert len(set(record["grid"].values())) > 1  # the weight matters on these questions
    assert record["judged_by"].startswith("answers")
    low = min(record["grid"], key=record["grid"].get)
    for weight in {f"{record['weight']:g}", low}:  # the grid's figures are eval's own
        assert record["grid"][weight] == pytest.approx(
            _mrr_at(root, args, held_out, weight), abs=0.01
        )
    same = _eval_refused(
        args,
        "eval.fusion=linear",
        "eval.fusion_weight=auto",
        f"eval.fusion_tune_qa={TOY / 'dev.qa.tsv'}",
    )
    assert same.returncode == 2 and "not held out" in same.stderr
    no_answers = root / "bare.qa.tsv"
    no_answers.write_text("".join(f"{r['question']}\t[]\n" for r in lines))
    bare = _eval_refused(
        args,
        "eval.fusion=linear",
        "eval.fusion_weight=auto",
        f"eval.fusion_tune_qa={no_answers}",
        "eval.fusion_depth=50",
    )
    assert bare.returncode == 2 and f"{no_answers} line 1:" in bare.stderr.strip().splitlines()[-1]


def test_an_auto_weight_judged_by_qrels(toy_run) -> None:
    """With data.qrels, the held-out questions are judged by it (their positive passages here),
    not by answers (they have none, which without qrels is refused): the grid matches eval
    scored by the same qrels."""
    root, args = toy_run
    lines = [json.loads(line) for line in (TOY / "train.jsonl").read_text().splitlines()[:40]]
    tune = root / "judged.qa.tsv"
    tune.write_text("".join(f"{r['question']}\t[]\n" for r in lines))  # no answers at all
    tune.with_suffix(".ids.txt").write_text("".join(f"t{i}\n" for i in range(len(lines))))
    qrels = root / "judged.qrels"
    dev_ids = [f"d{i}" for i in range(sum(1 for _ in open(TOY / "dev.qa.tsv")))]
    dev = root / "dev.qa.tsv"  # the toy's dev questions, with ids the qrels can name
    dev.write_text((TOY / "dev.qa.tsv").read_text())
    dev.with_suffix(".ids.txt").write_text("".join(f"{q}\n" for q in dev_ids))
    qrels.write_text(
        "".join(f"t{i} 0 {r['positive_ctxs'][0]['passage_id']} 1\n" for i, r in enumerate(lines))
        + f"{dev_ids[0]} 0 0 1\n"
    )
    judged = ["--set", f"data.qrels={qrels}", "--set", f"data.dev_qa={dev}"]
    unnamed = root / "unnamed.qa.tsv"  # no ids: its row numbers could be the dev questions'
    unnamed.write_text(tune.read_text())
    bad = run_cli(
        "eval",
        *args,
        "--set",
        "eval.fusion=linear",
        "--set",
        "eval.fusion_weight=auto",
        "--set",
        f"eval.fusion_tune_qa={unnamed}",
        "--set",
        "eval.fusion_depth=50",
        *judged,
        check=False,
    )
    assert bad.returncode == 2 and "its questions need ids" in bad.stderr
    record = _tuned(root, args, root / "auto-qrels", tune, *judged)
    assert record["judged_by"] == f"qrels {qrels}"
    weight = f"{record['weight']:g}"
    assert record["grid"][weight] == max(record["grid"].values()) > 0
    assert record["grid"][weight] == pytest.approx(
        _mrr_at(root, args, tune, weight, "--set", f"data.qrels={qrels}"), abs=0.01
    )
