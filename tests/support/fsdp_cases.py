"""Per-rank worker of the sharded (FSDP2) tests, and the single-process reference they compare with.

Every case builds the same float64 model on every rank (a tiny BERT, or the tiny Llama with LoRA
adapters and last-token pooling), shards its towers with the trainer's own ``shard_towers``, and
runs :data:`STEPS` AdamW updates of GradCache (or the full batch) on this rank's slice of a global
batch of :data:`N_Q` questions. It saves the first step's gradient and the weights after the last
step, each gathered whole. The reference is one process, unsharded, the whole batch, the full-batch
step and the same optimizer.
"""

from __future__ import annotations

import functools
from pathlib import Path
from typing import Any

import torch
from torch import Tensor

from dpr_cache.core.objective import make_loss_fn
from dpr_cache.core.steppers import Towers, make_stepper
from dpr_cache.model.biencoder import BiEncoder
from dpr_cache.model.fsdp import full_value, shard_towers
from dpr_cache.runtime import distributed
from dpr_cache.runtime.atomic import write_atomic
from dpr_cache.runtime.distributed import DistEnv
from dpr_cache.runtime.memory import trim
from tests.support.distributed_cases import (
    loss_inputs,
    naive_loss_fn,
    objective,
    rank_loss_inputs,
)
from tests.support.distributed_cases import make_model as bert_model
from tests.support.fixtures import random_inputs
from tests.support.ranks import join

N_Q = 6  # global questions: 3 a rank at 2 ranks (chunk 2 leaves 2 + 1), 2 a rank at 3
GROUP = 2  # a positive and one hard negative
CHUNK = 2
TEMPERATURE = 0.5
STEPS = 3
LR = 1e-3
# Adam divides by sqrt(v) + eps: a gradient that is zero but for rounding (BERT's last LayerNorm
# bias under mean pooling: the loss is blind to a shift of every passage alike) is its rounding
# noise over eps, ~1e-17 / eps a step. At DPR's eps 1e-8 that noise moves the weights ~2e-10
# apart after three steps with gradients equal to 2e-15; at 1e-6 it stays under 1e-11.
ADAM_EPS = 1e-6


def make_model(case: dict[str, Any]) -> BiEncoder:
    """The case's float64 model, the same on every rank (separate towers start different)."""
    shared, checkpointing = case.get("shared", False), case.get("checkpointing", False)
    if case.get("decoder"):
        from tests.support.llm import decoder_model, lora_settings

        model = decoder_model(
            "llama", lora=lora_settings(), shared=shared, checkpointing=checkpointing
        )
        return model.double().train()
    return bert_model(shared, checkpointing, case.get("multi", False))


def global_batch(case: dict[str, Any], model: BiEncoder, step: int) -> tuple[dict, dict, Tensor]:
    """The global batch of ``step``: random token ids for BERT, toy texts for the decoder."""
    if case.get("decoder"):
        from tests.support.llm import toy_batch

        q_inputs, p_inputs, p_ids = toy_batch(model.tokenizer, N_Q, GROUP - 1)
        return q_inputs, p_inputs, p_ids
    q_inputs = random_inputs(N_Q, 9, seed=10 + step)
    p_inputs = random_inputs(N_Q * GROUP, 12, seed=20 + step)
    return q_inputs, p_inputs, torch.arange(N_Q * GROUP) + 100


def rank_rows(inputs: dict, rank: int, world: int) -> dict:
    rows = next(iter(inputs.values())).shape[0] // world
    return {k: v[rank * rows : (rank + 1) * rows] for k, v in inputs.items()}


def float64_decoders() -> None:
    """The decoders' RMSNorm in float64 for float64 inputs (as ``tests.support.llm``'s
    ``float64_norms`` makes it under pytest's monkeypatch), in a spawned worker."""
    from transformers.models.llama.modeling_llama import LlamaRMSNorm

    from tests.support.llm import _rms_norm

    LlamaRMSNorm.forward = _rms_norm(LlamaRMSNorm.forward)


def optimizer_of(model: BiEncoder) -> torch.optim.Optimizer:
    trainable = [p for p in model.parameters() if p.requires_grad]
    return torch.optim.AdamW(trainable, lr=LR, eps=ADAM_EPS)


def whole(named) -> dict[str, Tensor]:
    """Each named tensor gathered whole (a collective for sharded ones)."""
    return {name: full_value(t).detach().clone() for name, t in named}


def stepper_of(case: dict[str, Any], model: BiEncoder, env: DistEnv, sharded: bool = True):
    """The case's GradCache (or full-batch) step on this rank's towers: sharded, or whole on
    one process."""
    if not sharded:
        assert env.world_size == 1, "unsharded towers run on one process here"
        towers = Towers(model.encode_query, model.encode_passage)
    else:
        towers = shard_towers(model, env, precision="fp32", sync=case.get("sync", "step"))
    if case.get("never_sync"):  # the control: every backward holds the sync back
        held = towers.no_sync if isinstance(towers.no_sync, tuple) else (towers.no_sync,) * 2
        towers = Towers(towers.encode_q, towers.encode_p, no_sync=held, wrappers=towers.wrappers)
    if case.get("naive"):
        loss_fn = naive_loss_fn(env, None)
    else:
        loss_fn = make_loss_fn(objective(case), rank=env.rank, world_size=env.world_size)
    stepper = make_stepper(case["mode"], towers, loss_fn, chunk_size=CHUNK, release_memory=trim)
    if case.get("never_sync"):
        stepper._sync_context = lambda is_query, last_of_tower, last_overall: towers.no_sync[
            0 if is_query else 1
        ]()
    return stepper


def run_steps(case, model, stepper, optimizer, env: DistEnv, steps: range, out: dict) -> None:
    """The global batches of ``steps``, this rank's slice of each: the losses (mean over the
    ranks) into ``out``, and the first step's gradient gathered whole."""
    out.setdefault("losses", [])
    for step in steps:
        q_inputs, p_inputs, p_ids = global_batch(case, model, step)
        optimizer.zero_grad(set_to_none=True)
        extra = rank_loss_inputs(loss_inputs(case, step, N_Q), env.rank, env.world_size)
        loss = stepper.step(
            rank_rows(q_inputs, env.rank, env.world_size),
            rank_rows(p_inputs, env.rank, env.world_size),
            p_ids=rank_rows({"ids": p_ids}, env.rank, env.world_size)["ids"],
            **extra,
        )
        out["losses"].append(distributed.all_mean(loss, env))
        if step == 0:
            out["grads"] = {
                n: full_value(p.grad).clone() if p.grad is not None else None
                for n, p in model.named_parameters()
                if p.requires_grad
            }
        optimizer.step()


def run_case(case: dict[str, Any], env: DistEnv) -> dict[str, Any]:
    model = make_model(case)
    stepper = stepper_of(case, model, env)
    optimizer = optimizer_of(model)
    out: dict[str, Any] = {}
    run_steps(case, model, stepper, optimizer, env, range(STEPS), out)
    out["weights"] = whole((n, p) for n, p in model.named_parameters() if p.requires_grad)
    return out


CUT = 1  # the steps a resumed case runs before its checkpoint


def resume_phase(case: dict[str, Any], env: DistEnv, phase: str, folder: Path) -> dict | None:
    """One half of a run cut at step :data:`CUT` (``case["sharded"]``: whether this half's
    towers are sharded): ``first`` runs the steps before it and saves the trainer's checkpoint
    into ``folder``; ``rest`` loads that checkpoint with the trainer's loader and runs the steps
    after it, returning the weights gathered whole."""
    from dpr_cache.train.checkpoint import load_checkpoint, save_checkpoint

    model = make_model(case)
    stepper = stepper_of(case, model, env, sharded=case[f"{phase}_sharded"])
    optimizer = optimizer_of(model)
    scheduler = torch.optim.lr_scheduler.LambdaLR(optimizer, lambda _: 1.0)
    if phase == "first":
        run_steps(case, model, stepper, optimizer, env, range(CUT), {})
        save_checkpoint(folder, CUT, model, optimizer, scheduler, None, env, keep=1)
        return None
    done = load_checkpoint(
        folder / f"step-{CUT:08d}", model, optimizer, scheduler, None, env, seed=0
    )
    assert done == CUT
    run_steps(case, model, stepper, optimizer, env, range(CUT, STEPS), {})
    return {"weights": whole((n, p) for n, p in model.named_parameters() if p.requires_grad)}


def reference(case: dict[str, Any]) -> dict[str, Any]:
    """One process, unsharded, the whole batch, the full-batch step: the same record."""
    model = make_model(case)
    loss_fn = make_loss_fn(objective(case))
    stepper = make_stepper(
        "full", Towers(model.encode_query, model.encode_passage), loss_fn, chunk_size=N_Q
    )
    optimizer = optimizer_of(model)
    out: dict[str, Any] = {"losses": []}
    for step in range(STEPS):
        q_inputs, p_inputs, p_ids = global_batch(case, model, step)
        optimizer.zero_grad(set_to_none=True)
        extra = loss_inputs(case, step, N_Q)
        out["losses"].append(float(stepper.step(q_inputs, p_inputs, p_ids=p_ids, **extra)))
        if step == 0:
            out["grads"] = {
                n: p.grad.clone() for n, p in model.named_parameters() if p.requires_grad
            }
        optimizer.step()
    out["weights"] = whole((n, p) for n, p in model.named_parameters() if p.requires_grad)
    return out


def main(rank: int, world: int, port: int, out_dir: str, cases: list[dict[str, Any]]) -> None:
    """Entry point for ``torch.multiprocessing.spawn``: run every case, rank 0 saves one file
    each. A case with a ``phase`` is one half of a resumed run (:func:`resume_phase`), its
    checkpoint in ``out_dir/<name>``."""
    env = join(rank, world, port)
    float64_decoders()
    try:
        for case in cases:
            try:
                if "phase" in case:
                    folder = Path(out_dir) / case["name"]
                    result = resume_phase(case, env, case["phase"], folder)
                else:
                    result = run_case(case, env)
            except Exception as exc:  # reported by the test
                result = {"error": f"{type(exc).__name__}: {exc}"}
            if env.is_main and result is not None:
                name = f"{case['name']}-{case['phase']}" if "phase" in case else case["name"]
                write_atomic(Path(out_dir) / f"{name}.pt", functools.partial(torch.save, result))
    finally:
        distributed.teardown()
