"""The ``fsdp`` section (issue 58): FSDP2 in a process group of one: the sharded GradCache
gradient's float64 gap to the full batch, and a BERT-base step's peak and bytes held under
``train.shard`` none and fsdp (fsdp / none: FSDP's own overhead). The dry run: the CPU, gloo."""

from __future__ import annotations

import time
from collections import namedtuple

import torch

from benchmarks.gpu.exact import Shape, make_model, max_relative_error
from benchmarks.gpu.perf import free_device, synthetic_pairs

# the exactness case's float64 BERT and batch, then the memory rows' (on a GPU BERT-base's shape)
_FIELDS = "exact_hidden exact_layers exact_batch exact_chunk hidden layers heads intermediate vocab"
FsdpPlan = namedtuple("FsdpPlan", f"{_FIELDS} batch chunk q_len p_len precision")
GPU_FSDP = FsdpPlan(64, 2, 16, 4, 768, 12, 12, 3072, 30522, 128, 32, 32, 256, "bf16")
DRY_FSDP = FsdpPlan(32, 2, 8, 2, 32, 2, 2, 64, 97, 8, 2, 8, 12, "bf16")


def _model(device: torch.device, dtype: torch.dtype, hidden, layers, heads, intermediate, vocab):
    """A BiEncoder with separate towers, the same weights at each call."""
    shape = Shape(hidden, layers, heads, vocab, q_len=32, p_len=512, intermediate=intermediate)
    return make_model(shape, device, dtype)


def exactness(plan: FsdpPlan, device: torch.device) -> dict:
    """The sharded GradCache gradient's float64 gap to the full batch, each sync."""
    from dpr_cache.config import Config
    from dpr_cache.runtime.distributed import DistEnv
    from dpr_cache.train.step import Chunking
    from dpr_cache.train.verify import BOUNDS, compare_steps, sharded_step

    shape = (plan.exact_hidden, plan.exact_layers, 2, 2 * plan.exact_hidden, 97)
    batch = synthetic_pairs(97, plan.exact_batch, 12, 16).to(device)
    train = {"temperature": 0.5, "hard_negatives": 1, "chunk_size": plan.exact_chunk}
    run, chunking = Config.model_validate({"train": train}), Chunking(plan.exact_chunk)
    model = _model(device, torch.float64, *shape)
    _, full = compare_steps(run, model, batch, chunking=chunking, modes=("full",))["full"]
    bound, rows = BOUNDS["float64"], []
    for sync in ("step", "chunk"):
        start = time.monotonic()
        twin, env = _model(device, torch.float64, *shape), DistEnv(device=device)
        synced = run.model_copy(update={"train": run.train.model_copy(update={"shard_sync": sync})})
        _, cached = sharded_step(synced, twin, batch, env, chunking=chunking)
        gap = max_relative_error(cached, full)  # inf where the parameters differ
        row = {"sync": sync, "relative_error": gap, "bound": bound, "ok": gap <= bound}
        rows.append(row | {"seconds": round(time.monotonic() - start, 2)})
    sizes = {"batch": plan.exact_batch, "chunk": plan.exact_chunk, "hidden": plan.exact_hidden}
    return sizes | {"layers": plan.exact_layers, "rows": rows}


def memory_row(plan: FsdpPlan, device: torch.device, shard: str) -> dict:
    """One GradCache step and AdamW update under ``shard``: the peak and the bytes held."""
    from benchmarks.harness import held_bytes
    from dpr_cache.core.loss import InfoNCE
    from dpr_cache.core.objective import Objective, make_loss_fn
    from dpr_cache.core.steppers import Towers, make_stepper
    from dpr_cache.model.fsdp import shard_towers
    from dpr_cache.runtime.device import autocast
    from dpr_cache.runtime.distributed import DistEnv
    from dpr_cache.runtime.memory import peak_memory_bytes, trim

    free_device(device)
    shape = (plan.hidden, plan.layers, plan.heads, plan.intermediate, plan.vocab)
    model = _model(device, torch.float32, *shape)
    if shard == "fsdp":
        towers = shard_towers(model, DistEnv(device=device), precision=plan.precision, sync="step")
    else:
        towers = Towers(model.encode_query, model.encode_passage)
    loss_fn = make_loss_fn(Objective(2, InfoNCE(0.05)))
    stepper = make_stepper("gradcache", towers, loss_fn, chunk_size=plan.chunk, release_memory=trim)
    optimizer = torch.optim.AdamW([p for p in model.parameters() if p.requires_grad], lr=1e-5)
    batch = synthetic_pairs(plan.vocab, plan.batch, plan.q_len, plan.p_len).to(device)
    free_device(device)  # the peak from here
    before = torch.cuda.memory_allocated(device) if device.type == "cuda" else None
    start = time.monotonic()
    optimizer.zero_grad(set_to_none=True)
    with autocast(device, plan.precision):
        stepper.step(batch.q_inputs, batch.p_inputs, **batch.loss_inputs())
    optimizer.step()
    if device.type == "cuda":
        torch.cuda.synchronize(device)
    after = torch.cuda.memory_allocated(device) if device.type == "cuda" else None
    peak = peak_memory_bytes(device)
    row = {"shard": shard, "seconds": round(time.monotonic() - start, 2), "peak_bytes": peak}
    row |= {"resident_before": before, "resident_after": after, **held_bytes(model, optimizer)}
    row["held"] = row["parameters"] + row["gradients"] + row["optimizer_state"]
    del model, optimizer, stepper, towers, batch
    free_device(device)
    return row


def fsdp_figures(plan: FsdpPlan, device: torch.device, into: dict) -> dict:
    """The section's figures into ``into`` as measured; a process group it made left again."""
    from dpr_cache.runtime import distributed

    ours = not distributed.joined()
    into["plan"] = plan._asdict()
    into["devices"] = torch.cuda.device_count() if device.type == "cuda" else 0
    try:
        into["exactness"] = exactness(plan, device)
        print(f"  fsdp exactness: {into['exactness']['rows']}", flush=True)
        into["memory"] = []
        for shard in ("none", "fsdp"):
            into["memory"].append(memory_row(plan, device, shard))
            print(f"  fsdp memory {shard}: {into['memory'][-1]['peak_bytes']:,}", flush=True)
    finally:
        if ours:
            distributed.teardown()
    return into
