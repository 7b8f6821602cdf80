"""``python -m benchmarks.realtext``: real batches and their token counts, the plan, the summaries
and targets, and a tiny end-to-end run."""

from __future__ import annotations

import dataclasses
import json
import os
from pathlib import Path

import pytest

from benchmarks import point, realtext
from benchmarks.point import PointSpec, run_point
from tests.support.fixtures import TOY

TINY = str(TOY / "tiny-bert")
REAL = {"model": TINY, "text": str(TOY / "train.jsonl"), "q_len": 64, "p_len": 256}
REAL |= {"hard_negatives": 1, "chunk": 4, "warmup": 0, "repeats": 1, "dropout": 0.0}


def _point(tmp_path, **kw) -> dict:
    return run_point(PointSpec(**{**REAL, "cache_dir": str(tmp_path), **kw}))


def test_real_batches_count_every_token_each_mode_encodes(tmp_path):
    """Counted independently of the hook: the full batch encodes its padded inputs once; ours
    encodes each chunk at its own width, the graph-less chunks twice."""
    from benchmarks.point import load_point

    full = _point(tmp_path, mode="full", batch=8)
    _, q, p, _, collate_s = load_point(
        PointSpec(**{**REAL, "mode": "full", "batch": 8, "cache_dir": str(tmp_path)})
    )
    assert full["encoded_tokens"] == q["input_ids"].numel() + p["input_ids"].numel()
    assert full["real_tokens"] == int(q["attention_mask"].sum() + p["attention_mask"].sum())
    assert full["real_tokens"] < full["encoded_tokens"] and collate_s > 0  # ragged: padded
    ordered = _point(tmp_path, mode="gradcache", batch=8)
    batch_order = _point(tmp_path, mode="gradcache", batch=8, length_order=False)
    assert ordered["real_tokens"] == batch_order["real_tokens"] == full["real_tokens"]
    assert ordered["encoded_tokens"] < batch_order["encoded_tokens"]
    assert ordered["loss"] == pytest.approx(full["loss"], rel=1e-5)  # no dropout: same loss


def test_plan_summaries_and_targets():
    plan = realtext.RealTextPlan(batches=[128, 512], full_batches=[32, 64], memory_batch=2048)
    timed, memory = realtext.plan_configs(plan)
    labels = [realtext.label(dataclasses.asdict(s)) for s in timed]
    assert [s.warmup for s in timed if s.batch == 512] == [0, 0, 0]  # ours and the peers
    assert labels[:5] == [
        "ours (gradcache) B=128 chunk 32",
        "ours (gradcache) B=128 chunk 32, batch order",
        "ours (gradcache) B=128 chunk 32, bf16",
        "st-cmnrl B=128 chunk 32",
        "gradcache-lib B=128 chunk 32",
    ]
    assert "ours (gradcache) B=512 chunk 32, batch order" not in labels  # first batch only
    assert labels[-3:] == ["full B=32", "full B=64", "full B=32, bf16"]
    assert [(m.batch, m.warmup, m.repeats) for m in memory] == [(2048, 0, 1)]
    only = realtext.RealTextPlan(
        batches=[128],
        full_batches=[8, 16],
        memory_batch=None,
        bf16=False,
        peers=False,
        batch_order=False,
    )
    assert [realtext.label(dataclasses.asdict(s)) for s in realtext.plan_configs(only)[0]] == [
        "ours (gradcache) B=128 chunk 32",
        "full B=8",
        "full B=16",
    ]

    def row(spec: PointSpec, round_: int, step_s: float, peak_gb: float) -> dict:
        return {
            **dataclasses.asdict(spec),
            "key": spec.key(),
            "round": round_,
            "step_s": step_s,
            "peak_bytes": peak_gb * 1e9,
            "real_tokens": 1000,
            "encoded_tokens": 1500,
            "collate_s": 0.1,
        }

    ours, cmnrl, lib = timed[0], timed[3], timed[4]
    full32, full64 = timed[-3], timed[-2]
    rows = [row(ours, r, s, 2.0) for r, s in ((1, 10.0), (2, 12.0), (3, 40.0))]  # median 12
    rows += [row(cmnrl, 1, 18.0, 3.0), row(lib, 1, 15.0, 3.0)]
    rows += [row(full32, 1, 4.0, 5.0)]  # 8 pairs/s, within 8 GB
    rows += [row(full64, 1, 5.0, 9.0)]  # 12.8 pairs/s but over budget
    rows += [{**row(memory[0], 1, 0, 0), "error": "exit 1: killed"}]
    summaries = realtext.summarize(rows, plan.budget_gb)
    by_label = {s["label"]: s for s in summaries}
    assert by_label["ours (gradcache) B=128 chunk 32"]["step_s"] == 12.0
    assert by_label["full B=64"]["within_budget"] is False
    assert by_label["ours (gradcache) B=2048 chunk 32"]["errors"] == ["exit 1: killed"]
    found = realtext.targets(summaries, plan)
    got = {t["target"].split(",")[0].split(" vs ")[1]: t for t in found}
    best = got["the best full batch in 8 GB"]
    assert (
        best["value"] == pytest.approx((128 / 12) / 8, abs=1e-3) and "full B=32" in best["detail"]
    )
    assert got["st-cmnrl"]["value"] == pytest.approx(18 / 12, abs=1e-3) and got["st-cmnrl"]["met"]
    assert (
        got["gradcache-lib"]["value"] == pytest.approx(15 / 12, abs=1e-3)
        and got["gradcache-lib"]["met"]
    )
    assert len(got) == 3  # the memory point failed: no memory target


def test_cli_tiny_run_writes_the_page_and_resumes(tmp_path, run_benchmark):
    out = tmp_path / "rt"
    args = [
        "--text",
        str(TOY / "train.jsonl"),
        "--model",
        TINY,
        "--batches",
        "8",
        "--full-batches",
        "4",
        "--memory-batch",
        "0",
        "--chunk",
        "4",
        "--rounds",
        "2",
        "--warmup",
        "0",
        "--no-peers",
        "--no-bf16",
        "--cache-dir",
        str(tmp_path / "cache"),
        "--out",
        str(out),
    ]
    done = run_benchmark("realtext", *args)
    assert done.returncode == 0, done.stderr[-2000:]
    lines = (out / realtext.POINTS_FILE).read_text().splitlines()
    assert len(lines) == 3 * 2  # ours, ours in batch order, full B=4; two rounds each
    page = (out / "realtext.md").read_text()
    assert "| ours (gradcache) B=8 chunk 4 | 2 |" in page
    _assert_this_machine(json.loads((out / "realtext.json").read_text())["machine"], page)
    assert "kept from earlier runs" not in page
    again = run_benchmark("realtext", *args, "--reuse")  # all done: nothing is run again
    assert again.returncode == 0
    assert (out / realtext.POINTS_FILE).read_text().splitlines() == lines
    assert "this run measured 0 of the 6 rows" in (out / "realtext.md").read_text()


def test_reuse_reads_only_this_plan_rows_and_retries_failed_rounds(tmp_path, monkeypatch):
    plan = realtext.RealTextPlan(
        batches=[8],
        full_batches=[4],
        chunk=4,
        memory_batch=None,
        rounds=2,
        bf16=False,
        peers=False,
    )
    timed, _ = realtext.plan_configs(plan)  # ours, ours in batch order, full B=4

    def row(spec: PointSpec, round_: int, step_s: float) -> dict:
        return {
            **dataclasses.asdict(spec),
            "key": spec.key(),
            "round": round_,
            "step_s": step_s,
            "peak_bytes": 1e9,
            "real_tokens": 100,
            "encoded_tokens": 150,
            "collate_s": 0.1,
        }

    stale = dataclasses.replace(timed[2], batch=64)  # a full batch an earlier plan measured
    saved = [row(stale, 1, 0.1), row(timed[1], 1, 3.0)]
    saved.append({**row(timed[0], 1, 0.0), "error": "exit 1: killed"})
    out = tmp_path / "rt"
    out.mkdir()
    (out / realtext.POINTS_FILE).write_text("".join(json.dumps(r) + "\n" for r in saved))
    calls = []

    def fake_run_point(spec: PointSpec) -> dict:
        calls.append(spec)
        return {k: v for k, v in row(spec, 0, 2.0).items() if k not in ("key", "round")}

    monkeypatch.setattr(point, "run_in_child", fake_run_point)
    result = realtext.run_realtext(plan, out, reuse=True, echo=lambda line: None)
    ours, order, full = timed
    assert calls == [ours, full, ours, order, full]  # round 1 of ours failed: run again
    assert (result["rows_measured"], result["rows_kept"]) == (5, 1)
    labels = [c["label"] for c in result["configs"]]
    assert "full B=64" not in labels and len(labels) == 3  # the earlier plan's row is not read
    mine = next(c for c in result["configs"] if c["label"] == "ours (gradcache) B=8 chunk 4")
    assert mine["rounds"] == 2 and mine["errors"] == []  # the retried round replaced the failure
    assert "this run measured 5 of the 6 rows" in (out / "realtext.md").read_text()


def _assert_this_machine(machine: dict, page: str) -> None:
    """The recorded machine is this one, read here from /proc: its CPU model, every vector flag
    it has of the kinds recorded (and none it lacks), its cores; the page names the model and
    the flags."""
    cpuinfo = Path("/proc/cpuinfo").read_text().splitlines()
    model = next(line.split(":", 1)[1].strip() for line in cpuinfo if line.startswith("model name"))
    flags = next(line.split(":", 1)[1].split() for line in cpuinfo if line.startswith("flags"))
    vector = [f for f in flags if f.startswith(("avx", "fma", "amx", "sse4", "f16c"))]
    assert machine["cpu"] == model and machine["flags"] == vector and vector
    assert machine["cores"] == os.cpu_count()
    assert model in page and " ".join(vector) in page
