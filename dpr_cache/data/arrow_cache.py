"""Arrow files under a cache dir, keyed by a source file's path, size and mtime.

A source is streamed once into ``<cache_dir>/<kind>-<name>-<key>.arrow`` (written atomically, so a
reader never sees half a file) with its counts in a JSON side file; later loads memory-map it.
"""

from __future__ import annotations

import hashlib
import json
import os
from collections.abc import Callable, Iterable
from pathlib import Path
from typing import Any

import pyarrow as pa
from datasets import Dataset, Features

from dpr_cache.runtime.atomic import write_atomic, write_json_atomic

# Bump when the cached layout or the parsing rules change: old cache files are then ignored.
CACHE_VERSION = 3


def default_cache_dir() -> Path:
    """``$XDG_CACHE_HOME/dpr-cache`` (``~/.cache/dpr-cache``)."""
    return Path(os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache") / "dpr-cache"


def cache_file(source: Path, cache_dir: Path, kind: str, how: str = "") -> Path:
    """Where the Arrow copy of ``source`` (a file, or a folder of files) lives, read as ``how``
    says (a layout and its column names); the name changes when the source changes."""
    source = Path(source)
    files = sorted(p for p in source.rglob("*") if p.is_file()) if source.is_dir() else [source]
    stats = [(str(p.relative_to(source)) if source.is_dir() else "", p.stat()) for p in files]
    shape = "|".join(f"{name}:{st.st_size}:{st.st_mtime_ns}" for name, st in stats)
    ident = f"{CACHE_VERSION}|{kind}|{how}|{source.resolve()}|{shape}"
    key = hashlib.blake2b(ident.encode(), digest_size=8).hexdigest()
    return Path(cache_dir) / f"{kind}-{source.name}-{key}.arrow"


def meta_file(arrow_path: Path) -> Path:
    """The JSON side file holding counts gathered while writing ``arrow_path``."""
    return arrow_path.with_suffix(".json")


BATCH_BYTES = 4 << 20
"""About the size of a record batch in a cache file: a memory-mapped stream is opened by
reading every batch's header, so fewer, larger batches leave fewer of its pages resident."""


def write_arrow(
    rows: Iterable[dict[str, Any]],
    features: Features,
    dest: Path,
    *,
    batch_rows: int = 256,
    meta: Callable[[], dict[str, Any]] | None = None,
) -> int:
    """Stream ``rows`` into an Arrow IPC stream at ``dest``; return the count. Rows are
    converted ``batch_rows`` at a time and written in record batches of about
    :data:`BATCH_BYTES` (or ``batch_rows`` rows, if larger).

    ``meta`` is called after the last row; its dict is saved next to the file (see meta_file).
    """
    schema = features.arrow_schema
    count = 0

    def write(tmp: Path) -> None:
        nonlocal count
        with pa.OSFile(str(tmp), "wb") as sink, pa.ipc.new_stream(sink, schema) as writer:
            buf: list[dict[str, Any]] = []
            pending: list[pa.RecordBatch] = []

            def flush() -> None:
                if pending:
                    writer.write_table(pa.Table.from_batches(pending, schema).combine_chunks())
                    pending.clear()

            for row in rows:
                buf.append(row)
                if len(buf) >= batch_rows:
                    pending.append(pa.RecordBatch.from_pylist(buf, schema=schema))
                    count += len(buf)
                    buf = []
                    if sum(b.nbytes for b in pending) >= BATCH_BYTES:
                        flush()
            if buf or count == 0:
                pending.append(pa.RecordBatch.from_pylist(buf, schema=schema))
                count += len(buf)
            flush()
        # the side file first: a cache file that exists always has its counts
        write_json_atomic(meta_file(dest), {"rows": count, **(meta() if meta else {})})

    write_atomic(dest, write)
    return count


def read_meta(arrow_path: Path) -> dict[str, Any]:
    """The counts saved with an Arrow cache file ({} if the side file is missing)."""
    path = meta_file(arrow_path)
    return json.loads(path.read_text()) if path.exists() else {}


def open_arrow(arrow_path: Path) -> Dataset:
    """Memory-map a cache file as a ``datasets.Dataset``."""
    return Dataset.from_file(str(arrow_path))
