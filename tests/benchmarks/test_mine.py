"""The mining benchmark rehearsed at toy size (every step, resumable): the figures it records, the
projection on its page, and a peak that does not grow with the questions."""

from __future__ import annotations

import json

from benchmarks.mine import NQ_QUESTIONS, projection


def test_tiny_rehearsal_measures_mine_and_projects_it(tmp_path, rehearse) -> None:
    done = rehearse("mine")
    assert done.returncode == 0, done.stderr[-3000:]
    results = json.loads((tmp_path / "out" / "mine.json").read_text())
    runs = results["small"]["runs"]
    assert [r["questions"] for r in runs.values()] == [64, 256]
    for run in runs.values():  # every question mined, every stage timed
        assert run["negatives"] == 30 * run["questions"]
        assert {"encode questions", "search", "read the candidates"} <= set(run["stages"])
        assert sum(run["stages"].values()) <= run["seconds"]
    assert results["scan"]["rows"] == 20_000 and results["scan"]["queries"] == 64
    assert not (tmp_path / "w" / "vectors").exists()  # the big files go once measured
    rows = dict((stage, s) for stage, s, _ in projection(results, None))
    big = runs["256"]
    # per-question stages scale by NQ's questions over the run's; the search by the parts
    encode = big["stages"]["encode questions"] / 256 * NQ_QUESTIONS
    assert abs(rows["encode questions"] - encode) < 1e-6
    assert rows["search"] == NQ_QUESTIONS // 64 * results["scan"]["seconds"]
    page = (tmp_path / "out" / "mine.md").read_text()
    assert "## Projected: 58,880 questions over 21,015,324 passages" in page
    assert "{" not in page and "passages (`dpr-cache index`" in page  # every field filled in
    again = rehearse("mine", timeout=300)
    assert again.returncode == 0 and again.stdout.count("done, skipped") == 2
