"""DPR's wiki passages TSV (``id<TAB>text<TAB>title``, csv-quoted, optionally gzipped)."""

from __future__ import annotations

import csv
import sys
from collections.abc import Iterator
from pathlib import Path

import pyarrow as pa
from datasets import Dataset, Features

from dpr_cache.data.arrow_cache import cache_file, open_arrow, write_arrow
from dpr_cache.data.files import open_text
from dpr_cache.errors import InputError

HEADER = ["id", "text", "title"]
PASSAGE_FEATURES = Features.from_arrow_schema(
    pa.schema([("id", pa.string()), ("text", pa.string()), ("title", pa.string())])
)


def _allow_long_fields() -> None:
    """Raise the csv module's 128 KiB field limit (one long passage must not stop a corpus)."""
    csv.field_size_limit(min(sys.maxsize, 2**31 - 1))


def read_passages(path: Path) -> Iterator[tuple[str, str, str]]:
    """Stream ``(id, text, title)`` rows from a passages TSV, read as DPR does (csv, tab).

    Raises InputError on a bad header or a row without exactly three fields (with its line).
    """
    path = Path(path)
    _allow_long_fields()
    line = 0
    try:
        with open_text(path) as f:
            reader = csv.reader(f, delimiter="\t")
            header = next(reader, None)
            if header != HEADER:
                got = "nothing" if header is None else "\\t".join(header)[:80]
                raise InputError(f"{path} line 1: header must be 'id\\ttext\\ttitle', got {got!r}")
            for row in reader:
                line = reader.line_num
                if not row:
                    continue
                if len(row) != 3:
                    raise InputError(
                        f"{path} line {line}: expected 3 tab-separated fields, got {len(row)}"
                    )
                yield row[0], row[1], row[2]
    except csv.Error as e:
        raise InputError(f"{path} line {line + 1}: {e}") from None
    except (OSError, EOFError, UnicodeDecodeError) as e:
        raise InputError(f"{path}: cannot read ({' '.join(str(e).split())})") from None


def load_passages(path: Path, cache_dir: Path) -> Dataset:
    """The passages TSV as a memory-mapped ``datasets.Dataset`` (columns id, text, title).

    Parsed once into ``cache_dir`` (keyed by path, size and mtime) and reused afterwards.
    """
    path = Path(path)
    open_text(path).close()  # InputError if missing
    arrow = cache_file(path, cache_dir, "passages")
    if not arrow.exists():
        rows = ({"id": i, "text": text, "title": title} for i, text, title in read_passages(path))
        write_arrow(rows, PASSAGE_FEATURES, arrow, batch_rows=10_000)
    return open_arrow(arrow)
