"""Build DPR-format retrieval files from SQuAD v1.1's official dev file.

One passage per paragraph (ids 1..N in file order), articles split train/dev by index
(article i is dev when i % 4 == 3), as described in ``data/squad/README.md``.
"""

from __future__ import annotations

import csv
import json
import re
from pathlib import Path
from typing import Any, TextIO

from dpr_cache.data.files import open_text
from dpr_cache.data.qas import qas_line
from dpr_cache.errors import InputError
from dpr_cache.runtime.atomic import write_many_atomic

_TABS_NEWLINES = re.compile(r"[\t\r\n]")


def is_dev_article(index: int) -> bool:
    """Article ``index`` (0-based, file order) belongs to the dev split."""
    return index % 4 == 3


def _load(source: Path) -> list[dict[str, Any]]:
    try:
        with open_text(source) as f:
            articles = json.load(f)["data"]
    except (ValueError, KeyError, TypeError) as e:
        raise InputError(f"{source}: not a SQuAD v1.1 JSON file ({e})") from None
    if not isinstance(articles, list):
        raise InputError(f"{source}: key 'data' must be a list of articles")
    return articles


def _distinct(items: list[str]) -> list[str]:
    return list(dict.fromkeys(items))


def _write_jsonl(f: TextIO, obj: dict[str, Any]) -> None:
    f.write(json.dumps(obj, ensure_ascii=False) + "\n")


def build_squad(source_json_gz: Path, out_dir: Path) -> dict[str, int]:
    """Write passages.tsv, train.jsonl, dev.jsonl and dev.qa.tsv into ``out_dir``.

    ``source_json_gz`` is SQuAD's ``dev-v1.1.json`` (plain or gzipped). Returns counts of
    articles, passages and questions per split.
    """
    articles = _load(Path(source_json_gz))
    out_dir = Path(out_dir)
    names = ("passages.tsv", "train.jsonl", "dev.jsonl", "dev.qa.tsv")
    counts = {"articles": len(articles), "passages": 0, "train": 0, "dev": 0}

    def write(tmps: list[Path]) -> None:
        with (
            open(tmps[0], "w", encoding="utf-8", newline="") as psg_f,
            open(tmps[1], "w", encoding="utf-8", newline="\n") as train_f,
            open(tmps[2], "w", encoding="utf-8", newline="\n") as dev_f,
            open(tmps[3], "w", encoding="utf-8", newline="\n") as qa_f,
        ):
            _write_splits(articles, counts, psg_f, train_f, dev_f, qa_f)

    write_many_atomic([out_dir / name for name in names], write)
    return counts


def _write_splits(articles, counts, psg_f, train_f, dev_f, qa_f) -> None:
    """One passage per paragraph into ``psg_f``; each question into its split's files."""
    passages = csv.writer(psg_f, delimiter="\t", lineterminator="\n")
    passages.writerow(["id", "text", "title"])
    for a, article in enumerate(articles):
        title = article["title"].replace("_", " ")
        dev = is_dev_article(a)
        for paragraph in article["paragraphs"]:
            counts["passages"] += 1
            pid = str(counts["passages"])
            text = _TABS_NEWLINES.sub(" ", paragraph["context"])
            passages.writerow([pid, text, title])
            ctx = {"passage_id": pid, "title": title, "text": text}
            for qa in paragraph["qas"]:
                question = " ".join(qa["question"].split())
                answers = _distinct([ans["text"] for ans in qa["answers"]])
                example = {
                    "id": qa["id"],
                    "question": question,
                    "answers": answers,
                    "positive_ctxs": [ctx],
                    "hard_negative_ctxs": [],
                    "negative_ctxs": [],
                }
                _write_jsonl(dev_f if dev else train_f, example)
                counts["dev" if dev else "train"] += 1
                if dev:
                    qa_f.write(qas_line(question, answers))
