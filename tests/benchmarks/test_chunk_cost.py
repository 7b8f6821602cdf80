"""``python -m benchmarks.chunk_cost``: the dry run writes a fit for every engine that can run
here, the least-squares fit finds a known slope (and shows a curve as one), and the engine list
takes a variant."""

from __future__ import annotations

import functools
import json

import numpy as np
import pytest
import torch

from benchmarks import chunk_cost
from benchmarks.chunk_cost import (
    DRY_RUN,
    ENGINES,
    CostPlan,
    Engine,
    dpr_cache_stepper,
    fit_line,
    markdown,
    parse_args,
    run_chunk_cost,
)
from benchmarks.peers import peer_available
from tests.support.fixtures import REPO

AVAILABLE = [
    n
    for n, e in ENGINES.items()
    if (e.peer is None or peer_available(e.peer)) and not e.compiled  # a dry run compiles none
]


def test_dry_run_writes_a_fit_for_every_engine(tmp_path, run_benchmark) -> None:
    proc = run_benchmark("chunk_cost", "--dry-run", "--out", str(tmp_path))
    assert proc.returncode == 0, proc.stderr[-3000:]
    result = json.loads((tmp_path / "chunk_cost.json").read_text())
    assert list(result["engines"]) == AVAILABLE
    assert result["plan"]["dry_run"] and result["plan"]["layers"] == DRY_RUN["layers"]
    for name, engine in result["engines"].items():
        fit, points = engine["fit"], engine["points"]
        _assert_least_squares(fit, points, name)
        assert [p["question_chunks"] for p in points] == DRY_RUN["chunks"]
        assert all(len(p["times_s"]) == DRY_RUN["rounds"] and p["step_s"] > 0 for p in points)
        assert points[-1]["forwards"] > points[0]["forwards"] > 0  # more chunks, more forwards
        assert all(p["tokens"] >= 2 * p["forwards"] for p in points)  # each pass: [CLS], [SEP]
    peers = [n for n in AVAILABLE if ENGINES[n].peer]
    assert {r["peer"] for r in result["ratios"]} == set(peers)
    page = (tmp_path / "chunk_cost.md").read_text()
    assert page == markdown(result)  # the page is written from the json alone
    assert "A dry run" in page and "vector flags:" in page and result["command"] in page
    for name in AVAILABLE:
        assert f"| `{name}` |" in page
    assert "`malloc_trim`" in page and "± " in page  # the disclosure, the slope's error


def test_the_fit_finds_a_known_slope() -> None:
    chunks = [3, 6, 12, 24, 48]
    fit = fit_line(chunks, [0.13 + 0.052 * x for x in chunks])
    assert fit["b_s"] == pytest.approx(0.052, rel=1e-9)
    assert fit["a_s"] == pytest.approx(0.13, rel=1e-9)
    assert fit["residual_rms_s"] < 1e-12 and fit["b_stderr_s"] < 1e-12
    noise = [0.01, -0.01, 0.01, -0.01, 0.01]  # 10 ms either way
    noisy = fit_line(chunks, [0.13 + 0.052 * x + e for x, e in zip(chunks, noise, strict=True)])
    assert noisy["b_s"] == pytest.approx(0.052, abs=1e-3)
    assert 0.005 < noisy["residual_rms_s"] < 0.01 and noisy["b_stderr_s"] > 0


def test_negative_control_a_flat_or_curved_step_is_not_a_cost_a_chunk() -> None:
    chunks = [3, 6, 12, 24, 48]
    flat = fit_line(chunks, [1.0] * len(chunks))
    assert abs(flat["b_s"]) < 1e-12 and abs(flat["a_s"] - 1.0) < 1e-12
    curved = fit_line(chunks, [0.001 * x * x for x in chunks])  # quadratic: the line fits badly
    assert curved["max_relative_residual"] > 0.5
    with pytest.raises(ValueError):
        fit_line([4, 4], [1.0, 2.0])


def test_engines_are_data_and_a_variant_runs(tmp_path, monkeypatch) -> None:
    variant = Engine(functools.partial(dpr_cache_stepper, length_order=False))
    monkeypatch.setitem(ENGINES, "dpr-cache-batch-order", variant)
    plan, names, out = parse_args(
        [
            "--out",
            str(tmp_path),
            "--dry-run",
            "--engines",
            "dpr-cache,dpr-cache-batch-order",
        ]
    )
    assert names == ["dpr-cache", "dpr-cache-batch-order"] and out == tmp_path
    plan.layers, plan.questions, plan.chunks, plan.rounds = 1, 4, [1, 2], 1
    threads = torch.get_num_threads()
    try:
        result = run_chunk_cost(plan, names, out, "test")
    finally:
        torch.set_num_threads(threads)
    assert list(result["engines"]) == names and result["ratios"] == []  # no peer, no ratio
    with pytest.raises(SystemExit, match="unknown engine"):
        chunk_cost.available_engines(["dpr-cache", "nope"])


def test_chunk_counts_must_divide_the_questions(tmp_path) -> None:
    plan = CostPlan(questions=6, chunks=[1, 4])
    with pytest.raises(SystemExit, match="each dividing 6"):
        run_chunk_cost(plan, ["dpr-cache"], tmp_path)


def _assert_least_squares(fit: dict, points: list[dict], name: str) -> None:
    """The page's line is numpy's least-squares fit of the medians, its standard error the
    textbook one (residual variance over n - 2, over the spread of the counts), and each
    fitted step lies on it."""
    x = np.array([p["chunks"] for p in points], dtype=float)
    y = np.array([p["step_s"] for p in points])
    b, a = np.polyfit(x, y, 1)
    assert fit["b_s"] == pytest.approx(b, rel=1e-9, abs=1e-12), name
    assert fit["a_s"] == pytest.approx(a, rel=1e-9, abs=1e-12), name
    residuals = y - (a + b * x)
    if len(x) == 2:  # a line through two points has no spread to estimate
        assert fit["b_stderr_s"] is None, name
    else:
        stderr = np.sqrt(residuals @ residuals / (len(x) - 2) / ((x - x.mean()) ** 2).sum())
        assert fit["b_stderr_s"] == pytest.approx(stderr, rel=1e-9, abs=1e-15), name
    assert fit["residual_rms_s"] == pytest.approx(np.sqrt(np.mean(residuals**2)), rel=1e-9)
    assert [p["fitted_s"] for p in points] == pytest.approx(list(a + b * x), rel=1e-9)


def test_the_published_fits_are_the_least_squares_lines_of_their_medians() -> None:
    """docs/bench/chunk_cost.json: every engine's slope, intercept and standard error as numpy
    fits them from the medians the page lists."""
    published = json.loads((REPO / "docs" / "bench" / "chunk_cost.json").read_text())
    for name, engine in published["engines"].items():
        _assert_least_squares(engine["fit"], engine["points"], name)
