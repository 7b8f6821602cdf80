"""A full disk (a small tmpfs the test mounts; root only): while encode writes its shards, while
train writes a checkpoint, while eval writes its results. Each stops with one line naming the
file, what it needs and what is free; what was written before stays whole; once the disk is
made larger, a rerun (``--resume`` for train) ends as a run never stopped. A file size limit
(``ulimit -f``, no root needed) is met the same way, its message naming the limit."""

from __future__ import annotations

import os
import resource
import subprocess
import sys
from pathlib import Path

import pytest

from dpr_cache.runtime.processes import child_env
from tests.faults.inject import assert_whole, digest, record
from tests.support.cli import run_cli, toy_overrides
from tests.support.fixtures import REPO, TOY, saved_weights


@pytest.fixture
def small_disk(tmp_path):
    """A tmpfs mounted at ``tmp_path/disk``; ``resize(kb)`` changes its size."""
    disk = tmp_path / "disk"
    disk.mkdir()
    if os.geteuid() != 0:
        pytest.skip("mounting a small filesystem needs root")

    def resize(kb: int, first: bool = False) -> None:
        options = f"size={kb}k" if first else f"remount,size={kb}k"
        subprocess.run(["mount", "-t", "tmpfs", "-o", options, "tmpfs", str(disk)], check=True)

    resize(64, first=True)
    yield disk, resize
    subprocess.run(["umount", str(disk)], check=False)


def _one_line(done, name: str) -> str:
    assert done.returncode == 1, done.stderr[-2000:]
    [line] = done.stderr.strip().splitlines()[-1:]
    assert line.startswith(f"error: no space left to write {name}") or f"/{name}: it needs" in line
    assert " are free there; free some space and run again" in line, line
    return line


def _encode_args(tmp_path: Path, shard_size: int) -> list[str]:
    """``encode`` of the toy passages by the tiny BERT in float32 shards of ``shard_size``
    (``--out`` to add)."""
    model, passages = str(TOY / "tiny-bert"), str(TOY / "passages.tsv")
    flags = ["--shard-size", str(shard_size), "--store-dtype", "float32"]
    cache = ["--cache-dir", str(tmp_path / "cache"), "-q"]
    return ["encode", "--model", model, "--passages", passages, *flags, *cache]


def test_encode_stops_on_a_full_disk_and_resumes_with_room(tmp_path, small_disk) -> None:
    disk, resize = small_disk
    args = _encode_args(tmp_path, 40)
    run_cli(*args, "--out", str(tmp_path / "whole"))
    want = digest(tmp_path / "whole")
    done = run_cli(*args, "--out", str(disk / "vecs"), check=False)
    line = _one_line(done, str(disk / "vecs"))
    assert ".npy: it needs about" in line or ".ids.txt: it needs about" in line
    kept = sorted((disk / "vecs").glob("*.npy"))
    assert kept, "no shard fitted before the disk filled: nothing earlier to keep"
    assert_whole(disk / "vecs")
    resize(4096)
    again = run_cli(*args, "--out", str(disk / "vecs"))
    assert again.returncode == 0 and digest(disk / "vecs") == want
    record("disk full", "encode", f"after {len(kept)} of 7 shards", True)


def test_train_stops_on_a_full_disk_at_a_checkpoint_and_resumes(tmp_path, small_disk) -> None:
    disk, resize = small_disk
    sets = {"train.max_steps": 6, "train.checkpoint_every": 2, "train.log_to": "none"}
    args = ["train", "--config", "configs/toy.yaml", "-q"]
    run_cli(*args, *toy_overrides(tmp_path / "whole", **sets))
    want = saved_weights(tmp_path / "whole" / "run" / "model")
    size = (
        sum(
            p.stat().st_size
            for p in (tmp_path / "whole" / "run" / "checkpoints").rglob("*")
            if p.is_file()
        )
        // 2
    )  # one checkpoint
    resize(int(size * 1.5) // 1024)  # room for one checkpoint, not two
    mine = [*args, *toy_overrides(tmp_path, **sets), "--set", f"output_dir={disk / 'run'}"]
    done = run_cli(*mine, check=False)
    line = _one_line(done, str(disk / "run"))
    assert "checkpoints/step-00000004" in line and "it needs about" in line
    assert (disk / "run" / "checkpoints" / "step-00000002" / "state.pt").is_file()
    resize(4 * size // 1024 + 4096)
    run_cli(*mine, "--resume")
    got = saved_weights(disk / "run" / "model")
    assert got.keys() == want.keys() and all((got[k] == want[k]).all() for k in want)
    record("disk full", "train", "writing the second checkpoint", True)


def test_eval_stops_on_a_full_disk_and_writes_all_with_room(tmp_path, small_disk) -> None:
    disk, resize = small_disk
    sets = toy_overrides(tmp_path, **{"train.max_steps": 2})
    run_cli("train", "--config", "configs/toy.yaml", "-q", *sets)
    run_cli("index", "--config", "configs/toy.yaml", "-q", *sets)
    evaluate = ["eval", "--config", "configs/toy.yaml", "-q", *sets]
    run_cli(*evaluate, "--out", str(tmp_path / "whole"))
    want = {k: v for k, v in digest(tmp_path / "whole").items() if k != "metrics.json"}
    done = run_cli(*evaluate, "--out", str(disk / "eval"), check=False)
    line = _one_line(done, str(disk / "eval"))
    assert "retrieval" in line or "run.trec" in line
    assert_whole(disk / "eval")
    whole = sum(f.stat().st_size for f in (tmp_path / "whole").rglob("*") if f.is_file())
    resize(2 * whole // 1024 + 1024)
    run_cli(*evaluate, "--out", str(disk / "eval"))
    got = {k: v for k, v in digest(disk / "eval").items() if k != "metrics.json"}
    assert got == want  # metrics.json names its folder: compared without it
    record("disk full", "eval", "writing retrieval.json", True)


def test_the_message_names_a_size_a_person_reads(tmp_path) -> None:
    from dpr_cache.runtime.atomic import DiskFull

    assert "it needs about 10.2 KB" in str(DiskFull(Path(tmp_path) / "x.npy", 10_240))
    assert "it needs about 3.0 GB" in str(DiskFull(Path(tmp_path) / "x.npy", 3 * 10**9))


def test_encode_stops_at_a_file_size_limit_and_resumes_without_it(tmp_path) -> None:
    """RLIMIT_FSIZE below one shard's size: encode stops at its first shard with one line naming
    the file and the limit (EFBIG, not a full disk); without the limit the rerun ends whole."""
    args = _encode_args(tmp_path, 100)
    run_cli(*args, "--out", str(tmp_path / "whole"))  # also fills the Arrow cache
    want = digest(tmp_path / "whole")
    shard = max(p.stat().st_size for p in (tmp_path / "whole").glob("*.npy"))
    limit = shard // 2
    others = [p for p in (tmp_path / "whole").rglob("*") if p.is_file() and p.suffix != ".npy"]
    assert all(p.stat().st_size < limit for p in others)  # only a shard meets the limit

    def capped() -> None:
        resource.setrlimit(resource.RLIMIT_FSIZE, (limit, limit))

    done = subprocess.run(
        [sys.executable, "-m", "dpr_cache", *args, "--out", str(tmp_path / "v")],
        cwd=REPO,
        env=child_env(),
        capture_output=True,
        text=True,
        preexec_fn=capped,
        timeout=600,
    )
    assert done.returncode == 1, done.stderr[-2000:]
    [line] = done.stderr.strip().splitlines()[-1:]
    assert line.startswith(f"error: cannot write {tmp_path / 'v'}"), line
    assert "file size limit of" in line and "(ulimit -f)" in line and "are free" not in line
    assert_whole(tmp_path / "v")
    again = run_cli(*args, "--out", str(tmp_path / "v"))
    assert again.returncode == 0 and digest(tmp_path / "v") == want
    record("file size limit", "encode", f"{limit:,} bytes, half a shard", True)


def test_sharded_train_stops_on_a_full_disk_at_a_checkpoint_and_resumes(tmp_path, small_disk):
    """Two gloo ranks under ``train.shard: fsdp``, room for one sharded checkpoint and not two:
    one line naming the checkpoint, the one before it whole; with room, ``--resume`` ends as
    the unbroken run."""
    disk, resize = small_disk
    sets = {
        "train.max_steps": 6,
        "train.checkpoint_every": 2,
        "train.log_to": "none",
        "train.shard": "fsdp",
    }
    args = ["train", "--config", "configs/toy.yaml", "-q"]
    run_cli(*args, *toy_overrides(tmp_path / "whole", **sets), world=2)
    want = saved_weights(tmp_path / "whole" / "run" / "model")
    checkpoints = tmp_path / "whole" / "run" / "checkpoints"
    size = sum(p.stat().st_size for p in checkpoints.rglob("*") if p.is_file()) // 2
    resize(int(size * 1.5) // 1024)  # room for one checkpoint, not two
    mine = [*args, *toy_overrides(tmp_path, **sets), "--set", f"output_dir={disk / 'run'}"]
    done = run_cli(*mine, check=False, world=2)
    said = {line for line in done.stderr.splitlines() if line.startswith("error: ")}
    assert done.returncode != 0 and len(said) == 1, done.stderr[-3000:]  # each rank's the same
    [line] = said
    assert line.startswith(f"error: no space left to write {disk / 'run'}"), line
    assert "checkpoints/step-00000004" in line and "it needs about" in line, line
    assert (disk / "run" / "checkpoints" / "step-00000002" / "shards.sha256").is_file()
    resize(4 * size // 1024 + 4096)
    run_cli(*mine, "--resume", world=2)
    got = saved_weights(disk / "run" / "model")
    assert got.keys() == want.keys() and all((got[k] == want[k]).all() for k in want)
    record("disk full", "train, sharded (2 gloo ranks)", "writing the second checkpoint", True)
