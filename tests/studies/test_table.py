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
    return {
        "mode": mode,
        "batch_size": 128,
        "lr": lr,
        "seed": seed,
        "dir": name,
        "digests": DIGESTS,
        **extra,
    }


def test_per_question_metrics_from_a_results_file(tmp_path):
    _run(tmp_path, "full", 1, [0, 4, None, 19])
    got = runs.per_question(tmp_path / "full-b128-lr2e-05-s1" / "eval" / "retrieval.json")
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
    base = {
        "epochs": 3,
        "warmup_pct": 10,
        "chunk_size": 8,
        "max_passage_length": 96,
        "dry_run": 0,
        "steps": 180,
        "negatives_per_question": 15,
    }
    metrics = {m: top1 for m in runs.METRICS}
    return {
        "mode": mode,
        "batch_size": batch,
        "lr": lr,
        "seed": seed,
        "dir": f"{mode}-{lr}-s{seed}",
        **metrics,
        **base,
        **extra,
    }


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
        ("full", 2e-5),
        ("accumulate", 2e-5),
        ("gradcache", 2e-5),
        ("gradcache", 1e-4),
    ]
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
    assert (
        "| accumulation 16 x 8 (128 examples an update, 8 in a batch) | 64.3 | 77.2 | 84.9 "
        "| 60.0 | 60.0 | 60.0 |" in lines
    )
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
    begin, end = table.README_BEGIN, table.README_END
    for broken in ("no markers\n", f"{end}\nx\n{begin}\n", f"{begin}\n{begin}\n{end}\n"):
        readme.write_text(broken)
        with pytest.raises(SystemExit, match="needs one"):
            table.write_readme_block(readme, ["x"])
        assert readme.read_text() == broken


RECIPE = {
    "epochs": 3,
    "warmup_pct": 10,
    "chunk_size": 8,
    "max_passage_length": 96,
    "temperature": 0.05,
    "dry_run": 0,
}


def _kept_run(mode: str, seed: int, top1: float, lr: float = 2e-5, source: str = "lost") -> dict:
    """A kept run record (kept.RUN_FIELDS), every metric at ``top1``."""
    times = {"train_wall_seconds": 3600.0, "index_seconds": None, "eval_seconds": None}
    record = {**_record(mode, seed, top1, lr=lr), **RECIPE, "source": source, **times}
    return {k: record.get(k) for k in (*kept.RUN_FIELDS, "source")}


def _diff(seed: int | str, value: float, lr: float = 2e-5, seeds=(1, 2)) -> dict:
    cells = {m: value for m in runs.METRICS} | {
        f"{m}_ci": [value - 1, value + 1] for m in runs.METRICS
    }
    extra = {"seeds": list(seeds)} if seed == "all" else {}
    return {"batch_size": 128, "lr": lr, "seed": seed, **extra, **cells}


def test_a_run_made_again_replaces_its_kept_record_and_the_differences_it_was_in():
    lost = [_kept_run(mode, s, 60.0 + s) for mode in ("accumulate", "gradcache") for s in (1, 2, 3)]
    diffs = [*(_diff(s, 1.0) for s in (1, 2, 3)), _diff("all", 1.0, seeds=(1, 2, 3))]
    covered = [list(kept.run_key(r)) for r in lost]
    kept_runs = {"runs": lost, "diffs": diffs, "unattributed": {"hours": 0.6, "runs": covered}}
    fresh = [
        _kept_run(mode, seed, 50.0, source="new")
        for mode, seed in (("accumulate", 1), ("gradcache", 1), ("gradcache", 4))
    ]
    merged = kept.merge_runs(kept_runs, fresh)
    acc = runs.group([r for r in merged if r["mode"] == "accumulate"])[0]
    assert acc["seeds"] == [1, 2, 3] and acc["per_seed"]["top1"] == [50.0, 62.0, 63.0]
    assert [r["seed"] for r in merged if r["mode"] == "gradcache"] == [1, 2, 3, 4]
    diffs, warnings = kept.merge_diffs(kept_runs, fresh, [_diff(1, 2.0)])
    assert [(d["seed"], d["top1"]) for d in diffs] == [(1, 2.0), (2, 1.0), (3, 1.0)]
    # seed 1 was computed again (no warning); the row over seeds 1-3 was not; seed 4 is unpaired
    assert len(warnings) == 2, warnings
    assert "seed all dropped" in warnings[0] and "seed 4" in warnings[1]
    # two of the six runs the 0.6 h covered were made again: their share goes
    assert kept.unattributed(kept_runs, fresh)["hours"] == pytest.approx(0.4)
    # the kept runs' own folders read again change nothing, and drop nothing
    same = [{**r, "source": "their folders"} for r in lost]
    assert kept.remade(kept_runs, same) == set()
    assert kept.merge_diffs(kept_runs, same, []) == (
        sorted(kept_runs["diffs"], key=runs.diff_order),
        [],
    )
    assert kept.unattributed(kept_runs, same)["hours"] == 0.6
    # one of the pair made again, its partner not: that seed's kept difference goes, with a warning
    lone = [{**lost[1], "top1": 10.0}]  # accumulation, seed 2
    got, warnings = kept.merge_diffs(kept_runs, lone, [])
    assert [d["seed"] for d in got] == [1, 3]
    assert "seed 2 dropped" in warnings[0] and "seed all dropped" in warnings[1]
    some = kept_runs["diffs"][:2] + kept_runs["diffs"][3:]  # seeds 1, 2 and the row over 1-3
    partial, warnings = kept.merge_diffs({**kept_runs, "diffs": some}, [], [])
    assert "over seeds [1, 2, 3] leaves out some of the paired seeds [1, 2]" in warnings[0]


def _run_folder(root: Path, mode: str, seed: int, first_hits: list[int | None]) -> None:
    """A finished run folder as run.sh leaves it: run.json, eval/metrics.json, train_log.jsonl
    and eval/retrieval.json."""
    _run(root, mode, seed, first_hits)
    folder = root / f"{mode}-b128-lr2e-05-s{seed}"
    per_q = runs.per_question(folder / "eval" / "retrieval.json")
    metrics = {m: float(v.mean()) for m, v in per_q.items()} | {"n_questions": len(first_hits)}
    (folder / "eval" / "metrics.json").write_text(json.dumps(metrics))
    run = {
        "mode": mode,
        "batch_size": 128,
        "lr": 2e-5,
        "seed": seed,
        **RECIPE,
        "train_wall_seconds": 1800.0,
        "index_seconds": 60.0,
        "eval_seconds": 30.0,
    }
    (folder / "run.json").write_text(json.dumps(run))
    step = {"seconds": 10.0, "peak_memory_bytes": 1e9, "negatives_per_question": 15}
    log = [{"step": i + 1, **step, "batch_digest": d} for i, d in enumerate(DIGESTS)]
    (folder / "train_log.jsonl").write_text("".join(json.dumps(r) + "\n" for r in log))


def _build(tmp_path: Path, monkeypatch, name: str, runs_dir: Path, kept_json: Path | None) -> str:
    out = {"--md": f"{name}.md", "--png": f"{name}.png", "--reading": "none.md"}
    argv = ["table", "--runs", str(runs_dir)]
    argv += [a for flag, file in out.items() for a in (flag, str(tmp_path / file))]
    monkeypatch.setattr("sys.argv", argv + (["--kept", str(kept_json)] if kept_json else []))
    table.main()
    return (tmp_path / f"{name}.md").read_text().replace(f"({name}.png)", "(plot)")


def test_a_page_rebuilt_from_its_results_json_is_the_same_page(tmp_path, monkeypatch):
    folders = tmp_path / "runs"
    for seed, acc, gc in ((1, [0, 3, 10, None], [0, 0, 10, 4]), (2, [1, 3, 0, 0], [0, 3, 0, 0])):
        _run_folder(folders, "accumulate", seed, acc)
        _run_folder(folders, "gradcache", seed, gc)
    first = _build(tmp_path, monkeypatch, "a", folders, None)
    # the same folders again over their own kept data: nothing counted twice
    again = _build(tmp_path, monkeypatch, "b", folders, tmp_path / "a.json")
    # the folders lost: the kept data alone
    alone = _build(tmp_path, monkeypatch, "c", tmp_path / "gone", tmp_path / "b.json")
    assert first == again == alone
    assert "Machine time of the runs behind this page: 2.1 h." in first  # 4 x (1800 + 90) s
    assert "| accumulation 16 x 8 | 1,2 | 3 | 15 | 37.5 ± 17.7 |" in first
    assert "| GradCache B=128 − accumulation 16 x 8 | all: 1,2 | +25.0 [" in first
    changed = json.loads((tmp_path / "c.json").read_text())
    changed["runs"][0]["top1"] = 99.0  # a negative control: the page does read the kept data
    (tmp_path / "c.json").write_text(json.dumps(changed))
    assert _build(tmp_path, monkeypatch, "d", tmp_path / "gone", tmp_path / "c.json") != first


def test_a_kept_file_of_another_recipe_or_not_a_kept_file_is_refused(tmp_path, monkeypatch):
    folders = tmp_path / "runs"
    _run_folder(folders, "accumulate", 1, [0, 1])
    other = {**kept.empty(), "runs": [{**_kept_run("gradcache", 1, 60.0), "temperature": 1.0}]}
    (tmp_path / "other.json").write_text(json.dumps(other))
    with pytest.raises(SystemExit, match="differ in temperature .*-s1 from lost: 1.0"):
        _build(tmp_path, monkeypatch, "x", folders, tmp_path / "other.json")
    (tmp_path / "broken.json").write_text('{"runs": []}')
    with pytest.raises(SystemExit, match=r"broken.json: not a results.json \(no diffs"):
        _build(tmp_path, monkeypatch, "x", folders, tmp_path / "broken.json")
    with pytest.raises(SystemExit, match=r"missing.json: cannot read kept results"):
        _build(tmp_path, monkeypatch, "x", folders, tmp_path / "missing.json")
    assert not (tmp_path / "x.md").exists() and not (tmp_path / "x.json").exists()
