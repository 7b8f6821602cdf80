"""GradCache's exactness on a device, each on a random BERT with its bound: float64 against the
full batch, the dropout replay, a finite difference, mixed precision."""

from __future__ import annotations

from collections import namedtuple
from typing import NamedTuple

import torch
from torch import Tensor
from torch.nn.utils import parameters_to_vector, vector_to_parameters

from dpr_cache.core.engine import GradCache
from dpr_cache.core.loss import contrastive_loss
from dpr_cache.model.attention import use_sdpa_without_wait
from dpr_cache.model.biencoder import BiEncoder
from dpr_cache.runtime.device import autocast

FP64_BOUND = 1e-10  # float64 GradCache vs full batch: largest gradient gap over largest gradient
FD_BOUND = 1e-6  # central finite difference vs GradCache, dropout on, float64 (truncation ~1e-8)
# GradCache vs the full batch under the same autocast (relative norm): ~25x and 40x a rounding
MIXED_BOUNDS = {"bf16": 1e-1, "fp16": 2e-2}
MIXED_RATIO = 1.5  # GradCache's gap to float64 at most this times the full batch's own
SAVINGS = {"length_bucket": 4}  # the replay, finite-difference and mixed checks' widths

Shape = namedtuple("Shape", "hidden layers heads vocab q_len p_len intermediate", defaults=[None])
SIZES = {  # base: BERT-base (110M parameters); tiny: a 2-layer toy
    "tiny": Shape(32, 2, 2, 97, 9, 12),
    "small": Shape(128, 2, 2, 1000, 16, 48),
    "base": Shape(768, 12, 12, 30522, 32, 128),
}


def bert_config(s: Shape, dropout: float, **extra):
    """The transformers config of a BERT of shape ``s``."""
    from transformers import BertConfig

    sizes = {"vocab_size": s.vocab, "hidden_size": s.hidden, "num_hidden_layers": s.layers}
    sizes |= {"num_attention_heads": s.heads, "intermediate_size": s.intermediate or 4 * s.hidden}
    drop = {"hidden_dropout_prob": dropout, "attention_probs_dropout_prob": dropout}
    return BertConfig(max_position_embeddings=max(64, s.p_len), **sizes, **drop, **extra)


def make_model(size, device, dtype, *, shared=False, checkpointing=False, dropout=0.0, seed=0):
    """A random BiEncoder of ``SIZES[size]`` (or the Shape ``size``) in train mode on ``device``."""
    config = bert_config(SIZES[size] if isinstance(size, str) else size, dropout)
    torch.manual_seed(seed)
    with torch.device(device):
        model = BiEncoder.from_config(config, shared=shared, gradient_checkpointing=checkpointing)
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
    """Questions, passages and ids, question 1's first hard negative question 0's positive."""
    shape, group = SIZES[size], 1 + hard_negatives
    q = random_inputs(n_q, shape.q_len, shape.vocab, device, seed)
    p = random_inputs(n_q * group, shape.p_len, shape.vocab, device, seed + 1)
    ids = torch.arange(n_q * group, device=device)
    if group > 1 and n_q > 1:
        ids[group + 1] = ids[0]
        for key in p:
            p[key][group + 1] = p[key][0]
    return q, p, ids


def _grads(model: torch.nn.Module, scale: float = 1.0) -> dict[str, Tensor]:
    return {n: p.grad.detach() / scale for n, p in model.named_parameters() if p.grad is not None}


def max_relative_error(got: dict | list[Tensor], want: dict | list[Tensor]) -> float:
    """Largest absolute difference over the largest reference value (dicts matched by key)."""
    if isinstance(want, dict):
        if got.keys() != want.keys():
            return float("inf")
        got, want = [got[k] for k in want], list(want.values())
    scale = max(w.abs().max().item() for w in want)
    return max((g - w).abs().max().item() for g, w in zip(got, want, strict=True)) / scale


def norm_relative_error(got: dict[str, Tensor], want: dict[str, Tensor]) -> float:
    """||got - want|| / ||want|| over every parameter's gradient, in float64."""
    if got.keys() != want.keys():
        return float("inf")
    diff = sum(((got[k].double() - want[k].double()) ** 2).sum() for k in want)
    ref = sum((want[k].double() ** 2).sum() for k in want)
    return float((diff / ref).sqrt())


def full_batch_grads(model: BiEncoder, q, p, ids, precision: str = "fp32", scale: float = 1.0):
    """The reference: one forward and backward of the whole batch, the loss in fp32."""
    model.zero_grad(set_to_none=True)
    with autocast(model.device, precision):
        reps = [model.encode_query(q), model.encode_passage(p)]
    reps = [r if r.dtype == torch.float64 else r.float() for r in reps]
    loss = contrastive_loss(*reps, p_ids=ids)
    (loss * scale).backward()
    return float(loss.detach()), _grads(model, scale)


class ExactCase(NamedTuple):
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
        even = "divides" if self.n_q % self.chunk == 0 else "uneven last chunk"
        head = f"{self.size}: B={self.n_q}, chunk {self.chunk} ({even}), H={self.hard_negatives}"
        return f"{head}, {towers}" + (", checkpointing" if self.checkpointing else "")


def exact_cases(sizes: list[str], n_q: int = 8) -> list[ExactCase]:
    """Per size: chunks that divide and do not, hard negatives, shared towers, checkpointing."""
    cases = [(n_q, n_q // 2, 1), (n_q - 1, 3, 2), (n_q, 3, 1, True), (n_q - 1, 2, 1, False, True)]
    return [ExactCase(size, *case) for size in sizes for case in cases]


def fp64_exactness(case: ExactCase, device: torch.device) -> dict:
    """GradCache against full-batch autograd in float64 on ``device``."""
    options = {"shared": case.shared, "checkpointing": case.checkpointing}
    model = make_model(case.size, device, torch.float64, **options)
    q, p, ids = make_batch(case.size, case.n_q, case.hard_negatives, device)
    want_loss, want = full_batch_grads(model, q, p, ids)
    model.zero_grad(set_to_none=True)
    engine = GradCache(model.encode_query, model.encode_passage, contrastive_loss, case.chunk)
    got_loss = float(engine.step(q, p, p_ids=ids).detach())
    error = max_relative_error(_grads(model), want)
    row = {"case": case.name, "loss_difference": abs(got_loss - want_loss)}
    return row | {"relative_error": error, "bound": FP64_BOUND, "ok": error <= FP64_BOUND}


def recorded_step(model, batch, precision: str = "fp32", **engine) -> list:
    """One GradCache step (chunk 3): every chunk's (first pass, re-forward) reps."""
    q, p, ids = batch
    outputs = ([], [])
    encoders = (model.encode_query, model.encode_passage)
    towers = [_recorded(e, out) for e, out in zip(encoders, outputs, strict=True)]
    gc = GradCache(*towers, contrastive_loss, 3, keep_last_graph=False, **engine)
    model.zero_grad(set_to_none=True)
    torch.manual_seed(7)
    with autocast(q["input_ids"].device, precision):
        gc.step(q, p, p_ids=ids)
    halves = [(out[: len(out) // 2], out[len(out) // 2 :]) for out in outputs]
    return [pair for first, again in halves for pair in zip(first, again, strict=True)]


def _recorded(encode, outputs: list):
    """``encode``, each output's copy kept in ``outputs`` in call order."""

    def run(inputs: dict) -> Tensor:
        reps = encode(inputs)
        outputs.append(reps.detach().clone())
        return reps

    return run


def replay_bitwise(size: str, device, precision: str = "fp32", dropout: float = 0.1) -> dict:
    """Dropout on: re-forward reps equal the first pass's bitwise, replayed; the control differs."""
    result = {"size": size, "precision": precision, "dropout": dropout}
    for replay, key in ((True, "replayed"), (False, "control_without_replay")):
        model = make_model(size, device, torch.float32, dropout=dropout)
        batch = make_batch(size, 8, 1, device)
        pairs = recorded_step(model, batch, precision, replay_rng=replay, **SAVINGS)
        equal = [torch.equal(a, b) for a, b in pairs]
        result[key] = {"chunks": len(equal), "bitwise_equal": sum(equal)}
    replayed, control = result["replayed"], result["control_without_replay"]
    result["ok"] = replayed["bitwise_equal"] == replayed["chunks"] and control["bitwise_equal"] == 0
    return result


def _directional(model: BiEncoder, run) -> float:
    """|central difference - analytic| / |analytic| along one random direction (float64)."""
    run()
    params = [p for p in model.parameters() if p.requires_grad]
    gen = torch.Generator().manual_seed(5)
    direction = [torch.randn(p.shape, generator=gen, dtype=p.dtype).to(p.device) for p in params]
    analytic = sum((p.grad * d).sum() for p, d in zip(params, direction, strict=True)).item()
    base, step, values = parameters_to_vector(params), 1e-6 * parameters_to_vector(direction), []
    for nudged in (base + step, base - step):
        vector_to_parameters(nudged, params)
        values.append(float(run()))
    vector_to_parameters(base, params)
    return abs((values[0] - values[1]) / 2e-6 - analytic) / abs(analytic)


def dropout_finite_difference(size: str, device: torch.device, dropout: float = 0.3) -> dict:
    """GradCache's gradient with dropout on against a central finite difference of its loss."""
    out = {"size": size, "dropout": dropout, "bound": FD_BOUND}
    for replay in (True, False):
        model = make_model(size, device, torch.float64, dropout=dropout)
        q, p, ids = make_batch(size, 6, 1, device)
        towers = (model.encode_query, model.encode_passage)
        engine = GradCache(*towers, contrastive_loss, 4, replay_rng=replay, **SAVINGS)

        def run(engine=engine, model=model, q=q, p=p, ids=ids) -> Tensor:
            torch.manual_seed(1234)
            model.zero_grad(set_to_none=True)
            return engine.step(q, p, p_ids=ids)

        out["error" if replay else "control_error"] = _directional(model, run)
    out["ok"] = out["error"] <= FD_BOUND and out["control_error"] > 1e-2
    return out


def mixed_precision(size: str, device: torch.device, precision: str, n_q: int = 16) -> dict:
    """GradCache against the full batch under ``precision``'s autocast, both against float64."""
    model = make_model(size, device, torch.float32)
    q, p, ids = make_batch(size, n_q, 1, device)
    scale = 2.0**12 if precision == "fp16" else 1.0
    scaler = torch.amp.GradScaler(device.type, init_scale=scale) if precision == "fp16" else None
    _, full = full_batch_grads(model, q, p, ids, precision, scale=scale)
    seen = {}

    def loss_fn(q_reps: Tensor, p_reps: Tensor, **kwargs) -> Tensor:
        loss = contrastive_loss(q_reps, p_reps, **kwargs)
        seen.update(reps=str(q_reps.dtype), loss=str(loss.dtype))
        return loss

    model.zero_grad(set_to_none=True)
    towers = (model.encode_query, model.encode_passage)
    engine = GradCache(*towers, loss_fn, 4, scaler=scaler, **SAVINGS)
    q_tower, p_tower = engine.split(q, p)
    with autocast(device, precision):
        for forward in (engine.forward_no_grad, engine.forward_last):
            forward(q_tower)
            forward(p_tower)
        engine.build_cache(q_tower, p_tower, p_ids=ids)
        seen["cache"] = str(q_tower.grads[0].dtype)
        engine.forward_backward(q_tower, p_tower)
    cached = _grads(model, scaler.get_scale() if scaler else 1.0)
    _, exact = full_batch_grads(make_model(size, device, torch.float64), q, p, ids)
    pairs = {"gradcache_vs_full": (cached, full), "full_vs_fp64": (full, exact)}
    pairs["gradcache_vs_fp64"] = (cached, exact)
    row = {"size": size, "precision": precision}
    row |= {name: norm_relative_error(*pair) for name, pair in pairs.items()}
    row |= {"ceiling": MIXED_BOUNDS[precision], "ratio_bound": MIXED_RATIO, "dtypes": seen}
    fp32 = all(seen[k] == "torch.float32" for k in ("reps", "loss", "cache"))
    ratio_ok = row["gradcache_vs_fp64"] <= MIXED_RATIO * row["full_vs_fp64"]
    return row | {"ok": row["gradcache_vs_full"] <= row["ceiling"] and ratio_ok and fp32}
