"""End to end on the toy corpus: train -> index -> eval through the real CLI."""

from __future__ import annotations

import json

import torch
from safetensors.torch import load_file
from transformers import AutoModel

from dpr_cache.evaluate import metrics_from_retrieval
from tests.e2e.cli_runner import run_cli, toy_overrides


def test_train_index_eval(tmp_path):
    args = ["--config", "configs/toy.yaml", *toy_overrides(tmp_path, **{"train.max_steps": 16})]
    run_cli("train", *args, "-q")
    run_cli("index", *args, "-q")
    proc = run_cli("eval", *args, "-q")
    out = tmp_path / "run"

    assert "hit rate" in proc.stdout
    log = [json.loads(line) for line in (out / "train_log.jsonl").read_text().splitlines()]
    assert [r["step"] for r in log] == list(range(1, 17))
    assert {"loss", "lr", "grad_norm", "batch_size", "negatives_per_question", "seconds",
            "peak_memory_bytes"} <= log[0].keys()  # fmt: skip
    assert log[0]["negatives_per_question"] == 16 * 2 - 1
    first, last = log[0]["loss"], sum(r["loss"] for r in log[-4:]) / 4
    assert last < 0.8 * first, (first, last)  # the loss falls

    assert (out / "config.yaml").is_file()
    for tower in ("query_encoder", "passage_encoder"):
        AutoModel.from_pretrained(out / "model" / tower)  # plain Hugging Face format

    metrics = json.loads((out / "eval" / "metrics.json").read_text())
    assert set(metrics) == {"top1", "top5", "top20", "top100", "n_questions"}
    assert metrics["n_questions"] == 263
    recomputed = metrics_from_retrieval(out / "eval" / "retrieval.json", [1, 5, 20, 100])
    for key in ("top1", "top5", "top20", "top100"):
        assert abs(metrics[key] - recomputed[key]) < 0.01
    results = json.loads((out / "eval" / "retrieval.json").read_text())
    assert len(results) == 263 and len(results[0]["ctxs"]) == 100
    assert {"id", "title", "text", "score", "has_answer"} <= results[0]["ctxs"][0].keys()
    scores = [c["score"] for c in results[0]["ctxs"]]
    assert scores == sorted(scores, reverse=True)


def test_modes_full_and_accumulate_run(tmp_path):
    for mode in ("full", "accumulate"):
        args = toy_overrides(tmp_path / mode, **{"train.mode": mode, "train.max_steps": 2})
        run_cli("train", "--config", "configs/toy.yaml", *args, "-q")
        log = (tmp_path / mode / "run" / "train_log.jsonl").read_text().splitlines()
        expected = 16 * 2 - 1 if mode == "full" else 4 * 2 - 1
        assert json.loads(log[0])["negatives_per_question"] == expected


def test_verify_reports_a_tiny_gap(tmp_path):
    proc = run_cli("verify", "--config", "configs/toy.yaml", *toy_overrides(tmp_path), "--double")
    line = next(x for x in proc.stdout.splitlines() if "max relative grad difference" in x)
    assert float(line.split(":")[1]) < 1e-10


def weights(model_dir) -> dict[str, torch.Tensor]:
    out = {}
    for tower in ("query_encoder", "passage_encoder"):
        for key, value in load_file(model_dir / tower / "model.safetensors").items():
            out[f"{tower}.{key}"] = value
    return out
