"""``dpr-cache bench --config``: each chunk size timed in its own process through the trainer's
own step, and the pick: the fastest chunk within the memory budget."""

from __future__ import annotations

from dpr_cache.train.bench import ChunkTiming, pick_chunk
from tests.support.cli import run_cli, toy_overrides


def test_the_pick_is_the_fastest_that_fits() -> None:
    rows = [ChunkTiming(4, 2.0, 8.0, 10), ChunkTiming(8, 1.0, 16.0, 20, fits=False),
            ChunkTiming(16, 1.5, 10.7, 15)]  # fmt: skip
    assert pick_chunk(rows).chunk == 16  # 8 is faster but over the budget
    assert pick_chunk([ChunkTiming(4, 2.0, 8.0, 10, fits=False)]) is None


def test_bench_times_each_chunk_and_names_the_one_to_train_with(tmp_path) -> None:
    args = ["bench", "--config", "configs/toy.yaml", *toy_overrides(tmp_path)]
    proc = run_cli(*args, "--chunks", "4,8,64", "--steps", "1", "--warmup", "0")
    lines = proc.stdout.splitlines()
    rows = [line.split("|") for line in lines if line.strip()[:1].isdigit()]
    assert [int(r[0]) for r in rows] == [4, 8, 16]  # 64 is cut to the batch of 16
    assert all(float(r[1]) > 0 and float(r[3]) > 0.1 for r in rows)  # seconds, peak GB
    assert lines[-1].startswith("fastest: train.chunk_size=")
    assert not (tmp_path / "run").exists()  # nothing written under output_dir
    tight = run_cli(*args, "--chunks", "4", "--steps", "1", "--warmup", "0",
                    "--set", "train.memory_budget=1MB", check=False)  # fmt: skip
    assert tight.returncode == 2 and "over 1MB" in tight.stdout
    assert tight.stderr.strip() == "error: train.memory_budget: no chunk size fits 1MB"
