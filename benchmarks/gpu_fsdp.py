"""The GPU suite's ``fsdp`` section (issue 58): FSDP2 on one GPU, in a process group of one (the
trainer's own ``shard_towers``; ``device_mesh`` makes the group of one without ``torchrun``).

- Exactness: a small random BERT in float64, the sharded GradCache gradient (``verify``'s
  ``sharded_step``, gathered whole) against the unsharded full batch (``compare_steps``), with
  the gradient sync once a step and once a chunk.
- Memory: one GradCache training step (bf16 autocast, FSDP's bf16 policy where sharded, AdamW's
  update included) of a random BERT-base-shaped model with separate towers, ``train.shard``
  none against fsdp: the peak (``torch.cuda.max_memory_allocated``) and the bytes the rank holds
  after it in parameters, gradients and AdamW's state (:func:`benchmarks.harness.held_bytes`).

With one GPU there is nothing to divide: the ratio fsdp / none measures FSDP's own overhead
(its gathered copies of a block, its bf16 copies, its communication buffers), not a division
across ranks; two GPUs were not available. The dry run (no CUDA) runs both parts on the CPU at
toy size (gloo), the peak then the process's RSS.
"""

from __future__ import annotations

import resource
import time
from dataclasses import asdict, dataclass

import torch

__all__ = ["FsdpPlan", "GPU_FSDP", "DRY_FSDP", "fsdp_figures"]


@dataclass(frozen=True)
class FsdpPlan:
    """The sizes of the section: the GPU's, or the dry run's."""

    exact_hidden: int  # the float64 BERT of the exactness case
    exact_layers: int
    exact_batch: int
    exact_chunk: int
    hidden: int  # the memory rows' BERT
    layers: int
    heads: int
    intermediate: int
    vocab: int
    batch: int
    chunk: int
    q_len: int
    p_len: int
    precision: str = "bf16"


GPU_FSDP = FsdpPlan(
    exact_hidden=64,
    exact_layers=2,
    exact_batch=16,
    exact_chunk=4,
    hidden=768,  # BERT-base's shape: 12 layers of 768, MLP 3,072, 30,522 words
    layers=12,
    heads=12,
    intermediate=3072,
    vocab=30522,
    batch=128,
    chunk=32,
    q_len=32,
    p_len=256,
)
DRY_FSDP = FsdpPlan(
    exact_hidden=32,
    exact_layers=2,
    exact_batch=8,
    exact_chunk=2,
    hidden=32,
    layers=2,
    heads=2,
    intermediate=64,
    vocab=97,
    batch=8,
    chunk=2,
    q_len=8,
    p_len=12,
)


def _bert(hidden: int, layers: int, heads: int, intermediate: int, vocab: int):
    from transformers import BertConfig

    return BertConfig(
        vocab_size=vocab,
        hidden_size=hidden,
        num_hidden_layers=layers,
        num_attention_heads=heads,
        intermediate_size=intermediate,
        max_position_embeddings=512,
        hidden_dropout_prob=0.0,
        attention_probs_dropout_prob=0.0,
    )


def _model(config, device: torch.device, dtype: torch.dtype):
    """A BiEncoder with separate towers (the passage tower moved off the query tower's start),
    the same weights at each call."""
    from dpr_cache.model.biencoder import BiEncoder

    torch.manual_seed(0)
    model = BiEncoder.from_config(config, shared=False, pooling="cls")
    with torch.no_grad():
        for param in model.passage_encoder.parameters():
            param.add_(0.02 * torch.randn_like(param))
    return model.to(device, dtype).train()


def _batch(vocab: int, n_q: int, q_len: int, p_len: int, device: torch.device):
    from dpr_cache.data.collate import Batch
    from dpr_cache.data.synthetic import synthetic_batch

    q, p, ids = synthetic_batch(None, vocab, n_q, 2 * n_q, q_len, p_len, seed=0)
    return Batch(q, p, ids, n_q, 2).to(device)


def exactness(plan: FsdpPlan, device: torch.device) -> dict:
    """The float64 gap of the sharded GradCache gradient to the unsharded full batch, with the
    sync once a step and once a chunk."""
    from dpr_cache.config import Config
    from dpr_cache.runtime.distributed import DistEnv
    from dpr_cache.train.step import Chunking
    from dpr_cache.train.verify import BOUNDS, compare_steps, sharded_step

    config = _bert(plan.exact_hidden, plan.exact_layers, 2, 2 * plan.exact_hidden, 97)
    batch = _batch(97, plan.exact_batch, 12, 16, device)
    train = {"temperature": 0.5, "hard_negatives": 1, "chunk_size": plan.exact_chunk}
    run = Config.model_validate({"train": train})
    chunking = Chunking(plan.exact_chunk)
    model = _model(config, device, torch.float64)
    _, full = compare_steps(run, model, batch, chunking=chunking, modes=("full",))["full"]
    scale = max(g.abs().max().item() for g in full.values())
    rows = []
    for sync in ("step", "chunk"):
        start = time.monotonic()
        twin = _model(config, device, torch.float64)
        env = DistEnv(device=device)
        synced = run.model_copy(update={"train": run.train.model_copy(update={"shard_sync": sync})})
        _, cached = sharded_step(synced, twin, batch, env, chunking=chunking)
        gap = max((cached[n] - full[n]).abs().max().item() for n in full) / scale
        rows.append(
            {
                "sync": sync,
                "relative_error": gap,
                "bound": BOUNDS["float64"],
                "ok": gap <= BOUNDS["float64"] and cached.keys() == full.keys(),
                "seconds": round(time.monotonic() - start, 2),
            }
        )
    return {
        "batch": plan.exact_batch,
        "chunk": plan.exact_chunk,
        "hidden": plan.exact_hidden,
        "layers": plan.exact_layers,
        "rows": rows,
    }


def _peak(device: torch.device) -> int:
    if device.type == "cuda":
        return torch.cuda.max_memory_allocated(device)
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024


def memory_row(plan: FsdpPlan, device: torch.device, shard: str) -> dict:
    """One GradCache step and one AdamW update of the memory rows' BERT under ``shard``: the
    peak, the memory held before and after, and the bytes of parameters, gradients and AdamW's
    state."""
    from benchmarks.gpu_perf import free_device
    from benchmarks.harness import held_bytes
    from dpr_cache.core.loss import InfoNCE
    from dpr_cache.core.objective import Objective, make_loss_fn
    from dpr_cache.core.steppers import Towers, make_stepper
    from dpr_cache.model.fsdp import shard_towers
    from dpr_cache.runtime.device import autocast
    from dpr_cache.runtime.distributed import DistEnv
    from dpr_cache.runtime.memory import trim

    free_device(device)
    config = _bert(plan.hidden, plan.layers, plan.heads, plan.intermediate, plan.vocab)
    model = _model(config, device, torch.float32)
    if shard == "fsdp":
        env = DistEnv(device=device)
        towers = shard_towers(model, env, precision=plan.precision, sync="step")
    else:
        towers = Towers(model.encode_query, model.encode_passage)
    loss_fn = make_loss_fn(Objective(2, InfoNCE(0.05)))
    stepper = make_stepper("gradcache", towers, loss_fn, chunk_size=plan.chunk, release_memory=trim)
    optimizer = torch.optim.AdamW([p for p in model.parameters() if p.requires_grad], lr=1e-5)
    batch = _batch(plan.vocab, plan.batch, plan.q_len, plan.p_len, device)
    if device.type == "cuda":
        torch.cuda.synchronize(device)
        torch.cuda.reset_peak_memory_stats(device)
    before = torch.cuda.memory_allocated(device) if device.type == "cuda" else None
    start = time.monotonic()
    optimizer.zero_grad(set_to_none=True)
    with autocast(device, plan.precision):
        stepper.step(batch.q_inputs, batch.p_inputs, **batch.loss_inputs())
    optimizer.step()
    if device.type == "cuda":
        torch.cuda.synchronize(device)
    row = {
        "shard": shard,
        "seconds": round(time.monotonic() - start, 2),
        "peak_bytes": _peak(device),
        "resident_before": before,
        "resident_after": torch.cuda.memory_allocated(device) if device.type == "cuda" else None,
        **held_bytes(model, optimizer),
    }
    row["held"] = row["parameters"] + row["gradients"] + row["optimizer_state"]
    del model, optimizer, stepper, towers, batch
    free_device(device)
    return row


def fsdp_figures(plan: FsdpPlan, device: torch.device, into: dict) -> dict:
    """The section's figures, put into ``into`` as they are measured. The process group of one
    that sharding joins is left again at the end where the section made it."""
    from dpr_cache.runtime import distributed

    ours = not distributed.joined()
    into["plan"] = asdict(plan)
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
