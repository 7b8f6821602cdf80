"""``python -m benchmarks.synthetic``: a tiny smoke run, the plan, the target ratios, and the
peer adapters."""

from __future__ import annotations

import dataclasses
import functools
import json

import pytest
import torch

from benchmarks.peers import make_peer, peer_available
from benchmarks.synthetic import BenchPlan, plan_points, targets
from dpr_cache.core.engine import GradCache
from dpr_cache.core.loss import contrastive_loss
from dpr_cache.data.synthetic import synthetic_batch
from dpr_cache.model.biencoder import BiEncoder
from tests.support.fixtures import REPO, TOY

TINY = str(TOY / "tiny-bert")
PEERS = [name for name in ("st-cmnrl", "gradcache-lib") if peer_available(name)]


def test_smoke_run_writes_json_markdown_and_plots(tmp_path, run_benchmark):
    out = tmp_path / "bench"
    args = ["--model", TINY, "--pooling", "cls", "--dropout", "0", "--batches", "4"]
    args += ["--modes", "full,gradcache", "--chunk", "2", "--focus-batch", "4"]
    args += ["--memory-batches", "8", "--q-len", "8", "--p-len", "16", "--repeats", "2"]
    args += ["--out", str(out)] + (["--peers"] if len(PEERS) == 2 else [])
    proc = run_benchmark("synthetic", *args)
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert "written to" in proc.stdout
    for name in ("bench.json", "bench.md", "memory_vs_batch.png", "time_vs_batch.png"):
        assert (out / name).is_file() and (out / name).stat().st_size > 0, name
    result = json.loads((out / "bench.json").read_text())
    assert {"machine", "plan", "points", "targets", "command"} <= set(result)
    modes = {(p["mode"], p["batch"]) for p in result["points"]}
    assert {("full", 4), ("gradcache", 4), ("gradcache-tiled", 4), ("gradcache", 8)} <= modes
    for p in result["points"]:
        assert "error" not in p, p
        assert len(p["times_s"]) == p["warmup"] + p["repeats"]
        assert p["step_s"] > 0 and p["pairs_per_s"] > 0 and p["peak_bytes"] > 0
    losses = {p["loss"] for p in result["points"] if p["batch"] == 4}
    assert max(losses) - min(losses) < 1e-4  # dropout off: every mode computes the same loss
    names = [t["target"] for t in result["targets"]]
    assert any("best full batch" in n for n in names) and any("peak vs full" in n for n in names)
    page = (out / "bench.md").read_text()
    assert "## Targets" in page and "vector flags:" in page


def test_plan_points_sweep_focus_and_memory():
    plan = BenchPlan(batches=[8, 32, 64], modes=["full", "gradcache"], chunk=32, focus_batch=64)
    plan.memory_batches, plan.peers = [2048], True
    got = [(s.mode, s.batch, s.repeats) for s in plan_points(plan)]
    assert ("full", 8, 3) in got and ("gradcache", 8, 3) not in got  # chunked modes: B >= chunk
    assert {("st-cmnrl", 64, 3), ("gradcache-lib", 64, 3), ("gradcache-naive", 64, 3)} <= set(got)
    assert got[-1] == ("gradcache", 2048, 1)
    assert len(got) == len(set(got))


def test_targets_are_ratios_of_points():
    def point(mode, batch, pairs, peak):
        return {"mode": mode, "batch": batch, "pairs_per_s": pairs, "peak_bytes": peak}

    result = {
        "plan": {"focus_batch": 128, "chunk": 32},
        "points": [
            point("full", 16, 9.0, 1.0e9),
            point("full", 32, 10.0, 1.2e9),
            point("gradcache", 128, 8.5, 1.25e9),
            point("st-cmnrl", 128, 5.0, 1.3e9),
            point("gradcache", 2048, 8.0, 1.3e9),
        ],
    }
    got = {t["target"]: t for t in targets(result)}
    assert got["gradcache B=128 vs best full batch"]["value"] == 0.85
    assert got["gradcache B=128 vs best full batch"]["met"] is True
    assert got["gradcache vs st-cmnrl, B=128"]["value"] == 1.7
    assert got["gradcache vs gradcache-lib, B=128"]["met"] is None  # not measured
    assert got["gradcache B=2048 peak vs full B=32"]["value"] == pytest.approx(1.083, abs=1e-3)


@pytest.mark.parametrize("peer", PEERS or [pytest.param("none", marks=pytest.mark.skip)])
def test_peer_computes_our_loss_and_gradient(peer):
    """Dropout off: a peer's loss and gradients equal our GradCache's on the same module."""
    torch.manual_seed(0)
    model = BiEncoder.from_pretrained(TINY, shared=True, pooling="mean", dropout=0.0).train()
    vocab = model.query_encoder.config.vocab_size
    q, p, ids = synthetic_batch(model.tokenizer, vocab, 6, 12, 8, 16, seed=3)
    ours = GradCache(
        model.encode_query, model.encode_passage, functools.partial(contrastive_loss), 2
    )
    model.zero_grad()
    loss_ours = ours.step(q, p, p_ids=ids)
    grads_ours = [x.grad.clone() for x in model.parameters() if x.grad is not None]
    model.zero_grad()
    loss_peer = make_peer(peer, model, 2).step(q, p, p_ids=ids)
    grads_peer = [x.grad.clone() for x in model.parameters() if x.grad is not None]
    assert float(loss_peer) == pytest.approx(float(loss_ours), rel=1e-5)
    assert len(grads_peer) == len(grads_ours)
    for a, b in zip(grads_ours, grads_peer, strict=True):  # key biases: 0 up to rounding
        assert (a - b).norm() <= 1e-4 * a.norm() + 1e-8


def test_reuse_takes_only_a_row_of_the_same_spec(tmp_path, monkeypatch):
    from benchmarks import point
    from benchmarks.point import PointSpec
    from benchmarks.synthetic import spec_key

    spec = PointSpec(mode="gradcache", batch=128)
    current = {**dataclasses.asdict(spec), "step_s": 1.0}
    path, ran = tmp_path / "points.jsonl", []
    figures = {"step_s": 2.0, "pairs_per_s": 64.0, "encoded_tokens": 1, "peak_bytes": 1}
    monkeypatch.setattr(
        point, "run_in_child", lambda s: ran.append(s) or {**dataclasses.asdict(s), **figures}
    )

    def rerun(saved: dict) -> list[dict]:
        path.write_text(json.dumps(saved) + "\n")
        ran.clear()
        return point.run_points(path, [("p", spec, {})], True, spec_key, lambda line: None)[0]

    assert rerun(current)[0]["step_s"] == 1.0 and ran == []  # a row of the same spec is reused
    for field in ("length_order", "fast_dropout", "epoch_order"):
        lacking = {k: v for k, v in current.items() if k != field}  # measured before the field
        assert PointSpec.from_row(lacking) is None, field
        assert rerun(lacking)[0]["step_s"] == 2.0 and ran == [spec], field
    assert rerun({**current, "length_order": False})[0]["step_s"] == 2.0  # another setting
    assert len(path.read_text().splitlines()) == 2  # the measured row appended


def test_every_saved_row_names_every_setting_it_was_measured_with():
    """The committed rows are complete, so a rerun with --reuse keeps exactly what matches."""
    from benchmarks.point import PointSpec

    for name in ("points.jsonl", "realtext_points.jsonl", "same_session/realtext_points.jsonl"):
        for line in (REPO / "docs" / "bench" / name).read_text().splitlines():
            row = json.loads(line)
            spec = PointSpec.from_row(row)
            assert spec is not None, name
            if "key" in row:  # real text: the row's key is its spec's
                assert row["key"] == spec.key(), name


def test_machine_line_names_the_cpu_its_flags_and_ram():
    from benchmarks.harness import cpu_text

    info = {"cpu": "AMD EPYC", "cores": 2, "ram_gb": 25.3, "flags": ["avx2", "avx512f"]}
    assert cpu_text(info) == "AMD EPYC, 2 cores, 25.3 GB RAM; vector flags: avx2 avx512f"
    assert cpu_text({**info, "flags": [], "ram_gb": None}).endswith(
        "unknown RAM; vector flags: none listed"
    )
