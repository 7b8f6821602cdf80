"""A multi-vector model (``model.vectors: multi``) through the real CLI on the toy corpus:
``train`` (6 steps; its towers load in sentence-transformers' ``MultiVectorEncoder``, giving our
token vectors), ``index`` (token shards), ``eval`` and ``search``, whose rankings equal a
brute-force MaxSim (:func:`dpr_cache.core.similarity.scores`) of the model's own question and
passage token vectors computed here; fusion takes the MaxSim scores; ``score --teacher hybrid``'s
dense part is that MaxSim; and a model or an index of the other kind, a width, an index type
of one vector a passage only (hnsw), precomputed query vectors and ``encode`` are each refused in
one line, nothing written."""

from __future__ import annotations

import csv
import json
from pathlib import Path

import numpy as np
import pytest
import torch

from dpr_cache.core.similarity import scores
from dpr_cache.data.qas import read_qas
from dpr_cache.data.tokenize import encode_questions, pad, tokenize_passages
from dpr_cache.model.biencoder import BiEncoder
from dpr_cache.retrieval.dense.store import write_shard
from tests.support.cli import run_cli, toy_overrides
from tests.support.fixtures import TOY

pytestmark = pytest.mark.slow

MULTI = ["--set", "model.vectors=multi", "--set", "model.multi_dim=16"]
QUESTIONS = 6  # the first dev questions checked against the brute force
DEPTH = 20


@pytest.fixture(scope="module")
def trained(tmp_path_factory) -> tuple[Path, list[str]]:
    """A multi-vector toy model trained for 6 steps and its index: the run folder and the
    config arguments."""
    root = tmp_path_factory.mktemp("multi")
    args = ["--config", "configs/toy.yaml", *toy_overrides(root), *MULTI, "-q"]
    run_cli("train", *args)
    run_cli("index", *args)
    return root / "run", args


def test_train_saves_what_sentence_transformers_loads(trained) -> None:
    st = pytest.importorskip("sentence_transformers")
    saved = trained[0] / "model"
    assert json.loads((saved / "biencoder.json").read_text())["vectors"] == "multi"
    ours = BiEncoder.from_pretrained(saved).eval()
    texts = ["Who wrote Hamlet?", "What is the capital of France?"]
    peer = st.MultiVectorEncoder(str(saved / "query_encoder"), device="cpu").eval()
    tok = ours.tokenizer(texts, padding=True, return_tensors="pt")
    with torch.no_grad():
        reps = ours.encode_query(dict(tok))
    for mine, theirs in zip(reps, peer.encode_query(texts), strict=True):
        mine = mine[mine.abs().sum(-1) > 0]
        cos = torch.nn.functional.cosine_similarity(mine, torch.as_tensor(theirs), dim=-1)
        assert mine.shape[0] == len(theirs) and (1 - cos).max() <= 1e-6
    meta = json.loads((trained[0] / "index" / "meta.json").read_text())
    assert (meta["vectors"], meta["dim"], meta["rows"]) == ("multi", 16, 273)


def _passages() -> list[dict[str, str]]:
    with open(TOY / "passages.tsv", encoding="utf-8", newline="") as f:
        return list(csv.DictReader(f, delimiter="\t"))


@pytest.fixture(scope="module")
def brute_force(trained) -> tuple[np.ndarray, list[str], np.ndarray]:
    """MaxSim [QUESTIONS, passages] of the first dev questions against every toy passage, from
    the saved model's own towers (passage tokens rounded to float16, as stored), the passage
    ids, and the same MaxSim without the rounding (a negative control)."""
    model = BiEncoder.from_pretrained(trained[0] / "model").eval()
    passages = _passages()
    feats = tokenize_passages(
        model.tokenizer, [p["title"] for p in passages], [p["text"] for p in passages], 128
    )
    questions = [q for q, _ in read_qas(TOY / "dev.qa.tsv")[:QUESTIONS]]
    with torch.no_grad():
        blocks = np.array_split(np.arange(len(passages)), 8)
        p = torch.cat([model.encode_passage(pad(model.tokenizer, feats, rows)) for rows in blocks])
        q = model.encode_query(dict(encode_questions(model.tokenizer, questions, 32)))
    assert p.dim() == 3 and p.shape[-1] == 16  # token vectors
    ids = [p["id"] for p in passages]
    return scores(q, p.half().float()).numpy(), ids, scores(q, p).numpy()


def _run(path: Path) -> dict[str, list[tuple[str, float]]]:
    out: dict[str, list[tuple[str, float]]] = {}
    for line in path.read_text().splitlines():
        qid, _, pid, rank, score, _ = line.split()
        out.setdefault(qid, []).append((pid, float(score)))
        assert int(rank) == len(out[qid])
    return out


def _check_top(run: dict, reference: np.ndarray, ids: list[str]) -> None:
    """Each checked question's run equals the reference's top ``DEPTH``: its scores to 1e-4
    (measured: 4e-6), its passages wherever the reference's scores are 2e-4 apart (most)."""
    for i in range(QUESTIONS):
        ranked = run[str(i)][:DEPTH]
        order = np.argsort(-reference[i], kind="stable")[:DEPTH]
        want = reference[i][order]
        np.testing.assert_allclose([s for _, s in ranked], want, rtol=0, atol=1e-4)
        apart = np.abs(np.diff(want, prepend=np.inf, append=-np.inf)) > 2e-4
        clear = apart[:-1] & apart[1:]
        assert clear.mean() > 0.8
        assert [ranked[j][0] for j in np.flatnonzero(clear)] == [
            ids[order[j]] for j in np.flatnonzero(clear)
        ]


def test_eval_and_search_rank_by_the_models_maxsim(trained, brute_force, tmp_path) -> None:
    run_dir, args = trained
    meta = json.loads((run_dir / "index" / "meta.json").read_text())
    assert (meta["vectors"], meta["dim"], meta["rows"]) == ("multi", 16, 273)
    assert meta["tokens"] == sum(s["tokens"] for s in meta["shards"])
    proc = run_cli("eval", *args)
    assert "hit rate" in proc.stdout
    metrics = json.loads((run_dir / "eval" / "metrics.json").read_text())
    assert {"top1", "top5", "top20", "top100", "mrr@10", "n_questions"} <= set(metrics)
    assert metrics["n_questions"] == 263 and 0 < metrics["top100"] <= 100
    assert metrics["measured"]["index"]["vectors"] == "multi"
    reference, ids, unrounded = brute_force
    evaluated = _run(run_dir / "eval" / "run.trec")
    _check_top(evaluated, reference, ids)
    with pytest.raises(AssertionError):  # the check sees float16 storage's rounding
        _check_top(evaluated, unrounded, ids)
    out = tmp_path / "search.trec"
    run_cli(*_search(run_dir, out, "--k", str(DEPTH)))
    searched = _run(out)
    assert searched == {q: ranked[:DEPTH] for q, ranked in evaluated.items()}


def _search(run_dir: Path, out: Path, *extra: str) -> list[str]:
    return [
        "search",
        "--index",
        str(run_dir / "index"),
        "--questions",
        str(TOY / "dev.qa.tsv"),
        "--model",
        str(run_dir / "model"),
        "--out",
        str(out),
        "--cache-dir",
        str(run_dir.parent / "cache"),
        *extra,
    ]


def test_fusion_and_the_hybrid_teacher_take_maxsim(trained, brute_force, tmp_path) -> None:
    """Linear fusion with a dense weight of 1000 ranks as MaxSim does, its scores 1000 times
    MaxSim plus BM25's; the hybrid teacher's scores under two weights differ by the weights'
    difference times MaxSim."""
    run_dir, _ = trained
    reference, ids, _ = brute_force
    fused = tmp_path / "fused.trec"
    run_cli(*_search(run_dir, fused, "--k", "5", "--fusion", "linear", "--fusion-weight", "1000"))
    for qid, ranked in list(_run(fused).items())[:QUESTIONS]:
        top = int(np.argmax(reference[int(qid)]))
        assert ranked[0][0] == ids[top]
        assert -0.01 < ranked[0][1] - 1000 * reference[int(qid), top] < 60  # BM25's part
    teacher = ["score", "--teacher", "hybrid", "--model", str(run_dir / "model")]
    teacher += ["--index", str(run_dir / "index"), "--train", str(TOY / "train.jsonl")]
    teacher += ["--cache-dir", str(run_dir.parent / "cache")]
    runs = {}
    for weight in ("1", "3"):
        out = tmp_path / f"scored{weight}.jsonl"
        run_cli(*teacher, "--fusion-weight", weight, "--out", str(out))
        runs[weight] = [json.loads(line) for line in out.read_text().splitlines()][:3]
    model = BiEncoder.from_pretrained(run_dir / "model").eval()
    for one, three in zip(runs["1"], runs["3"], strict=True):
        ctx = one["positive_ctxs"][0]
        dense = (three["positive_ctxs"][0]["teacher_score"] - ctx["teacher_score"]) / 2
        feats = tokenize_passages(model.tokenizer, [ctx["title"]], [ctx["text"]], 128)
        with torch.no_grad():
            p = model.encode_passage(pad(model.tokenizer, feats)).half().float()
            q = model.encode_query(dict(encode_questions(model.tokenizer, [one["question"]], 32)))
        assert abs(dense - scores(q, p).item()) < 1e-4


def _refused(proc, *fragments: str) -> None:
    assert proc.returncode == 2, proc.stderr
    lines = proc.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("error: ") and "Traceback" not in proc.stderr
    for fragment in fragments:
        assert fragment in lines[0], lines[0]


def test_what_a_multi_vector_model_is_not_is_one_line(trained, tmp_path) -> None:
    run_dir, args = trained
    other = [*args, "--set", f"output_dir={tmp_path / 'other'}", "--model", str(run_dir / "model")]
    _refused(run_cli("index", *other, "--dim", "8", check=False), "index.dim (--dim): 8")
    _refused(run_cli("index", *other, "--type", "hnsw", check=False), "index.type: 'hnsw'")
    sets = {"output_dir": run_dir, "data.cache_dir": run_dir.parent / "cache"}
    evaluate = ["eval", "--config", "configs/toy.yaml", "--out", str(tmp_path / "e")]
    evaluate += [arg for key, value in sets.items() for arg in ("--set", f"{key}={value}")]
    _refused(run_cli(*evaluate, "--dim", "8", check=False), "index.dim (--dim): 8")
    assert not (tmp_path / "other").exists() and not (tmp_path / "e").exists()
    out = tmp_path / "r.trec"
    _refused(run_cli(*_search(run_dir, out, "--dim", "16"), check=False), "--dim: 16")
    tiny = str(TOY / "tiny-bert")
    single = _search(run_dir, out)
    single[single.index("--model") + 1] = tiny
    _refused(run_cli(*single, check=False), "one vector a text", "holds token vectors")
    write_shard(tmp_path / "q.npy", np.zeros((2, 16)), ["a", "b"], "float32")
    flat = tmp_path / "flat"
    run_cli("index", "--embeddings", str(tmp_path / "q.npy"), "--out", str(flat))
    vectors = _search(run_dir, out)
    vectors[vectors.index("--questions") : vectors.index("--questions") + 2] = [
        "--query-embeddings",
        str(tmp_path / "q.npy"),
    ]
    _refused(run_cli(*vectors, check=False), "--query-embeddings", "--questions FILE")
    reverse = _search(run_dir, out)
    reverse[reverse.index("--index") + 1] = str(flat)
    _refused(run_cli(*reverse, check=False), "a multi-vector model", "one vector a passage")
    assert not out.exists()
    encode = ["encode", "--model", str(run_dir / "model"), "--questions", str(TOY / "dev.qa.tsv")]
    _refused(run_cli(*encode, "--out", str(tmp_path / "enc"), check=False), "not built yet")
    assert not (tmp_path / "enc").exists()


def test_sentence_transformers_ranks_as_our_search(trained, tmp_path) -> None:
    """The run's towers loaded by sentence-transformers' ``MultiVectorEncoder``, its own
    encode and MaxSim over every toy passage: the same top-1 as our search for at least 99% of
    the dev questions (fp16 storage may swap near ties)."""
    st = pytest.importorskip("sentence_transformers")
    run_dir, _ = trained
    out = tmp_path / "ours.trec"
    run_cli(*_search(run_dir, out, "--k", "1"))
    ours = {qid: ranked[0][0] for qid, ranked in _run(out).items()}
    passages = _passages()
    q_peer = st.MultiVectorEncoder(str(run_dir / "model" / "query_encoder"), device="cpu")
    p_peer = st.MultiVectorEncoder(str(run_dir / "model" / "passage_encoder"), device="cpu")
    p_peer.max_seq_length = 128  # the index's passage length (toy.yaml)
    docs = p_peer.encode_document([[p["title"], p["text"]] for p in passages])
    questions = [q for q, _ in read_qas(TOY / "dev.qa.tsv")]
    theirs = q_peer.similarity(q_peer.encode_query(questions), docs).argmax(dim=1)
    agree = np.mean([ours[str(i)] == passages[int(j)]["id"] for i, j in enumerate(theirs)])
    print(f"top-1 agreement with sentence-transformers: {agree:.4f}")
    assert agree >= 0.99, agree
