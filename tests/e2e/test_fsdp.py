"""GradCache over towers sharded with FSDP2, on 2 and 3 gloo ranks against one unsharded process:
the first step's gradient and the weights after three AdamW steps, in float64; negative controls
that break the cross-rank gradient or the sync; a run cut by a checkpoint and resumed on another
number of ranks or sharding (2 -> 3, 3 -> 2, 2 -> 1 unsharded, 1 unsharded -> 3) against the
unbroken run, in float64; ``train --set train.shard=fsdp`` under torchrun (checkpoints, resume on
the same and on another world size, the saved model) against the same run under DDP.

Each world size's cases run in one spawned process group (``fsdp_cases.main``).
"""

from __future__ import annotations

import contextlib
import functools
import json
import shutil
from pathlib import Path
from typing import Any

import pytest
import torch
import torch.distributed as dist

from dpr_cache.runtime import distributed
from dpr_cache.runtime.distributed import DistEnv
from dpr_cache.train.checkpoint import sharded_state
from tests.support import fsdp_cases as w
from tests.support.cli import run_cli
from tests.support.fixtures import saved_weights
from tests.support.ranks import spawn_ranks

pytestmark = [
    pytest.mark.slow,
    pytest.mark.skipif(
        not (dist.is_available() and dist.is_gloo_available()),
        reason="torch.distributed with gloo is unavailable",
    ),
]

EXACT = [
    {"name": "gradcache-separate", "mode": "gradcache"},
    {"name": "gradcache-shared-chunk-sync", "mode": "gradcache", "shared": True, "sync": "chunk"},
    {"name": "gradcache-separate-ckpt", "mode": "gradcache", "checkpointing": True},
    {"name": "full-separate", "mode": "full"},
    {"name": "lora-llama-shared", "mode": "gradcache", "decoder": True, "shared": True},
    {
        "name": "lora-llama-separate-ckpt",
        "mode": "gradcache",
        "decoder": True,
        "checkpointing": True,
    },
    {
        "name": "options-all-directions-guided-matryoshka-distill",
        "mode": "gradcache",
        "distill": "distill_kl",
        "weight": 0.5,
        "loss": {
            "directions": [
                "query_to_passage",
                "passage_to_query",
                "query_to_query",
                "passage_to_passage",
            ],
            "hardness": "all",
            "strength": 5.0,
            "guide_margin": 0.1,
            "matryoshka": [32, 16],
            "normalize": True,
        },
    },
    {
        "name": "options-symmetric-per-direction-shared-tiled",
        "mode": "gradcache",
        "shared": True,
        "tile": 4,
        "loss": {
            "directions": ["query_to_passage", "passage_to_query"],
            "partition": "per_direction",
            "hardness": "hard",
            "strength": 3.0,
        },
    },
]
CONTROLS = [
    {"name": "naive-gather", "mode": "gradcache", "naive": True},
    {"name": "never-sync", "mode": "gradcache", "never_sync": True},
]
SPAWN_TIMEOUT = 300


@pytest.fixture(scope="module", params=[2, 3], ids=["2-ranks", "3-ranks"])
def spawned(request, tmp_path_factory) -> tuple[int, Path]:
    """Every case on ``world`` spawned ranks once; the folder of rank 0's result files."""
    world = request.param
    out = tmp_path_factory.mktemp(f"fsdp-{world}")
    cases = EXACT + CONTROLS if world == 2 else EXACT
    spawn_ranks(w.main, world, str(out), cases, timeout=SPAWN_TIMEOUT)
    return world, out


def _result(folder: Path, case: dict[str, Any]) -> dict[str, Any]:
    result = torch.load(folder / f"{case['name']}.pt")
    assert "error" not in result, result.get("error")
    return result


@contextlib.contextmanager
def _float64_norms(case: dict[str, Any]):
    """The decoders' RMSNorm in float64 for float64 inputs while a decoder case runs here."""
    if not case.get("decoder"):
        yield
        return
    from transformers.models.llama.modeling_llama import LlamaRMSNorm

    from tests.support.llm import _rms_norm

    forward = LlamaRMSNorm.forward
    LlamaRMSNorm.forward = _rms_norm(forward)
    try:
        yield
    finally:
        LlamaRMSNorm.forward = forward


@functools.cache
def _reference(name: str) -> dict[str, Any]:
    case = next(c for c in EXACT + CONTROLS if c["name"] == name)
    with _float64_norms(case):
        return w.reference(case)


def _relative_gap(got: dict[str, torch.Tensor | None], want: dict[str, torch.Tensor]) -> float:
    """The largest difference over every tensor, relative to the largest magnitude of
    ``want``; infinite when a tensor is missing."""
    assert got.keys() == want.keys()
    if any(v is None for v in got.values()):
        return float("inf")
    scale = max(v.abs().max().item() for v in want.values())
    return max((got[k] - want[k]).abs().max().item() for k in want) / scale


@pytest.mark.parametrize("case", EXACT, ids=[c["name"] for c in EXACT])
def test_sharded_gradcache_gives_the_single_process_gradient_and_weights(spawned, case):
    world, folder = spawned
    got, want = _result(folder, case), _reference(case["name"])
    grad_gap = _relative_gap(got["grads"], want["grads"])
    weight_gap = _relative_gap(got["weights"], want["weights"])
    print(f"{case['name']} at {world} ranks: gradient {grad_gap:.1e}, weights {weight_gap:.1e}")
    assert got["losses"] == pytest.approx(want["losses"], rel=1e-12)
    assert grad_gap <= 1e-10
    assert weight_gap <= 1e-10


@pytest.mark.parametrize("case", CONTROLS, ids=[c["name"] for c in CONTROLS])
def test_negative_controls_are_caught(spawned, case):
    """Other ranks' passages as constants, or gradients never reduce-scattered: not the
    single-process gradient."""
    world, folder = spawned
    if world != 2:
        pytest.skip("the controls run at 2 ranks")
    got = _result(folder, case)
    reference = _reference("gradcache-separate")  # the same model and batch, done right
    assert _relative_gap(got["grads"], reference["grads"]) > 1e-3


RESUMED = {  # a run cut at step w.CUT: (world, sharded) before the cut, and after it
    "2-to-3": ("gradcache-separate", (2, True), (3, True)),
    "3-to-2": ("gradcache-separate", (3, True), (2, True)),
    "2-to-1-unsharded": ("gradcache-separate", (2, True), (1, False)),
    "1-unsharded-to-3": ("gradcache-separate", (1, False), (3, True)),
    "lora-llama-2-to-3": ("lora-llama-shared", (2, True), (3, True)),
    "lora-llama-2-to-1-unsharded": ("lora-llama-shared", (2, True), (1, False)),
}


def _phase(name: str, phase: str) -> dict[str, Any]:
    base, first, rest = RESUMED[name]
    case = next(c for c in EXACT if c["name"] == base)
    return {
        **case,
        "name": name,
        "phase": phase,
        "first_sharded": first[1],
        "rest_sharded": rest[1],
    }


def _in_process(out: Path, name: str, phase: str) -> None:
    """A half of a resumed case on this one process, unsharded (its result saved as a
    spawned rank 0 saves it)."""
    case = _phase(name, phase)
    with _float64_norms(case):
        result = w.resume_phase(case, DistEnv(), phase, out / name)
    if result is not None:
        torch.save(result, out / f"{name}-{phase}.pt")


@pytest.fixture(scope="module")
def resumed(tmp_path_factory) -> Path:
    """Every case of :data:`RESUMED`: its first half on its world, then its rest on the other,
    through the trainer's own checkpoint; the folder of the rest halves' weights."""
    out = tmp_path_factory.mktemp("fsdp-resumed")

    def halves(phase: str, world: int) -> list[dict[str, Any]]:
        at = 1 if phase == "first" else 2
        return [_phase(n, phase) for n, r in RESUMED.items() if r[at] == (world, world > 1)]

    for case in halves("first", 1):
        _in_process(out, case["name"], "first")
    spawn_ranks(w.main, 2, str(out), halves("first", 2), timeout=SPAWN_TIMEOUT)
    work = halves("rest", 3) + halves("first", 3)
    spawn_ranks(w.main, 3, str(out), work, timeout=SPAWN_TIMEOUT)
    spawn_ranks(w.main, 2, str(out), halves("rest", 2), timeout=SPAWN_TIMEOUT)
    for case in halves("rest", 1):
        _in_process(out, case["name"], "rest")
    return out


@pytest.mark.parametrize("name", list(RESUMED))
def test_a_checkpoint_resumes_on_another_world_size_as_an_unbroken_run(resumed, name):
    """The weights and the optimizer state resharded (or cut into shards, or gathered whole)
    as they load: the weights after the last step equal an unbroken single-process run's."""
    got = _result(resumed, {"name": f"{name}-rest"})
    want = _reference(RESUMED[name][0])
    gap = _relative_gap(got["weights"], want["weights"])
    print(f"{name}: weights {gap:.1e}")
    assert gap <= 1e-10


def test_resuming_without_the_checkpoints_moments_is_caught(resumed):
    """The negative control: the same checkpoint's weights with fresh AdamW moments (what a
    loader that dropped the optimizer's state would leave) end elsewhere."""
    name = "2-to-1-unsharded"
    case = _phase(name, "rest")
    model = w.make_model(case)
    optimizer = w.optimizer_of(model)
    state = {"model": sharded_state(model, optimizer)["model"]}
    distributed.sharded_load(state, resumed / name / f"step-{w.CUT:08d}" / "shards")
    model.load_state_dict(state["model"], strict=False)
    stepper = w.stepper_of(case, model, DistEnv(), sharded=False)
    w.run_steps(case, model, stepper, optimizer, DistEnv(), range(w.CUT, w.STEPS), {})
    got = w.whole((n, p) for n, p in model.named_parameters() if p.requires_grad)
    assert _relative_gap(got, _reference(RESUMED[name][0])["weights"]) > 1e-4


def _train(out: Path, world: int, *extra: str, flags: tuple[str, ...] = (), check: bool = True):
    """``train`` of the toy config under torchrun, dropout on (replayed by GradCache and carried
    over a resume). Adam's eps is raised as in ``test_distributed``: the passage tower's last
    LayerNorm bias has a gradient of pure rounding noise, which Adam at eps 1e-8 turns into a
    step of about lr whatever its size."""
    args = ["train", "-c", "configs/toy.yaml", *flags, "--set", f"output_dir={out}"]
    for item in (
        "train.device=cpu",
        "train.batch_size=16",
        "train.chunk_size=4",
        "train.max_steps=4",
        "train.checkpoint_every=2",
        "train.adam_eps=1e-4",
        "model.dropout=0.1",
        f"data.cache_dir={out.parent / 'cache'}",
        *extra,
    ):
        args += ["--set", item]
    return run_cli(*args, "-q", world=world, check=check)


@pytest.fixture(scope="module")
def cli_runs(tmp_path_factory) -> Path:
    """``train`` under torchrun at 2 ranks, under DDP and sharded (FSDP)."""
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


def test_torchrun_fsdp_resumes_bit_exactly(cli_runs):
    """Drop the last checkpoint and the model; resume from step 2 on 2 ranks."""
    out = cli_runs / "resumed"
    shutil.copytree(cli_runs / "fsdp", out)
    shutil.rmtree(out / "checkpoints" / "step-00000004")
    shutil.rmtree(out / "model")
    _train(out, 2, "train.shard=fsdp", flags=("--resume",))
    resumed, whole = saved_weights(out / "model"), saved_weights(cli_runs / "fsdp" / "model")
    for name, tensor in whole.items():
        assert torch.equal(resumed[name], tensor), name


UNDROPPED = ("train.batch_size=12", "model.dropout=0.0")  # 6 a rank at 2 ranks, 4 at 3


def _cut_at_two(run: Path, out: Path) -> Path:
    """A copy of a finished 4-step run as it was after step 2: its last checkpoint and its
    model gone."""
    shutil.copytree(run, out)
    shutil.rmtree(out / "checkpoints" / "step-00000004")
    shutil.rmtree(out / "model")
    return out


@pytest.fixture(scope="module")
def world_runs(tmp_path_factory) -> Path:
    """Unbroken 2-rank runs, sharded and under DDP, dropout off (the dropout of ranks that
    changed number cannot be replayed)."""
    root = tmp_path_factory.mktemp("fsdp-world")
    _train(root / "fsdp", 2, "train.shard=fsdp", *UNDROPPED)
    _train(root / "ddp", 2, *UNDROPPED)
    return root


@pytest.mark.parametrize(
    "saved, world, shard",
    [("fsdp", 3, "fsdp"), ("fsdp", 1, "none"), ("ddp", 3, "fsdp")],
    ids=["fsdp-2-to-fsdp-3", "fsdp-2-to-one-process", "ddp-2-to-fsdp-3"],
)
def test_torchrun_resumes_on_another_world_size(world_runs, tmp_path, saved, world, shard):
    """Cut after step 2, resumed on another number of ranks (or sharding): the model the
    unbroken run trained, to fp32's rounding over another order of reductions."""
    out = _cut_at_two(world_runs / saved, tmp_path / "run")
    result = _train(out, world, f"train.shard={shard}", *UNDROPPED, flags=("--resume",))
    said = f"step-00000002: saved on 2 ranks, {'sharded' if saved == 'fsdp' else 'unsharded'}"
    assert said in result.stderr, result.stderr[-2000:]
    got, want = saved_weights(out / "model"), saved_weights(world_runs / saved / "model")
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
