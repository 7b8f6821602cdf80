"""The rows of a data file, whatever holds them: JSON Lines or a JSON array (maybe gzipped),
Parquet, CSV, or a folder written by ``datasets``' ``save_to_disk``. Each yields ``(where, row)``
one row at a time (``where`` names the row for an error: ``line N``, ``item I``, ``row R``), so a
file of any size is read in bounded memory."""

from __future__ import annotations

import csv
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from dpr_cache.data.files import check_file, open_text
from dpr_cache.errors import InputError

__all__ = ["container_of", "iter_rows", "is_datasets_folder"]

_BATCH_ROWS = 1024
_READ_BUFFER = 1 << 20  # bytes a Parquet column is read in
_DATASETS_MARKERS = ("dataset_info.json", "state.json", "dataset_dict.json")


def is_datasets_folder(path: Path) -> bool:
    """True for a folder ``datasets``' ``save_to_disk`` wrote (a Dataset or a DatasetDict)."""
    return path.is_dir() and any((path / name).exists() for name in _DATASETS_MARKERS)


def container_of(path: Path) -> str:
    """``datasets``, ``parquet``, ``csv`` or ``json`` (JSON Lines or an array, maybe gzipped):
    a folder by what ``save_to_disk`` leaves in it, a file by its name."""
    path = Path(path)
    if path.is_dir():
        if is_datasets_folder(path):
            return "datasets"
        raise InputError(
            f"{path}: a folder, but neither one written by datasets' save_to_disk nor a BEIR "
            "folder (corpus.jsonl, queries.jsonl, qrels/)"
        )
    name = path.name.lower().removesuffix(".gz")
    if name.endswith(".parquet"):
        return "parquet"
    if name.endswith(".csv"):
        return "csv"
    return "json"


def iter_rows(path: Path, *, split: str = "train") -> Iterator[tuple[str, Any]]:
    """Each row of ``path`` as ``(where, row)``; a ``datasets`` folder holding several splits
    gives ``split``'s rows."""
    path = Path(path)
    if not path.exists():
        check_file(path)  # the missing file's one line (with its download hint)
    kind = container_of(path)
    if kind == "datasets":
        return _datasets_rows(path, split)
    if kind == "parquet":
        return _parquet_rows(path)
    if kind == "csv":
        return _csv_rows(path)
    from dpr_cache.data.training import iter_raw

    return iter_raw(path)


def _parquet_rows(path: Path) -> Iterator[tuple[str, Any]]:
    import pyarrow as pa
    import pyarrow.parquet as pq

    try:  # read through a small buffer: iter_batches alone holds whole row groups, or the file
        reader = pq.ParquetFile(check_file(path), buffer_size=_READ_BUFFER, pre_buffer=False)
    except (pa.ArrowInvalid, OSError) as e:
        raise InputError(f"{path}: not a Parquet file ({_short(e)})") from None
    done = 0
    for batch in reader.iter_batches(batch_size=_BATCH_ROWS, use_threads=False):
        for row in batch.to_pylist():
            yield f"row {done}", row
            done += 1


def _csv_rows(path: Path) -> Iterator[tuple[str, Any]]:
    csv.field_size_limit(min(sys.maxsize, 2**31 - 1))  # passages longer than csv's 128 KiB
    with open_text(path) as f:
        reader = csv.DictReader(f)
        if not reader.fieldnames:
            raise InputError(f"{path}: empty file")
        try:
            for row in reader:
                if None in row:  # more fields than the header names
                    raise InputError(
                        f"{path} line {reader.line_num}: {len(reader.fieldnames) + len(row[None])}"
                        f" fields, the header names {len(reader.fieldnames)}"
                    )
                yield f"line {reader.line_num}", row
        except csv.Error as e:
            raise InputError(f"{path} line {reader.line_num}: not valid CSV ({e})") from None


def _datasets_rows(path: Path, split: str) -> Iterator[tuple[str, Any]]:
    from datasets import DatasetDict, load_from_disk

    try:
        data = load_from_disk(str(path))
    except (FileNotFoundError, ValueError, OSError) as e:
        raise InputError(f"{path}: not a folder datasets can load ({_short(e)})") from None
    if isinstance(data, DatasetDict):
        if split not in data:
            raise InputError(f"{path}: no '{split}' split (it has {', '.join(sorted(data))})")
        data = data[split]
    done = 0
    for batch in data.iter(batch_size=_BATCH_ROWS):
        columns = list(batch)
        for values in zip(*(batch[c] for c in columns), strict=True):
            yield f"row {done}", dict(zip(columns, values, strict=True))
            done += 1


def _short(err: Exception) -> str:
    text = " ".join(str(err).split())
    return text if len(text) <= 120 else text[:117] + "..."
