"""``kill -9`` at seeded moments of every command that writes: train (by step, and inside a
checkpoint's write), encode, index (flat and IVF), search, eval and mine (by the bytes written
so far). After each kill no file under its final name is partial; a rerun (``--resume`` for
train) ends with outputs identical to an uninterrupted run's and no temporary left behind."""

from __future__ import annotations

import json
import random
import shutil
from pathlib import Path

import pytest

from tests.faults.inject import (
    assert_whole,
    digest,
    folder_bytes,
    kill_when,
    leftovers,
    record,
    start,
)
from tests.support.cli import encode_args, run_cli, toy_overrides
from tests.support.fixtures import TOY

SEED = 2026
RNG = random.Random(SEED)
STEPS = 8


@pytest.fixture(scope="module")
def model(tmp_path_factory) -> Path:
    """A toy model, trained a few steps: what encode, index, search, eval and mine use."""
    root = tmp_path_factory.mktemp("kill-model")
    run_cli(
        "train",
        "--config",
        "configs/toy.yaml",
        "-q",
        *toy_overrides(root, **{"train.max_steps": 4}),
    )
    return root / "run" / "model"


def _inject(
    command: str, args: list[str], out: Path, fractions: list[float], rerun: list[str] | None = None
) -> None:
    """Run to the end for the reference, then for each fraction: start afresh, kill -9 once the
    folder ``out`` holds that share of the reference's bytes, check, rerun, compare."""
    run_cli(*args)
    want, total = digest(out), folder_bytes(out)
    for fraction in fractions:
        shutil.rmtree(out, ignore_errors=True)
        proc = start(*args)
        killed = kill_when(proc, lambda f=fraction: folder_bytes(out) >= f * total)
        where = f"at {fraction:.0%} of {total:,} bytes"
        assert killed, f"{command} ended before the kill {where}: nothing was tested"
        assert_whole(out)
        run_cli(*(rerun or args))
        assert digest(out) == want, f"{command} killed {where}: its rerun differs"
        assert not leftovers(out), leftovers(out)
        record("kill -9", command, where, True)


def _fractions(n: int) -> list[float]:
    return sorted(round(RNG.uniform(0.1, 0.9), 2) for _ in range(n))


def test_train_killed_at_seeded_steps_and_inside_a_checkpoint(tmp_path) -> None:
    args = [
        "train",
        "--config",
        "configs/toy.yaml",
        "-q",
        *toy_overrides(tmp_path, **{"train.max_steps": STEPS, "train.checkpoint_every": 2}),
    ]
    run_cli(*args)
    out = tmp_path / "run"
    want = digest(out)
    points = sorted(RNG.sample(range(1, STEPS), 2))
    log = out / "train_log.jsonl"
    for point in [*points, "checkpoint"]:

        def ready(point=point) -> bool:
            if point == "checkpoint":  # inside a checkpoint's write: its folder not swapped in
                return any(out.glob("checkpoints/.tmp-step-*"))
            return log.is_file() and len(log.read_text().splitlines()) >= point

        for _ in range(3):  # a checkpoint's write lasts milliseconds: a poll may miss it
            shutil.rmtree(out)
            if kill_when(start(*args), ready):
                break
        else:
            raise AssertionError(f"three runs ended before the kill at {point}")
        assert_whole(out)
        run_cli(*args, "--resume")
        assert digest(out) == want, f"killed at {point}: the resumed run differs"
        assert not leftovers(out), leftovers(out)
        record(
            "kill -9",
            "train",
            f"after step {point}" if point != "checkpoint" else "while a checkpoint was written",
            True,
        )


def test_encode_killed_while_writing_shards(tmp_path, model) -> None:
    out = tmp_path / "vecs"
    cache = ["--cache-dir", str(tmp_path / "cache"), "-q"]
    args = encode_args(model, out, "--shard-size", "40", *cache)
    _inject("encode", args, out, _fractions(2))


@pytest.mark.parametrize("kind", ["flat", "ivf"])
def test_index_killed_while_building(tmp_path, model, kind) -> None:
    sets = toy_overrides(
        tmp_path, **{"index.shard_size": 40, "index.type": kind, "index.ivf_nlist": 4}
    )
    args = ["index", "--config", "configs/toy.yaml", "--model", str(model), "-q", *sets]
    _inject(f"index ({kind})", args, tmp_path / "run" / "index", _fractions(2))


def test_search_eval_and_mine_killed_while_writing(tmp_path, model) -> None:
    sets = toy_overrides(tmp_path, **{"index.shard_size": 40})
    run_cli("index", "--config", "configs/toy.yaml", "--model", str(model), "-q", *sets)
    index = tmp_path / "run" / "index"
    run_cli(
        "encode",
        "--model",
        str(model),
        "--questions",
        str(TOY / "dev.qa.tsv"),
        "--out",
        str(tmp_path / "q"),
        "-q",
    )
    runs = tmp_path / "runs"
    search = [
        "search",
        "--index",
        str(index),
        "--query-embeddings",
        str(tmp_path / "q" / "questions.npy"),
        "--k",
        "100",
        "--out",
        str(runs / "r.trec"),
    ]
    _inject("search", search, runs, _fractions(2))
    eval_out = tmp_path / "eval"
    evaluate = [
        "eval",
        "--config",
        "configs/toy.yaml",
        "--model",
        str(model),
        "-q",
        *sets,
        "--out",
        str(eval_out),
    ]
    _inject("eval", evaluate, eval_out, _fractions(2))
    mined = tmp_path / "mined" / "train.mined.jsonl"
    mine = [
        "mine",
        "--model",
        str(model),
        "--index",
        str(index),
        "--train",
        str(TOY / "train.jsonl"),
        "--out",
        str(mined),
        "--negatives",
        "5",
        "--depth",
        "20",
        "--batch",
        "60",
        "--cache-dir",
        str(tmp_path / "cache"),
        "-q",
    ]
    _inject("mine", mine, mined.parent, _fractions(2))
    summary = json.loads((mined.parent / "train.mined.summary.json").read_text())
    assert summary["questions"] == 300


_LOADER = """
import sys, time, torch
from dpr_cache.runtime.processes import worker_init
class Big(torch.utils.data.Dataset):  # items larger than a pipe's buffer
    def __len__(self): return 8
    def __getitem__(self, i): return bytes(1 << 20)  # pickled through the pipe
loader = torch.utils.data.DataLoader(Big(), batch_size=None, num_workers=1,
                                     worker_init_fn=worker_init() if sys.argv[1] == "1" else None)
items = iter(loader)
next(items)  # the worker goes on preparing the next items, which no one reads
print("ready", flush=True)
time.sleep(600)
"""


@pytest.mark.parametrize("set_up", [True, False], ids=["worker_init", "torch-default"])
def test_a_data_loader_worker_ends_with_its_killed_parent(set_up: bool) -> None:
    """A worker whose parent is killed while it writes an item must not wait forever on the
    pipe; torch's own worker does (negative control), the project's worker set-up does not."""
    import subprocess
    import sys

    from dpr_cache.runtime.processes import child_env

    proc = subprocess.Popen(
        [sys.executable, "-c", _LOADER, "1" if set_up else "0"],
        env=child_env(),
        stdout=subprocess.PIPE,
        text=True,
    )
    assert proc.stdout.readline().strip() == "ready"
    if set_up:
        assert kill_when(proc, lambda: True, timeout=30)
        record("kill -9", "a data-loader worker's parent", "while the worker wrote an item", True)
    else:
        with pytest.raises(AssertionError, match="outlived their parent"):
            kill_when(proc, lambda: True, timeout=30)
