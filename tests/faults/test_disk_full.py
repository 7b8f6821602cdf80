"""A full disk (a small tmpfs the test mounts; root only): while encode writes its shards, while
train writes a checkpoint, while eval writes its results. Each stops with one line naming the
file, what it needs and what is free; what was written before stays whole; once the disk is
made larger, a rerun (``--resume`` for train) ends as a run never stopped."""

from __future__ import annotations

import os
import subprocess
from pathlib import Path

import pytest

from dpr_cache.testing.cli import run_cli, toy_overrides
from dpr_cache.testing.fixtures import TOY, saved_weights
from tests.faults.inject import assert_whole, digest, record


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


def test_encode_stops_on_a_full_disk_and_resumes_with_room(tmp_path, small_disk) -> None:
    disk, resize = small_disk
    args = ["encode", "--model", str(TOY / "tiny-bert"), "--passages", str(TOY / "passages.tsv"),
            "--shard-size", "40", "--store-dtype", "float32", "--cache-dir",
            str(tmp_path / "cache"), "-q"]  # fmt: skip
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
    size = sum(p.stat().st_size for p in (tmp_path / "whole" / "run" / "checkpoints").rglob("*")
               if p.is_file()) // 2  # one checkpoint  # fmt: skip
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
