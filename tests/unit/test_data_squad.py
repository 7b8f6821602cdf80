"""The SQuAD build reproduces the shared squad1.1-dev files byte for byte."""

from __future__ import annotations

import gzip
import hashlib
import json
from pathlib import Path

import pytest

from dpr_cache.data.passages import read_passages
from dpr_cache.data.qas import read_qas
from dpr_cache.data.squad import build_squad
from dpr_cache.data.training import iter_training_examples
from dpr_cache.errors import InputError

REPO = Path(__file__).resolve().parents[2]
SOURCE = REPO / "data" / "squad" / "dev-v1.1.json.gz"
SHARED = REPO.parent / "shared" / "data" / "squad1.1-dev"
FILES = ["passages.tsv", "train.jsonl", "dev.jsonl", "dev.qa.tsv"]


def test_committed_source_is_the_official_file() -> None:
    digest = hashlib.sha256(gzip.decompress(SOURCE.read_bytes())).hexdigest()
    assert digest == "95aa6a52d5d6a735563366753ca50492a658031da74f301ac5238b03966972c9"


@pytest.fixture(scope="module")
def built(tmp_path_factory) -> tuple[Path, dict]:
    out = tmp_path_factory.mktemp("squad")
    return out, build_squad(SOURCE, out)


def test_counts(built) -> None:
    _, counts = built
    assert counts == {"articles": 48, "passages": 2067, "train": 7793, "dev": 2777}


@pytest.mark.skipif(not SHARED.is_dir(), reason="../shared is not present")
@pytest.mark.parametrize("name", FILES)
def test_equals_shared_files(built, name: str) -> None:
    out, _ = built
    assert (out / name).read_bytes() == (SHARED / name).read_bytes()


def test_outputs_read_back_with_the_project_readers(built) -> None:
    out, _ = built
    passages = {pid: (text, title) for pid, text, title in read_passages(out / "passages.tsv")}
    assert len(passages) == 2067 and passages["1"][1] == "Super Bowl 50"
    dev = list(iter_training_examples(out / "dev.jsonl"))
    qas = read_qas(out / "dev.qa.tsv")
    assert [(e["question"], e["answers"]) for e in dev] == qas
    for e in dev[:50]:
        pos = e["positive_ctxs"][0]
        assert passages[pos["passage_id"]] == (pos["text"], pos["title"])
        assert all(a in pos["text"] for a in e["answers"])


def test_bad_source(tmp_path: Path) -> None:
    bad = tmp_path / "x.json"
    bad.write_text(json.dumps({"version": "1.1"}))
    with pytest.raises(InputError, match=r"x\.json: not a SQuAD v1\.1 JSON file"):
        build_squad(bad, tmp_path / "out")
