"""Checkpoints restore every state a step depends on; the optimizer groups and the schedule are
DPR's."""

from __future__ import annotations

import random

import numpy as np
import pytest
import torch

from dpr_cache.errors import InputError
from dpr_cache.model.biencoder import BiEncoder
from dpr_cache.runtime.distributed import DistEnv, all_mean
from dpr_cache.train.checkpoint import (
    FORMAT,
    STATE_FILE,
    latest_checkpoint,
    load_checkpoint,
    save_checkpoint,
    seed_resumed_rank,
)
from dpr_cache.train.recipe import flat_softmax_warning, linear_warmup_decay, param_groups
from tests.support.fixtures import bert_config


def _trainer(seed: int = 0):
    torch.manual_seed(seed)
    model = BiEncoder.from_config(bert_config())
    optimizer = torch.optim.AdamW(param_groups(model, 0.01), lr=1e-3)
    scheduler = torch.optim.lr_scheduler.LambdaLR(optimizer, linear_warmup_decay(2, 10))
    return model, optimizer, scheduler


def _one_step(model, optimizer, scheduler) -> None:
    ids = torch.randint(5, 97, (4, 6))
    loss = model.encode_query({"input_ids": ids, "attention_mask": torch.ones_like(ids)}).sum()
    loss.backward()
    optimizer.step()
    scheduler.step()
    optimizer.zero_grad()


def _draws() -> tuple:
    return random.random(), float(np.random.rand()), float(torch.rand(1))


def test_save_then_load_resumes_the_same_stream(tmp_path) -> None:
    """Two more steps after a reload equal two more steps of the run that saved, RNG included."""
    model, optimizer, scheduler = _trainer()
    _one_step(model, optimizer, scheduler)
    path = save_checkpoint(tmp_path, 1, model, optimizer, scheduler, None, DistEnv(), keep=2)
    assert latest_checkpoint(tmp_path) == path
    draws = _draws()
    _one_step(model, optimizer, scheduler)
    want = {k: v.clone() for k, v in model.state_dict().items()}

    fresh, fresh_opt, fresh_sched = _trainer(seed=7)  # other weights, other RNG
    assert load_checkpoint(path, fresh, fresh_opt, fresh_sched, None, DistEnv(), seed=0) == 1
    assert _draws() == draws
    _one_step(fresh, fresh_opt, fresh_sched)
    got = fresh.state_dict()
    assert all(torch.equal(got[k], want[k]) for k in want)
    assert fresh_sched.get_last_lr() == scheduler.get_last_lr()


def test_cuda_rng_states_are_restored_as_cpu_byte_tensors_whatever_the_device(
    tmp_path, monkeypatch
) -> None:
    """``torch.cuda.set_rng_state_all`` takes CPU byte tensors only: a checkpoint resumed on a
    device other than the CPU (here ``meta`` stands in for the GPU) hands it the saved states
    as saved, and the weights and moments arrive on the parameters' device."""
    saved_state = torch.arange(16, dtype=torch.uint8)
    restored: list[torch.Tensor] = []
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "get_rng_state_all", lambda: [saved_state.clone()])
    monkeypatch.setattr(torch.cuda, "set_rng_state_all", restored.extend)
    model, optimizer, scheduler = _trainer()
    _one_step(model, optimizer, scheduler)
    path = save_checkpoint(tmp_path, 1, model, optimizer, scheduler, None, DistEnv(), keep=2)

    fresh, fresh_opt, fresh_sched = _trainer(seed=7)
    env = DistEnv(device=torch.device("meta"))
    assert load_checkpoint(path, fresh, fresh_opt, fresh_sched, None, env, seed=0) == 1
    assert [(t.device.type, t.dtype) for t in restored] == [("cpu", torch.uint8)]
    assert torch.equal(restored[0], saved_state)
    weights = model.state_dict()
    assert all(torch.equal(t, weights[k]) for k, t in fresh.state_dict().items())
    moments = [s["exp_avg"] for s in fresh_opt.state.values()]
    assert moments and all(m.device.type == "cpu" for m in moments)


def test_old_checkpoints_are_pruned_and_another_world_size_seeds_afresh(tmp_path) -> None:
    """On another world size the weights load and each rank's streams are seeded from
    (seed, step, rank): its saved streams do not line up with the new ranks'."""
    model, optimizer, scheduler = _trainer()
    _one_step(model, optimizer, scheduler)
    for step in (1, 2, 3):
        save_checkpoint(tmp_path, step, model, optimizer, scheduler, None, DistEnv(), keep=2)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["step-00000002", "step-00000003"]
    want = {k: v.clone() for k, v in model.state_dict().items()}
    seed_resumed_rank(5, 3, 1)
    fresh_draws = _draws()
    fresh, fresh_opt, fresh_sched = _trainer(seed=7)
    env = DistEnv(rank=1, world_size=2)
    assert (
        load_checkpoint(
            tmp_path / "step-00000003", fresh, fresh_opt, fresh_sched, None, env, seed=5
        )
        == 3
    )
    assert _draws() == fresh_draws
    assert all(torch.equal(t, want[k]) for k, t in fresh.state_dict().items())
    seed_resumed_rank(5, 3, 0)  # the control: another rank draws otherwise
    assert _draws() != fresh_draws


def test_a_checkpoint_of_another_layout_or_epoch_order_is_refused(tmp_path) -> None:
    """A checkpoint of another format, or whose batches were drawn another way, would resume into
    other weights or other batches: a one-line error each; the current one loads."""
    model, optimizer, scheduler = _trainer()
    path = save_checkpoint(tmp_path, 1, model, optimizer, scheduler, None, DistEnv(), keep=2)
    assert load_checkpoint(path, model, optimizer, scheduler, None, DistEnv(), seed=0) == 1
    state = torch.load(path / STATE_FILE, weights_only=False)
    for key, value, message in (
        ("format", None, rf"format None, this one reads {FORMAT}\)"),
        ("format", 1, "a checkpoint of another dpr-cache version"),
        ("epoch_order", "seed + epoch", r"draws batch orders as seed \+ epoch, this dpr-cache"),
        ("negative_draw", "per step", "draws hard negatives as per step, this dpr-cache"),
    ):
        torch.save({**state, key: value}, path / STATE_FILE)
        with pytest.raises(InputError, match=message):
            load_checkpoint(path, model, optimizer, scheduler, None, DistEnv(), seed=0)
    older = {k: v for k, v in state.items() if k != "negative_draw"}  # drew a step's own
    torch.save(older, path / STATE_FILE)
    with pytest.raises(InputError, match=r"hard negatives as stream_entropy\(seed, step, q"):
        load_checkpoint(path, model, optimizer, scheduler, None, DistEnv(), seed=0)


def test_a_checkpoint_of_another_model_is_refused(tmp_path) -> None:
    """Any missing weight (the frozen pooler too) or unexpected one is a one-line error."""
    model, optimizer, scheduler = _trainer()
    path = save_checkpoint(tmp_path, 1, model, optimizer, scheduler, None, DistEnv(), keep=2)
    state = torch.load(path / STATE_FILE, weights_only=False)
    assert any(".pooler." in k for k in state["model"])
    fresh, fresh_opt, fresh_sched = _trainer(seed=7)
    for drop in (".pooler.", "encoder.layer.0.attention.self.query.weight"):
        kept = {k: v for k, v in state["model"].items() if drop not in k}
        torch.save({**state, "model": kept}, path / STATE_FILE)
        with pytest.raises(InputError, match="weights missing"):
            load_checkpoint(path, fresh, fresh_opt, fresh_sched, None, DistEnv(), seed=0)
    extra = {**state["model"], "query_encoder.extra.weight": torch.zeros(1)}
    torch.save({**state, "model": extra}, path / STATE_FILE)
    with pytest.raises(InputError, match="1 unexpected"):
        load_checkpoint(path, fresh, fresh_opt, fresh_sched, None, DistEnv(), seed=0)


def test_no_decay_on_biases_and_layer_norms() -> None:
    model = BiEncoder.from_config(bert_config(), shared=True)
    decay, no_decay = param_groups(model, 0.1)
    names = {id(p): n for n, p in model.named_parameters()}
    assert decay["weight_decay"] == 0.1 and no_decay["weight_decay"] == 0.0
    assert all(
        names[id(p)].endswith("bias") or "LayerNorm" in names[id(p)] for p in no_decay["params"]
    )
    assert all(p.dim() == 2 for p in decay["params"])  # weights of linear layers and embeddings
    total = len(decay["params"]) + len(no_decay["params"])
    trainable = {id(p) for p in model.parameters() if p.requires_grad}  # the pooler is frozen
    assert total == len(trainable)  # each once, shared towers too


def test_schedule_warms_up_then_decays_to_zero() -> None:
    factor = linear_warmup_decay(warmup=4, total=12)
    assert [factor(s) for s in range(4)] == [0.25, 0.5, 0.75, 1.0]
    assert [round(factor(s), 3) for s in (4, 8, 12, 20)] == [1.0, 0.5, 0.0, 0.0]
    assert linear_warmup_decay(0, 4)(0) == 1.0


def test_all_mean_on_one_process_is_the_value() -> None:
    assert all_mean(torch.tensor(2.5, dtype=torch.bfloat16), DistEnv()) == 2.5


def test_unit_length_vectors_at_temperature_one_are_warned_about() -> None:
    assert "nearly flat" in flat_softmax_warning(normalize=True, temperature=1.0)
    assert flat_softmax_warning(normalize=True, temperature=0.05) is None  # cosine, scale 20
    assert flat_softmax_warning(normalize=False, temperature=1.0) is None  # DPR's dot products
