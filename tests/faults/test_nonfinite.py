"""A loss that is not finite, from one poisoned question (its word's embedding set to 1e30, so
its batch's vectors overflow): in fp32 the run stops at that step with one line naming the step
and the batch, nothing updated and the last checkpoint sound; in fp16 the step is skipped as
torch's GradScaler skips an overflow, counted in the log, and the run goes on to its model."""

from __future__ import annotations

import itertools
import json
import shutil
from pathlib import Path

import pytest
from safetensors.torch import load_file, save_file

from dpr_cache.data.batches import TrainBatches
from dpr_cache.model.towers import load_tokenizer
from dpr_cache.train.checkpoint import sound_checkpoint
from tests.faults.inject import record
from tests.support.cli import run_cli, toy_overrides
from tests.support.fixtures import TOY

BATCH, SEED, STEP = 16, 42, 4  # the poisoned question is in the batch of step 4 (0-based 3)


@pytest.fixture(scope="module")
def poisoned(tmp_path_factory) -> dict:
    """A copy of the tiny BERT whose embedding of one word is 1e30, and the toy's training file
    with that word in one question of step STEP's batch."""
    root = tmp_path_factory.mktemp("nonfinite")
    model = root / "tiny-bert"
    shutil.copytree(TOY / "tiny-bert", model)
    tok = load_tokenizer(model)
    lines = (TOY / "train.jsonl").read_text().splitlines()
    used = {t for x in lines for t in tok(" ".join(_texts(json.loads(x))))["input_ids"]}
    vocab = tok.get_vocab()
    word = next(
        w
        for w in sorted(vocab)
        if w.isalpha()
        and len(w) > 3
        and tok(w)["input_ids"][1:-1] == [vocab[w]]
        and vocab[w] not in used
    )
    token = vocab[word]  # a word of one token no question or passage holds
    weights = load_file(model / "model.safetensors")
    key = next(k for k in weights if k.endswith("word_embeddings.weight"))
    weights[key][token] = 1e30
    save_file(weights, model / "model.safetensors", metadata={"format": "pt"})
    victim = TrainBatches(len(lines), BATCH, SEED).batch_indices(STEP - 1)[0]
    record_ = json.loads(lines[victim])
    record_["question"] = f"{word} {record_['question']}"
    lines[victim] = json.dumps(record_)
    train = root / "train.jsonl"
    train.write_text("\n".join(lines) + "\n")
    return {"model": model, "train": train, "victim": victim}


def _texts(obj) -> list[str]:
    """Every string in a training record: its question, its passages' titles and texts."""
    if isinstance(obj, str):
        return [obj]
    items = obj.values() if isinstance(obj, dict) else obj if isinstance(obj, list) else []
    return [t for v in items for t in _texts(v)]


def _args(tmp_path: Path, poisoned: dict, precision: str, **more) -> list[str]:
    sets = {
        "model.name_or_path": poisoned["model"],
        "data.train": poisoned["train"],
        **more,
        "train.max_steps": 6,
        "train.checkpoint_every": 2,
        "train.precision": precision,
        "model.dropout": 0.0,
    }
    return ["train", "--config", "configs/toy.yaml", "-q", *toy_overrides(tmp_path, **sets)]


@pytest.mark.parametrize("precision", ["fp32", "bf16"])
def test_full_precision_stops_naming_the_step_and_keeps_the_checkpoint(
    tmp_path, poisoned, precision
) -> None:
    done = run_cli(*_args(tmp_path, poisoned, precision), check=False)
    assert done.returncode == 3, done.stderr[-2000:]
    [line] = done.stderr.strip().splitlines()[-1:]
    assert line.startswith(f"error: train: the loss is not finite at step {STEP} (batch ")
    assert f"questions {poisoned['victim']}," in line and "step-00000002 as it was" in line
    checkpoints = tmp_path / "run" / "checkpoints"
    assert sound_checkpoint(checkpoints).name == "step-00000002"
    assert not (tmp_path / "run" / "model").exists()
    log = [json.loads(x) for x in (tmp_path / "run" / "train_log.jsonl").read_text().splitlines()]
    assert [r["step"] for r in log] == [1, 2, 3]  # the step that met it logged nothing
    record("loss not finite", f"train ({precision})", f"step {STEP}", True)


def _log(run: Path) -> list[dict]:
    return [json.loads(x) for x in (run / "train_log.jsonl").read_text().splitlines()]


def test_fp16_skips_the_step_and_counts_it(tmp_path, poisoned) -> None:
    """fp16's first steps may overflow too (the scale starts at 2**16 and halves at each skip,
    as torch's GradScaler does), so the poisoned run is compared with the same run unpoisoned:
    its step STEP has a finite loss, the poisoned run's is skipped with a NaN loss."""
    clean = {**poisoned, "train": TOY / "train.jsonl"}
    run_cli(*_args(tmp_path / "clean", clean, "fp16"))
    assert all(r["loss"] == r["loss"] for r in _log(tmp_path / "clean" / "run"))  # no NaN
    run_cli(*_args(tmp_path, poisoned, "fp16"))
    log = _log(tmp_path / "run")
    assert [r["step"] for r in log] == [1, 2, 3, 4, 5, 6]
    hit = log[STEP - 1]
    assert hit["skipped"] is True and hit["loss"] != hit["loss"]  # the poisoned batch: NaN
    assert [r["skipped_steps"] for r in log] == list(
        itertools.accumulate(int(r["skipped"]) for r in log)
    )
    for before, after in itertools.pairwise(log):  # a skip halves the scale
        assert after["loss_scale"] == before["loss_scale"] * (0.5 if after["skipped"] else 1)
    assert (tmp_path / "run" / "model" / "query_encoder" / "model.safetensors").is_file()
    record("loss not finite", "train (fp16)", f"step {STEP}", True)


@pytest.fixture(scope="module")
def poisoned_everywhere(tmp_path_factory) -> Path:
    """A copy of the tiny BERT whose [CLS] embedding is 1e30: every batch's loss overflows."""
    model = tmp_path_factory.mktemp("every-step") / "tiny-bert"
    shutil.copytree(TOY / "tiny-bert", model)
    weights = load_file(model / "model.safetensors")
    key = next(k for k in weights if k.endswith("word_embeddings.weight"))
    weights[key][load_tokenizer(model).cls_token_id] = 1e30
    save_file(weights, model / "model.safetensors", metadata={"format": "pt"})
    return model


@pytest.mark.parametrize("limit", [3, None], ids=["three", "never"])
def test_fp16_stops_past_max_skipped_steps(tmp_path, poisoned_everywhere, limit) -> None:
    """Every step skipped: past train.max_skipped_steps the run stops with one line naming the
    steps, the last loss scale tried and what to change, its last checkpoint kept; the control,
    with no limit, runs to its last step (exit 0) with every step skipped."""
    model = {"model": poisoned_everywhere, "train": TOY / "train.jsonl"}
    limit_set = {"train.max_skipped_steps": "null" if limit is None else limit}
    done = run_cli(*_args(tmp_path, model, "fp16", **limit_set), check=False)
    run = tmp_path / "run"
    if limit is None:
        assert done.returncode == 0 and all(r["skipped"] for r in _log(run))
        return
    assert done.returncode == 3, done.stderr[-2000:]
    [line] = done.stderr.strip().splitlines()[-1:]
    assert line.startswith("error: train: 4 steps in a row skipped (steps 1 to 4), the loss ")
    assert "tried, down to 8192; stopped past train.max_skipped_steps" in line, line  # 2**16 / 8
    assert "the last checkpoint step-00000002 kept" in line, line
    assert line.endswith("or raise train.max_skipped_steps"), line
    assert [r["step"] for r in _log(run)] == [1, 2, 3, 4] and not (run / "model").exists()
    assert sound_checkpoint(run / "checkpoints").name == "step-00000002"
    record("every step skipped", "train (fp16), max_skipped_steps 3", "step 4", True)
