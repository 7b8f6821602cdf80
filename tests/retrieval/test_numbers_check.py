"""Independent checks of reported numbers (on the corpus of tests/retrieval/conftest.py).

For an evaluated run folder (``eval/`` with its ``config.yaml``, ``index/``):

- the questions and answers of retrieval.json are those of ``data.dev_qa``, read here with csv;
- each question has ``max(eval.top_k)`` ctxs (or the whole corpus), scores not increasing, and
  each ctx's text and title are the corpus's;
- top-k recomputed from each ctx's *text* with DPR's answer rule, written out again below from
  DPR's description (the stored has_answer flags and dpr_cache.data.answers are not used), equals
  metrics.json;
- the streamed flat search's top-100 equals a brute-force numpy search over the stored vectors, for
  made-up queries and for real dev questions re-encoded with the run's model, whose brute-force
  top-100 must be retrieval.json's; for a multi-vector run (a vector a token), the real questions'
  brute-force MaxSim over the stored token vectors, read from the shards' files here.

test_index_eval.py checks metrics.json against the stored flags and the top-20 on the test corpus.
Set ``DPR_CACHE_CHECK_RUNS=runs/reproduce`` (a folder of run folders) to run every check on real
outputs too (studies/squad_batch_size/run.sh does).
"""

from __future__ import annotations

import ast
import csv
import gzip
import json
import os
from pathlib import Path

import numpy as np
import pytest
import torch

from dpr_cache.config import Config, load_config
from dpr_cache.data.passages import read_passages
from dpr_cache.data.tokenize import encode_questions
from dpr_cache.model.biencoder import BiEncoder
from dpr_cache.model.loading import load_encoder
from dpr_cache.retrieval.dense.index import open_index, search_index
from dpr_cache.retrieval.drivers.eval import evaluate
from dpr_cache.retrieval.drivers.index import build_index
from dpr_cache.runtime.memory import rss_bytes
from tests.support.dpr_answers import dpr_has_answer
from tests.support.fixtures import index_vectors

N_LARGE = 300


def recompute_metrics(retrieval: Path, ks: list[int], match: str = "string") -> dict[str, float]:
    """Top-k hit rates (percent, 2 decimals) from ctx texts, by DPR's answer rule."""
    entries = json.loads(retrieval.read_text(encoding="utf-8"))
    first_hits = []
    for entry in entries:
        ctxs = entry["ctxs"]
        hits = (r for r, c in enumerate(ctxs) if dpr_has_answer(entry["answers"], c["text"], match))
        first_hits.append(next(hits, None))
    n = len(entries)
    out: dict[str, float] = {
        f"top{k}": round(100.0 * sum(h is not None and h < k for h in first_hits) / n, 2)
        for k in ks
    }
    out["n_questions"] = n
    return out


def eval_config(eval_dir: Path) -> Config:
    """The config the evaluation ran with: eval/config.yaml (or the trained run's config.yaml)."""
    for path in (eval_dir / "config.yaml", eval_dir.parent / "config.yaml"):
        if path.is_file():
            return load_config(path, [])
    pytest.fail(f"{eval_dir}: no config.yaml recorded; rerun `dpr-cache eval` on it")


def check_metrics(eval_dir: Path, match: str = "string") -> None:
    metrics = json.loads((eval_dir / "metrics.json").read_text())
    ks = sorted(int(key[3:]) for key in metrics if key.startswith("top"))
    recomputed = recompute_metrics(eval_dir / "retrieval.json", ks, match)
    assert recomputed["n_questions"] == metrics["n_questions"]
    for k in ks:
        assert recomputed[f"top{k}"] == pytest.approx(metrics[f"top{k}"], abs=0.006), k


def read_dev_qa(path: Path) -> list[tuple[str, list[str]]]:
    """question<TAB>answers-list lines, read with csv (JSON, else a Python literal list)."""
    opener = gzip.open if path.suffix == ".gz" else open
    with opener(path, "rt", encoding="utf-8", newline="") as f:
        rows = [row for row in csv.reader(f, delimiter="\t") if row and "".join(row).strip()]
    out = []
    for question, answers in rows:
        try:
            parsed = json.loads(answers)
        except ValueError:
            parsed = ast.literal_eval(answers)
        out.append((question, [str(a) for a in parsed]))
    return out


def check_questions(eval_dir: Path, config: Config, n_passages: int, bm25: bool = False) -> None:
    """retrieval.json holds dev_qa's questions and answers in order, each with a full ctx list
    (BM25's: only passages sharing a word with the question, so scoring above 0, and maybe
    fewer), best first, no passage twice."""
    entries = json.loads((eval_dir / "retrieval.json").read_text(encoding="utf-8"))
    qas = read_dev_qa(Path(config.data.dev_qa))
    assert [(e["question"], e["answers"]) for e in entries] == qas
    n_ctxs = min(max(config.eval.top_k), n_passages)
    for entry in entries:
        scores = [ctx["score"] for ctx in entry["ctxs"]]
        assert scores == sorted(scores, reverse=True)
        if bm25:
            assert len(scores) <= n_ctxs and all(score > 0 for score in scores)
        else:
            assert len(scores) == n_ctxs
        assert len({ctx["id"] for ctx in entry["ctxs"]}) == len(scores)


def check_ctx_texts(eval_dir: Path, passages: Path) -> None:
    rows = {pid: (text, title) for pid, text, title in read_passages(passages)}
    for entry in json.loads((eval_dir / "retrieval.json").read_text(encoding="utf-8")):
        for ctx in entry["ctxs"]:
            assert (ctx["text"], ctx["title"]) == rows[ctx["id"]]


def assert_exact_top_n(
    got_rows: np.ndarray, got_scores: np.ndarray, exact: np.ndarray, tol: float
) -> None:
    """``got_rows`` (best first, with ``got_scores``) are the top-n of the exact scores of all rows:
    the true scores, those of the best n, and the exact order wherever no near-tie (within
    10 x ``tol`` of a neighbour, the one past the cut included) allows a swap."""
    n = len(got_rows)
    best = np.argsort(-exact, kind="stable")
    np.testing.assert_allclose(got_scores, exact[got_rows], atol=tol)  # the true scores
    np.testing.assert_allclose(got_scores, exact[best[:n]], atol=tol)  # of the best n
    padded = np.concatenate([[np.inf], exact[best[: n + 1]], [-np.inf]])  # one past the cut
    gap_above = padded[:n] - padded[1 : n + 1]
    gap_below = padded[1 : n + 1] - padded[2 : n + 2]
    clear = (gap_above > 10 * tol) & (gap_below > 10 * tol)  # no near-tie: position fixed
    assert (got_rows[clear] == best[:n][clear]).all()


def check_flat_top_k(index_dir: Path, k: int = 100, n_queries: int = 64) -> None:
    """The streamed flat search = exact inner-product top-k over the stored vectors, computed
    here in float64 (ties within float error may swap)."""
    opened = open_index(index_dir)
    assert opened.type == "flat"
    embs, ids = index_vectors(index_dir)
    assert embs.shape == (opened.meta["rows"], opened.meta["dim"]) and len(ids) == len(embs)
    rng = np.random.default_rng(0)
    scale = float(np.linalg.norm(embs, axis=1).mean())
    picks = embs[rng.choice(len(embs), n_queries // 2)]
    noise = rng.normal(size=(n_queries - len(picks), embs.shape[1])) / np.sqrt(embs.shape[1])
    queries = np.concatenate([picks, noise * scale]).astype(np.float32)
    hits = search_index(opened, queries, k, rss_bytes() + 2 * 10**9)
    exact = queries.astype(np.float64) @ embs.astype(np.float64).T
    tol = 1e-5 * scale * scale + 1e-6
    assert hits.rows.shape == (n_queries, min(k, len(embs)))
    n = hits.rows.shape[1]
    for q in range(n_queries):
        assert len(set(hits.rows[q].tolist())) == n and hits.rows[q].min() >= 0
        assert_exact_top_n(hits.rows[q], hits.scores[q], exact[q], tol)


def check_real_queries(eval_dir: Path, config: Config, n_queries: int = 32) -> None:
    """Dev questions re-encoded with the index's model: their brute-force top-k over the stored
    embeddings is retrieval.json's (same scores; same order wherever no near-tie allows a swap)."""
    index_dir = eval_dir.parent / "index"
    meta = open_index(index_dir).meta
    p_embs, ids = index_vectors(index_dir)
    p_embs = p_embs.astype(np.float64)  # [n_passages, dim], the stored vectors
    entries = json.loads((eval_dir / "retrieval.json").read_text(encoding="utf-8"))
    picks = np.linspace(0, len(entries) - 1, min(n_queries, len(entries))).round().astype(int)
    picked = [entries[i] for i in sorted(set(picks.tolist()))]
    model = load_encoder(Path(meta["model"]["dir"]), pooling=config.model.pooling, query_only=True)
    with torch.inference_mode():
        inputs = encode_questions(
            model.tokenizer, [e["question"] for e in picked], config.model.max_query_length
        )
        q_embs = model.encode_query(inputs).double().numpy()  # [n_queries, dim]
    brute = q_embs @ p_embs.T  # [n_queries, n_passages]
    row_of = {pid: r for r, pid in enumerate(ids)}
    scale = float(np.abs(brute).max())
    tol = 1e-5 * scale + 1e-6  # float32 scores; a re-encode pads differently
    for entry, exact in zip(picked, brute, strict=True):
        got_rows = np.array([row_of[ctx["id"]] for ctx in entry["ctxs"]])
        got_scores = np.array([ctx["score"] for ctx in entry["ctxs"]])
        assert_exact_top_n(got_rows, got_scores, exact, tol)


def token_vectors(index_dir: Path) -> tuple[np.ndarray, np.ndarray, list[str]]:
    """A multi-vector index's stored token vectors (float64 [tokens, dim]), each passage's first
    token row (the last entry: the token count) and the passages' ids, read straight from the
    shards' files in meta.json's order (``X.npy``, ``X.offsets.npy``, ``X.ids.txt``)."""
    meta = json.loads((index_dir / "meta.json").read_text())
    blocks, starts, ids, done = [], [], [], 0
    for shard in meta["shards"]:
        path = index_dir / shard["path"]
        stem = path.name.removesuffix(".npy")
        blocks.append(np.load(path).astype(np.float64))
        starts.append(np.load(path.with_name(stem + ".offsets.npy"))[:-1] + done)
        ids += path.with_name(stem + ".ids.txt").read_text(encoding="utf-8").splitlines()
        done += len(blocks[-1])
    return np.concatenate(blocks), np.append(np.concatenate(starts), done), ids


def brute_maxsim(question: np.ndarray, tokens: np.ndarray, offsets: np.ndarray) -> np.ndarray:
    """MaxSim of one question's token vectors [L, dim] against every passage: for each question
    token its best token of the passage, summed (-inf for a passage without a token)."""
    sims = question @ tokens.T  # [L, tokens]
    counts = np.diff(offsets)
    out = np.full(len(counts), -np.inf)
    real = counts > 0
    out[real] = np.maximum.reduceat(sims, offsets[:-1][real], axis=1).sum(axis=0)
    return out


def check_real_multi_queries(eval_dir: Path, config: Config, n_queries: int = 32) -> None:
    """A multi-vector run's dev questions re-encoded with its model (token vectors): their
    brute-force MaxSim top-k over the stored token vectors is retrieval.json's."""
    index_dir = eval_dir.parent / "index"
    meta = open_index(index_dir).meta
    tokens, offsets, ids = token_vectors(index_dir)
    entries = json.loads((eval_dir / "retrieval.json").read_text(encoding="utf-8"))
    picks = np.linspace(0, len(entries) - 1, min(n_queries, len(entries))).round().astype(int)
    picked = [entries[i] for i in sorted(set(picks.tolist()))]
    model = load_encoder(Path(meta["model"]["dir"]), query_only=True)
    with torch.inference_mode():
        inputs = encode_questions(
            model.tokenizer, [e["question"] for e in picked], config.model.max_query_length
        )
        questions = model.encode_query(inputs).double().numpy()  # [n_queries, L, dim]
    assert questions.ndim == 3 and questions.shape[-1] == tokens.shape[1]
    row_of = {pid: r for r, pid in enumerate(ids)}
    for entry, question in zip(picked, questions, strict=True):
        exact = brute_maxsim(question, tokens, offsets)
        tol = 1e-5 * float(np.abs(exact[np.isfinite(exact)]).max()) + 1e-6
        got_rows = np.array([row_of[ctx["id"]] for ctx in entry["ctxs"]])
        got_scores = np.array([ctx["score"] for ctx in entry["ctxs"]])
        assert_exact_top_n(got_rows, got_scores, exact, tol)


# -- on the test corpora --------------------------------------------------------------------


def test_metrics_recomputed_from_ctx_texts(corpus, built) -> None:
    eval_dir = built.output_path / "eval"
    config = eval_config(eval_dir)
    assert config.data.dev_qa == built.data.dev_qa  # eval/config.yaml is the one it ran with
    check_metrics(eval_dir)
    check_questions(eval_dir, config, corpus["n_passages"])
    check_ctx_texts(eval_dir, Path(built.data.passages))
    check_real_queries(eval_dir, config)


def test_reference_answer_rule_follows_dpr() -> None:
    """The test's own answer rule on cases DPR's description settles."""
    assert dpr_has_answer(["1856"], "born on 10 July 1856 into")
    assert dpr_has_answer(["Nikola Tesla"], "nikola  TESLA, inventor")  # case, spacing
    assert not dpr_has_answer(["Tesla"], "Teslas")  # whole tokens only
    assert not dpr_has_answer(["New York"], "New Jersey and York")  # contiguous only
    assert dpr_has_answer(["U.S."], "the U.S. army")  # punctuation is a token of its own
    assert not dpr_has_answer(["café"], "cafe")  # NFD keeps the accent as a mark
    assert not dpr_has_answer(["", " "], "anything")
    assert dpr_has_answer([r"18\d\d"], "born in 1856", match="regex")


def test_question_check_catches_a_dropped_ctx(corpus, built, tmp_path) -> None:
    """Negative control: a cut ctx list fails check_questions."""
    eval_dir = built.output_path / "eval"
    entries = json.loads((eval_dir / "retrieval.json").read_text())
    entries[3]["ctxs"].pop()
    (tmp_path / "retrieval.json").write_text(json.dumps(entries))
    with pytest.raises(AssertionError):
        check_questions(tmp_path, eval_config(eval_dir), corpus["n_passages"])


def _swapped_ctxs(run: Path, tmp_path: Path) -> Path:
    """``tmp_path/eval``: the run's retrieval.json with every question's first and last ctx
    swapped, beside a link to the run's index."""
    entries = json.loads((run / "eval" / "retrieval.json").read_text())
    for entry in entries:
        entry["ctxs"][0], entry["ctxs"][-1] = entry["ctxs"][-1], entry["ctxs"][0]
    (tmp_path / "eval").mkdir()
    (tmp_path / "eval" / "retrieval.json").write_text(json.dumps(entries))
    (tmp_path / "index").symlink_to(run / "index")
    return tmp_path / "eval"


def test_query_check_catches_a_swapped_ctx(built, tmp_path) -> None:
    """Negative control: two ctxs swapped between ranks far apart fail check_real_queries."""
    swapped = _swapped_ctxs(built.output_path, tmp_path)
    with pytest.raises(AssertionError):
        check_real_queries(swapped, eval_config(built.output_path / "eval"))


def test_recount_disagrees_when_a_text_is_changed(built, tmp_path) -> None:
    """Negative control: the recount reads the texts, not the stored flags."""
    entries = json.loads((built.output_path / "eval" / "retrieval.json").read_text())
    hit = next(e for e in entries if e["ctxs"][0]["has_answer"])
    hit["ctxs"][0]["text"] = "no answer here"  # the flag still says True
    (tmp_path / "retrieval.json").write_text(json.dumps(entries))
    (tmp_path / "metrics.json").write_bytes(
        (built.output_path / "eval" / "metrics.json").read_bytes()
    )
    with pytest.raises(AssertionError):
        check_metrics(tmp_path)


@pytest.fixture(scope="module")
def large_index(corpus, make_config, tmp_path_factory) -> Path:
    """A flat index of 300 passages (the test corpus's words), so top-100 is a real cut."""
    root = tmp_path_factory.mktemp("large")
    rng = np.random.default_rng(1)
    with open(root / "passages.tsv", "w", encoding="utf-8", newline="") as f:
        writer = csv.writer(f, delimiter="\t", lineterminator="\n")
        writer.writerow(["id", "text", "title"])
        for i in range(N_LARGE):
            words = rng.choice(corpus["words"], size=int(rng.integers(3, 30))).tolist()
            writer.writerow([f"x{i}", " ".join(words), f"Title {corpus['words'][i % 12]}"])
    config = make_config(corpus, root / "run")
    config.data.passages = str(root / "passages.tsv")
    build_index(config, progress=False)
    return root / "run" / "index"


@pytest.fixture(scope="module")
def built_multi(corpus, make_config, tmp_path_factory) -> Config:
    """A flat index and an evaluation of the tiny BERT as a multi-vector model (8-d tokens)."""
    out = tmp_path_factory.mktemp("multi")
    BiEncoder.from_pretrained(corpus["tiny"], vectors="multi", multi_dim=8).save_pretrained(
        out / "model"
    )
    config = make_config(corpus, out, with_model=False)
    build_index(config, progress=False)
    evaluate(config, progress=False)
    return config


def test_multi_vector_metrics_and_maxsim_recomputed(corpus, built_multi) -> None:
    eval_dir = built_multi.output_path / "eval"
    config = eval_config(eval_dir)
    check_metrics(eval_dir)
    check_questions(eval_dir, config, corpus["n_passages"])
    check_real_multi_queries(eval_dir, config)


def test_maxsim_check_catches_a_swapped_ctx(built_multi, tmp_path) -> None:
    """Negative control: two ctxs swapped between ranks far apart fail the MaxSim check."""
    swapped = _swapped_ctxs(built_multi.output_path, tmp_path)
    with pytest.raises(AssertionError):
        check_real_multi_queries(swapped, eval_config(built_multi.output_path / "eval"))


def test_flat_top100_equals_brute_force(large_index: Path, built) -> None:
    check_flat_top_k(large_index, k=100)
    check_flat_top_k(built.output_path / "index", k=100)  # k above the corpus size: all of it


# -- on real outputs (opt-in) ---------------------------------------------------------------


def _run_dirs(part: str) -> list:
    root = os.environ.get("DPR_CACHE_CHECK_RUNS")
    if not root:
        return [pytest.param(None, marks=pytest.mark.skip(reason="DPR_CACHE_CHECK_RUNS not set"))]
    found = sorted(p.parent for p in Path(root).glob(f"*/{part}"))
    return [pytest.param(p, id=p.parent.name) for p in found] or [
        pytest.param(None, marks=pytest.mark.skip(reason=f"no */{part} under {root}"))
    ]


@pytest.mark.parametrize("eval_dir", _run_dirs("eval/metrics.json"))
def test_real_metrics_recomputed(eval_dir: Path) -> None:
    if not (eval_dir / "retrieval.json").exists() and (eval_dir / "retrieval.ranks.json").exists():
        pytest.skip("restored from a study's saved state: checked when it was made")
    config = eval_config(eval_dir)
    passages = Path(config.data.passages)
    check_metrics(eval_dir, config.eval.match)
    meta = eval_dir.parent / "index" / "meta.json"  # none for a BM25 run
    n_passages = sum(1 for _ in read_passages(passages))
    check_questions(eval_dir, config, n_passages, bm25=not meta.is_file())
    check_ctx_texts(eval_dir, passages)
    recorded = json.loads(meta.read_text()) if meta.is_file() else {}
    if recorded.get("type") == "flat" and recorded.get("vectors") == "multi":
        check_real_multi_queries(eval_dir, config)
    elif recorded.get("type") == "flat":
        check_real_queries(eval_dir, config)


@pytest.mark.parametrize("index_dir", _run_dirs("index/meta.json"))
def test_real_flat_top100(index_dir: Path) -> None:
    meta = json.loads((index_dir / "meta.json").read_text())
    if meta["type"] != "flat":
        pytest.skip("not a flat index")
    if meta.get("vectors") == "multi":
        pytest.skip("a vector a token: its real questions' MaxSim is checked instead")
    check_flat_top_k(index_dir, k=100)
