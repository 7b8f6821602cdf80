"""The SQuAD build reproduces the published squad1.1-dev files (DPR's formats) byte for byte.

Their sha256 digests are pinned below, so the check runs anywhere, without the published copy.
"""

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
from tests.support.fixtures import SQUAD_SOURCE as SOURCE

PUBLISHED_SHA256 = {  # the squad1.1-dev files published in DPR's formats
    "passages.tsv": "58b84e23c6d4b0d48c2874d1c7a25c7bfbcdb75a1fcd33b622302e91172c7f13",
    "train.jsonl": "9d930979b2ea33c73d1cbc642d39393e99bd31491a43335737e25e5890c96f74",
    "dev.jsonl": "0cb769c528149b322158d1b2ba29319552333f1f7530e2a8f372d4b129413c90",
    "dev.qa.tsv": "b2baa7361d5a459e67cd6f7c37490d3e5756a769a547f1e823341bfece4d55d7",
}


def test_committed_source_is_the_official_file() -> None:
    digest = hashlib.sha256(gzip.decompress(SOURCE.read_bytes())).hexdigest()
    assert digest == "95aa6a52d5d6a735563366753ca50492a658031da74f301ac5238b03966972c9"


@pytest.fixture
def built(squad_build) -> tuple[Path, dict]:
    return squad_build


def test_counts(built) -> None:
    _, counts = built
    assert counts == {"articles": 48, "passages": 2067, "train": 7793, "dev": 2777}


@pytest.mark.parametrize("name", sorted(PUBLISHED_SHA256))
def test_equals_the_published_files(built, name: str) -> None:
    out, _ = built
    assert hashlib.sha256((out / name).read_bytes()).hexdigest() == PUBLISHED_SHA256[name]


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
