"""scripts/reproduce_table.py: the paired comparison of a GradCache run with the full batch."""

from __future__ import annotations

import importlib.util
import json
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
_spec = importlib.util.spec_from_file_location("table", ROOT / "scripts" / "reproduce_table.py")
table = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(table)


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
    ranks = table.first_hit_ranks(tmp_path / "r" / "eval" / "retrieval.json")
    assert ranks == [0, 4, float("inf"), 19]


def test_paired_differences_against_a_hand_count(tmp_path):
    full = _run(tmp_path, "full-b8", "full", [0, 3, 10, None, 0, 25])
    same = _run(tmp_path, "gc-same", "gradcache", [0, 3, 10, None, 0, 25])
    better = _run(tmp_path, "gc-better", "gradcache", [0, 0, 0, 0, 0, 0])
    mixed = _run(tmp_path, "gc-mixed", "gradcache", [2, 0, 10, 4, 0, 25])
    got = {d["setting"]: d for d in table.paired_differences([full, same, better, mixed], tmp_path)}
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
