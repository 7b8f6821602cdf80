"""``train.chunk_size: auto``: the largest chunk whose training step fits ``train.memory_budget``.

GradCache's peak is one question chunk and one passage chunk encoded with their graphs and
backpropagated (the kept last chunks), plus what scales with the whole batch (representations,
their gradients, the loss) and AdamW's two moments. A short probe measures the first, a
forward and backward of ``chunk`` questions and ``p_chunk_size or chunk`` passages at the
configured maximum lengths: on CUDA in this process (``torch.cuda.max_memory_allocated``), on
CPU in a fresh process per candidate (its peak resident set, ``ru_maxrss``, so the figure
includes the interpreter, the libraries and the model, as training will). The rest is added from
the sizes. Candidates are the powers of two below the local batch and the local batch itself,
searched by bisection (the peak grows with the chunk). The choice and every probe are printed
and written to ``output_dir/chunk_choice.json``.
"""

from __future__ import annotations

import json
import sys
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import torch

from dpr_cache.config import LoraConfig, ModelConfig, TrainConfig
from dpr_cache.core.similarity import TOKEN_BLOCK_ELEMENTS
from dpr_cache.errors import InputError
from dpr_cache.model.biencoder import BiEncoder
from dpr_cache.runtime.atomic import write_json_atomic
from dpr_cache.runtime.device import autocast
from dpr_cache.runtime.distributed import DistEnv, rank0_says
from dpr_cache.runtime.memory import peak_memory_bytes
from dpr_cache.runtime.processes import ChildFailed, run_json_child

__all__ = [
    "ProbeSpec",
    "BatchShape",
    "pick_chunk_size",
    "candidate_chunks",
    "batch_extras_bytes",
    "SAFETY_MARGIN",
]

SAFETY_MARGIN = 0.10
"""Fraction of the budget kept free for what the probe does not see (allocator slack, data)."""

CHOICE_FILE = "chunk_choice.json"


def candidate_chunks(local_batch: int) -> list[int]:
    """1, 2, 4, ... below ``local_batch``, then ``local_batch``."""
    sizes, c = [], 1
    while c < local_batch:
        sizes.append(c)
        c *= 2
    return sizes + [local_batch]


@dataclass(frozen=True)
class ProbeSpec:
    """What one chunk's forward and backward depends on: the ``model`` section (the model, its
    towers, pooling, dropout, checkpointing, lengths, dtype, attention and LoRA adapters) and the
    ``train`` section (passages per chunk, threads, and the precision the CUDA probe runs under;
    the CPU probe runs in fp32)."""

    model: ModelConfig
    train: TrainConfig

    def payload(self, chunk: int) -> dict:
        """The child's arguments for a question chunk of ``chunk`` rows."""
        m, t = self.model, self.train
        return {
            "model": m.name_or_path,
            "shared": m.shared,
            "pooling": m.pooling,
            "dropout": m.dropout,
            "checkpointing": m.gradient_checkpointing,
            "dtype": m.dtype,
            "attn_implementation": m.attn_implementation,
            "lora": m.lora.model_dump() if m.lora is not None else None,
            "vectors": m.vectors,
            "multi_dim": m.multi_dim,
            "q_len": m.max_query_length,
            "p_len": m.max_passage_length,
            "threads": t.num_threads,
            "precision": t.precision,
            "q_rows": chunk,
            "p_rows": t.p_chunk_size or chunk,
        }


@dataclass(frozen=True)
class BatchShape:
    """What scales with the whole batch rather than the chunk."""

    batch_size: int  # global questions per step
    hard_negatives: int = 0
    loss_tile_size: int | None = None
    # a question's and a passage's tokens at most (model.max_query_length and
    # max_passage_length; None: the model's own): what a multi-vector model's cache holds
    lengths: tuple[int, int] | None = None


def batch_extras_bytes(model: BiEncoder, shape: BatchShape, local_batch: int) -> int:
    """Memory the chunk probe does not hold: AdamW moments, reps and their grads, the loss (a
    multi-vector model's: every token vector, and the tiled loss's block)."""
    n_params = sum(p.numel() for p in model.parameters())
    optimizer = 2 * 4 * n_params
    n_p = local_batch * (1 + shape.hard_negatives)
    if model.multi is not None:  # token vectors; the loss's one block of token scores
        q_len, p_len = shape.lengths or (model.max_query_length or 0, model.max_passage_length or 0)
        reps = 3 * 4 * (local_batch * q_len + n_p * p_len) * model.dim
        return optimizer + reps + 3 * 4 * TOKEN_BLOCK_ELEMENTS
    reps = 3 * 4 * (local_batch + n_p) * model.dim  # reps, cache leaf and its gradient
    if shape.loss_tile_size:
        loss = 3 * 4 * shape.loss_tile_size * shape.loss_tile_size
    else:
        loss = 3 * 4 * local_batch * n_p * max(1, (shape.batch_size // local_batch))
    return optimizer + reps + loss


def _chunk_step(model: BiEncoder, payload: dict, device: torch.device) -> None:
    """Forward and backward of one question chunk and one passage chunk, both with graphs."""
    from dpr_cache.core.loss import contrastive_loss
    from dpr_cache.data.synthetic import synthetic_batch

    vocab = int(model.query_encoder.config.vocab_size)
    q, p, _ = synthetic_batch(
        model.tokenizer,
        vocab,
        payload["q_rows"],
        payload["p_rows"],
        payload["q_len"],
        payload["p_len"],
        seed=0,
    )
    q = {k: v.to(device) for k, v in q.items()}
    p = {k: v.to(device) for k, v in p.items()}
    q_reps, p_reps = model.encode_query(q), model.encode_passage(p)
    n = min(len(q_reps), len(p_reps))  # the loss only needs to reach both graphs
    contrastive_loss(q_reps[:n], p_reps[:n]).backward()


def probe_cpu(payload: dict) -> int:
    """Peak RSS of a fresh process that loads the model and runs one chunk step."""
    try:
        return int(run_json_child("dpr_cache.train.autochunk", [json.dumps(payload)])["peak_bytes"])
    except ChildFailed as e:
        chunk = payload["q_rows"]
        raise InputError(
            f"train.chunk_size auto: probe of chunk {chunk} failed: {e.tail}"
        ) from None


OUT_OF_MEMORY = 2**62
"""What a CUDA probe that ran out of memory reports: more than any budget."""


def _probe_cuda(model: BiEncoder, payload: dict) -> int:
    """Peak allocated memory of one chunk step on the model's GPU (OUT_OF_MEMORY when the
    step does not fit at all)."""
    device = model.device
    model.zero_grad(set_to_none=True)
    torch.cuda.empty_cache()
    torch.cuda.reset_peak_memory_stats(device)
    try:
        with autocast(device, payload["precision"]):
            _chunk_step(model, payload, device)
        peak = peak_memory_bytes(device)
    except torch.OutOfMemoryError:
        peak = OUT_OF_MEMORY
    model.zero_grad(set_to_none=True)
    torch.cuda.empty_cache()
    return peak


def largest_fitting_chunk(
    probe: ProbeSpec, shape: BatchShape, model: BiEncoder, local_batch: int, budget_bytes: int
) -> int | None:
    """The largest candidate chunk whose CUDA probe plus batch extras fits ``budget_bytes``
    less the safety margin (None when not even a chunk of one does)."""
    candidates = candidate_chunks(local_batch)
    extras = batch_extras_bytes(model, shape, local_batch)
    limit = int(budget_bytes * (1 - SAFETY_MARGIN))
    best = _bisect(candidates, lambda c: _probe_cuda(model, probe.payload(c)) + extras <= limit)
    return candidates[best] if best is not None else None


def _bisect(candidates: list[int], fits: Callable[[int], bool]) -> int | None:
    """Index of the largest candidate that fits (fits is monotone: true, ..., true, false...)."""
    lo, hi, best = 0, len(candidates) - 1, None
    while lo <= hi:
        mid = (lo + hi) // 2
        if fits(candidates[mid]):
            best, lo = mid, mid + 1
        else:
            hi = mid - 1
    return best


def pick_chunk_size(
    probe: ProbeSpec,
    shape: BatchShape,
    model: BiEncoder,
    env: DistEnv,
    budget_bytes: int,
    out_dir: Path | None,
    *,
    measure: Callable[[int], int] | None = None,
) -> int:
    """The largest candidate chunk whose probed peak plus batch extras fits
    ``(1 - SAFETY_MARGIN) * budget_bytes``; logged and written to ``out_dir/chunk_choice.json``
    (``out_dir`` None: logged only).

    ``measure(chunk) -> peak bytes`` replaces the probe (tests). Under ``torchrun`` rank 0
    probes and every rank takes its choice.
    """
    local_batch = shape.batch_size // env.world_size
    candidates = candidate_chunks(local_batch)
    extras = batch_extras_bytes(model, shape, local_batch)
    limit = int(budget_bytes * (1 - SAFETY_MARGIN))
    if measure is None:
        if env.device.type == "cuda":
            measure = lambda c: _probe_cuda(model, probe.payload(c))  # noqa: E731
        else:
            measure = lambda c: probe_cpu(probe.payload(c))  # noqa: E731
    probes: list[dict] = []
    choice: list = [None]
    if env.is_main:

        def fits(chunk: int) -> bool:
            peak = measure(chunk)
            probes.append({"chunk": chunk, "probe_peak_bytes": peak, "total_bytes": peak + extras})
            probes[-1]["fits"] = peak + extras <= limit
            return probes[-1]["fits"]

        best = _bisect(candidates, fits)
        choice[0] = candidates[best] if best is not None else None
    chunk = rank0_says(choice[0])
    record = {
        "chunk_size": chunk,
        "budget_bytes": budget_bytes,
        "safety_margin": SAFETY_MARGIN,
        "limit_bytes": limit,
        "batch_extras_bytes": extras,
        "local_batch": local_batch,
        "candidates": candidates,
        "probes": sorted(probes, key=lambda p: p["chunk"]),
        "device": str(env.device),
        "memory": "cuda max_memory_allocated" if env.device.type == "cuda" else "peak RSS",
    }
    if env.is_main and out_dir is not None:
        write_json_atomic(Path(out_dir) / CHOICE_FILE, record)
        tried = ", ".join(
            f"{p['chunk']}: {p['total_bytes'] / 1e9:.2f} GB" for p in record["probes"]
        )
        print(
            f"chunk_size auto: {chunk} (budget {budget_bytes / 1e9:.2f} GB less "
            f"{SAFETY_MARGIN:.0%} margin; probed {tried})",
            file=sys.stderr,
            flush=True,
        )
    if chunk is None:
        smallest = min(probes, key=lambda p: p["chunk"]) if probes else None
        need = f"{smallest['total_bytes'] / 1e9:.2f} GB" if smallest else "more"
        raise InputError(
            f"train.memory_budget: {budget_bytes / 1e9:.2f} GB is too small: chunk "
            f"{candidates[0]} needs {need} (with a {SAFETY_MARGIN:.0%} margin)"
        )
    return chunk


def main(argv: list[str] | None = None) -> None:
    """Child of the CPU probe: one chunk step, then ``{"peak_bytes": ...}`` on stdout."""
    from dpr_cache.runtime.quiet import quiet_libraries

    argv = sys.argv[1:] if argv is None else argv
    quiet_libraries()
    payload = json.loads(argv[0])
    if payload.get("threads"):
        torch.set_num_threads(payload["threads"])
    model = BiEncoder.from_pretrained(
        payload["model"],
        shared=payload["shared"],
        pooling=payload["pooling"],
        gradient_checkpointing=payload["checkpointing"],
        dropout=payload["dropout"],
        dtype=payload["dtype"],
        attn_implementation=payload["attn_implementation"],
        lora=LoraConfig(**payload["lora"]) if payload["lora"] is not None else None,
        vectors=payload.get("vectors"),
        multi_dim=payload.get("multi_dim"),
    ).train()
    _chunk_step(model, payload, torch.device("cpu"))
    print(json.dumps({"peak_bytes": peak_memory_bytes()}), flush=True)


if __name__ == "__main__":
    main()
