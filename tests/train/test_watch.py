"""Training you can watch: TensorBoard's own reader finds the logged scalars, validation during
training equals `dpr-cache eval` of the same model, the best model is kept, the curve drawn."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from tests.support.cli import run_cli, toy_overrides

event_accumulator = pytest.importorskip("tensorboard.backend.event_processing.event_accumulator")


def test_tensorboard_validation_best_model_and_curve(tmp_path: Path) -> None:
    sets = toy_overrides(
        tmp_path,
        **{
            "train.max_steps": 4,
            "train.log_to": "tensorboard",
            "train.eval_every": 2,
            "train.eval_questions": 263,
            "index.store_dtype": "float32",
        },
    )
    run_cli("train", "--config", "configs/toy.yaml", *sets, "-q")
    run = tmp_path / "run"
    log = [json.loads(line) for line in (run / "train_log.jsonl").read_text().splitlines()]
    assert [r["step"] for r in log] == [1, 2, 3, 4]
    events = event_accumulator.EventAccumulator(str(run / "tensorboard"))
    events.Reload()
    scalars = set(events.Tags()["scalars"])
    assert {"loss", "lr", "grad_norm", "pairs_per_second", "peak_memory_bytes"} <= scalars
    assert [e.value for e in events.Scalars("loss")] == pytest.approx([r["loss"] for r in log])
    assert [e.step for e in events.Scalars("val_top20")] == [2, 4]

    best = json.loads((run / "best.json").read_text())
    val = {r["step"]: r["val_top100"] for r in log if "val_top100" in r}
    assert best["val_top100"] == max(val.values()) and val[best["step"]] == best["val_top100"]
    assert (run / "best_model" / "query_encoder" / "modules.json").is_file()
    assert (run / "loss_curve.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"

    # validation over the whole toy corpus is eval's measurement of the final model
    run_cli("index", "--config", "configs/toy.yaml", *sets, "-q")
    run_cli("eval", "--config", "configs/toy.yaml", *sets, "-q")
    metrics = json.loads((run / "eval" / "metrics.json").read_text())
    for k in (1, 5, 20, 100):
        assert metrics[f"top{k}"] == pytest.approx(log[-1][f"val_top{k}"], abs=0.006), k


def test_no_validation_without_dev_questions(tmp_path: Path) -> None:
    sets = toy_overrides(tmp_path, **{"train.eval_every": 2, "data.dev_qa": "null"})
    proc = run_cli("train", "--config", "configs/toy.yaml", *sets, "-q", check=False)
    assert proc.returncode == 2 and "train.eval_every: needs data.dev_qa" in proc.stderr


def test_a_new_run_clears_an_earlier_best_model_and_a_resumed_run_keeps_its_own(
    tmp_path: Path,
) -> None:
    import torch

    from dpr_cache.train.watch import BEST_DIR, BEST_FILE, Watcher

    def earlier_best() -> None:
        (tmp_path / BEST_DIR / "query_encoder").mkdir(parents=True, exist_ok=True)
        (tmp_path / BEST_FILE).write_text(json.dumps({"step": 4, "val_top100": 50.0}))

    cpu = torch.device("cpu")
    kw = {"tensorboard": False, "validator": None, "eval_every": None, "device": cpu}
    earlier_best()
    resumed = Watcher(tmp_path, start_step=6, **kw)
    assert resumed.best == {"step": 4, "val_top100": 50.0} and (tmp_path / BEST_DIR).is_dir()
    fresh = Watcher(tmp_path, start_step=0, **kw)
    assert fresh.best is None
    assert not (tmp_path / BEST_FILE).exists() and not (tmp_path / BEST_DIR).exists()
