"""``encode``, ``index --embeddings`` and ``search`` through the real CLI on the toy corpus:
the TREC run equals a numpy brute-force search over the same stored vectors, DPR's pickles index
like our shards, an index of precomputed vectors evaluates like an encoded one, and bad input is
one line with exit 2."""

from __future__ import annotations

import json
import pickle
import shutil
from pathlib import Path

import numpy as np
import pytest

from dpr_cache.retrieval.dense.store import EmbeddingStore, write_shard
from dpr_cache.retrieval.metrics import read_qrels
from tests.support.cli import encode_args, run_cli, toy_overrides
from tests.support.fixtures import REPO, TOY

TINY = str(TOY / "tiny-bert")


def _run(path: Path) -> dict[str, list[tuple[str, float]]]:
    """qid -> [(pid, score)] in rank order, checking the TREC columns on the way."""
    out: dict[str, list[tuple[str, float]]] = {}
    for line in path.read_text().splitlines():
        qid, q0, pid, rank, score, tag = line.split()
        assert q0 == "Q0" and tag == "dpr-cache"
        out.setdefault(qid, []).append((pid, float(score)))
        assert int(rank) == len(out[qid])
    return out


def _encode_passages(out: Path, cache: Path, *flags: str) -> None:
    """``encode`` of the toy passages by the tiny BERT into ``out``."""
    run_cli(*encode_args(TINY, out, "--cache-dir", str(cache), *flags, "-q"))


@pytest.fixture(scope="module")
def encoded(tmp_path_factory) -> Path:
    root = tmp_path_factory.mktemp("vectors")
    _encode_passages(root / "p", root / "cache", "--shard-size", "100")
    run_cli(
        "encode", "--model", TINY, "--questions", str(TOY / "dev.qa.tsv"), "--out", str(root / "q")
    )
    return root


def test_search_run_equals_brute_force(encoded: Path) -> None:
    p, q = encoded / "p", encoded / "q"
    assert len(list(p.glob("*.npy"))) == 3 and (q / "questions.ids.txt").read_text().startswith(
        "0\n1\n"
    )
    run_cli("index", "--embeddings", f"{p}/*.npy", "--out", str(encoded / "flat"))
    run_cli(
        "search",
        "--index",
        str(encoded / "flat"),
        "--query-embeddings",
        str(q / "questions.npy"),
        "--k",
        "10",
        "--out",
        str(encoded / "run.trec"),
    )
    run = _run(encoded / "run.trec")
    store = EmbeddingStore.from_glob(f"{p}/*.npy")
    vectors = np.concatenate([b.copy() for _, b in store.blocks(1000)])
    ids = store.ids_of(np.arange(store.rows))
    queries = np.load(q / "questions.npy")
    scores = queries @ vectors.T
    assert sorted(run, key=int) == [str(i) for i in range(len(queries))]
    for qid, ranked in run.items():
        exact = scores[int(qid)]
        want = np.sort(exact)[::-1][:10]
        np.testing.assert_allclose([s for _, s in ranked], want, rtol=1e-5, atol=1e-5)
        rows = [int(np.flatnonzero(ids == pid)[0]) for pid, _ in ranked]
        np.testing.assert_allclose(exact[rows], want, rtol=1e-5, atol=1e-5)


def test_dpr_pickles_index_like_our_shards(encoded: Path) -> None:
    """DPR's generate_dense_embeddings output (pickled (id, vector) lists) gives the same run."""
    store = EmbeddingStore.from_glob(f"{encoded / 'p'}/*.npy")
    pkl = encoded / "dpr"
    pkl.mkdir(exist_ok=True)
    for i, shard in enumerate(store.shards):
        block = next(store.blocks(shard.rows, shards=[i]))[1]
        ids = store.ids_of(np.arange(store.starts[i], store.starts[i + 1]))
        with open(pkl / f"wiki_passages_{i}.pkl", "wb") as f:
            pickle.dump([(pid, vec.copy()) for pid, vec in zip(ids, block, strict=True)], f)
    run_cli("index", "--embeddings", f"{pkl}/*.pkl", "--out", str(encoded / "from-dpr"))
    run_cli(
        "search",
        "--index",
        str(encoded / "from-dpr"),
        "--query-embeddings",
        str(encoded / "q" / "questions.npy"),
        "--k",
        "10",
        "--out",
        str(encoded / "dpr.trec"),
    )
    if not (encoded / "run.trec").is_file():
        run_cli("index", "--embeddings", f"{encoded / 'p'}/*.npy", "--out", str(encoded / "flat"))
        run_cli(
            "search",
            "--index",
            str(encoded / "flat"),
            "--query-embeddings",
            str(encoded / "q" / "questions.npy"),
            "--k",
            "10",
            "--out",
            str(encoded / "run.trec"),
        )
    assert (encoded / "dpr.trec").read_text() == (encoded / "run.trec").read_text()


def test_an_index_of_precomputed_vectors_evaluates_like_an_encoded_one(encoded, tmp_path) -> None:
    """eval maps the retrieved ids to passages by id when the index did not encode the file."""
    args = ["--config", "configs/toy.yaml", "--model", TINY, "-q", *toy_overrides(tmp_path)]
    run_cli("index", *args)
    run_cli("eval", *args)
    encoded_metrics = json.loads((tmp_path / "run" / "eval" / "metrics.json").read_text())
    encoded_pids = _run_pids(tmp_path / "run" / "eval" / "run.trec")
    shutil.rmtree(tmp_path / "run" / "index")
    # the same vectors, written by `encode` (as toy.yaml encodes) with no record of the TSV
    _encode_passages(tmp_path / "p", encoded / "cache", "--pooling", "mean", "--max-length", "128")
    run_cli(
        "index", "--embeddings", f"{tmp_path / 'p'}/*.npy", "--out", str(tmp_path / "run" / "index")
    )
    proc = run_cli("eval", *args)
    assert "precomputed embeddings" in proc.stderr
    assert json.loads((tmp_path / "run" / "eval" / "metrics.json").read_text()) == encoded_metrics
    # DPR's own pickles name the passages "wiki:<id>" where the TSV says "<id>"
    store = EmbeddingStore.from_glob(f"{tmp_path / 'p'}/*.npy")
    vectors = next(store.blocks(store.rows))[1].astype(np.float32)
    ids = [f"wiki:{pid}" for pid in store.ids_of(np.arange(store.rows))]
    with open(tmp_path / "wiki_passages_0.pkl", "wb") as f:
        pickle.dump(list(zip(ids, vectors, strict=True)), f)
    shutil.rmtree(tmp_path / "run" / "index")
    run_cli(
        "index",
        "--embeddings",
        str(tmp_path / "wiki_passages_0.pkl"),
        "--out",
        str(tmp_path / "run" / "index"),
    )
    run_cli("eval", *args)
    prefixed = json.loads((tmp_path / "run" / "eval" / "metrics.json").read_text())
    assert {k: v for k, v in prefixed.items() if k != "measured"} == {
        k: v for k, v in encoded_metrics.items() if k != "measured"
    }
    # the run names each passage as the TSV (and so any qrels) does
    assert _run_pids(tmp_path / "run" / "eval" / "run.trec") == encoded_pids
    assert not any(pid.startswith("wiki:") for pid in encoded_pids)


def _run_pids(run: Path) -> list[str]:
    return [line.split()[2] for line in run.read_text().splitlines()]


def _expect_error(proc, *fragments: str) -> None:
    assert proc.returncode == 2, proc.stderr
    lines = proc.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("error: ") and "Traceback" not in proc.stderr
    for fragment in fragments:
        assert fragment in lines[0], lines[0]


def test_bad_input_is_one_line(encoded: Path, tmp_path: Path) -> None:
    mixed = tmp_path / "mixed"
    shutil.copytree(encoded / "p", mixed)
    write_shard(mixed / "zz-wide.npy", np.zeros((2, 65)), ["a", "b"])
    _expect_error(
        run_cli(
            "index", "--embeddings", f"{mixed}/*.npy", "--out", str(tmp_path / "i"), check=False
        ),
        "zz-wide.npy",
        "65 x float16",
    )
    (mixed / "zz-wide.npy").unlink()
    (mixed / "zz-wide.ids.txt").unlink()
    run_cli("index", "--embeddings", f"{mixed}/*.npy", "--out", str(tmp_path / "i"))
    write_shard(tmp_path / "q.npy", np.zeros((3, 7)), ["a", "b", "c"], "float32")
    _expect_error(
        run_cli(
            "search",
            "--index",
            str(tmp_path / "i"),
            "--query-embeddings",
            str(tmp_path / "q.npy"),
            "--out",
            str(tmp_path / "r.trec"),
            check=False,
        ),
        "(3, 7)",
        "64-d",
    )
    _expect_error(
        _search_refused(tmp_path, encoded, "--memory-gb", "0.05"),
        "a memory budget of 0.05 GB is too small",
        "give --memory-gb",
    )
    assert not (tmp_path / "r.trec").exists()
    _expect_error(
        run_cli(
            "index",
            "--embeddings",
            f"{mixed}/*.npy",
            "--out",
            str(tmp_path / "h"),
            "--type",
            "hnsw",
            "--memory-gb",
            "0.00001",
            check=False,
        ),
        "hnsw",
        "cannot be memory-mapped",
    )
    shard = next(mixed.glob("*-00001.npy"))
    shard.unlink()  # a shard the index recorded is gone
    _expect_error(
        _search_refused(tmp_path, encoded),
        shard.name,
        "no such shard",
    )


def test_eval_and_search_rank_the_same_questions_alike(tmp_path: Path) -> None:
    """A question is encoded one way: ``search --questions`` gives the very run ``eval`` wrote,
    with a question length (12) that is neither the model's saved one nor DPR's."""
    args = ["--config", "configs/toy.yaml", "--model", TINY, "-q", *toy_overrides(tmp_path)]
    args += ["--set", "model.max_query_length=12"]
    run_cli("index", *args)
    run_cli("eval", *args)
    run_cli(
        "search",
        "--index",
        str(tmp_path / "run" / "index"),
        "--questions",
        str(TOY / "dev.qa.tsv"),
        "--model",
        TINY,
        "--k",
        "100",
        "--out",
        str(tmp_path / "search.trec"),
    )
    searched = (tmp_path / "search.trec").read_text()
    assert searched == (tmp_path / "run" / "eval" / "run.trec").read_text()
    # negative control: the same questions cut at the model's own length rank otherwise
    run_cli(
        "encode",
        "--model",
        TINY,
        "--questions",
        str(TOY / "dev.qa.tsv"),
        "--pooling",
        "mean",
        "--max-length",
        "32",
        "--out",
        str(tmp_path / "q32"),
    )
    run_cli(
        "search",
        "--index",
        str(tmp_path / "run" / "index"),
        "--query-embeddings",
        str(tmp_path / "q32" / "questions.npy"),
        "--k",
        "100",
        "--out",
        str(tmp_path / "q32.trec"),
    )
    assert (tmp_path / "q32.trec").read_text() != searched


def test_a_beir_run_is_named_as_its_qrels(tmp_path: Path) -> None:
    """``search --questions`` and ``encode --questions`` name a BEIR set's questions by its
    query ids (``questions.ids.txt``), so its qrels judge the run."""
    beir = tmp_path / "beir"
    run_cli("data", "beir", str(REPO / "data" / "beir-sample"), "--out", str(beir))
    args = ["--config", "configs/toy.yaml", "--model", TINY, "-q", *toy_overrides(tmp_path)]
    args += ["--set", f"data.passages={beir / 'passages.tsv'}"]
    run_cli("index", *args)
    run_cli(
        "search",
        "--index",
        str(tmp_path / "run" / "index"),
        "--questions",
        str(beir / "questions.tsv"),
        "--model",
        TINY,
        "--k",
        "5",
        "--out",
        str(tmp_path / "run.trec"),
    )
    judged = read_qrels(beir / "qrels.trec")
    ids = (beir / "questions.ids.txt").read_text().splitlines()
    assert list(_run(tmp_path / "run.trec")) == ids and set(ids) == set(judged)
    run_cli(
        "encode",
        "--model",
        TINY,
        "--questions",
        str(beir / "questions.tsv"),
        "--out",
        str(tmp_path / "q"),
    )
    assert (tmp_path / "q" / "questions.ids.txt").read_text().splitlines() == ids


def _search_refused(tmp_path: Path, encoded: Path, *flags: str):
    """``search`` of the encoded questions in ``tmp_path/i`` into ``tmp_path/r.trec``, expected
    to fail: the finished process."""
    queries = str(encoded / "q" / "questions.npy")
    index, out = str(tmp_path / "i"), str(tmp_path / "r.trec")
    return run_cli(
        "search", "--index", index, "--query-embeddings", queries, *flags, "--out", out, check=False
    )


def test_what_would_destroy_an_input_or_give_an_empty_run_is_refused(encoded, tmp_path) -> None:
    """An output into the index or over the query ids, query vectors that are not finite, a
    budget or knob out of range: one line, exit 2, the inputs as they were."""
    index = tmp_path / "i"
    run_cli("index", "--embeddings", f"{encoded / 'p'}/*.npy", "--out", str(index))
    queries = tmp_path / "q"
    shutil.copytree(encoded / "q", queries)
    vectors = queries / "questions.npy"
    before = {p: p.read_bytes() for p in [*index.iterdir(), *queries.iterdir()]}
    bad = tmp_path / "nan.npy"
    rows = np.load(vectors).astype(np.float32)
    rows[2, 1] = np.nan
    write_shard(bad, rows, [str(i) for i in range(len(rows))], "float32")
    on_index = ["search", "--index", str(index)]
    search = [*on_index, "--query-embeddings", str(vectors)]
    out = ["--out", str(tmp_path / "r.trec")]
    run = [*search, *out]
    shallow = ["--fusion", "linear", "--fusion-depth", "3", "--k", "50"]
    cases = {
        "must not go into the index": [*search, "--out", str(index / "meta.json")],
        "must not overwrite the query ids": [*search, "--out", str(queries / "questions.ids.txt")],
        "nan.npy: row 2 is not finite": [*on_index, "--query-embeddings", str(bad), *out],
        "--memory-gb: Input should be a finite number": [*run, "--memory-gb", "inf"],
        "--nprobe: Input should be greater than or equal to 1": [*run, "--nprobe", "0"],
        "--fusion-depth: 3 candidates a side cannot fill": [*run, *shallow],
    }
    for message, args in cases.items():
        _expect_error(run_cli(*args, check=False), message)
    assert {p: p.read_bytes() for p in before} == before
    assert not (tmp_path / "r.trec").exists()


def test_export_refuses_a_folder_it_would_wipe(tmp_path) -> None:
    """export writes its folder whole: one holding the model, or other files, is refused as it
    was; an earlier export's is replaced (the control)."""
    run = tmp_path / "run"
    shutil.copytree(TOY / "tiny-bert", run / "model")
    (run / "config.yaml").write_text("kept: yes\n")
    other = tmp_path / "other"
    other.mkdir()
    (other / "notes.txt").write_text("mine\n")
    model = str(run / "model")
    for out, message in [
        (run / "model", "holds the model (--model), which writing it would remove"),
        (run, "holds the model (--model), which writing it would remove"),
        (other, "holds notes.txt, which writing it would remove"),
    ]:
        before = {p: p.read_bytes() for p in out.rglob("*") if p.is_file()}
        _expect_error(run_cli("export", "--model", model, "--out", str(out), check=False), message)
        assert {p: p.read_bytes() for p in out.rglob("*") if p.is_file()} == before
    exported = tmp_path / "exported"
    for _ in range(2):  # a new folder, then the same export again over it
        run_cli("export", "--model", model, "--out", str(exported))
    assert sorted(p.name for p in exported.iterdir()) == ["ctx_encoder", "question_encoder"]
