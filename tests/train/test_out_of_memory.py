"""A step that runs out of GPU memory stops ``train`` with one line naming the chunk that fits.

No GPU here: the step raises ``torch.OutOfMemoryError`` as CUDA's allocator does, and the chunk
probe is a stand-in whose peak grows with the chunk (and runs out of memory itself past a size),
so what is checked is the search and the message; ``tests/cuda`` runs the real thing.
"""

from __future__ import annotations

import types

import pytest
import torch
from typer.testing import CliRunner

from dpr_cache.cli import app
from dpr_cache.config import ModelConfig, TrainConfig
from dpr_cache.train import autochunk, trainer
from dpr_cache.train.autochunk import OUT_OF_MEMORY, BatchShape, ProbeSpec, largest_fitting_chunk
from tests.support.cli import toy_overrides

GB = 10**9


def fake_probe(per_row: int, ceiling: int):
    """A probe peak of ``per_row`` bytes a question row; out of memory past ``ceiling`` rows."""

    def probe(model, payload):
        rows = payload["q_rows"]
        return OUT_OF_MEMORY if rows > ceiling else rows * per_row

    return probe


def test_largest_fitting_chunk_bisects_through_out_of_memory_probes(monkeypatch):
    monkeypatch.setattr(autochunk, "_probe_cuda", fake_probe(GB // 4, 64))
    monkeypatch.setattr(autochunk, "batch_extras_bytes", lambda *a: 0)
    shape = BatchShape(batch_size=512)
    spec = ProbeSpec(ModelConfig(name_or_path="m"), TrainConfig())
    # 10 GB less the 10% margin holds 36 rows: the largest power of two is 32
    assert largest_fitting_chunk(spec, shape, None, 512, 10 * GB) == 32
    # a budget beyond the device: the probe's out-of-memory caps it at 64
    assert largest_fitting_chunk(spec, shape, None, 512, 1000 * GB) == 64
    assert largest_fitting_chunk(spec, shape, None, 512, GB // 8) is None


@pytest.fixture
def oom_gpu(monkeypatch):
    """A 'GPU' of 16 GB: every training step runs out of memory; the probe fits 32 rows."""

    def step(self, batch):
        raise torch.OutOfMemoryError("CUDA out of memory. Tried to allocate 20.00 GiB")

    monkeypatch.setattr(trainer.Trainer, "step", step)
    monkeypatch.setattr(autochunk, "_probe_cuda", fake_probe(GB // 4, 10_000))
    monkeypatch.setattr(autochunk, "batch_extras_bytes", lambda *a: 4 * GB)
    props = types.SimpleNamespace(total_memory=16 * GB)
    monkeypatch.setattr(torch.cuda, "get_device_properties", lambda device: props)
    monkeypatch.setattr(torch.cuda, "get_device_name", lambda device: "Test GPU")
    monkeypatch.setattr(torch.cuda, "empty_cache", lambda: None)


@pytest.mark.parametrize(
    "mode, what, advice",
    [
        ("gradcache", "chunk 64 ran", "chunk 32 fits: set train.chunk_size=32 (or"),
        (
            "full",
            "a full batch of 64 questions ran",
            "train.chunk_size=32 and train.mode=gradcache",
        ),
    ],
)
def test_train_out_of_memory_is_one_line_naming_the_chunk_that_fits(
    oom_gpu, tmp_path, mode, what, advice
):
    args = toy_overrides(
        tmp_path, **{"train.batch_size": 64, "train.chunk_size": 64, "train.mode": mode}
    )
    result = CliRunner().invoke(app, ["train", "--config", "configs/toy.yaml", *args, "-q"])
    lines = result.output.strip().splitlines()
    assert result.exit_code == 2, result.output
    assert lines[-1].startswith("error: train.chunk_size: ")
    assert what in lines[-1] and "at step 1 on Test GPU (16.0 GB)" in lines[-1]
    assert advice in lines[-1]
    assert "Traceback" not in result.output
    # (16 GB - 10%) - 4 GB of extras holds 41 rows of 0.25 GB: 32 is the largest candidate
    assert not (tmp_path / "run" / "model").exists()


def test_a_chunk_of_one_that_does_not_fit_says_so(oom_gpu, monkeypatch, tmp_path):
    monkeypatch.setattr(autochunk, "batch_extras_bytes", lambda *a: 20 * GB)
    args = toy_overrides(tmp_path, **{"train.batch_size": 16, "train.chunk_size": 4})
    result = CliRunner().invoke(app, ["train", "--config", "configs/toy.yaml", *args, "-q"])
    assert result.exit_code == 2
    assert "not even a chunk of 1 fits" in result.output.strip().splitlines()[-1]
