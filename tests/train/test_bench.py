"""``dpr-cache bench --config``: each chunk size timed in its own process through the trainer's
own step, and the pick: the fastest chunk within the memory budget."""

from __future__ import annotations

import pytest
import torch

from dpr_cache.train.bench import ChunkTiming, pick_chunk
from tests.support.cli import run_cli, toy_overrides


def test_the_pick_is_the_fastest_that_fits() -> None:
    rows = [
        ChunkTiming(4, 2.0, 8.0, 10),
        ChunkTiming(8, 1.0, 16.0, 20, fits=False),
        ChunkTiming(16, 1.5, 10.7, 15),
    ]
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
    tight = run_cli(
        *args,
        "--chunks",
        "4",
        "--steps",
        "1",
        "--warmup",
        "0",
        "--set",
        "train.memory_budget=1MB",
        check=False,
    )
    assert tight.returncode == 2 and "over 1MB" in tight.stdout
    assert tight.stderr.strip() == "error: train.memory_budget: no chunk size fits 1MB"


def test_a_chunk_out_of_memory_is_a_row_and_the_sizes_that_ran_keep_theirs(monkeypatch) -> None:
    """The child says a chunk ran out of memory: it is a row saying so, the larger sizes are
    not tried, the pick is among the sizes that ran."""
    from dpr_cache.config import load_config
    from dpr_cache.train import bench

    asked = []

    def child(module, args):
        asked.append(int(args[1]))
        if int(args[1]) >= 8:
            return {"out_of_memory": "NVIDIA X (cuda:0) ran out of memory: 0.10 of 24.0 GB free"}
        return {"step_s": 2.0, "pairs_per_s": 8.0, "peak_bytes": 10}

    monkeypatch.setattr(bench, "run_json_child", child)
    timings = bench.bench_chunks(load_config("configs/toy.yaml", []), [16, 4, 8], 1, 0)
    assert asked == [4, 8]  # 16 not tried
    assert [(t.chunk, t.out_of_memory is None) for t in timings] == [(4, True), (8, False)]
    assert pick_chunk(timings).chunk == 4
    table = bench.format_table(timings, None)
    assert "     8 | NVIDIA X (cuda:0) ran out of memory: 0.10 of 24.0 GB free (larger" in table


def test_the_child_reports_running_out_of_memory_and_raises_anything_else(tmp_path, monkeypatch):
    from dpr_cache.config import load_config
    from dpr_cache.train import bench
    from dpr_cache.train.trainer import Trainer

    config = load_config("configs/toy.yaml", [*toy_overrides(tmp_path)[1::2], "train.device=cpu"])

    def out_of_memory(self, batch):
        raise torch.OutOfMemoryError("CUDA out of memory. Tried to allocate 2.00 GiB")

    monkeypatch.setattr(Trainer, "step", out_of_memory)
    assert bench._time_steps(config, 1, 0) == {"out_of_memory": "ran out of memory"}

    def broken(self, batch):
        raise RuntimeError("expected scalar type Float")  # the control: not memory

    monkeypatch.setattr(Trainer, "step", broken)
    with pytest.raises(RuntimeError, match="expected scalar type"):
        bench._time_steps(config, 1, 0)


@pytest.mark.parametrize(
    "chunks, sets, advice",
    [
        ("4,8", [], "chunk 4, the smallest asked, ran out of memory: ask for smaller ones"),
        ("1,2", [], "chunk 1, the smallest asked, ran out of memory: shorten model.max_passage"),
        ("4", ["--set", "train.mode=full"], "set train.mode=gradcache"),
    ],
)
def test_bench_says_what_to_do_when_even_the_smallest_chunk_ran_out_of_memory(
    monkeypatch, chunks, sets, advice
) -> None:
    from typer.testing import CliRunner

    from dpr_cache.cli.app import app
    from dpr_cache.train import bench

    oom = {"out_of_memory": "the GPU ran out of memory"}
    monkeypatch.setattr(bench, "run_json_child", lambda module, args: oom)
    args = ["bench", "--config", "configs/toy.yaml", "--chunks", chunks, *sets]
    done = CliRunner().invoke(app, args)
    assert done.exit_code == 2, done.output
    assert "error: bench: chunk " in done.output and advice in done.output, done.output
