"""Distillation from the command line on the toy corpus with a stand-in teacher's scores:
``verify`` proves each loss, ``train`` learns from them with 15 hard negatives a question."""

from __future__ import annotations

import json

import pytest

from dpr_cache.config import load_config
from dpr_cache.train import step as step_module
from dpr_cache.train import verify as verify_module
from tests.support.cli import run_cli, toy_overrides
from tests.support.teacher import write_scored_toy

LOSSES = {
    "distill_kl": ["train.loss=distill_kl", "train.teacher_temperature=2"],
    "distill_kl mixed": ["train.loss=distill_kl", "train.distill_weight=0.5"],
    "margin_mse mixed, tiled": [
        "train.loss=margin_mse",
        "train.distill_weight=0.3",
        "train.loss_tile_size=7",
        "train.hard_negatives=2",
    ],
}


@pytest.fixture(scope="module")
def scored(tmp_path_factory):
    return write_scored_toy(tmp_path_factory.mktemp("teacher") / "train.jsonl")


def sets(*items: str) -> list[str]:
    return [arg for item in items for arg in ("--set", item)]


@pytest.mark.parametrize("name", list(LOSSES))
def test_verify_proves_the_configured_loss(tmp_path, scored, name):
    args = toy_overrides(tmp_path, **{"data.train": scored, "train.chunk_size": 3})
    proc = run_cli(
        "verify", "--config", "configs/toy.yaml", *args, *sets(*LOSSES[name]), "--double"
    )
    loss_line = next(x for x in proc.stdout.splitlines() if x.strip().startswith("loss:"))
    assert name.split()[0] in loss_line
    line = next(x for x in proc.stdout.splitlines() if "max relative grad difference" in x)
    assert float(line.split(":")[1].split()[0]) < 1e-10
    assert "verdict: equal" in proc.stdout


def test_verify_calls_a_wrong_distillation_gradient_different(tmp_path, scored, monkeypatch):
    """Negative control: GradCache fed a shuffled teacher is over the bound and said so."""
    real = step_module.make_stepper

    class Shuffled:
        def __init__(self, stepper):
            self.stepper = stepper

        def step(self, q, p, teacher_scores, **kw):
            return self.stepper.step(q, p, teacher_scores=teacher_scores.flip(0), **kw)

    def skewed(mode, towers, loss_fn, **kwargs):
        stepper = real(mode, towers, loss_fn, **kwargs)
        return Shuffled(stepper) if mode == "gradcache" else stepper

    monkeypatch.setattr(step_module, "make_stepper", skewed)
    overrides = [a for a in toy_overrides(tmp_path, **{"data.train": scored}) if a != "--set"]
    config = load_config("configs/toy.yaml", overrides + ["train.loss=distill_kl"])
    report = verify_module.verify(config, double=True)
    assert report["verdict"].startswith("DIFFERENT")


def test_train_distills_with_fifteen_hard_negatives(tmp_path):
    """A short run with distill_kl mixed in, H = 15 drawn from 16 scored hard negatives."""
    scored = write_scored_toy(tmp_path / "scored.jsonl", extra=14)
    args = toy_overrides(
        tmp_path, **{"data.train": scored, "train.max_steps": 2, "train.batch_size": 8}
    )
    extra = sets("train.loss=distill_kl", "train.distill_weight=0.5", "train.hard_negatives=15")
    run_cli("train", "--config", "configs/toy.yaml", *args, *extra, "-q")
    log = [json.loads(x) for x in (tmp_path / "run" / "train_log.jsonl").read_text().splitlines()]
    steps = [x for x in log if "loss" in x]
    assert len(steps) == 2 and all(x["loss"] > 0 for x in steps)
    assert steps[0]["negatives_per_question"] == 8 * 16 - 1  # the contrastive half: in-batch
    resolved = load_config(tmp_path / "run" / "config.yaml")
    assert (resolved.train.loss, resolved.train.distill_weight) == ("distill_kl", 0.5)
    assert resolved.train.hard_negatives == 15


def test_distillation_alone_logs_its_own_group_as_the_negatives(tmp_path):
    """No in-batch scores are computed: each question is scored against its H hard negatives."""
    scored = write_scored_toy(tmp_path / "scored.jsonl", extra=1)
    keys = {"data.train": scored, "train.max_steps": 1, "train.batch_size": 4}
    extra = sets("train.loss=margin_mse", "train.hard_negatives=3")
    run_cli("train", "--config", "configs/toy.yaml", *toy_overrides(tmp_path, **keys), *extra, "-q")
    log = [json.loads(x) for x in (tmp_path / "run" / "train_log.jsonl").read_text().splitlines()]
    assert [x["negatives_per_question"] for x in log if "loss" in x] == [3]


def test_teacher_scores_too_large_for_the_loss_stop_the_run_in_one_line_naming_them(tmp_path):
    """Scores within float32's range but whose margins squared are not (1e30 times the
    stand-in's): margin_mse's loss is not finite at the first step, and the line points at the
    teacher's scores, not at fp16 (which would skip every step)."""
    scored = write_scored_toy(tmp_path / "scored.jsonl")
    records = [json.loads(x) for x in scored.read_text().splitlines()]
    for record in records:
        for key in ("positive_ctxs", "hard_negative_ctxs"):
            for ctx in record[key]:
                ctx["teacher_score"] = (1 + ctx["teacher_score"]) * 1e30
    scored.write_text("".join(json.dumps(r) + "\n" for r in records))
    args = toy_overrides(tmp_path, **{"data.train": scored, "train.max_steps": 2})
    loss = sets("train.loss=margin_mse")
    done = run_cli("train", "--config", "configs/toy.yaml", *args, *loss, "-q", check=False)
    assert done.returncode == 3 and "Traceback" not in done.stderr, done.stderr[-2000:]
    [line] = done.stderr.strip().splitlines()[-1:]
    assert line.startswith("error: train: the loss is not finite at step 1 "), line
    advice = "check the scale of data.train's teacher_score values, or lower train.lr"
    assert line.endswith(f"as it was: {advice}"), line
