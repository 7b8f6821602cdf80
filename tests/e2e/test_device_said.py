"""A config for a GPU (fp16, ``train.device: auto``) on a machine whose torch finds no CUDA
device trains on the CPU, and says so once, naming the torch build; its progress bar names the
device and precision whatever they are."""

from __future__ import annotations

import pytest
import torch

from tests.support.cli import run_cli, toy_overrides

pytestmark = pytest.mark.skipif(torch.cuda.is_available(), reason="needs a machine without CUDA")

SAID = "train.device auto found no CUDA device (torch "


def _train(tmp_path, *sets: str):
    args = toy_overrides(tmp_path, **{"train.max_steps": 1})
    more = [x for item in sets for x in ("--set", item)]
    return run_cli("train", "--config", "configs/toy.yaml", *args, *more)


def test_a_gpu_config_without_a_gpu_says_it_trains_on_the_cpu(tmp_path):
    done = _train(tmp_path, "train.precision=fp16")
    warned = [line for line in done.stderr.splitlines() if SAID in line]
    assert len(warned) == 1, done.stderr
    assert f"(torch {torch.__version__}): training on the CPU in fp16" in warned[0], warned
    fix = "check the GPU's driver" if torch.version.cuda else "install a CUDA build of torch"
    assert fix in warned[0], warned
    assert "train gradcache B=16 on cpu fp16" in done.stderr  # the progress bar


@pytest.mark.parametrize(
    "sets", [["train.precision=fp32"], ["train.precision=fp16", "train.device=cpu"]]
)
def test_the_cpu_asked_for_or_fp32_is_not_warned(tmp_path, sets):
    done = _train(tmp_path, *sets)
    assert SAID not in done.stderr, done.stderr
    precision = sets[0].split("=")[1]
    assert f"train gradcache B=16 on cpu {precision}" in done.stderr  # the progress bar
