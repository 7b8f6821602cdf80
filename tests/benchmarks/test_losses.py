"""``python -m benchmarks.losses``: its points measured in this process on the toy set (ours
through ``build_step``, each option; token budgets; the peer at a budget), the saved points
resumed, and the summary and page read off known figures."""

from __future__ import annotations

import dataclasses
import json

import pytest

from benchmarks import losses
from benchmarks.losses import DRY, LossPoint, measure, page, plan_points, summarize
from benchmarks.peers import peer_available


@pytest.fixture(scope="module")
def plan(tmp_path_factory):
    cache = tmp_path_factory.mktemp("losses-cache")
    return dataclasses.replace(DRY, cache_dir=str(cache))


@pytest.mark.parametrize(
    "point",
    [
        LossPoint("option: plain"),
        LossPoint("option: guided", {"guide": "MODEL"}),
        LossPoint("option: matryoshka", {"matryoshka_dims": "DIMS"}),
        LossPoint("tokens 128", {"chunk_tokens": 128, "chunk_size": 16}),
    ],
    ids=lambda p: p.name,
)
def test_each_kind_of_point_measures_a_step(plan, point) -> None:
    row = measure(plan, point)
    assert row["name"] == point.name and row["step_s"] > 0 and row["peak_bytes"] > 0
    assert row["real_tokens"] > 16 * 3  # questions and passages, at their own lengths


@pytest.mark.skipif(not peer_available("st-cmnrl"), reason="sentence-transformers is absent")
def test_the_peer_point_runs_cmnrl_at_a_token_budget(plan) -> None:
    row = measure(plan, LossPoint("cmnrl tokens 128", peer_tokens=128))
    assert row["step_s"] > 0


def test_the_plan_lists_every_option_and_budget_for_both_engines() -> None:
    names = [p.name for p in plan_points(DRY)]
    assert [n for n in names if n.startswith("option: ")] == [
        f"option: {n}" for n in losses.OPTIONS
    ]
    for t in DRY.token_budgets:
        assert f"tokens {t}" in names and f"cmnrl tokens {t}" in names
    assert all(f"rows {c}" in names for c in DRY.row_chunks)


def test_summary_takes_medians_and_ratios_and_the_page_shows_them() -> None:
    rows = [
        {"name": "option: plain", "step_s": s, "peak_bytes": 1e9, "round": r}
        for r, s in enumerate([2.0, 4.0, 3.0])
    ]
    rows += [{"name": "option: guided", "step_s": 4.5, "peak_bytes": 2e9, "round": 0}]
    rows += [{"name": "tokens 128", "step_s": 1.0, "peak_bytes": 1e9, "round": 0}]
    rows += [{"name": "cmnrl tokens 128", "step_s": 1.5, "peak_bytes": 1e9, "round": 0}]
    rows += [{"name": "rows 4", "error": "exit 1: boom", "round": 0}]
    summary = summarize(DRY, rows)
    points = summary["points"]
    assert points["option: plain"]["step_s"] == 3.0  # the median of three rounds
    assert points["option: guided"]["vs_plain"] == pytest.approx(1.5)
    assert points["tokens 128"]["speedup_vs_cmnrl"] == pytest.approx(1.5)
    assert summary["errors"] == ["rows 4: exit 1: boom"]
    summary["loss_ms"] = {"guided": 1.25}
    machine = {"cpu": "X", "cores": 2, "ram_gb": 24, "flags": ["avx2"], "torch": "t", "threads": 2}
    machine["transformers"] = "t"
    text = page(summary, machine, "2026-12-06")
    assert (
        "| guided | 4.50 | 2.00 | 1.500 | 1.2 |" in text
        and "| plain | 3.00 | 1.00 | 1.000 | – |" in text
    )
    assert "| tokens 128 | 1.00 | 1.00 | 1.50 |" in text and "rows 4: exit 1: boom" in text


def test_the_loss_alone_is_timed_for_every_option(plan) -> None:
    times = losses.loss_only(plan, repeats=2)
    assert list(times) == list(losses.OPTIONS) and all(ms > 0 for ms in times.values())


def test_saved_points_of_the_same_plan_are_kept(tmp_path, monkeypatch, plan) -> None:
    """A resumed run measures only the points it lacks; points of another plan are measured
    again."""
    small = dataclasses.replace(plan, row_chunks=(4,), token_budgets=(128,))
    ran = []

    def fake(module, payload):
        ran.append(payload["point"]["name"])
        return {"name": payload["point"]["name"], "step_s": 1.0, "peak_bytes": 1}

    monkeypatch.setattr(losses, "run_child_or_error", fake)
    losses.run(small, tmp_path)
    first = list(ran)
    assert len(first) == len(plan_points(small))
    losses.run(small, tmp_path)
    assert ran == first  # all kept
    losses.run(dataclasses.replace(small, steps=2), tmp_path)
    assert len(ran) == 2 * len(first)
    assert len((tmp_path / losses.POINTS).read_text().splitlines()) == 2 * len(first)
    json.loads((tmp_path / losses.POINTS).read_text().splitlines()[0])
