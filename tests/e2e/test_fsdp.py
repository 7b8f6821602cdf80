"""GradCache over towers sharded with FSDP2, on 2 and 3 gloo ranks against one unsharded process:
the first step's gradient and the weights after three AdamW steps, in float64; negative controls
that break the cross-rank gradient or the sync; a run cut by a checkpoint and resumed on another
number of ranks or sharding (2 -> 3, 3 -> 2, 2 -> 1 unsharded, 1 unsharded -> 3) against the
unbroken run, in float64. The command line's sharded runs: ``tests/e2e/test_fsdp_cli.py``.

Each world size's cases run in one spawned process group (``fsdp_cases.main``).
"""

from __future__ import annotations

import contextlib
import functools
from pathlib import Path
from typing import Any

import pytest
import torch
import torch.distributed as dist

from dpr_cache.runtime import distributed
from dpr_cache.runtime.distributed import DistEnv
from dpr_cache.train.checkpoint import sharded_state
from tests.support import fsdp_cases as w
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
    {"name": "gradcache-separate-multi-tiled", "mode": "gradcache", "multi": True, "tile": 3},
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
    # a weight both towers share, saved under both names, cut into shards once
    "shared-1-unsharded-to-3": ("gradcache-shared-chunk-sync", (1, False), (3, True)),
    "lora-llama-1-unsharded-to-3": ("lora-llama-shared", (1, False), (3, True)),
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
