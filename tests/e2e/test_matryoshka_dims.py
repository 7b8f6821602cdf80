"""Retrieval at a Matryoshka dim through the real CLI: ``encode``, ``index`` (``--config`` and
``--embeddings``), ``search`` and ``eval`` with ``--dim`` / ``index.dim`` give the vectors cut to
their first D dims and re-normalized (checked against numpy on the full-width vectors), the
index records D, and every contradiction is one line with exit 2."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest

from dpr_cache.retrieval.dense.store import EmbeddingStore
from tests.support.cli import run_cli, toy_overrides
from tests.support.fixtures import REPO, TOY

D = 16


@pytest.fixture(scope="module")
def model_dir(tmp_path_factory) -> Path:
    """The toy BERT saved as a normalizing model (as a Matryoshka run of it would save)."""
    from dpr_cache.model.biencoder import BiEncoder

    out = tmp_path_factory.mktemp("mrl") / "model"
    model = BiEncoder.from_pretrained(TOY / "tiny-bert", pooling="mean", normalize=True)
    model.max_query_length, model.max_passage_length = 32, 128
    model.save_pretrained(out)
    return out


@pytest.fixture(scope="module")
def vectors(model_dir: Path) -> dict[str, Path]:
    """Passages and questions encoded at the full width and at D."""
    root = model_dir.parent
    out = {}
    for name, dim in (("full", None), ("cut", D)):
        extra = [] if dim is None else ["--dim", str(dim)]
        for side, flag, source in (
            ("p", "--passages", "passages.tsv"),
            ("q", "--questions", "dev.qa.tsv"),
        ):
            folder = root / f"{side}-{name}"
            run_cli(
                "encode",
                "--model",
                str(model_dir),
                flag,
                str(TOY / source),
                "--out",
                str(folder),
                "--cache-dir",
                str(root / "cache"),
                "-q",
                *extra,
            )
            out[f"{side}-{name}"] = folder
    return out


def _rows(folder: Path) -> np.ndarray:
    store = EmbeddingStore.from_glob(f"{folder}/*.npy")
    return np.concatenate([b.copy() for _, b in store.blocks(10_000)])


def _cut(full: np.ndarray, dim: int) -> np.ndarray:
    head = full[:, :dim]
    return head / np.linalg.norm(head, axis=1, keepdims=True)


def test_encode_at_a_dim_is_the_full_vector_cut_and_renormalized(vectors) -> None:
    for side in ("p", "q"):
        full, cut = _rows(vectors[f"{side}-full"]), _rows(vectors[f"{side}-cut"])
        assert cut.shape == (full.shape[0], D)
        np.testing.assert_allclose(cut, _cut(full, D), atol=2e-3)  # float16 passages
    record = json.loads((vectors["q-cut"] / "encode.json").read_text())
    assert record["dim"] == D


def _top(run: Path) -> dict[str, list[str]]:
    out: dict[str, list[str]] = {}
    for line in run.read_text().splitlines():
        qid, _, pid, *_ = line.split()
        out.setdefault(qid, []).append(pid)
    return out


def test_index_of_embeddings_cut_to_a_dim_searches_as_numpy(vectors, tmp_path: Path) -> None:
    run_cli(
        "index",
        "--embeddings",
        f"{vectors['p-full']}/*.npy",
        "--out",
        str(tmp_path / "ix"),
        "--dim",
        str(D),
    )
    meta = json.loads((tmp_path / "ix" / "meta.json").read_text())
    assert meta["dim"] == D and meta["cut_from"] == 64
    run_cli(
        "search",
        "--index",
        str(tmp_path / "ix"),
        "--query-embeddings",
        str(vectors["q-full"] / "questions.npy"),
        "--dim",
        str(D),
        "--k",
        "5",
        "--out",
        str(tmp_path / "run.trec"),
    )
    passages, questions = _cut(_rows(vectors["p-full"]), D), _cut(_rows(vectors["q-full"]), D)
    store = EmbeddingStore.from_glob(f"{vectors['p-full']}/*.npy")
    ids = store.ids_of(np.arange(store.rows))
    want = np.argsort(-(questions @ passages.T), axis=1, kind="stable")[:, :5]
    got = _top(tmp_path / "run.trec")
    agree = [got[str(i)][0] == ids[want[i, 0]] for i in range(len(questions))]
    assert np.mean(agree) >= 0.99  # float16 ties aside


@pytest.fixture(scope="module")
def indexed(model_dir: Path, tmp_path_factory) -> Path:
    out = tmp_path_factory.mktemp("mrl-run")
    sets = toy_overrides(out, output_dir=str(out), **{"index.dim": D})
    run_cli(
        "index", "--config", str(REPO / "configs/toy.yaml"), "--model", str(model_dir), *sets, "-q"
    )
    return out


def _eval_sets(run: Path) -> list[str]:
    return ["--set", f"output_dir={run}", "--set", f"data.cache_dir={run / 'cache'}"]


def test_eval_at_the_index_s_dim_and_the_index_records_it(indexed, model_dir) -> None:
    meta = json.loads((indexed / "index" / "meta.json").read_text())
    assert meta["dim"] == D and meta["model"]["dim"] == D
    sets = _eval_sets(indexed)
    run_cli(
        "eval", "--config", str(REPO / "configs/toy.yaml"), "--model", str(model_dir), *sets, "-q"
    )
    metrics = json.loads((indexed / "eval" / "metrics.json").read_text())
    assert metrics["n_questions"] == 263


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["eval", "--dim", "32"], "index.dim (--dim): 32, but the index was built with 16"),
        (["search", "--dim", "8"], "index.dim (--dim): 8, but the index was built with 16"),
        (["encode", "--dim", "65"], "index.dim (--dim): 65 is not a width"),
        (["index-embeddings", "--dim", "99"], "--dim 99:"),
        (["search-vectors", "--dim", "8"], "--dim 8: the index at"),
    ],
)
def test_a_dim_that_contradicts_is_one_line(indexed, model_dir, vectors, tmp_path, args, message):
    command, *flags = args
    sets = _eval_sets(indexed)
    if command == "eval":
        full = [
            "eval",
            "--config",
            str(REPO / "configs/toy.yaml"),
            "--model",
            str(model_dir),
            *sets,
        ]
    elif command == "search":
        full = [
            "search",
            "--index",
            str(indexed / "index"),
            "--questions",
            str(TOY / "dev.qa.tsv"),
            "--model",
            str(model_dir),
            "--out",
            str(tmp_path / "r.trec"),
        ]
    elif command == "encode":
        full = [
            "encode",
            "--model",
            str(model_dir),
            "--questions",
            str(TOY / "dev.qa.tsv"),
            "--out",
            str(tmp_path / "q"),
        ]
    elif command == "index-embeddings":
        full = ["index", "--embeddings", f"{vectors['p-full']}/*.npy", "--out", str(tmp_path / "i")]
    else:
        full = [
            "search",
            "--index",
            str(indexed / "index"),
            "--query-embeddings",
            str(vectors["q-full"] / "questions.npy"),
            "--out",
            str(tmp_path / "r.trec"),
        ]
    proc = run_cli(*full, *flags, check=False)
    assert proc.returncode == 2, proc.stderr[-2000:]
    lines = proc.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("error: ") and message in lines[0], lines
    assert not (tmp_path / "r.trec").exists() and not (tmp_path / "i").exists()
