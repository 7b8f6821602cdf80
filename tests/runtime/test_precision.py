"""``auto`` precision's one rule, by device: bf16 on CUDA from compute capability 8.0, fp16
below it, bf16 on ROCm, fp32 on the CPU (CUDA faked by monkeypatching); what asks for it holds
the precision resolved; only index and eval may say auto, train may not."""

from __future__ import annotations

import pytest
import torch

from dpr_cache.config import Config
from dpr_cache.retrieval.dense.questions import QuestionRun
from dpr_cache.runtime.device import resolve_precision


def _fake_gpus(monkeypatch, capabilities: dict[int, tuple[int, int]], hip: str | None = None):
    """CUDA devices of the given compute capabilities; the devices asked about are recorded."""
    asked = []

    def capability(device=None):
        asked.append(device)
        return capabilities[torch.device(device).index]

    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "get_device_capability", capability)
    monkeypatch.setattr(torch.version, "hip", hip)
    return asked


def test_auto_is_bf16_from_capability_8_fp16_below_fp32_on_the_cpu(monkeypatch) -> None:
    asked = _fake_gpus(monkeypatch, {0: (7, 5), 1: (8, 0), 2: (9, 0), 3: (6, 1)})
    gpus = [resolve_precision("auto", torch.device("cuda", i)) for i in range(4)]
    assert gpus == ["fp16", "bf16", "bf16", "fp16"]  # control: the rule is not one constant
    assert [d.index for d in asked] == [0, 1, 2, 3]  # each GPU's own capability
    assert resolve_precision("auto", torch.device("cpu")) == "fp32"
    assert len(asked) == 4  # the CPU asks no GPU
    for name in ("fp32", "bf16", "fp16"):  # a name asked for is kept, on either device
        assert resolve_precision(name, torch.device("cuda", 0)) == name
        assert resolve_precision(name, torch.device("cpu")) == name
    with pytest.raises(ValueError, match="precision"):
        resolve_precision("fp8", torch.device("cpu"))


def test_auto_on_rocm_is_bf16(monkeypatch) -> None:
    _fake_gpus(monkeypatch, {0: (7, 0)}, hip="6.2")
    assert resolve_precision("auto", torch.device("cuda", 0)) == "bf16"


def test_a_question_run_holds_the_precision_it_resolved(monkeypatch) -> None:
    _fake_gpus(monkeypatch, {0: (9, 0), 1: (7, 5)})
    assert QuestionRun(torch.device("cuda", 0), "auto").precision == "bf16"
    assert QuestionRun(torch.device("cuda", 1), "auto").precision == "fp16"
    assert QuestionRun(torch.device("cpu"), "auto").precision == "fp32"
    assert QuestionRun(torch.device("cuda", 0), "fp32").precision == "fp32"


def test_index_and_eval_default_to_auto_and_train_has_none() -> None:
    config = Config()
    assert (config.index.precision, config.eval.precision, config.train.precision) == (
        "auto",
        "auto",
        "fp32",
    )
    assert Config(index={"precision": "bf16"}).index.precision == "bf16"
    with pytest.raises(ValueError, match="precision"):
        Config(train={"precision": "auto"})
    with pytest.raises(ValueError, match="precision"):
        Config(index={"precision": "fp8"})
