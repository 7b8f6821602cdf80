"""Two gloo ranks on CPU against one process: gradients, gradient syncs, CLI runs, resume, index.

The gradient tests spawn 2 processes once (``distributed_cases.main``) that run every case in one
process group; the reference is one process encoding the whole global batch with the same
float64 weights. The CLI tests run ``torchrun --nproc_per_node 2`` on the toy config.
"""

from __future__ import annotations

import functools
import json
import shutil
from pathlib import Path
from typing import Any

import pytest
import torch
import torch.distributed as dist
import yaml

from dpr_cache.core.accumulate import FullBatch
from dpr_cache.core.distill import mixed_loss
from dpr_cache.core.loss import contrastive_loss
from dpr_cache.core.objective import make_loss_fn
from tests.support import distributed_cases as w
from tests.support.cli import run_cli as run_dpr_cache
from tests.support.fixtures import REPO, saved_weights
from tests.support.ranks import spawn_ranks

pytestmark = [
    pytest.mark.slow,
    pytest.mark.skipif(
        not (dist.is_available() and dist.is_gloo_available()),
        reason="torch.distributed with gloo is unavailable",
    ),
]

WORLD = 2
PARITY = [
    {"name": "full-shared", "mode": "full", "shared": True},
    {"name": "full-separate", "mode": "full", "shared": False},
    {"name": "full-separate-tiled", "mode": "full", "shared": False, "tile": 3},
    {"name": "gradcache-shared", "mode": "gradcache", "shared": True},
    {"name": "gradcache-separate", "mode": "gradcache", "shared": False},
    {"name": "gradcache-shared-tiled", "mode": "gradcache", "shared": True, "tile": 3},
    {"name": "gradcache-separate-tiled", "mode": "gradcache", "shared": False, "tile": 5},
    {"name": "full-shared-ckpt", "mode": "full", "shared": True, "checkpointing": True},
    {"name": "gradcache-shared-ckpt", "mode": "gradcache", "shared": True, "checkpointing": True},
    {
        "name": "gradcache-separate-ckpt",
        "mode": "gradcache",
        "shared": False,
        "checkpointing": True,
    },
    {"name": "gradcache-shared-multi", "mode": "gradcache", "shared": True, "multi": True},
    {
        "name": "gradcache-separate-multi-tiled",
        "mode": "gradcache",
        "shared": False,
        "multi": True,
        "tile": 3,
    },
]
NAIVE = [
    {"name": "naive-full-shared", "mode": "full", "shared": True, "naive": True},
    {"name": "naive-gradcache-separate", "mode": "gradcache", "shared": False, "naive": True},
]
ACCUMULATE = [  # a baseline with other gradients by design: only its syncs are checked
    {"name": "accumulate-shared", "mode": "accumulate", "shared": True},
    {"name": "accumulate-separate", "mode": "accumulate", "shared": False},
]
SYNC_CONTROL = [
    {"name": "sync-every-chunk", "mode": "gradcache", "shared": True, "sync_every_chunk": True},
]
SPAWN_TIMEOUT = 120


@pytest.fixture(scope="module")
def spawned(tmp_path_factory) -> Path:
    """Run every case on 2 spawned ranks once; return the folder of their result files."""
    out = tmp_path_factory.mktemp("dist-grads")
    cases = PARITY + ACCUMULATE + NAIVE + SYNC_CONTROL
    spawn_ranks(w.main, WORLD, str(out), cases, timeout=SPAWN_TIMEOUT)
    return out


def results(folder: Path, case: dict[str, Any]) -> list[dict[str, Any]]:
    """Each rank's result for a case; fails with the worker's error if it raised."""
    per_rank = [torch.load(folder / f"{case['name']}-rank{r}.pt") for r in range(WORLD)]
    for rank, result in enumerate(per_rank):
        assert "error" not in result, f"rank {rank}: {result.get('error')}"
    return per_rank


@functools.cache
def reference(
    shared: bool, step: int, multi: bool = False
) -> tuple[float, dict[str, torch.Tensor]]:
    """One process, the whole global batch, the untiled loss: the loss and every .grad."""
    model = w.make_model(shared, multi=multi)
    q_inputs, p_inputs, p_ids = w.global_batch(step)
    loss_fn = functools.partial(
        contrastive_loss, temperature=w.TEMPERATURE, group_size=w.GROUP, p_ids=p_ids
    )
    model.zero_grad(set_to_none=True)
    loss = FullBatch(model.encode_query, model.encode_passage, loss_fn).step(q_inputs, p_inputs)
    grads = {n: p.grad.clone() for n, p in model.named_parameters() if p.requires_grad}
    return float(loss), grads


def max_relative_error(got: dict[str, torch.Tensor], want: dict[str, torch.Tensor]) -> float:
    assert got.keys() == want.keys()
    scale = max(v.abs().max().item() for v in want.values())
    return max((got[k] - want[k]).abs().max().item() for k in want) / scale


def assert_synced_once(per_rank: list[dict]) -> None:
    """Every rank's DDP hook saw each parameter once a step (one all-reduce)."""
    for result in per_rank:
        for step in result["steps"]:
            assert all(set(s["params"].values()) == {1} for s in step["syncs"])


def assert_every_step(per_rank: list[dict], name: str, reference, bound: float) -> None:
    """At every step the ranks' mean loss is ``reference(step)``'s and each rank's gradient is
    within ``bound`` (relative) of its gradient."""
    for step in range(w.STEPS):
        want_loss, want = reference(step)
        losses = [r["steps"][step]["loss"] for r in per_rank]
        assert sum(losses) / WORLD == pytest.approx(want_loss, rel=1e-12)
        for rank, result in enumerate(per_rank):
            err = max_relative_error(result["steps"][step]["grads"], want)
            print(f"{name} step {step} rank {rank}: max relative error {err:.2e}")
            assert err <= bound


@pytest.mark.parametrize("case", PARITY, ids=[c["name"] for c in PARITY])
def test_two_ranks_give_the_single_process_gradient(spawned, case):
    reference_at = functools.partial(reference, case["shared"], multi=case.get("multi", False))
    assert_every_step(results(spawned, case), case["name"], reference_at, 1e-6)


@pytest.mark.parametrize("case", PARITY + ACCUMULATE, ids=[c["name"] for c in PARITY + ACCUMULATE])
def test_each_parameter_is_all_reduced_once_per_step(spawned, case):
    """One DDP for a shared tower, one per separate tower; every parameter synced once."""
    per_rank = results(spawned, case)
    wrappers = 1 if case["shared"] else 2
    for result in per_rank:
        for step in result["steps"]:
            assert len(step["syncs"]) == wrappers
            for sync, n_params in zip(step["syncs"], step["n_params"], strict=True):
                assert sync["calls"] >= 1
                assert len(sync["params"]) == n_params
                assert set(sync["params"].values()) == {1}, sync["params"]


def test_counter_sees_every_chunk_sync_without_no_sync(spawned):
    """The hook's control: without no_sync every chunk's backward all-reduces again."""
    (case,) = SYNC_CONTROL
    for result in results(spawned, case):
        for step in range(w.STEPS):
            (sync,) = result["steps"][step]["syncs"]
            assert min(sync["params"].values()) == 5  # 2 question + 3 passage chunks
            _, want = reference(case["shared"], step)
            assert max_relative_error(result["steps"][step]["grads"], want) < 1e-6


@pytest.mark.parametrize("case", NAIVE, ids=[c["name"] for c in NAIVE])
def test_negative_control_gather_without_gradient_is_wrong(spawned, case):
    """Cutting the gradient to other ranks' passages loses part of the gradient."""
    per_rank = results(spawned, case)
    for step in range(w.STEPS):
        _, want = reference(case["shared"], step)
        for result in per_rank:
            err = max_relative_error(result["steps"][step]["grads"], want)
            print(f"{case['name']} step {step}: max relative error {err:.2e}")
            assert err > 1e-3


# -- distillation: each rank's group terms on its own rows, the same normalisation -------------

DISTILL = [
    {
        "name": "distill-kl-gradcache-separate",
        "mode": "gradcache",
        "shared": False,
        "distill": "distill_kl",
    },
    {
        "name": "distill-kl-mixed-gradcache-shared-tiled",
        "mode": "gradcache",
        "shared": True,
        "distill": "distill_kl",
        "weight": 0.5,
        "tile": 3,
    },
    {
        "name": "margin-mse-gradcache-shared",
        "mode": "gradcache",
        "shared": True,
        "distill": "margin_mse",
    },
    {
        "name": "margin-mse-mixed-full-separate",
        "mode": "full",
        "shared": False,
        "distill": "margin_mse",
        "weight": 0.3,
    },
]
DISTILL_CONTROL = [
    {
        "name": "distill-kl-wrong-teacher",
        "mode": "gradcache",
        "shared": False,
        "distill": "distill_kl",
        "wrong_teacher": True,
    },
]


@pytest.fixture(scope="module")
def spawned_distill(tmp_path_factory) -> Path:
    """The distillation cases on 2 spawned ranks (apart, so ``-k distill`` runs only them)."""
    out = tmp_path_factory.mktemp("dist-distill")
    spawn_ranks(w.main, WORLD, str(out), DISTILL + DISTILL_CONTROL, timeout=SPAWN_TIMEOUT)
    return out


@functools.cache
def distill_reference(case_name: str, step: int) -> tuple[float, dict[str, torch.Tensor]]:
    """One process, the whole global batch, the untiled loss with the case's distillation."""
    case = next(c for c in DISTILL + DISTILL_CONTROL if c["name"] == case_name)
    model = w.make_model(case["shared"])
    q_inputs, p_inputs, p_ids = w.global_batch(step)
    loss_fn = functools.partial(
        mixed_loss,
        temperature=w.TEMPERATURE,
        group_size=w.GROUP,
        p_ids=p_ids,
        distillation=w.distillation(case),
        teacher_scores=w.teacher_scores(step),
    )
    model.zero_grad(set_to_none=True)
    loss = FullBatch(model.encode_query, model.encode_passage, loss_fn).step(q_inputs, p_inputs)
    grads = {n: p.grad.clone() for n, p in model.named_parameters() if p.requires_grad}
    return float(loss), grads


@pytest.mark.parametrize("case", DISTILL, ids=[c["name"] for c in DISTILL])
def test_two_ranks_give_the_single_process_gradient_with_distillation(spawned_distill, case):
    per_rank = results(spawned_distill, case)
    reference_at = functools.partial(distill_reference, case["name"])
    assert_every_step(per_rank, case["name"], reference_at, 1e-6)
    assert_synced_once(per_rank)


def test_negative_control_distillation_with_another_rank_s_teacher_is_wrong(spawned_distill):
    """Rank 1 reading rank 0's teacher scores gives another gradient: the scores must be the
    rank's own rows'."""
    (case,) = DISTILL_CONTROL
    for step in range(w.STEPS):
        _, want = distill_reference(case["name"], step)
        for result in results(spawned_distill, case):
            assert max_relative_error(result["steps"][step]["grads"], want) > 1e-3


# -- the loss's options: directions, hardness, a guide, Matryoshka, mixed with distillation ----

ALL_DIRECTIONS = ["query_to_passage", "passage_to_query", "query_to_query", "passage_to_passage"]
OPTIONS = [
    {
        "name": "options-all-directions-hard-all-tiled",
        "mode": "gradcache",
        "shared": False,
        "tile": 3,
        "loss": {"directions": ALL_DIRECTIONS, "hardness": "all", "strength": 5.0},
    },
    {
        "name": "options-symmetric-per-direction-hard",
        "mode": "gradcache",
        "shared": True,
        "loss": {
            "directions": ["query_to_passage", "passage_to_query"],
            "partition": "per_direction",
            "hardness": "hard",
            "strength": 3.0,
        },
    },
    {
        "name": "options-guided-same-side",
        "mode": "gradcache",
        "shared": False,
        "loss": {"directions": ALL_DIRECTIONS, "guide_margin": 0.1},
    },
    {
        "name": "options-matryoshka-distill-tiled",
        "mode": "gradcache",
        "shared": True,
        "tile": 5,
        "distill": "distill_kl",
        "weight": 0.5,
        "loss": {
            "directions": ["query_to_passage", "passage_to_query"],
            "matryoshka": [32, 16, 8],
            "normalize": True,
            "guide_margin": 0.2,
            "strategy": "relative",
        },
    },
    {
        "name": "options-everything-full",
        "mode": "full",
        "shared": False,
        "distill": "margin_mse",
        "weight": 0.3,
        "loss": {
            "directions": ALL_DIRECTIONS,
            "hardness": "in_batch",
            "strength": 9.0,
            "guide_margin": 0.0,
            "matryoshka": [32, 8],
        },
    },
]


@pytest.fixture(scope="module")
def spawned_options(tmp_path_factory) -> Path:
    """The loss-option cases on 2 spawned ranks (apart, so ``-k options`` runs only them)."""
    out = tmp_path_factory.mktemp("dist-options")
    spawn_ranks(w.main, WORLD, str(out), OPTIONS, timeout=SPAWN_TIMEOUT)
    return out


@functools.cache
def options_reference(case_name: str, step: int) -> tuple[float, dict[str, torch.Tensor]]:
    """One process, the whole global batch, the case's loss untiled."""
    case = next(c for c in OPTIONS if c["name"] == case_name)
    model = w.make_model(case["shared"])
    q_inputs, p_inputs, p_ids = w.global_batch(step)
    loss_fn = make_loss_fn(w.objective({**case, "tile": None}))
    model.zero_grad(set_to_none=True)
    extra = w.loss_inputs(case, step)
    loss = FullBatch(model.encode_query, model.encode_passage, loss_fn).step(
        q_inputs, p_inputs, p_ids=p_ids, **extra
    )
    grads = {n: p.grad.clone() for n, p in model.named_parameters() if p.requires_grad}
    return float(loss), grads


@pytest.mark.parametrize("case", OPTIONS, ids=[c["name"] for c in OPTIONS])
def test_two_ranks_give_the_single_process_gradient_for_every_loss_option(spawned_options, case):
    per_rank = results(spawned_options, case)
    reference_at = functools.partial(options_reference, case["name"])
    assert_every_step(per_rank, case["name"], reference_at, 1e-10)
    assert_synced_once(per_rank)


def test_every_global_batch_is_full_so_no_rank_waits_alone():
    """The last partial batch of an epoch is dropped: each rank gets b = B / W rows, always."""
    from dpr_cache.data import TrainBatches
    from dpr_cache.errors import InputError

    batches = TrainBatches(300, 16, seed=3)
    for step in range(3 * batches.steps_per_epoch):
        indices = batches.batch_indices(step)
        assert len(indices) == 16
        parts = [TrainBatches.rank_slice(indices, r, WORLD) for r in range(WORLD)]
        assert [len(p) for p in parts] == [8, 8] and sum(parts, []) == indices
    with pytest.raises(InputError, match="not divisible"):
        TrainBatches.rank_slice(list(range(15)), 0, WORLD)


# -- the command line under torchrun --------------------------------------------------------

CLI_TIMEOUT = 180
STEPS = 3


def run_cli(args: list[str], world: int = 1):
    """``dpr-cache ARGS``, under ``torchrun --nproc_per_node WORLD`` if WORLD > 1."""
    return run_dpr_cache(*args, world=world, timeout=CLI_TIMEOUT)


def train_args(out: Path, cache: Path, *extra: str) -> list[str]:
    # adam_eps: Adam turns a gradient that is pure rounding noise (the passage tower's last
    # LayerNorm bias shifts every passage rep alike, so the loss ignores it) into a +-lr step;
    # with the default 1e-8 even two single-process runs with other chunk sizes differ by ~lr
    # there. A larger eps keeps the comparison about the gradients, not about that noise.
    # length_order off: each rank orders its own rows by length, so its chunks would differ from
    # the single process's and so would that noise (the bias then differs by ~1.4e-6); ordered
    # chunks across ranks are compared in float64 above (two ranks give the single-process
    # gradient, with length_order on by default).
    sets = {
        "output_dir": out,
        "data.cache_dir": cache,
        "model.dropout": 0.0,
        "train.max_steps": STEPS,
        "train.batch_size": 16,
        "train.chunk_size": 4,
        "train.checkpoint_every": 2,
        "train.num_threads": 1,
        "train.adam_eps": 1e-4,
        "train.length_order": "false",
    }
    args = ["train", "--config", "configs/toy.yaml", "--quiet"]
    for key, value in sets.items():
        args += ["--set", f"{key}={value}"]
    return args + list(extra)


def assert_same_weights(got: dict, want: dict, label: str) -> None:
    assert got.keys() == want.keys()
    worst = max((got[k] - want[k]).abs().max().item() for k in want)
    print(f"{label}: max |difference| of the weights {worst:.2e}")
    for key in want:
        torch.testing.assert_close(got[key], want[key], rtol=1e-5, atol=1e-6, msg=key)


@pytest.fixture(scope="module")
def cli_runs(tmp_path_factory) -> dict[str, Path]:
    """One single-process and one 2-rank run of the toy config (same global batch and seed)."""
    root = tmp_path_factory.mktemp("dist-cli")
    cache = root / "cache"
    run_cli(train_args(root / "single", cache))
    run_cli(train_args(root / "two", cache), world=WORLD)
    return {"root": root, "cache": cache, "single": root / "single", "two": root / "two"}


def test_torchrun_training_equals_single_process(cli_runs):
    assert_same_weights(
        saved_weights(cli_runs["two"] / "model"),
        saved_weights(cli_runs["single"] / "model"),
        "2 ranks vs 1 process",
    )


def test_rank_zero_alone_writes_log_and_checkpoints(cli_runs):
    out = cli_runs["two"]
    lines = (out / "train_log.jsonl").read_text().splitlines()
    assert [json.loads(line)["step"] for line in lines] == [1, 2, 3]
    single = (cli_runs["single"] / "train_log.jsonl").read_text().splitlines()
    for got, want in zip(lines, single, strict=True):  # the logged loss is the global mean
        assert json.loads(got)["loss"] == pytest.approx(json.loads(want)["loss"], rel=1e-5)
    assert sorted(p.name for p in (out / "checkpoints").iterdir()) == [
        "step-00000002",
        "step-00000003",
    ]
    state = torch.load(out / "checkpoints/step-00000003/state.pt", weights_only=False)
    assert state["world_size"] == WORLD and len(state["rng"]) == WORLD
    assert not [p.name for p in out.rglob("*") if p.name.startswith((".tmp-", ".old-"))]


def _initial_seed(torch_rng_state: torch.Tensor) -> bytes:
    """The seed a CPU generator was last seeded with, as its state stores it (the first 8
    bytes), whatever has been drawn since."""
    return bytes(torch_rng_state[:8].tolist())


def test_each_rank_draws_dropout_from_its_own_stream(cli_runs):
    """Rank r seeds torch with the ("dropout", seed, r) stream; a single process is rank 0."""
    from dpr_cache.runtime.seeds import stream_seed

    def seeded(seed: int, draws: int = 0) -> bytes:
        gen = torch.Generator().manual_seed(seed)
        torch.rand(draws, generator=gen)
        return _initial_seed(gen.get_state())

    assert seeded(7, draws=1000) == seeded(7) != seeded(8)  # the stored seed survives draws
    two = torch.load(cli_runs["two"] / "checkpoints/step-00000003/state.pt", weights_only=False)
    one = torch.load(cli_runs["single"] / "checkpoints/step-00000003/state.pt", weights_only=False)
    seed = yaml.safe_load((REPO / "configs/toy.yaml").read_text())["train"]["seed"]
    got = [_initial_seed(rng["torch"]) for rng in two["rng"]]
    assert got == [seeded(stream_seed("dropout", seed, rank)) for rank in range(WORLD)]
    assert got[0] != got[1] and _initial_seed(one["rng"][0]["torch"]) == got[0]


def test_torchrun_resume_reproduces_the_run(cli_runs):
    """Drop the step-3 checkpoint and the model, resume on 2 ranks from step 2."""
    out = cli_runs["root"] / "resumed"
    shutil.copytree(cli_runs["two"], out)
    shutil.rmtree(out / "checkpoints/step-00000003")
    shutil.rmtree(out / "model")
    run_cli(train_args(out, cli_runs["cache"], "--resume"), world=WORLD)
    assert_same_weights(
        saved_weights(out / "model"), saved_weights(cli_runs["two"] / "model"), "resumed"
    )
    lines = (out / "train_log.jsonl").read_text().splitlines()
    assert [json.loads(line)["step"] for line in lines] == [1, 2, 3]


def test_torchrun_index_equals_single_process(cli_runs, monkeypatch):
    """Shards go round-robin to 2 ranks; rank 0 builds the index over all of them."""
    from dpr_cache.config import load_config
    from dpr_cache.retrieval.drivers.index import build_index
    from tests.support.fixtures import index_vectors

    model = cli_runs["two"] / "model"
    out = cli_runs["root"] / "index-two"
    sets = ["--set", f"output_dir={out}", "--set", f"data.cache_dir={cli_runs['cache']}"]
    sets += ["--set", "index.shard_size=100", "--set", "train.num_threads=1"]
    run_cli(["index", "--config", "configs/toy.yaml", "--quiet", "--model", str(model), *sets], 2)
    meta = json.loads((out / "index/meta.json").read_text())
    assert len(meta["shards"]) >= 2 and meta["type"] == "flat"

    monkeypatch.chdir(REPO)  # the toy config's paths are relative to the repository
    config = load_config(
        REPO / "configs/toy.yaml",
        [f"output_dir={cli_runs['root'] / 'index-one'}", f"data.cache_dir={cli_runs['cache']}"]
        + ["index.shard_size=100"],
    )
    one = build_index(config, model, progress=False)
    got_ids, want_ids = index_vectors(out / "index")[1], index_vectors(one)[1]
    assert got_ids == want_ids
    got, want = index_vectors(out / "index")[0], index_vectors(one)[0]
    assert got.shape == want.shape == (meta["rows"], meta["dim"])
    worst = float(abs(got - want).max())
    print(f"index: max |difference| of the embeddings {worst:.2e}")
    assert worst < 1e-5


def test_torchrun_search_equals_single_process(cli_runs, tmp_path):
    """Each rank scans its share of a flat index's shards (3 shards over 2 ranks); rank 0's
    merged TREC run is the single process's, byte for byte."""
    model = cli_runs["two"] / "model"
    run_cli(
        [
            "encode",
            "--model",
            str(model),
            "--passages",
            "data/toy/passages.tsv",
            "--out",
            str(tmp_path / "p"),
            "--cache-dir",
            str(cli_runs["cache"]),
            "--shard-size",
            "100",
            "-q",
        ]
    )
    run_cli(
        [
            "encode",
            "--model",
            str(model),
            "--questions",
            "data/toy/dev.qa.tsv",
            "--out",
            str(tmp_path / "q"),
        ]
    )
    run_cli(["index", "--embeddings", f"{tmp_path}/p/*.npy", "--out", str(tmp_path / "index")])
    common = [
        "search",
        "--index",
        str(tmp_path / "index"),
        "--query-embeddings",
        str(tmp_path / "q" / "questions.npy"),
        "--k",
        "20",
    ]
    run_cli([*common, "--out", str(tmp_path / "one.trec")])
    run_cli([*common, "--out", str(tmp_path / "two.trec")], world=WORLD)
    one = (tmp_path / "one.trec").read_text()
    assert one and (tmp_path / "two.trec").read_text() == one
    assert len(one.splitlines()) == 263 * 20


def test_torchrun_mine_equals_single_process(cli_runs, tmp_path):
    """Mining splits the index's shards over 2 ranks (3 shards); rank 0 writes the same file."""
    model = cli_runs["two"] / "model"
    sets = ["--set", f"output_dir={tmp_path}", "--set", f"data.cache_dir={cli_runs['cache']}"]
    run_cli(
        [
            "index",
            "--config",
            "configs/toy.yaml",
            "-q",
            "--model",
            str(model),
            *sets,
            "--set",
            "index.shard_size=100",
        ]
    )
    common = [
        "mine",
        "--model",
        str(model),
        "--index",
        str(tmp_path / "index"),
        "--train",
        "data/toy/train.jsonl",
        "--cache-dir",
        str(cli_runs["cache"]),
        "--negatives",
        "5",
        "--depth",
        "20",
        "--batch",
        "128",
        "-q",
    ]
    run_cli([*common, "--out", str(tmp_path / "one.jsonl")])
    run_cli([*common, "--out", str(tmp_path / "two.jsonl")], world=WORLD)
    one = (tmp_path / "one.jsonl").read_bytes()
    assert one and (tmp_path / "two.jsonl").read_bytes() == one
    summaries = [json.loads((tmp_path / f"{n}.summary.json").read_text()) for n in ("one", "two")]
    assert summaries[0]["dropped"] == summaries[1]["dropped"]


def test_torchrun_on_several_sources_equals_single_process(tmp_path):
    """One source a batch under torchrun: each rank's share of the global batch comes from the
    step's source, with its prompt, as the single process's does."""
    import pandas as pd

    from tests.support.layouts import st_rows, tevatron_rows, write_jsonl

    pd.DataFrame(st_rows()).to_parquet(tmp_path / "st.parquet")
    write_jsonl(tmp_path / "tev.jsonl", tevatron_rows())
    sources = (
        f"data.train=[{{path: {tmp_path / 'st.parquet'}, query_prefix: 'triplet: '}}, "
        f"{{path: {tmp_path / 'tev.jsonl'}, weight: 2}}]"
    )
    runs = {}
    for name, world in (("single", 1), ("two", WORLD)):
        extra = ("--set", sources, "--set", "data.batching=proportional")
        run_cli(train_args(tmp_path / name, tmp_path / "cache", *extra), world=world)
        runs[name] = saved_weights(tmp_path / name / "model")
        lines = (tmp_path / name / "train_log.jsonl").read_text().splitlines()
        assert {json.loads(x)["source"] for x in lines} <= {"st", "tev"}
    assert_same_weights(runs["two"], runs["single"], "2 ranks vs 1 process, two sources")
