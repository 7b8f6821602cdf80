"""The large-source benchmark, small: it reads its synthetic Parquet file in one pass, every row,
and its page shows what its JSON holds."""

from __future__ import annotations

import json

import pyarrow.parquet as pq

from tests.support.cli import run_benchmark


def test_the_sources_benchmark_reads_every_row_once(tmp_path):
    done = run_benchmark(
        "sources", "--out", str(tmp_path), "--rows", "3000", "--work", str(tmp_path / "w")
    )
    assert done.returncode == 0, done.stderr[-2000:]
    result = json.loads((tmp_path / "sources.json").read_text())
    source = tmp_path / "w" / "st-3000.parquet"
    assert pq.ParquetFile(source).metadata.num_rows == 3000
    assert result["first"]["rows"] == 3000 and result["first"]["passes"] == 1
    assert not result["first"]["from_cache"] and result["from_cache"]["from_cache"]
    assert result["from_cache"]["passes"] == 0  # opened from the cache, the file not read
    assert 0 < result["first"]["peak_rss_gb"] < 1.0 and result["met"]
    page = (tmp_path / "sources.md").read_text()
    assert f"| first (parse into the cache) | 3,000 | {result['first']['wall_s']:.1f} |" in page
    assert "**met**" in page
