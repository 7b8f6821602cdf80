"""Independent checks of reported numbers (builds on tests/unit/test_index_eval.py's fixtures).

- top-k recomputed from retrieval.json with the answer rule applied to each ctx's *text* (the
  stored has_answer flags are ignored), compared with metrics.json; ctx texts are the corpus's;
- the FAISS flat index's top-100 equals a brute-force numpy search over the same embeddings.

test_index_eval.py already checks metrics.json against the stored flags and the top-20 of
retrieval.json against re-encoded questions; these add the text-level recount and a top-100 over
a corpus larger than 100. Set ``DPR_CACHE_CHECK_RUNS=runs/reproduce`` (a folder of run folders)
to run both checks on real outputs too (scripts/reproduce_squad.sh does).
"""

from __future__ import annotations

import csv
import json
import os
from pathlib import Path

import numpy as np
import pytest

from dpr_cache.answers import has_answer
from dpr_cache.data.passages import read_passages
from dpr_cache.index import build_index, load_index, load_shard_embeddings, search
from tests.unit import test_index_eval as base

corpus = base.corpus  # pytest fixtures, shared with test_index_eval.py
built = base.built
N_LARGE = 300


def recompute_metrics(retrieval: Path, ks: list[int]) -> dict[str, float]:
    """Top-k hit rates (percent, 2 decimals) from ctx texts, by DPR's answer rule."""
    entries = json.loads(retrieval.read_text(encoding="utf-8"))
    first_hits = []
    for entry in entries:
        hits = (r for r, c in enumerate(entry["ctxs"]) if has_answer(entry["answers"], c["text"]))
        first_hits.append(next(hits, None))
    n = len(entries)
    out: dict[str, float] = {
        f"top{k}": round(100.0 * sum(h is not None and h < k for h in first_hits) / n, 2)
        for k in ks
    }
    out["n_questions"] = n
    return out


def check_metrics(eval_dir: Path) -> None:
    metrics = json.loads((eval_dir / "metrics.json").read_text())
    ks = sorted(int(key[3:]) for key in metrics if key.startswith("top"))
    recomputed = recompute_metrics(eval_dir / "retrieval.json", ks)
    assert recomputed["n_questions"] == metrics["n_questions"]
    for k in ks:
        assert recomputed[f"top{k}"] == pytest.approx(metrics[f"top{k}"], abs=0.006), k


def check_ctx_texts(eval_dir: Path, passages: Path) -> None:
    rows = {pid: (text, title) for pid, text, title in read_passages(passages)}
    for entry in json.loads((eval_dir / "retrieval.json").read_text(encoding="utf-8")):
        for ctx in entry["ctxs"]:
            assert (ctx["text"], ctx["title"]) == rows[ctx["id"]]


def check_flat_top_k(index_dir: Path, k: int = 100, n_queries: int = 64) -> None:
    """FAISS flat search = exact inner-product top-k (ties within float error may swap)."""
    index, ids, meta = load_index(index_dir)
    assert meta["index_type"] == "flat"
    embs = load_shard_embeddings(index_dir)
    assert embs.shape == (index.ntotal, meta["dim"]) == (len(ids), meta["dim"])
    rng = np.random.default_rng(0)
    scale = float(np.linalg.norm(embs, axis=1).mean())
    picks = embs[rng.choice(len(embs), n_queries // 2)]
    noise = rng.normal(size=(n_queries - len(picks), embs.shape[1])) / np.sqrt(embs.shape[1])
    queries = np.concatenate([picks, noise * scale]).astype(np.float32)
    scores, rows = search(index, queries, k)
    exact = queries.astype(np.float64) @ embs.astype(np.float64).T
    tol = 1e-5 * scale * scale + 1e-6
    assert rows.shape == (n_queries, min(k, len(embs)))
    n = rows.shape[1]
    for q in range(n_queries):
        best = np.argsort(-exact[q], kind="stable")
        order = best[:n]
        padded = np.concatenate([[np.inf], exact[q, best[: n + 1]], [-np.inf]])  # one past the cut
        assert len(set(rows[q].tolist())) == n and rows[q].min() >= 0
        np.testing.assert_allclose(scores[q], exact[q, rows[q]], atol=tol)  # true scores
        np.testing.assert_allclose(scores[q], padded[1 : n + 1], atol=tol)  # and the best ones
        gap_above = padded[:n] - padded[1 : n + 1]
        gap_below = padded[1 : n + 1] - padded[2 : n + 2]
        clear = (gap_above > 10 * tol) & (gap_below > 10 * tol)  # no near-tie: position fixed
        assert (rows[q][clear] == order[clear]).all()


# -- on the test corpora --------------------------------------------------------------------


def test_metrics_recomputed_from_ctx_texts(built) -> None:
    check_metrics(built.output_path / "eval")
    check_ctx_texts(built.output_path / "eval", Path(built.data.passages))


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
def large_index(corpus, tmp_path_factory) -> Path:
    """A flat index of 300 passages (the test corpus's words), so top-100 is a real cut."""
    root = tmp_path_factory.mktemp("large")
    rng = np.random.default_rng(1)
    with open(root / "passages.tsv", "w", encoding="utf-8", newline="") as f:
        writer = csv.writer(f, delimiter="\t", lineterminator="\n")
        writer.writerow(["id", "text", "title"])
        for i in range(N_LARGE):
            words = rng.choice(base.WORDS, size=int(rng.integers(3, 30))).tolist()
            writer.writerow([f"x{i}", " ".join(words), f"Title {base.WORDS[i % 12]}"])
    config = base.make_config(corpus, root / "run")
    config.data.passages = str(root / "passages.tsv")
    build_index(config, progress=False)
    return root / "run" / "index"


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
    check_metrics(eval_dir)
    meta = json.loads((eval_dir.parent / "index" / "meta.json").read_text())
    check_ctx_texts(eval_dir, Path(meta["passages"]["path"]))


@pytest.mark.parametrize("index_dir", _run_dirs("index/meta.json"))
def test_real_flat_top100(index_dir: Path) -> None:
    if json.loads((index_dir / "meta.json").read_text())["index_type"] != "flat":
        pytest.skip("not a flat index")
    check_flat_top_k(index_dir, k=100)
