"""DPR training files (a JSON array or JSON Lines, maybe gzipped) streamed into an Arrow cache."""

from __future__ import annotations

import json
import logging
import math
from collections.abc import Iterator
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import IO, Any

import ijson
import pyarrow as pa
from datasets import Dataset, Features

from dpr_cache.data.arrow_cache import cache_file, open_arrow, read_meta, write_arrow
from dpr_cache.data.files import open_binary
from dpr_cache.data.ids import derived_passage_id
from dpr_cache.errors import InputError

log = logging.getLogger(__name__)

CTX_KEYS = ("positive_ctxs", "hard_negative_ctxs", "negative_ctxs")
# Keys that DPR-style files use for a passage's id, in order of preference.
_ID_KEYS = ("passage_id", "psg_id", "id", "docid")
_CTX = pa.struct(
    [
        ("title", pa.string()),
        ("text", pa.string()),
        ("passage_id", pa.string()),
        ("teacher_score", pa.float64()),  # null where the file gives none
    ]
)
TRAIN_FEATURES = Features.from_arrow_schema(
    pa.schema(
        [("question", pa.string()), ("answers", pa.list_(pa.string()))]
        + [(key, pa.list_(_CTX)) for key in CTX_KEYS]
    )
)


@dataclass
class ParseStats:
    """Counts gathered while reading a training file, and where its teacher scores run short:
    the first kept record whose positive or one of whose hard negatives has no
    ``teacher_score`` (``where: key[j]``), and the fewest hard negatives a kept record has."""

    read: int = 0
    kept: int = 0
    dropped_no_positive: int = 0
    unscored: str | None = None
    fewest_hard_negatives: int | None = None
    fewest_where: str | None = None

    def count_teacher(self, example: dict[str, Any], where: str) -> None:
        """Note a kept example's teacher scores and hard negatives."""
        if self.unscored is None:
            ctxs = [("positive_ctxs", 0, example["positive_ctxs"][0])]
            ctxs += [
                ("hard_negative_ctxs", j, c) for j, c in enumerate(example["hard_negative_ctxs"])
            ]
            for key, j, ctx in ctxs:
                if ctx.get("teacher_score") is None:
                    self.unscored = f"{where}: {key}[{j}]"
                    break
        n = len(example["hard_negative_ctxs"])
        if self.fewest_hard_negatives is None or n < self.fewest_hard_negatives:
            self.fewest_hard_negatives, self.fewest_where = n, where


def _short(err: Exception) -> str:
    """An exception message squeezed onto one short line."""
    text = " ".join(str(err).split())
    return text if len(text) <= 120 else text[:117] + "..."


def _first_char(path: Path) -> str:
    """The first non-whitespace character of the (decompressed) file, '' if there is none."""
    with open_binary(path) as f:
        while chunk := f.read(4096):
            stripped = chunk.lstrip(b" \t\r\n\xef\xbb\xbf")
            if stripped:
                return chr(stripped[0])
    return ""


def _skip_bom(f: IO[bytes]) -> IO[bytes]:
    if f.read(3) != b"\xef\xbb\xbf":
        f.seek(0)
    return f


def _iter_jsonl(path: Path) -> Iterator[tuple[str, Any]]:
    with open_binary(path) as f:
        for n, line in enumerate(f, start=1):
            if n == 1 and line.startswith(b"\xef\xbb\xbf"):
                line = line[3:]
            if not line.strip():
                continue
            try:
                yield f"line {n}", json.loads(line.rstrip(b"\r\n"))
            except (ValueError, UnicodeDecodeError) as e:
                msg = _json_error(e) if isinstance(e, json.JSONDecodeError) else _short(e)
                raise InputError(f"{path} line {n}: not valid JSON ({msg})") from None


def _json_error(e: json.JSONDecodeError) -> str:
    """What is wrong and where in the line (``msg`` alone may end in a bare "at")."""
    return f"{e.msg.removesuffix(' at')} at column {e.colno}"


def _iter_json_array(path: Path) -> Iterator[tuple[str, Any]]:
    with open_binary(path) as f:
        done = 0
        try:
            for obj in ijson.items(_skip_bom(f), "item", use_float=True):
                yield f"item {done}", obj
                done += 1
        except ijson.JSONError as e:
            raise InputError(f"{path} item {done}: not valid JSON ({_short(e)})") from None


def iter_raw(path: Path) -> Iterator[tuple[str, Any]]:
    """Yield ``(where, object)`` for each record; ``where`` is 'line N' (JSONL) or 'item I'."""
    path = Path(path)
    try:
        first = _first_char(path)
        if first == "[":
            yield from _iter_json_array(path)
        elif first == "{":
            yield from _iter_jsonl(path)
        elif not first:
            raise InputError(f"{path}: empty file")
        else:
            raise InputError(f"{path}: not DPR JSON or JSON Lines (starts with {first!r})")
    except (OSError, EOFError) as e:  # unreadable or truncated gzip, I/O errors
        raise InputError(f"{path}: cannot read ({_short(e)})") from None


def _ctxs(obj: dict, key: str, where: str) -> list[dict[str, str]]:
    raw = obj.get(key) or []
    if not isinstance(raw, list):
        raise InputError(f"{where}: key '{key}' must be a list")
    out = []
    for j, ctx in enumerate(raw):
        if not isinstance(ctx, dict) or "text" not in ctx:
            raise InputError(f"{where}: {key}[{j}] must be an object with a 'text'")
        title = "" if ctx.get("title") is None else str(ctx["title"])
        text = str(ctx["text"])
        pid = next((ctx[k] for k in _ID_KEYS if ctx.get(k) not in (None, "")), None)
        clean = {
            "title": title,
            "text": text,
            "passage_id": derived_passage_id(title, text) if pid is None else str(pid),
        }
        if ctx.get("teacher_score") is not None:
            clean["teacher_score"] = _teacher_score(ctx["teacher_score"], f"{where}: {key}[{j}]")
        out.append(clean)
    return out


FLOAT32_OVERFLOW = 2.0**128 - 2.0**103  # from here on a float64 rounds to float32's infinity


def _teacher_score(value: Any, where: str) -> float:
    """A ctx's ``teacher_score`` as a float finite in float32; InputError naming ``where``
    otherwise."""
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        raise InputError(f"{where}: teacher_score must be a number, got {value!r}")
    try:
        number = float(value)
    except OverflowError:  # an integer past float64's range
        raise InputError(f"{where}: teacher_score {str(value)[:12]}... is too large") from None
    if not math.isfinite(number):
        raise InputError(f"{where}: teacher_score is not finite ({value})")
    if abs(number) >= FLOAT32_OVERFLOW:
        raise InputError(
            f"{where}: teacher_score {number:.9g} is past float32's range (largest "
            "3.40282347e+38), the precision distillation's loss takes it in"
        )
    return number


def clean_example(obj: Any, where: str) -> dict[str, Any]:
    """Validate one record and keep only the fields training needs (``where`` names it)."""
    if not isinstance(obj, dict):
        raise InputError(f"{where}: expected a JSON object, got {type(obj).__name__}")
    for key in ("question", "positive_ctxs"):
        if key not in obj:
            raise InputError(f"{where}: missing key '{key}'")
    if not isinstance(obj["question"], str):
        raise InputError(f"{where}: key 'question' must be a string")
    answers = obj.get("answers") or []
    if not isinstance(answers, list):
        raise InputError(f"{where}: key 'answers' must be a list")
    example: dict[str, Any] = {"question": obj["question"], "answers": [str(a) for a in answers]}
    for key in CTX_KEYS:
        example[key] = _ctxs(obj, key, where)
    return example


@dataclass(frozen=True)
class Reading:
    """How a training source is read: its layout (None: recognised from its columns), its
    columns renamed (``{file's column: layout's column}``), and a ``datasets`` folder's or BEIR
    folder's split."""

    layout: str | None = None
    columns: tuple[tuple[str, str], ...] = ()
    split: str = "train"

    def key(self) -> str:
        """What the Arrow cache's name depends on besides the source's bytes."""
        return f"{self.layout}|{sorted(self.columns)}|{self.split}"

    def records(self, path: Path) -> Iterator[tuple[str, Any]]:
        """``path``'s records in DPR's form (:func:`~dpr_cache.data.layouts.iter_dpr_records`)."""
        from dpr_cache.data.layouts import iter_dpr_records

        columns = dict(self.columns)
        return iter_dpr_records(path, layout=self.layout, columns=columns, split=self.split)


def iter_training_examples(
    path: Path, stats: ParseStats | None = None, reading: Reading = Reading()
) -> Iterator[dict[str, Any]]:
    """Stream cleaned examples from a training source, skipping (and counting) those without a
    positive passage, as DPR does."""
    stats = stats if stats is not None else ParseStats()
    for where, obj in reading.records(path):
        example = clean_example(obj, f"{path} {where}")
        stats.read += 1
        if not example["positive_ctxs"]:
            stats.dropped_no_positive += 1
            continue
        stats.kept += 1
        stats.count_teacher(example, f"{path} {where}")
        yield example


def load_training_set(
    path: Path,
    cache_dir: Path,
    *,
    stats: dict[str, Any] | None = None,
    reading: Reading = Reading(),
) -> Dataset:
    """Load a training source (a DPR file, or any layout :class:`Reading` names) as a
    memory-mapped ``datasets.Dataset``.

    The source is parsed once into ``cache_dir`` (keyed by its path, sizes, mtimes and how it is
    read); later calls reuse that copy. Columns: question, answers, positive_ctxs,
    hard_negative_ctxs, negative_ctxs (each ctx: title, text, passage_id as a string,
    teacher_score as a float or None). If ``stats`` is given it is filled with
    :class:`ParseStats`' fields, ``cache_file`` and ``from_cache``.
    """
    path = Path(path)
    if not path.is_dir():
        open_binary(path).close()  # InputError if missing
    arrow = cache_file(path, cache_dir, "train", reading.key())
    from_cache = arrow.exists()
    if not from_cache:
        parse = ParseStats()
        rows = iter_training_examples(path, parse, reading)
        write_arrow(rows, TRAIN_FEATURES, arrow, meta=lambda: asdict(parse))
    meta = read_meta(arrow)
    if meta.get("kept", 0) == 0:
        raise InputError(f"{path}: no question with a positive passage")
    if meta.get("dropped_no_positive"):
        log.warning(
            "%s: dropped %d of %d questions without a positive passage",
            path,
            meta["dropped_no_positive"],
            meta["read"],
        )
    if stats is not None:
        stats.update(meta, cache_file=str(arrow), from_cache=from_cache)
    return open_arrow(arrow)


def check_teacher_scores(stats: dict[str, Any], hard_negatives: int) -> None:
    """Raise InputError naming the file and record unless every record of a loaded file (its
    ``stats``) has a ``teacher_score`` on its first positive and on each of its hard negatives
    (any of them may be drawn), and at least ``hard_negatives`` of them (fewer would be filled
    with other questions' positives, which the teacher did not score for this question)."""
    if stats.get("unscored"):
        raise InputError(
            f"{stats['unscored']} has no teacher_score, which train.loss needs on every "
            "positive and hard negative"
        )
    fewest = stats.get("fewest_hard_negatives")
    if fewest is not None and fewest < hard_negatives:
        raise InputError(
            f"{stats['fewest_where']}: {fewest} hard negatives, but train.hard_negatives is "
            f"{hard_negatives} and train.loss needs each of them scored by the teacher"
        )
