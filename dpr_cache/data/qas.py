"""DPR's question files for evaluation: ``question<TAB>["answer", ...]`` per line, no header."""

from __future__ import annotations

import ast
import csv
import json
from pathlib import Path

from dpr_cache.data.files import open_text
from dpr_cache.errors import InputError


def parse_answers(field: str) -> list[str] | None:
    """A JSON list, else a Python-literal list (as DPR's ``eval``), of strings; None if neither."""
    try:
        value = json.loads(field)
    except ValueError:
        try:
            value = ast.literal_eval(field)
        except (ValueError, SyntaxError, TypeError, MemoryError, RecursionError):
            return None
    if not isinstance(value, (list, tuple)):
        return None
    return [str(a) for a in value]


def qas_line(question: str, answers: list[str]) -> str:
    """One line of a qas file: the question, csv-quoted where :func:`read_qas` (and DPR's own
    reader, ``csv.reader`` on tabs) would misread it bare (an opening quote, a tab, a line break),
    then the answers as a JSON list."""
    if question.startswith('"') or any(c in question for c in "\t\r\n"):
        question = '"' + question.replace('"', '""') + '"'
    return f"{question}\t{json.dumps(list(answers), ensure_ascii=False)}\n"


def read_qas(path: Path) -> list[tuple[str, list[str]]]:
    """Read a DPR qas file (``.tsv`` or DPR's tab-delimited ``.csv``, optionally gzipped)."""
    path = Path(path)
    out: list[tuple[str, list[str]]] = []
    line = 0
    try:
        with open_text(path) as f:
            reader = csv.reader(f, delimiter="\t")
            for row in reader:
                line = reader.line_num
                if not row or (len(row) == 1 and not row[0].strip()):
                    continue
                if len(row) != 2:
                    raise InputError(
                        f"{path} line {line}: expected 'question<TAB>[answers]', "
                        f"got {len(row)} field(s)"
                    )
                answers = parse_answers(row[1])
                if answers is None:
                    raise InputError(
                        f"{path} line {line}: answers are not a JSON or Python list: "
                        f"{row[1][:60]!r}"
                    )
                out.append((row[0], answers))
    except csv.Error as e:
        raise InputError(f"{path} line {line + 1}: {e}") from None
    except (OSError, EOFError, UnicodeDecodeError) as e:
        raise InputError(f"{path}: cannot read ({' '.join(str(e).split())})") from None
    return out


QID_KEYS = ("id", "qid", "_id", "query_id")


def record_question_id(record: dict, n: int) -> str:
    """A training record's question id, by the rule :func:`question_ids` follows: the file's
    own (the record's ``id``, ``qid``, ``_id`` or ``query_id``), else its row ``n`` from 0."""
    return next((str(record[k]) for k in QID_KEYS if record.get(k) not in (None, "")), str(n))


def question_ids(qas_path: Path, n: int) -> list[str]:
    """The questions' ids, the one rule every command follows: the file's own (``X.ids.txt``
    beside a qas file ``X.tsv``, BEIR's query ids, one a line), else the row numbers from 0."""
    ids_file = qas_path.with_suffix(".ids.txt")
    if not ids_file.is_file():
        return [str(i) for i in range(n)]
    ids = ids_file.read_text(encoding="utf-8").splitlines()
    if len(ids) != n:
        raise InputError(f"{ids_file}: {len(ids)} ids for the {n} questions of {qas_path}")
    return ids
