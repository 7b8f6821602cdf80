"""``benchmarks.sharding``'s dry run (a tiny BERT and the tiny Llama with LoRA at 1 and 2 gloo
ranks, every case of a world size in one process group): FSDP divides what a rank holds by the
world size, DDP holds it whole, the gradients agree, and the page says so."""

from __future__ import annotations

import json

import pytest
import torch.distributed as dist

from tests.support.cli import run_benchmark

pytestmark = [
    pytest.mark.slow,  # spawned ranks importing torch and transformers: about 30 s
    pytest.mark.skipif(
        not (dist.is_available() and dist.is_gloo_available()),
        reason="torch.distributed with gloo is unavailable",
    ),
]


@pytest.fixture(scope="module")
def dry(tmp_path_factory):
    out = tmp_path_factory.mktemp("sharding")
    proc = run_benchmark("sharding", "--dry-run", "--out", str(out), timeout=300)
    assert proc.returncode == 0, proc.stderr[-3000:]
    return json.loads((out / "sharding.json").read_text()), (out / "sharding.md").read_text()


def test_fsdp_divides_what_a_rank_holds_and_ddp_does_not(dry):
    result, _ = dry
    assert list(result["models"]) == ["bert", "llama-lora"]
    for name, model in result["models"].items():
        runs = {(r["world"], r["shard"]): r for r in model["runs"]}
        assert set(runs) == {(1, "none"), (1, "fsdp"), (2, "none"), (2, "fsdp")}
        whole = runs[(1, "none")]["max"]
        assert runs[(2, "none")]["max"]["held"] == whole["held"]  # DDP: a copy on every rank
        assert runs[(1, "fsdp")]["max"]["held"] == whole["held"]  # a group of one: all of it
        sharded = runs[(2, "fsdp")]
        for kind in ("parameters", "gradients", "optimizer_state", "held"):
            assert 0.5 <= sharded["ratio"][kind] <= 0.52, (name, kind, sharded["ratio"])
        # both ranks hold about half: the shards are FSDP's even split on the first dimension
        held = [rank["held"] for rank in sharded["ranks"]]
        assert sum(held) == pytest.approx(whole["held"], rel=0.02)
        for r in model["runs"]:
            assert r["grad_gap"] <= 1e-12, (name, r["world"], r["shard"], r["grad_gap"])
            assert r["max"]["optimizer_state"] > 2 * r["max"]["trainable_parameters"] - 1
            assert r["max"]["peak_rss"] > 0
    lora = result["models"]["llama-lora"]
    assert lora["trainable"] < lora["parameters"] / 4  # the adapters alone train


def test_the_page_states_the_ratio_and_what_is_not_counted(dry):
    result, page = dry
    assert page.startswith("# What a rank holds: `train.shard` none (DDP) against fsdp")
    assert "**Dry run**" in page
    assert "| 2 | fsdp | " in page and "| 2 | none (DDP) | " in page
    assert "DDP's gradient buckets" in page and "dominated by the libraries" in page
    bert = result["models"]["bert"]["runs"][-1]
    assert f"{bert['ratio']['held']:.3f} at W=2 (1/W = 0.500)" in page
