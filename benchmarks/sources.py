"""A synthetic sentence-transformers Parquet file (``anchor``, ``positive``, ``negative``: random
words at MS MARCO's lengths) read into the Arrow cache in a process of its own (wall time, peak
RSS, passes over the file), then again from the cache. Goal: under 1 GB, one pass, at 10M rows::

    python -m benchmarks.sources --out docs/bench                    # 10M rows: ~15 minutes
    python -m benchmarks.sources --out /tmp/s --rows 20000           # a quick look

The file is kept under ``--work`` for a rerun with the same row count.
"""

from __future__ import annotations

import shutil
import sys
from pathlib import Path
from typing import Annotated

import numpy as np
import typer

from benchmarks import harness
from dpr_cache.runtime.atomic import write_atomic

GOAL_GB = 1.0
LENGTHS = {"anchor": 35, "positive": 330, "negative": 330}  # characters, about
_BATCH = 100_000
LOADS = (
    "load | rows | seconds | rows a second | peak RSS (GB) | passes over the file",
    "{load} | {rows:,} | {wall_s:.1f} | {rate} | {peak_rss_gb:.3f} | {passes}",
)
WORK = Path("runs/bench-sources")

_CHILD = """
import json, sys, time
import pyarrow.parquet as pq
passes, _iter = [], pq.ParquetFile.iter_batches
pq.ParquetFile.iter_batches = lambda self, *a, **k: passes.append(1) or _iter(self, *a, **k)
from pathlib import Path
from dpr_cache.data.training import load_training_set
start, stats = time.perf_counter(), {}
data = load_training_set(Path(sys.argv[1]), Path(sys.argv[2]), stats=stats)
seconds = time.perf_counter() - start
print(json.dumps({"rows": len(data), "load_seconds": seconds, "passes": len(passes),
                  "from_cache": stats["from_cache"], "first": data[0]["question"]}))
"""


def synthetic_parquet(path: Path, rows: int, seed: int = 0) -> Path:
    """``rows`` rows of random words in the triplet columns, a row group at a time (kept)."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    marker = path.with_suffix(".rows")
    if path.exists() and marker.exists() and marker.read_text() == str(rows):
        return path
    rng = np.random.default_rng(seed)
    letters = np.array(list("abcdefghijklmnopqrstuvwxyz"))
    words = ["".join(rng.choice(letters, size=rng.integers(2, 10))) for _ in range(20_000)]
    text = " ".join(rng.choice(words, size=2_000_000).tolist())
    schema = pa.schema([(name, pa.string()) for name in LENGTHS])

    def column(start: int, n: int, length: int) -> list[str]:
        at = rng.integers(0, len(text) - 2 * length, size=n).tolist()
        sizes = rng.integers(length // 2, 3 * length // 2, size=n).tolist()
        return [f"{start + i} {text[at[i] : at[i] + sizes[i]]}" for i in range(n)]

    def write(tmp: Path) -> None:
        with pq.ParquetWriter(str(tmp), schema) as writer:
            for start in range(0, rows, _BATCH):
                n = min(_BATCH, rows - start)
                columns = {name: column(start, n, length) for name, length in LENGTHS.items()}
                writer.write_table(pa.table(columns, schema=schema))

    path.parent.mkdir(parents=True, exist_ok=True)
    write_atomic(path, write)
    marker.write_text(str(rows))
    return path


def run(rows: int, work: Path) -> dict:
    """The file read into a fresh cache, then again from it, each in a process of its own."""
    source = synthetic_parquet(work / f"st-{rows}.parquet", rows)
    cache = work / "cache"
    command = [sys.executable, "-c", _CHILD, str(source), str(cache)]
    shutil.rmtree(cache, ignore_errors=True)
    first, again = (harness.measured(command, work / f"load-{n}.txt", True) for n in (1, 2))
    first["wall_s"], again["wall_s"] = first["seconds"], again["seconds"]
    arrow = sum(p.stat().st_size for p in cache.glob("*.arrow"))
    sizes = {"rows": rows, "parquet_gb": source.stat().st_size / 1e9, "arrow_gb": arrow / 1e9}
    met = first["peak_rss_gb"] < GOAL_GB and first["passes"] == 1 and first["rows"] == rows
    return sizes | {"first": first, "from_cache": again, "goal_gb": GOAL_GB, "met": met}


def render(result: dict, folder: Path, source: Path | None = None) -> Path:
    """``sources.md`` in ``folder`` from the saved ``sources.json``."""
    first, again, n = result["first"], result["from_cache"], result["rows"]
    rate = f"{first['rows'] / first['wall_s']:,.0f}"
    rows = [{**first, "load": "first (parse into the cache)", "rate": rate}]
    rows.append({**again, "load": "again (from the cache)", "rate": "-"})
    return harness.write_page(
        folder / "sources.md",
        "Reading a large source in another layout",
        harness.measured_text(
            result, f"python -m benchmarks.sources --out docs/bench --rows {n}", "sources.json"
        ),
        f"A synthetic sentence-transformers Parquet file of {n:,} rows (`anchor`, `positive`,"
        f" `negative`: random words of about {', '.join(map(str, LENGTHS.values()))} characters;"
        f" {result['parquet_gb']:.2f} GB) read by `load_training_set` into the Arrow cache"
        f" ({result['arrow_gb']:.2f} GB), each load a process of its own (peak RSS: `ru_maxrss`;"
        " passes: the Parquet reader's batch iterations).",
        harness.format_table(LOADS, rows),
        f"The goal (peak RSS under {GOAL_GB:g} GB, one pass): "
        f"**{'met' if result['met'] else 'not met'}**.",
    )


def main(
    out: Annotated[Path, typer.Option(help="Where sources.json and sources.md go.")],
    rows: Annotated[int, typer.Option(help="Rows of the synthetic source.")] = 10_000_000,
    work: Annotated[Path, typer.Option(help="The synthetic file and cache.")] = WORK,
) -> None:
    harness.save_result(out / "sources.json", run(rows, work), harness.cpu_info(), render)


if __name__ == "__main__":
    typer.run(main)
