"""The batch-size study's table: the paired comparison of a GradCache run with the full batch."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from studies.squad_batch_size import runs, table


def _run(runs: Path, name: str, mode: str, first_hits: list[int | None]) -> dict:
    """A run folder whose question i has its first answer at rank first_hits[i] (None: never)."""
    entries = []
    for hit in first_hits:
        ctxs = [{"id": str(r), "has_answer": r == hit} for r in range(30)]
        entries.append({"question": "q", "answers": ["a"], "ctxs": ctxs})
    (runs / name / "eval").mkdir(parents=True)
    (runs / name / "eval" / "retrieval.json").write_text(json.dumps(entries))
    return {"model": "m", "setting": name, "mode": mode, "seed": 1, "dir": name}


def test_first_hit_ranks(tmp_path):
    _run(tmp_path, "r", "full", [0, 4, None, 19])
    ranks = runs.first_hit_ranks(tmp_path / "r" / "eval" / "retrieval.json")
    assert ranks == [0, 4, float("inf"), 19]


def test_paired_differences_against_a_hand_count(tmp_path):
    full = _run(tmp_path, "full-b8", "full", [0, 3, 10, None, 0, 25])
    same = _run(tmp_path, "gc-same", "gradcache", [0, 3, 10, None, 0, 25])
    better = _run(tmp_path, "gc-better", "gradcache", [0, 0, 0, 0, 0, 0])
    mixed = _run(tmp_path, "gc-mixed", "gradcache", [2, 0, 10, 4, 0, 25])
    got = {d["setting"]: d for d in runs.paired_differences([full, same, better, mixed], tmp_path)}
    assert set(got) == {"gc-same", "gc-better", "gc-mixed"}  # the full run is the baseline only
    assert got["gc-same"]["top5"] == 0 and got["gc-same"]["top5_ci"] == (0.0, 0.0)
    # top-1: full hits questions 0 and 4 (2 of 6); "better" hits all 6: +4/6 = +66.7 points
    assert got["gc-better"]["top1"] == pytest.approx(100 * 4 / 6)
    # mixed, top-1: loses q0, gains q1 -> 0; top-5: gains q3 -> +1/6; top-20: the same +1/6
    assert got["gc-mixed"]["top1"] == pytest.approx(0.0)
    assert got["gc-mixed"]["top5"] == pytest.approx(100 / 6)
    lo, hi = got["gc-mixed"]["top1_ci"]
    assert lo < 0 < hi  # one loss and one gain: the interval straddles zero
    lo, hi = got["gc-mixed"]["top5_ci"]
    assert lo == 0.0 and hi > 0  # only gains: never below zero


def _record(model: str, setting: str, seed: int, top1: float, **extra) -> dict:
    mode = "full" if setting.startswith("full") else "gradcache"
    batch = int(setting.split("-b")[1])
    base = {"epochs": 1, "lr": 2e-5, "warmup_pct": 10, "chunk_size": 8, "dry_run": 0}
    return {"model": model, "setting": setting, "mode": mode, "batch_size": batch, "seed": seed,
            "dir": f"{model}-{setting}-s{seed}", "top1": top1, "top5": top1, "top20": top1,
            "top100": top1, **base, **extra}  # fmt: skip


def test_group_averages_seeds_and_flags_a_mismatch():
    records = [
        _record("m", "full-b8", 1, 60.0),
        _record("m", "full-b8", 2, 64.0),
        _record("m", "gradcache-b128", 1, 70.0),
    ]
    rows = {r["setting"]: r for r in runs.group(records)}
    assert rows["full-b8"]["seeds"] == [1, 2] and rows["full-b8"]["top1"] == 62.0
    assert rows["full-b8"]["top1_sd"] == pytest.approx(2**0.5 * 2)  # sample sd of 60, 64
    assert rows["gradcache-b128"]["top1_sd"] is None  # one seed: no spread, not zero
    note = table._seed_mismatch(runs.group(records))
    assert len(note) == 1 and "different seeds" in note[0]
    assert table._seed_mismatch(runs.group(records[:2])) == []


def test_seed_spread_of_the_paired_differences():
    def diff(setting: str, seed: int, top1: float, top5: float, top20: float) -> dict:
        return {"model": "m", "setting": setting, "seed": seed, "top1": top1, "top5": top5,
                "top20": top20}  # fmt: skip

    diffs = [
        diff("gradcache-b128", 1, 1.0, 0.0, 2.0),
        diff("gradcache-b128", 2, 3.0, 0.0, 2.0),
        diff("gradcache-b512", 1, -5.0, 1.0, 0.0),
    ]
    got = {s["setting"]: s for s in runs.seed_spread(diffs)}
    assert got["gradcache-b128"]["seeds"] == [1, 2]
    assert got["gradcache-b128"]["top1"] == 2.0
    assert got["gradcache-b128"]["top1_sd"] == pytest.approx(2**0.5)
    assert got["gradcache-b128"]["top5_sd"] == 0.0
    assert got["gradcache-b512"]["top1_sd"] is None


def test_runs_with_different_recipes_are_refused():
    same = [_record("m", "full-b8", 1, 60.0), _record("m", "gradcache-b128", 1, 61.0)]
    runs.check_same_recipe(same)
    mixed = [*same, _record("m", "gradcache-b512", 1, 58.0, epochs=2)]
    with pytest.raises(SystemExit, match="epochs"):
        runs.check_same_recipe(mixed)


def test_readme_block_is_replaced_between_the_markers(tmp_path):
    readme = tmp_path / "README.md"
    readme.write_text(f"intro\n{table.README_BEGIN}\nold table\n{table.README_END}\noutro\n")
    table.write_readme_block(readme, ["| new |", "|---|"])
    assert readme.read_text() == (
        f"intro\n{table.README_BEGIN}\n| new |\n|---|\n{table.README_END}\noutro\n"
    )
    readme.write_text("no markers\n")
    with pytest.raises(SystemExit, match="needs one"):
        table.write_readme_block(readme, ["x"])
