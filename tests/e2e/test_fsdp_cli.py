"""``train --set train.shard=fsdp`` under torchrun against the same run under DDP: the saved model,
the checkpoints, a resume on the same world size (bit for bit) and on another (3 sharded ranks,
from a sharded and from a DDP checkpoint); ``verify`` under torchrun with sharded towers. The
float64 checks of the sharded step and of resuming on other world sizes:
``tests/e2e/test_fsdp.py``."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest
import torch
import torch.distributed as dist

from tests.support.cli import run_cli
from tests.support.fixtures import saved_weights

pytestmark = [
    pytest.mark.slow,
    pytest.mark.skipif(
        not (dist.is_available() and dist.is_gloo_available()),
        reason="torch.distributed with gloo is unavailable",
    ),
]


def _train(out: Path, world: int, *extra: str, flags: tuple[str, ...] = (), check: bool = True):
    """``train`` of the toy config under torchrun, dropout off (the dropout of ranks that changed
    number cannot be replayed), 12 questions a step (6 a rank at 2 ranks, 4 at 3). Adam's eps
    is raised as in ``test_distributed``: the passage tower's last LayerNorm bias has a gradient
    of pure rounding noise, which Adam at eps 1e-8 turns into a step of about lr whatever its
    size."""
    args = ["train", "-c", "configs/toy.yaml", *flags, "--set", f"output_dir={out}"]
    for item in (
        "train.device=cpu",
        "train.batch_size=12",
        "train.chunk_size=4",
        "train.max_steps=4",
        "train.checkpoint_every=2",
        "train.adam_eps=1e-4",
        "model.dropout=0.0",
        f"data.cache_dir={out.parent / 'cache'}",
        *extra,
    ):
        args += ["--set", item]
    return run_cli(*args, "-q", world=world, check=check)


def _cut_at_two(run: Path, out: Path) -> Path:
    """A copy of a finished 4-step run as it was after step 2: its last checkpoint and its
    model gone."""
    shutil.copytree(run, out)
    shutil.rmtree(out / "checkpoints" / "step-00000004")
    shutil.rmtree(out / "model")
    return out


@pytest.fixture(scope="module")
def cli_runs(tmp_path_factory) -> Path:
    """``train`` under torchrun at 2 ranks, under DDP and sharded (FSDP), never interrupted."""
    root = tmp_path_factory.mktemp("fsdp-cli")
    _train(root / "ddp", 2)
    _train(root / "fsdp", 2, "train.shard=fsdp")
    return root


def test_torchrun_fsdp_trains_the_ddp_model(cli_runs):
    ddp = saved_weights(cli_runs / "ddp" / "model")
    fsdp = saved_weights(cli_runs / "fsdp" / "model")
    assert fsdp.keys() == ddp.keys()  # the same folder, gathered whole
    for name, tensor in ddp.items():  # fp32: the reductions' order differs from DDP's
        torch.testing.assert_close(fsdp[name], tensor, rtol=1e-5, atol=1e-6, msg=name)
    shards = sorted((cli_runs / "fsdp" / "checkpoints").glob("step-*/shards/*.distcp"))
    assert len(shards) == 2 * 2  # two checkpoints kept, a file from each rank


def test_torchrun_fsdp_resumes_bit_exactly(cli_runs, tmp_path):
    """Cut after step 2 and resumed on 2 ranks: the unbroken run's weights, bit for bit."""
    out = _cut_at_two(cli_runs / "fsdp", tmp_path / "run")
    _train(out, 2, "train.shard=fsdp", flags=("--resume",))
    resumed, whole = saved_weights(out / "model"), saved_weights(cli_runs / "fsdp" / "model")
    for name, tensor in whole.items():
        assert torch.equal(resumed[name], tensor), name


@pytest.mark.parametrize(
    "saved, world, shard",
    [("fsdp", 3, "fsdp"), ("ddp", 3, "fsdp")],
    ids=["fsdp-2-to-fsdp-3", "ddp-2-to-fsdp-3"],
)
def test_torchrun_resumes_on_another_world_size(cli_runs, tmp_path, saved, world, shard):
    """Cut after step 2, resumed on another number of ranks (or sharding): the model the
    unbroken run trained, to fp32's rounding over another order of reductions (a sharded
    checkpoint resumed on one process: tests/e2e/test_fsdp.py, in float64)."""
    out = _cut_at_two(cli_runs / saved, tmp_path / "run")
    result = _train(out, world, f"train.shard={shard}", flags=("--resume",))
    said = f"step-00000002: saved on 2 ranks, {'sharded' if saved == 'fsdp' else 'unsharded'}"
    assert said in result.stderr, result.stderr[-2000:]
    got, want = saved_weights(out / "model"), saved_weights(cli_runs / saved / "model")
    assert got.keys() == want.keys()
    for name, tensor in want.items():
        torch.testing.assert_close(got[name], tensor, rtol=1e-5, atol=1e-6, msg=name)
    log = [json.loads(line) for line in (out / "train_log.jsonl").read_text().splitlines()]
    assert [r["step"] for r in log] == [1, 2, 3, 4]


@pytest.mark.parametrize("config", ["configs/toy.yaml", "configs/toy_llm.yaml"])
def test_verify_under_torchrun_with_sharded_towers(config):
    """``verify`` with train.shard fsdp: GradCache over towers sharded on 2 ranks, each on its
    slice of the batch, against one rank's unsharded full batch, in float64."""
    sets = ["train.shard=fsdp", "train.device=cpu", "train.batch_size=8", "train.chunk_size=3"]
    args = ["verify", "-c", config, "--double"]
    for item in sets:
        args += ["--set", item]
    result = run_cli(*args, world=2)
    lines = [line.strip() for line in result.stdout.splitlines()]
    assert "towers: sharded over 2 rank(s) (FSDP2, sync per step)" in lines, result.stdout
    assert sum(line.startswith("verdict:") for line in lines) == 1  # rank 0 alone reports
    gap = next(line for line in lines if line.startswith("max relative grad difference"))
    assert float(gap.split(":")[1].split()[0]) <= 1e-10, gap
