"""A command's output that would overwrite the passages file an index records (the one ``mine``,
``score --teacher hybrid`` and ``search --fusion`` read when no --passages is given) is refused
with one line before any work, the file left as it was."""

from __future__ import annotations

import shutil
from pathlib import Path

import numpy as np
import pytest
from typer.testing import CliRunner

from dpr_cache.cli import app
from dpr_cache.retrieval.dense.index import recorded_passages
from dpr_cache.retrieval.drivers.index import build_index


@pytest.fixture(scope="module")
def indexed(corpus, make_config, tmp_path_factory) -> dict[str, Path]:
    """An index of a copy of the test corpus's passages (the copy is what the index records)."""
    root = tmp_path_factory.mktemp("outputs")
    passages = root / "passages.tsv"
    shutil.copy(corpus["root"] / "passages.tsv", passages)
    config = make_config(corpus, root / "run")
    config = config.model_copy(
        update={"data": config.data.model_copy(update={"passages": str(passages)})}
    )
    build_index(config, progress=False)
    train = root / "train.jsonl"
    train.write_text(
        '{"question": "where is code0?", "answers": ["code0"], '
        '"positive_ctxs": [{"title": "t", "text": "code0", "passage_id": "p0"}]}\n'
    )
    run = root / "run"
    return {"index": run / "index", "passages": passages, "train": train, "model": run / "model"}


def test_the_index_records_the_copy(indexed) -> None:
    assert recorded_passages(indexed["index"]).resolve() == indexed["passages"].resolve()
    assert recorded_passages(indexed["index"].parent / "nowhere") is None  # control


@pytest.mark.parametrize("command", ["mine", "score", "search"])
def test_an_output_naming_the_indexs_passages_is_refused(indexed, command, tmp_path) -> None:
    index, passages, model = (str(indexed[k]) for k in ("index", "passages", "model"))
    queries = tmp_path / "q.npy"
    np.save(queries, np.zeros((1, 4), dtype=np.float32))
    train = ["--train", str(indexed["train"]), "-q"]
    words = {
        "mine": ["mine", "--model", model, "--index", index, *train],
        "score": ["score", "--teacher", "hybrid", "--model", model, "--index", index, *train],
        "search": ["search", "--index", index, "--query-embeddings", str(queries)]
        + ["--fusion", "linear"],
    }[command]
    before = indexed["passages"].read_bytes()
    result = CliRunner().invoke(app, [*words, "--out", passages])
    assert result.exit_code == 2, result.output
    assert result.output.strip() == (
        f"error: {passages}: the output must not overwrite the passages file"
    )
    assert indexed["passages"].read_bytes() == before
    assert not any(p.name.endswith(".lock") for p in indexed["passages"].parent.iterdir())
