"""Training data in the layouts people keep it in, read as DPR records.

- ``dpr``: DPR's records (``question``, ``answers``, ``positive_ctxs``, ``hard_negative_ctxs``,
  ``negative_ctxs``), as DPR writes them.
- ``sentence_transformers``: a column a text: the question (``anchor``, ``query`` or
  ``question``), its passage (``positive``, ``pos``, ``answer`` or ``document``) and negatives
  (``negative``, ``negatives``, ``negative_1`` .. ``negative_n``), each a string or a list of
  strings; columns with none of these names are taken by position, as sentence-transformers
  takes them (the first the question, the second the passage, the rest negatives).
- ``tevatron``: ``query`` (or ``query_text``), ``positive_passages`` and ``negative_passages``,
  lists of ``{docid, title, text}``.
- ``beir``: a BEIR folder (``corpus.jsonl``, ``queries.jsonl``, ``qrels/<split>.tsv``): each judged
  query with its passages judged above 0 as positives and those judged 0 as hard negatives.

Any of the first three in JSON Lines, a JSON array, Parquet, CSV or a ``save_to_disk`` folder
(:mod:`dpr_cache.data.records`); the layout is recognised from the first row's columns unless
named, after the columns are renamed by a mapping (``{file's column: layout's column}``). A
passage without an id is given one from its title and text
(:func:`~dpr_cache.data.ids.derived_passage_id`) when the record is cleaned."""

from __future__ import annotations

import re
import tempfile
from collections.abc import Iterator, Mapping
from pathlib import Path
from typing import Any

from dpr_cache.data.beir import read_qrels
from dpr_cache.data.files import check_file
from dpr_cache.data.records import iter_rows
from dpr_cache.errors import InputError

__all__ = ["LAYOUTS", "is_beir_folder", "iter_dpr_records", "layout_of"]

LAYOUTS = ("dpr", "sentence_transformers", "tevatron", "beir")

_ANCHOR = ("anchor", "query", "question")
_POSITIVE = ("positive", "pos", "answer", "document")
_NEGATIVE = ("negative", "negatives", "neg")
_NUMBERED = re.compile(r"^(negative|neg)_(\d+)$")
_IGNORED = ("label", "score", "id", "query_id", "idx")  # not texts (sentence-transformers' too)


def is_beir_folder(path: Path) -> bool:
    """True for a folder laid out as BEIR's (``corpus.jsonl``, ``queries.jsonl``, ``qrels/``)."""
    path = Path(path)
    return path.is_dir() and (path / "corpus.jsonl").exists() and (path / "qrels").is_dir()


def layout_of(row: Mapping[str, Any], where: str) -> str:
    """The layout a (renamed) row's columns say it is in; InputError naming ``where`` when they
    say none."""
    keys = set(row)
    if "positive_ctxs" in keys:
        return "dpr"
    if "positive_passages" in keys:
        return "tevatron"
    if keys & set(_ANCHOR) and keys & set(_POSITIVE):
        return "sentence_transformers"
    if "question" in keys:  # DPR's, its positive_ctxs missing: said when the record is cleaned
        return "dpr"
    shown = ", ".join(sorted(keys)[:8]) or "none"
    raise InputError(
        f"{where}: columns ({shown}) are none of DPR's (question, positive_ctxs), tevatron's "
        "(query, positive_passages) or sentence-transformers' (anchor, positive): name the "
        "layout (format:) or rename the columns (columns:)"
    )


def iter_dpr_records(
    path: Path,
    *,
    layout: str | None = None,
    columns: Mapping[str, str] | None = None,
    split: str = "train",
) -> Iterator[tuple[str, Any]]:
    """Each record of ``path`` as ``(where, DPR record)``: a DPR file's records as they are,
    another layout's converted (``where`` names the file's row). ``layout`` None: recognised."""
    path = Path(path)
    if layout == "beir" or (layout is None and is_beir_folder(path)):
        yield from _beir_records(path, split)
        return
    columns = dict(columns or {})
    for where, row in iter_rows(path, split=split):
        where = f"{path} {where}"
        if not isinstance(row, dict):
            raise InputError(f"{where}: expected an object, got {type(row).__name__}")
        if columns:
            row = _renamed(row, columns, where)
        if layout is None:
            layout = layout_of(row, where)
        yield where.removeprefix(f"{path} "), _CONVERT[layout](row, where)


def _renamed(row: dict[str, Any], columns: Mapping[str, str], where: str) -> dict[str, Any]:
    missing = [c for c in columns if c not in row]
    if missing:
        raise InputError(f"{where}: no column '{missing[0]}' (named in columns:)")
    return {columns.get(key, key): value for key, value in row.items()}


def _dpr(row: dict[str, Any], where: str) -> dict[str, Any]:
    return row


def _tevatron(row: dict[str, Any], where: str) -> dict[str, Any]:
    question = row.get("query", row.get("query_text"))
    if question is None:
        raise InputError(f"{where}: no column 'query' (tevatron's question)")
    out = {"question": question, "answers": row.get("answers") or []}
    for key, ours in (("positive_passages", "positive_ctxs"), ("negative_passages", None)):
        value = row.get(key) or []
        if not isinstance(value, list):
            raise InputError(f"{where}: column '{key}' must be a list of passages")
        ctxs = []
        for j, passage in enumerate(value):
            if not isinstance(passage, dict) or "text" not in passage:
                raise InputError(f"{where}: {key}[{j}] must be an object with a 'text'")
            ctx = {"title": passage.get("title") or "", "text": passage["text"]}
            if passage.get("docid") not in (None, ""):
                ctx["passage_id"] = str(passage["docid"])
            ctxs.append(ctx)
        out[ours or "hard_negative_ctxs"] = ctxs
    return out


def _st(row: dict[str, Any], where: str) -> dict[str, Any]:
    anchor = next((k for k in _ANCHOR if k in row), None)
    positive = next((k for k in _POSITIVE if k in row), None)
    if anchor is None or positive is None:  # sentence-transformers' own rule: by position
        texts = [k for k in row if k not in _IGNORED]
        if len(texts) < 2:
            raise InputError(f"{where}: a question and a passage column are needed, found {texts}")
        anchor, positive, negatives = texts[0], texts[1], texts[2:]
    else:
        numbered = sorted(
            (int(m.group(2)), k) for k in row if (m := _NUMBERED.match(k)) is not None
        )
        negatives = [k for k in _NEGATIVE if k in row] + [k for _, k in numbered]
    return {
        "question": _text(row, anchor, where),
        "answers": [],
        "positive_ctxs": [{"title": "", "text": _text(row, positive, where)}],
        "hard_negative_ctxs": [
            {"title": "", "text": text} for key in negatives for text in _texts(row, key, where)
        ],
    }


def _text(row: dict[str, Any], key: str, where: str) -> str:
    value = row[key]
    if not isinstance(value, str) or not value.strip():
        raise InputError(f"{where}: column '{key}' must be a text, got {value!r:.40}")
    return value


def _texts(row: dict[str, Any], key: str, where: str) -> list[str]:
    value = row[key]
    if value is None or value == "":
        return []
    values = value if isinstance(value, list) else [value]
    for text in values:
        if not isinstance(text, str):
            raise InputError(f"{where}: column '{key}' must hold texts, got {text!r:.40}")
    return [t for t in values if t.strip()]


_CONVERT = {"dpr": _dpr, "sentence_transformers": _st, "tevatron": _tevatron}


# -- BEIR ------------------------------------------------------------------------------------


def _beir_records(folder: Path, split: str) -> Iterator[tuple[str, Any]]:
    """A BEIR folder's judged queries as DPR records, in ``queries.jsonl``'s order. The judged
    passages are copied once from the corpus into a memory-mapped Arrow file: memory grows with
    the judgments, never with the corpus."""
    import pyarrow as pa

    if not Path(folder).is_dir() or not is_beir_folder(folder):
        raise InputError(f"{folder}: not a BEIR folder (corpus.jsonl, queries.jsonl, qrels/)")
    qrels_path = check_file(Path(folder) / "qrels" / f"{split}.tsv")
    qrels = read_qrels(qrels_path)
    with tempfile.TemporaryDirectory(prefix="beir-") as tmp:
        judged, rows = _judged_passages(folder / "corpus.jsonl", qrels, Path(tmp) / "judged")
        lost = next((d for docs in qrels.values() for d, _ in docs if d not in rows), None)
        if lost is not None:
            raise InputError(f"{qrels_path}: corpus-id {lost!r} is not in corpus.jsonl")
        table = pa.ipc.open_file(pa.memory_map(str(judged))).read_all()
        seen = set()
        for where, obj in _jsonl(folder / "queries.jsonl"):
            qid = str(obj.get("_id"))
            if qid not in qrels or qid in seen:
                continue
            seen.add(qid)
            ctxs = {True: [], False: []}
            for doc, grade in qrels[qid]:
                i = rows[doc]
                ctx = {"passage_id": doc, "title": table["title"][i].as_py()}
                ctx["text"] = table["text"][i].as_py()
                ctxs[grade > 0].append(ctx)
            yield (
                f"queries.jsonl {where}",
                {
                    "question": str(obj.get("text", "")),
                    "answers": [],
                    "positive_ctxs": ctxs[True],
                    "hard_negative_ctxs": ctxs[False],
                },
            )
        missing = next((q for q in qrels if q not in seen), None)
        if missing is not None:
            raise InputError(f"{folder / 'queries.jsonl'}: no text for judged query {missing!r}")


def _judged_passages(
    corpus: Path, qrels: Mapping[str, list[tuple[str, int]]], dest: Path
) -> tuple[Path, dict[str, int]]:
    """The corpus's judged passages written to an Arrow file at ``dest``, and each one's row."""
    import pyarrow as pa

    wanted = {doc for docs in qrels.values() for doc, _ in docs}
    schema = pa.schema([("title", pa.string()), ("text", pa.string())])
    rows: dict[str, int] = {}
    buf: list[dict[str, str]] = []
    with pa.OSFile(str(dest), "wb") as sink, pa.ipc.new_file(sink, schema) as writer:
        for where, obj in _jsonl(corpus):
            if "_id" not in obj:
                raise InputError(f"{corpus} {where}: no '_id'")
            doc = str(obj["_id"])
            if doc in wanted and doc not in rows:
                rows[doc] = len(rows)
                buf.append(
                    {"title": str(obj.get("title") or ""), "text": str(obj.get("text") or "")}
                )
                if len(buf) >= 1024:
                    writer.write_batch(pa.RecordBatch.from_pylist(buf, schema=schema))
                    buf = []
        writer.write_batch(pa.RecordBatch.from_pylist(buf, schema=schema))
    return dest, rows


def _jsonl(path: Path) -> Iterator[tuple[str, Any]]:
    from dpr_cache.data.training import iter_raw

    return iter_raw(check_file(path))
