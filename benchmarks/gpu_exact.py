"""GradCache's exactness on a device: float64 against full-batch autograd, the RNG replay of each
chunk's dropout, a finite-difference check with dropout on, and mixed precision against the full
batch under the same autocast.

Each check builds its own random model (a tiny BERT, or BERT-base's shape with random weights) on
the device it is given and returns plain figures with their bounds; ``benchmarks.gpu`` puts them
on the GPU page and ``tests/cuda`` asserts them on a GPU (and ``tests/benchmarks`` on the CPU).
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
from torch import Tensor

from dpr_cache.core.engine import GradCache
from dpr_cache.core.loss import contrastive_loss
from dpr_cache.model.attention import use_sdpa_without_wait
from dpr_cache.model.biencoder import BiEncoder
from dpr_cache.runtime.device import autocast

__all__ = [
    "SIZES",
    "FP64_BOUND",
    "FD_BOUND",
    "MIXED_BOUNDS",
    "MIXED_RATIO",
    "ExactCase",
    "exact_cases",
    "fp64_exactness",
    "replay_bitwise",
    "dropout_finite_difference",
    "mixed_precision",
]

FP64_BOUND = 1e-10
"""GradCache vs the full batch in float64: largest gradient difference over the largest gradient."""
FD_BOUND = 1e-6
"""Central finite difference vs GradCache's gradient, dropout on, float64 (truncation ~1e-8)."""
MIXED_BOUNDS = {"bf16": 1e-1, "fp16": 2e-2}
"""Ceilings of GradCache's gradient vs the full batch's under the same autocast (relative norm):
about 25x and 40x a single rounding of the format (bf16 keeps 8 bits, 3.9e-3; fp16 11, 4.9e-4),
room for a whole BERT's accumulated rounding; the defended bound is ``MIXED_RATIO``."""
MIXED_RATIO = 1.5
"""The defended bound: GradCache's distance to the float64 gradient at most this times the full
batch's own distance to it under the same autocast. Chunks change the shapes of the matrix
products, hence their rounding, but must add no error of their own: a wrong gradient (a chunk's
dropout not replayed, a chunk dropped) lands far above."""


@dataclass(frozen=True)
class Shape:
    """A BERT's shape; ``base`` is BERT-base (110M parameters), ``tiny`` a 2-layer toy."""

    hidden: int
    layers: int
    heads: int
    vocab: int
    q_len: int
    p_len: int


SIZES = {
    "tiny": Shape(hidden=32, layers=2, heads=2, vocab=97, q_len=9, p_len=12),
    "small": Shape(hidden=128, layers=2, heads=2, vocab=1000, q_len=16, p_len=48),
    "base": Shape(hidden=768, layers=12, heads=12, vocab=30522, q_len=32, p_len=128),
}


def bert_config(shape: Shape, dropout: float = 0.0):
    from transformers import BertConfig

    return BertConfig(
        vocab_size=shape.vocab,
        hidden_size=shape.hidden,
        num_hidden_layers=shape.layers,
        num_attention_heads=shape.heads,
        intermediate_size=4 * shape.hidden,
        max_position_embeddings=max(64, shape.p_len),
        hidden_dropout_prob=dropout,
        attention_probs_dropout_prob=dropout,
    )


def make_model(
    size: str,
    device: torch.device,
    dtype: torch.dtype,
    *,
    shared: bool = False,
    checkpointing: bool = False,
    dropout: float = 0.0,
    seed: int = 0,
) -> BiEncoder:
    """A random BiEncoder of ``SIZES[size]`` in train mode; separate towers start different.
    Its weights are made on ``device`` (a BERT-base drawn on the host costs seconds). On CUDA
    its SDPA attention builds padding masks without host waits, as the trainer's does."""
    torch.manual_seed(seed)
    with torch.device(device):
        model = BiEncoder.from_config(
            bert_config(SIZES[size], dropout), shared=shared, gradient_checkpointing=checkpointing
        )
    if not shared:
        with torch.no_grad():
            for param in model.passage_encoder.parameters():
                param.add_(0.02 * torch.randn_like(param))
    if device.type == "cuda":
        use_sdpa_without_wait([model.query_encoder, model.passage_encoder])
    return model.to(device, dtype).train()


def random_inputs(rows: int, length: int, vocab: int, device: torch.device, seed: int) -> dict:
    """Token ids with ragged padding: row lengths drawn between half and all of ``length``."""
    gen = torch.Generator().manual_seed(seed)
    ids = torch.randint(5, vocab, (rows, length), generator=gen)
    lengths = torch.randint(max(2, length // 2), length + 1, (rows,), generator=gen)
    mask = (torch.arange(length)[None, :] < lengths[:, None]).long()
    ids = ids * mask
    ids[:, 0] = 2
    inputs = {"input_ids": ids, "attention_mask": mask, "token_type_ids": torch.zeros_like(ids)}
    return {k: v.to(device) for k, v in inputs.items()}


def make_batch(size: str, n_q: int, hard_negatives: int, device: torch.device, seed: int = 1):
    """Questions, passage groups and ids; question 1's first hard negative repeats question 0's
    positive (a false negative the loss masks by id)."""
    shape, group = SIZES[size], 1 + hard_negatives
    q = random_inputs(n_q, shape.q_len, shape.vocab, device, seed)
    p = random_inputs(n_q * group, shape.p_len, shape.vocab, device, seed + 1)
    ids = torch.arange(n_q * group, device=device)
    if group > 1 and n_q > 1:
        ids[group + 1] = ids[0]
        for key in p:
            p[key][group + 1] = p[key][0]
    return q, p, ids


def _grads(model: torch.nn.Module) -> dict[str, Tensor]:
    return {n: p.grad.detach().clone() for n, p in model.named_parameters() if p.grad is not None}


def max_relative_error(got: dict[str, Tensor], want: dict[str, Tensor]) -> float:
    """Largest absolute difference over the largest reference gradient."""
    if got.keys() != want.keys():
        return float("inf")
    scale = max(w.abs().max().item() for w in want.values())
    return max((got[k] - want[k]).abs().max().item() for k in want) / scale


def norm_relative_error(got: dict[str, Tensor], want: dict[str, Tensor]) -> float:
    """||got - want|| / ||want|| over every parameter's gradient, in float64."""
    if got.keys() != want.keys():
        return float("inf")
    diff = sum(((got[k].double() - want[k].double()) ** 2).sum() for k in want)
    ref = sum((want[k].double() ** 2).sum() for k in want)
    return float((diff / ref).sqrt())


def full_batch_grads(model: BiEncoder, q, p, ids, precision: str = "fp32", scale: float = 1.0):
    """The reference: one forward of the whole batch (under ``precision``'s autocast), the loss
    in fp32 on fp32 reps, one backward."""
    model.zero_grad(set_to_none=True)
    with autocast(model.device, precision):
        q_reps, p_reps = model.encode_query(q), model.encode_passage(p)
    loss = contrastive_loss(
        q_reps.float() if q_reps.dtype != torch.float64 else q_reps,
        p_reps.float() if p_reps.dtype != torch.float64 else p_reps,
        p_ids=ids,
    )
    (loss * scale).backward()
    return float(loss.detach()), {k: v / scale for k, v in _grads(model).items()}


SAVINGS = {"length_bucket": 4}
"""A saving the replay, finite-difference and mixed-precision checks add to the engine's
defaults (length order, trimmed chunks, the kept last graph), which the float64 comparisons
keep as the trainer runs them: chunk widths rounded up to a multiple of 4, narrower than every
size's rows, so chunks take widths between their longest row and the batch's."""


def gradcache_grads(model: BiEncoder, q, p, ids, chunk: int, precision="fp32", **engine_kwargs):
    model.zero_grad(set_to_none=True)
    engine = GradCache(
        model.encode_query, model.encode_passage, contrastive_loss, chunk, **engine_kwargs
    )
    with autocast(model.device, precision):
        loss = engine.step(q, p, p_ids=ids)
    scale = engine_kwargs["scaler"].get_scale() if engine_kwargs.get("scaler") else 1.0
    return float(loss.detach()), {k: v / scale for k, v in _grads(model).items()}


@dataclass(frozen=True)
class ExactCase:
    """One float64 comparison: model size, questions, chunk, hard negatives, towers."""

    size: str
    n_q: int
    chunk: int
    hard_negatives: int
    shared: bool = False
    checkpointing: bool = False

    @property
    def name(self) -> str:
        towers = "shared" if self.shared else "separate"
        ckpt = ", checkpointing" if self.checkpointing else ""
        even = "divides" if self.n_q % self.chunk == 0 else "uneven last chunk"
        return (
            f"{self.size}: B={self.n_q}, chunk {self.chunk} ({even}), "
            f"H={self.hard_negatives}, {towers}{ckpt}"
        )


def exact_cases(sizes: list[str], n_q: int = 8) -> list[ExactCase]:
    """Per size: a chunk that divides the batch, one that does not, hard negatives, shared and
    separate towers, gradient checkpointing."""
    cases = []
    for size in sizes:
        cases += [
            ExactCase(size, n_q, n_q // 2, 1),
            ExactCase(size, n_q - 1, 3, 2),
            ExactCase(size, n_q, 3, 1, shared=True),
            ExactCase(size, n_q - 1, 2, 1, checkpointing=True),
        ]
    return cases


def fp64_exactness(case: ExactCase, device: torch.device) -> dict:
    """GradCache against full-batch autograd in float64 on ``device``."""
    model = make_model(
        case.size, device, torch.float64, shared=case.shared, checkpointing=case.checkpointing
    )
    q, p, ids = make_batch(case.size, case.n_q, case.hard_negatives, device)
    want_loss, want = full_batch_grads(model, q, p, ids)
    got_loss, got = gradcache_grads(model, q, p, ids, case.chunk)
    error = max_relative_error(got, want)
    return {
        "case": case.name,
        "loss_difference": abs(got_loss - want_loss),
        "relative_error": error,
        "bound": FP64_BOUND,
        "ok": error <= FP64_BOUND,
    }


class _Recorder:
    """Wraps an encoder and keeps a copy of every output, in call order."""

    def __init__(self, encode) -> None:
        self.encode, self.outputs = encode, []

    def __call__(self, inputs: dict) -> Tensor:
        reps = self.encode(inputs)
        self.outputs.append(reps.detach().clone())
        return reps


def replay_bitwise(
    size: str, device: torch.device, precision: str = "fp32", dropout: float = 0.1
) -> dict:
    """Dropout on: every chunk's re-forward reps equal its first pass's bit for bit with the RNG
    replayed; without the replay (the negative control) they differ."""
    result = {"size": size, "precision": precision, "dropout": dropout}
    for replay in (True, False):
        model = make_model(size, device, torch.float32, dropout=dropout)
        q, p, ids = make_batch(size, 8, 1, device)
        enc_q, enc_p = _Recorder(model.encode_query), _Recorder(model.encode_passage)
        engine = GradCache(
            enc_q, enc_p, contrastive_loss, 3, keep_last_graph=False, replay_rng=replay, **SAVINGS
        )
        torch.manual_seed(7)
        with autocast(device, precision):
            engine.step(q, p, p_ids=ids)
        equal = []
        for rec in (enc_q, enc_p):
            n = len(rec.outputs) // 2
            equal += [
                torch.equal(a, b) for a, b in zip(rec.outputs[:n], rec.outputs[n:], strict=True)
            ]
        key = "replayed" if replay else "control_without_replay"
        result[key] = {"chunks": len(equal), "bitwise_equal": sum(equal)}
    result["ok"] = (
        result["replayed"]["bitwise_equal"] == result["replayed"]["chunks"]
        and result["control_without_replay"]["bitwise_equal"] == 0
    )
    return result


def _directional(model: BiEncoder, run) -> float:
    """|central difference - analytic| / |analytic| along one random direction (float64)."""
    run()
    params = [p for p in model.parameters() if p.requires_grad]
    gen = torch.Generator().manual_seed(5)
    direction = [torch.randn(p.shape, generator=gen, dtype=p.dtype).to(p.device) for p in params]
    analytic = sum((p.grad * d).sum() for p, d in zip(params, direction, strict=True)).item()
    eps, values = 1e-6, []
    for sign in (1, -1):
        with torch.no_grad():
            for p, d in zip(params, direction, strict=True):
                p.add_(sign * eps * d)
        values.append(float(run()))
        with torch.no_grad():
            for p, d in zip(params, direction, strict=True):
                p.sub_(sign * eps * d)
    return abs((values[0] - values[1]) / (2 * eps) - analytic) / abs(analytic)


def dropout_finite_difference(size: str, device: torch.device, dropout: float = 0.3) -> dict:
    """GradCache's gradient with dropout on, along a random direction, against a central finite
    difference of its own loss (same seed each call); the control skips the RNG replay."""
    out = {"size": size, "dropout": dropout, "bound": FD_BOUND}
    for replay in (True, False):
        model = make_model(size, device, torch.float64, dropout=dropout)
        q, p, ids = make_batch(size, 6, 1, device)
        engine = GradCache(
            model.encode_query,
            model.encode_passage,
            contrastive_loss,
            4,
            replay_rng=replay,
            **SAVINGS,
        )

        def run(engine=engine, model=model, q=q, p=p, ids=ids) -> Tensor:
            torch.manual_seed(1234)
            model.zero_grad(set_to_none=True)
            return engine.step(q, p, p_ids=ids)

        out["error" if replay else "control_error"] = _directional(model, run)
    out["ok"] = out["error"] <= FD_BOUND and out["control_error"] > 1e-2
    return out


def mixed_precision(size: str, device: torch.device, precision: str, n_q: int = 16) -> dict:
    """GradCache under ``precision``'s autocast (fp16 with a GradScaler) against the full batch
    under the same autocast, both against float64; the dtypes the loss and the cache see."""
    model = make_model(size, device, torch.float32)
    q, p, ids = make_batch(size, n_q, 1, device)
    scaler = torch.amp.GradScaler(device.type, init_scale=2.0**12) if precision == "fp16" else None
    _, full = full_batch_grads(model, q, p, ids, precision, scale=2.0**12 if scaler else 1.0)
    seen = {}

    def loss_fn(q_reps: Tensor, p_reps: Tensor, **kwargs) -> Tensor:
        loss = contrastive_loss(q_reps, p_reps, **kwargs)
        seen.update(reps=str(q_reps.dtype), loss=str(loss.dtype))
        return loss

    model.zero_grad(set_to_none=True)
    engine = GradCache(
        model.encode_query, model.encode_passage, loss_fn, 4, scaler=scaler, **SAVINGS
    )
    q_tower, p_tower = engine.split(q, p)
    with autocast(device, precision):
        for tower in (q_tower, p_tower):
            engine.forward_no_grad(tower)
        for tower in (q_tower, p_tower):
            engine.forward_last(tower)
        engine.build_cache(q_tower, p_tower, p_ids=ids)
        seen["cache"] = str(q_tower.grads[0].dtype)
        engine.forward_backward(q_tower, p_tower)
    scale = scaler.get_scale() if scaler else 1.0
    cached = {k: v / scale for k, v in _grads(model).items()}
    reference = make_model(size, device, torch.float64)
    _, exact = full_batch_grads(reference, q, p, ids)
    gc_full = norm_relative_error(cached, full)
    full_exact = norm_relative_error(full, exact)
    gc_exact = norm_relative_error(cached, exact)
    fp32 = all(seen[k] == "torch.float32" for k in ("reps", "loss", "cache"))
    return {
        "size": size,
        "precision": precision,
        "gradcache_vs_full": gc_full,
        "full_vs_fp64": full_exact,
        "gradcache_vs_fp64": gc_exact,
        "ceiling": MIXED_BOUNDS[precision],
        "ratio_bound": MIXED_RATIO,
        "dtypes": seen,
        "ok": gc_full <= MIXED_BOUNDS[precision] and gc_exact <= MIXED_RATIO * full_exact and fp32,
    }
