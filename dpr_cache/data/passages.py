"""DPR's wiki passages TSV (``id<TAB>text<TAB>title``, csv-quoted, optionally gzipped)."""

from __future__ import annotations

import csv
import sys
from collections.abc import Iterator, Sequence
from pathlib import Path

import numpy as np
import pyarrow as pa
from datasets import Dataset, Features

from dpr_cache.data.arrow_cache import cache_file, open_arrow, write_arrow
from dpr_cache.data.files import open_text
from dpr_cache.data.ids import passage_hash
from dpr_cache.errors import InputError
from dpr_cache.runtime.atomic import write_atomic

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


def _batches(dataset: Dataset):
    """The Arrow cache's record batches, through a memory map opened for this call: the pages a
    read touches do not stay counted in the process's resident memory (a dataset's own map keeps
    every page it ever touched)."""
    with pa.memory_map(dataset.cache_files[0]["filename"]) as source:
        yield from pa.ipc.open_stream(source)  # batch by batch, zero-copy from the map


def iter_passage_batches(dataset: Dataset) -> Iterator[dict[str, list[str]]]:
    """The columns id, title, text of every passage, a record batch at a time, in file order."""
    for batch in _batches(dataset):
        yield {name: batch.column(name).to_pylist() for name in ("id", "title", "text")}


def passage_columns(dataset: Dataset, rows: Sequence[int]) -> dict[str, list[str]]:
    """Columns id, title, text of the given dataset rows, in their order. Each record batch
    holding a row is read on its own (a take over the whole table would concatenate a 21M-row
    text column first)."""
    rows = np.asarray(rows, dtype=np.int64)
    out: dict[str, list] = {name: [None] * len(rows) for name in ("id", "title", "text")}
    order = np.argsort(rows, kind="stable")
    done, start = 0, 0
    for batch in _batches(dataset) if len(rows) else ():
        stop = start + batch.num_rows
        end = done + int(np.searchsorted(rows[order[done:]], stop))
        if end > done:
            picked = order[done:end]
            taken = batch.take(pa.array(rows[picked] - start))
            for name in out:
                for i, value in zip(picked.tolist(), taken.column(name).to_pylist(), strict=True):
                    out[name][i] = value
            done = end
        if done == len(rows):
            break
        start = stop
    if done != len(rows):
        raise IndexError(f"row {int(rows[order[done]])} is past the {start} passages")
    return out


def passage_rows(dataset: Dataset, ids: Sequence[str]) -> np.ndarray:
    """The dataset rows holding the given passage ids (-1 for an id it lacks).

    Looks the ids up in a table of 64-bit id hashes and their rows, sorted once, saved beside
    the Arrow file and opened memory-mapped (16 bytes a passage: 336 MB of disk for 21M, read
    a few pages a lookup, never 21M Python strings); each hit is confirmed by comparing the
    stored id.
    """
    table = _id_table(dataset)  # [2, n] uint64: sorted hashes, their rows
    hashes = table[0]
    wanted = np.fromiter((passage_hash(pid) for pid in ids), dtype=np.uint64, count=len(ids))
    at = np.minimum(np.searchsorted(hashes, wanted), len(hashes) - 1)
    found = np.where(hashes[at] == wanted, table[1][at], -1).astype(np.int64)
    hit = np.flatnonzero(found >= 0)
    if len(hit):  # a hash match is a hit only if the stored id is the one asked for
        stored = passage_columns(dataset, found[hit].tolist())["id"]
        found[[i for i, pid in zip(hit.tolist(), stored, strict=True) if pid != ids[i]]] = -1
    return found


def _id_table(dataset: Dataset) -> np.ndarray:
    """[2, n] uint64: the sorted id hashes, then their rows; built in blocks once, saved beside
    the Arrow file, opened memory-mapped."""
    arrow = Path(dataset.cache_files[0]["filename"])
    path = arrow.with_suffix(".idhash.npy")
    if not path.is_file():
        hashes = np.empty(len(dataset), dtype=np.uint64)
        start = 0
        for batch in _batches(dataset):  # the id column only, batch by batch
            ids = batch.column("id").to_pylist()
            hashes[start : start + len(ids)] = [passage_hash(pid) for pid in ids]
            start += len(ids)
        rows = np.argsort(hashes, kind="stable")

        def write(tmp: Path) -> None:  # straight into the file's pages: no third copy in memory
            table = np.lib.format.open_memmap(tmp, mode="w+", dtype=np.uint64, shape=(2, len(rows)))
            np.take(hashes, rows, out=table[0])
            table[1] = rows
            table.flush()
            del table

        write_atomic(path, write)
    return np.load(path, mmap_mode="r")
