"""The batch-size study's table: arms over seeds, the paired comparison of GradCache with
accumulation (checked against hand counts), the pairing check and the paper's labels."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest

from studies.squad_batch_size import kept, runs, table

DIGESTS = ["a1", "b2", "c3"]


def _run(
    root: Path, mode: str, seed: int, first_hits: list[int | None], lr: float = 2e-5, **extra
) -> dict:
    """A run folder whose question i has its first answer at rank first_hits[i] (None: never),
    and its record as runs.collect gives it."""
    name = f"{mode}-b128-lr{lr:g}-s{seed}"
    entries = []
    for hit in first_hits:
        ctxs = [{"id": str(r), "has_answer": r == hit} for r in range(30)]
        entries.append({"question": "q", "answers": ["a"], "ctxs": ctxs})
    (root / name / "eval").mkdir(parents=True)
    (root / name / "eval" / "retrieval.json").write_text(json.dumps(entries))
    return {"mode": mode, "batch_size": 128, "lr": lr, "seed": seed, "dir": name,
            "digests": DIGESTS, **extra}  # fmt: skip


def test_first_hit_ranks_and_per_question_metrics(tmp_path):
    _run(tmp_path, "full", 1, [0, 4, None, 19])
    ranks = runs.first_hit_ranks(tmp_path / "full-b128-lr2e-05-s1" / "eval" / "retrieval.json")
    assert ranks.tolist() == [0, 4, float("inf"), 19]
    got = runs.per_question(ranks)
    assert got["top1"].tolist() == [100, 0, 0, 0] and got["top5"].tolist() == [100, 100, 0, 0]
    assert got["top20"].tolist() == [100, 100, 0, 100]
    assert got["mrr@10"].tolist() == pytest.approx([100, 20, 0, 0])  # rank 19 is past 10


def test_paired_differences_against_a_hand_count(tmp_path):
    acc = _run(tmp_path, "accumulate", 1, [0, 3, 10, None, 0, 25])
    same = _run(tmp_path, "gradcache", 1, [0, 3, 10, None, 0, 25])
    [d] = runs.paired_differences([acc, same], tmp_path)
    assert d["top5"] == 0 and d["top5_ci"] == (0.0, 0.0) and d["seed"] == 1
    mixed = _run(tmp_path, "gradcache", 2, [2, 0, 10, 4, 0, 25])
    acc2 = _run(tmp_path, "accumulate", 2, [0, 3, 10, None, 0, 25])
    got = {d["seed"]: d for d in runs.paired_differences([acc, same, acc2, mixed], tmp_path)}
    # seed 2, top-1: loses q0, gains q1 -> 0; top-5: gains q3 -> +1/6; MRR@10: q0 1 -> 1/3,
    # q1 1/4 -> 1, q3 0 -> 1/5
    assert got[2]["top1"] == pytest.approx(0.0)
    assert got[2]["top5"] == pytest.approx(100 / 6)
    assert got[2]["mrr@10"] == pytest.approx(100 * (-2 / 3 + 3 / 4 + 1 / 5) / 6)
    lo, hi = got[2]["top1_ci"]
    assert lo < 0 < hi  # one loss and one gain: the interval straddles zero
    lo, hi = got[2]["top5_ci"]
    assert lo == 0.0 and hi > 0  # only gains: never below zero
    # over both seeds: the mean of the two differences, their sd, an interval between
    pooled = got["all"]
    assert pooled["seeds"] == [1, 2]
    assert pooled["top5"] == pytest.approx(100 / 12)
    assert pooled["top5_sd"] == pytest.approx(np.std([0, 100 / 6], ddof=1))
    assert pooled["top5_ci"][0] == 0.0 and pooled["top5_ci"][1] < got[2]["top5_ci"][1]


def test_a_pair_must_have_trained_on_the_same_batches(tmp_path):
    acc = _run(tmp_path, "accumulate", 1, [0, 1])
    other = _run(tmp_path, "gradcache", 1, [0, 1], digests=["a1", "b2", "zz"])
    with pytest.raises(SystemExit, match="same batches"):
        runs.paired_differences([acc, other], tmp_path)
    unlogged = {**other, "digests": [None, None, None]}  # a log written before digests
    with pytest.raises(SystemExit, match="same batches"):
        runs.paired_differences([acc, unlogged], tmp_path)
    other_lr = _run(tmp_path, "gradcache", 1, [0, 1], lr=1e-4)  # no accumulation at its lr
    assert runs.paired_differences([acc, other_lr], tmp_path) == []


def _record(mode: str, seed: int, top1: float, lr: float = 2e-5, batch: int = 128, **extra):
    base = {"epochs": 3, "warmup_pct": 10, "chunk_size": 8, "max_passage_length": 96,
            "dry_run": 0, "steps": 180, "negatives_per_question": 15}  # fmt: skip
    metrics = {m: top1 for m in runs.METRICS}
    return {"mode": mode, "batch_size": batch, "lr": lr, "seed": seed,
            "dir": f"{mode}-{lr}-s{seed}", **metrics, **base, **extra}  # fmt: skip


def test_group_averages_seeds_per_arm_in_the_papers_order():
    records = [
        _record("gradcache", 1, 70.0),
        _record("accumulate", 2, 64.0),
        _record("accumulate", 1, 60.0),
        _record("gradcache", 1, 71.0, lr=1e-4),
        _record("full", 1, 55.0, batch=8),
    ]
    rows = runs.group(records)
    assert [(r["mode"], r["lr"]) for r in rows] == [
        ("full", 2e-5), ("accumulate", 2e-5), ("gradcache", 2e-5), ("gradcache", 1e-4)
    ]  # fmt: skip
    acc = rows[1]
    assert acc["seeds"] == [1, 2] and acc["per_seed"]["top1"] == [60.0, 64.0]
    assert acc["top1"] == 62.0 and acc["top1_sd"] == pytest.approx(2**0.5 * 2)
    assert rows[2]["top1_sd"] is None  # one seed: no spread, not zero


def test_labels_follow_the_paper():
    assert runs.arm_label("full", 8, 2e-5, 8, 2e-5) == "sequential B=8"
    assert runs.arm_label("accumulate", 128, 2e-5, 8, 2e-5) == "accumulation 16 x 8"
    assert runs.arm_label("gradcache", 128, 1e-4, 8, 2e-5) == "GradCache B=128, lr 1e-4"
    assert runs.format_lr(2e-5) == "2e-5" and runs.format_lr(3e-4) == "3e-4"
    rows = runs.group([_record("accumulate", 1, 60.0), _record("gradcache", 1, 70.0)])
    lines = table.paper_table(rows)
    assert "| accumulation 16 x 8 (128 examples an update, 8 in a batch) | 64.3 | 77.2 | 84.9 " \
        "| 60.0 | 60.0 | 60.0 |" in lines  # fmt: skip
    assert "| GradCache B=128 | 68.6 | 79.3 | 86.0 | 70.0 | 70.0 | 70.0 |" in lines
    assert "| sequential B=8 (what fits one GPU) | 59.3 | 71.9 | 80.9 | not run" in lines[2]


def test_runs_of_different_recipes_are_refused_but_lr_is_an_arm():
    same = [_record("accumulate", 1, 60.0), _record("gradcache", 1, 61.0, lr=1e-4)]
    runs.check_same_recipe(same)
    mixed = [*same, _record("gradcache", 2, 58.0, epochs=2)]
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


def _kept(arms: list[dict], diffs: list[dict], hours: float, source: str, **recipe) -> dict:
    base = {"epochs": 3, "warmup_pct": 10, "chunk_size": 8, "max_passage_length": 96,
            "temperature": 0.05, "dry_run": 0, "n_questions": 6}  # fmt: skip
    refs = [["all-MiniLM-L6-v2 off the shelf", {m: 50.0 for m in runs.METRICS}]]
    return {"recipe": {**base, **recipe}, "machine_hours": hours, "sources": [source],
            "refs": refs, "arms": arms, "diffs": diffs}  # fmt: skip


def _diff(seed: int | str, value: float, lr: float = 2e-5) -> dict:
    cells = {m: value for m in runs.METRICS} | {
        f"{m}_ci": [value - 1, value + 1] for m in runs.METRICS
    }
    seeds = {"seeds": [1, 2]} if seed == "all" else {}
    return {"batch_size": 128, "lr": lr, "seed": seed, **seeds, **cells}


def test_kept_results_keep_lost_arms_and_fresh_runs_replace_what_they_redo(tmp_path):
    earlier = runs.group([_record("accumulate", 1, 60.0), _record("gradcache", 1, 70.0),
                          _record("accumulate", 1, 64.0, lr=1e-4)])  # fmt: skip
    fresh = runs.group(
        [_record("accumulate", 1, 64.5, lr=1e-4), _record("gradcache", 1, 66.0, lr=1e-4)]
    )
    merged = kept.merge(
        _kept(earlier, [_diff(1, 10.0)], 8.0, "lost runs"),
        _kept(fresh, [_diff(1, 1.5, lr=1e-4)], 1.5, "runs/x"),
        tmp_path / "results.json",
    )
    got = [(a["mode"], a["lr"], a["top1"]) for a in merged["arms"]]
    assert got == [("accumulate", 2e-5, 60.0), ("gradcache", 2e-5, 70.0),
                   ("accumulate", 1e-4, 64.5), ("gradcache", 1e-4, 66.0)]  # fmt: skip
    assert [(d["lr"], d["top1"]) for d in merged["diffs"]] == [(2e-5, 10.0), (1e-4, 1.5)]
    assert merged["machine_hours"] == 9.5 and merged["sources"] == ["lost runs", "runs/x"]
    with pytest.raises(SystemExit, match=r"results.json: .* temperature"):
        kept.merge(_kept(earlier, [], 8.0, "a"), _kept(fresh, [], 1.0, "b", temperature=1.0),
                   tmp_path / "results.json")  # fmt: skip
    assert kept.merge(merged, None, tmp_path / "results.json") is merged  # no runs: as kept


def test_a_page_built_from_its_own_results_json_is_the_same_page(tmp_path, monkeypatch):
    arms = runs.group([_record("accumulate", 1, 60.0), _record("accumulate", 2, 61.0),
                       _record("gradcache", 1, 70.0), _record("gradcache", 2, 72.0)])  # fmt: skip
    first = tmp_path / "first.json"
    kept.save(first, _kept(arms, [_diff(1, 10.0), _diff(2, 11.0), _diff("all", 10.5)], 2.0, "s"))
    pages = []
    for name, source in (("a", first), ("b", tmp_path / "a.json")):
        argv = ["table", "--runs", str(tmp_path / "none"), "--kept", str(source),
                "--md", str(tmp_path / f"{name}.md"), "--png", str(tmp_path / f"{name}.png"),
                "--reading", str(tmp_path / "none.md")]  # fmt: skip
        monkeypatch.setattr("sys.argv", argv)
        table.main()
        pages.append((tmp_path / f"{name}.md").read_text().replace(f"({name}.png)", ""))
    assert pages[0] == pages[1]
    assert "| accumulation 16 x 8 | 1,2 | 180 | 15 | 60.5 ± 0.7 |" in pages[0]
    assert "| GradCache B=128 − accumulation 16 x 8 | all: 1,2 | +10.5 [+9.5, +11.5] |" in pages[0]
    assert "| all-MiniLM-L6-v2 off the shelf | – | – | – | 50.0 |" in pages[0]
    (tmp_path / "broken.json").write_text('{"recipe": {}}')
    monkeypatch.setattr("sys.argv", ["table", "--kept", str(tmp_path / "broken.json")])
    with pytest.raises(SystemExit, match=r"broken.json: not a results.json \(no arms"):
        table.main()
