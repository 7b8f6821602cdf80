"""The GPU suite's ``llm`` section (issue 57): a decoder LLM as the towers, trained as a user of
``configs/llm_lora.yaml`` would train it. A decoder of Mistral-7B's shape with random weights in
bf16, LoRA r = 16 on every linear layer (fp32 adapters over the frozen base), gradient
checkpointing, last-token pooling, one shared tower, 64-token questions and 256-token passages
with every position attended, one hard negative, bf16 autocast:

- one GradCache training step's peak memory at B = 64, 256 and 1,024 (a chunk of 32);
- the largest full batch (``train.mode: full``) whose step fits: doubling, then bisection, each
  try after the first two placed where the peaks so far, linear in the batch, reach the device's
  memory;
- pairs per second at B = 256: dpr-cache's GradCache, the full batch, and sentence-transformers'
  ``CachedMultipleNegativesRankingLoss`` on the very same peft-wrapped module at the same
  mini-batch, interleaved (:func:`benchmarks.gpu_perf._interleave`); beside them the largest
  full batch's step from the search;
- the same memory and speed rows, faster, on a decoder of Qwen2-0.5B's shape.

The weights are built from a config directly on the device in bf16 (no download, no fp32 copy
on the host) by :meth:`dpr_cache.model.biencoder.BiEncoder.from_config`, which adds the LoRA
adapters and the checkpointing as ``train``'s loading does; each training step is
:meth:`dpr_cache.train.trainer.Trainer.step` of the trainer :func:`build_trainer` makes from a
config, its loading of ``model.name_or_path`` answered with the model built here
(:func:`_prebuilt`, which checks that the config asked for the model it gets). A step is timed
as the other sections time one (the steppers' ``.step``: forward, loss, backward).

Every measurement first checks that its estimated seconds fit in what is left of the section
(and, for the 7B, what the 0.5B's rows need): what does not fit is recorded as skipped, with
the seconds it needed and had. The figures go into ``into`` as they are measured, so that a
section stopped part way keeps them. The dry run (no CUDA) runs every part on two tiny decoders
of the same families, a full batch above a pretended limit "running out of memory".
"""

from __future__ import annotations

import contextlib
import functools
import json
import math
import time
from collections.abc import Callable, Iterator
from dataclasses import asdict, dataclass, field
from pathlib import Path
from unittest import mock

import torch

from benchmarks import gpu_perf
from dpr_cache.data.collate import Batch

__all__ = [
    "DecoderShape",
    "LlmPlan",
    "GPU_LLM",
    "DRY_LLM",
    "MISTRAL_7B",
    "QWEN2_05B",
    "llm_figures",
    "build_decoder",
    "decoder_batch",
    "search_largest",
]

REPO = Path(__file__).resolve().parents[1]
TOY = REPO / "data" / "toy"


@dataclass(frozen=True)
class DecoderShape:
    """A decoder's architecture: what its cost depends on (the weights are random)."""

    name: str
    family: str  # transformers' model_type: mistral (Llama's architecture) or qwen2
    layers: int
    hidden: int
    heads: int
    kv_heads: int
    intermediate: int
    vocab: int
    eos: int  # the EOS id ending every text (the tokenizer appends it for last-token pooling)
    tied: bool  # input and output embeddings tied (the base model has no output head either way)
    # a toy folder of the family: sentence-transformers' Transformer loads it, then is given ours
    st_folder: str

    def config(self, dtype: torch.dtype):
        """The transformers config of this shape, its weights in ``dtype``."""
        from transformers import AutoConfig

        extra = {"sliding_window": 4096} if self.family == "mistral" else {}
        return AutoConfig.for_model(
            self.family,
            vocab_size=self.vocab,
            hidden_size=self.hidden,
            intermediate_size=self.intermediate,
            num_hidden_layers=self.layers,
            num_attention_heads=self.heads,
            num_key_value_heads=self.kv_heads,
            max_position_embeddings=32768,
            rms_norm_eps=1e-5 if self.family == "mistral" else 1e-6,
            bos_token_id=1 if self.family == "mistral" else None,
            eos_token_id=self.eos,
            tie_word_embeddings=self.tied,
            attention_dropout=0.0,
            dtype=dtype,
            **extra,
        )


MISTRAL_7B = DecoderShape(
    "Mistral-7B", "mistral", 32, 4096, 32, 8, 14336, 32000, 2, False, str(TOY / "tiny-llama")
)
QWEN2_05B = DecoderShape(
    "Qwen2-0.5B", "qwen2", 24, 896, 14, 2, 4864, 151936, 151643, True, str(TOY / "tiny-qwen2")
)
# the dry run's: data/toy/tiny-llama's and tiny-qwen2's shapes, in the same two families
TINY_MISTRAL = DecoderShape(
    "tiny (Mistral family)", "mistral", 2, 32, 4, 2, 64, 512, 2, False, str(TOY / "tiny-llama")
)
TINY_QWEN2 = DecoderShape(
    "tiny (Qwen2 family)", "qwen2", 2, 32, 4, 2, 64, 512, 0, True, str(TOY / "tiny-qwen2")
)


@dataclass(frozen=True)
class LlmPlan:
    """The sizes of the section: the GPU's, or the dry run's."""

    big: DecoderShape  # the goals' decoder (memory, largest full batch, speed)
    small: DecoderShape  # the faster row (memory, speed)
    q_len: int
    p_len: int
    memory_batches: list[int]
    chunk: int
    speed_batch: int
    big_rounds: int  # timed rounds of the big decoder's comparison (interleaved)
    big_warmups: int
    small_rounds: int
    small_warmups: int
    full_start: int  # the largest full batch's search: its first try
    full_granularity: int  # ... and the resolution it stops at
    small_reserve_s: float  # seconds the big decoder's rows leave to the small one's
    pretend_limit: int | None = None  # dry run: a full batch above it "runs out of memory"
    dtype: str = "bf16"  # model.dtype
    precision: str = "bf16"  # train.precision (autocast)
    lora: dict = field(
        default_factory=lambda: {
            "r": 16,
            "alpha": 32,
            "dropout": 0.1,
            "target_modules": "all-linear",
        }
    )


GPU_LLM = LlmPlan(
    big=MISTRAL_7B,
    small=QWEN2_05B,
    q_len=64,
    p_len=256,
    memory_batches=[64, 256, 1024],
    chunk=32,  # configs/llm_lora.yaml's
    speed_batch=256,
    # a 7B step at B = 256 is some 20 s: one round, its kernels warmed by the memory rows' steps
    # at the same chunk shapes
    big_rounds=1,
    big_warmups=0,
    small_rounds=2,
    small_warmups=1,
    full_start=128,
    full_granularity=32,
    small_reserve_s=60,
)
DRY_LLM = LlmPlan(
    big=TINY_MISTRAL,
    small=TINY_QWEN2,
    q_len=8,
    p_len=16,
    memory_batches=[4, 8, 16],
    chunk=2,
    speed_batch=8,
    big_rounds=1,
    big_warmups=0,
    small_rounds=1,
    small_warmups=1,
    full_start=2,
    full_granularity=2,
    small_reserve_s=0,
    pretend_limit=11,
)


def build_decoder(shape: DecoderShape, plan: LlmPlan, device: torch.device):
    """A shared-tower BiEncoder of ``shape`` with random weights made on ``device`` in
    ``plan.dtype`` (the bf16 weights of a 7B are never on the host), LoRA adapters of
    ``plan.lora`` on its frozen base, gradient checkpointing, last-token pooling, dot product
    (no normalization: the peers' loss is a dot product at scale 1)."""
    from dpr_cache.config import LoraConfig
    from dpr_cache.model.biencoder import BiEncoder
    from dpr_cache.model.decoders import torch_dtype

    torch.manual_seed(0)
    with torch.device(device):
        model = BiEncoder.from_config(
            shape.config(torch_dtype(plan.dtype)),
            shared=True,
            pooling="last",
            gradient_checkpointing=True,
            normalize=False,
            lora=LoraConfig(**plan.lora),
        )
    model.weights_dtype = plan.dtype
    model.max_query_length, model.max_passage_length = plan.q_len, plan.p_len
    return model.train()


def decoder_batch(shape: DecoderShape, n_q: int, q_len: int, p_len: int, seed: int = 0) -> Batch:
    """``n_q`` questions of ``q_len`` random tokens and a positive and a hard negative of
    ``p_len`` each, every position attended (no padding: the most memory) and each row ending
    in the EOS that last-token pooling reads; distinct passage ids."""
    from dpr_cache.data.synthetic import synthetic_batch

    q, p, ids = synthetic_batch(None, shape.vocab, n_q, 2 * n_q, q_len, p_len, seed)
    for rows in (q, p):
        del rows["token_type_ids"]  # a decoder takes none
        rows["input_ids"][:, -1] = shape.eos
    return Batch(q, p, ids, n_q, 2)


def _config(plan: LlmPlan, shape: DecoderShape, work: Path, device: torch.device, **train):
    """The run config a user would write for this model (``configs/llm_lora.yaml``'s model
    section, at this shape), with ``train`` keys."""
    from dpr_cache.config import load_config

    lora = ", ".join(f"{k}: {v}" for k, v in plan.lora.items())
    sets = [
        f"output_dir={work}",
        f"model.name_or_path={work / shape.family}",  # never read: see _prebuilt
        "model.shared=true",
        "model.pooling=last",
        "model.normalize=false",
        f"model.dtype={plan.dtype}",
        "model.gradient_checkpointing=true",
        f"model.max_query_length={plan.q_len}",
        f"model.max_passage_length={plan.p_len}",
        f"model.lora={{{lora}}}",
        "train.lr=1e-4",
        "train.temperature=1.0",
        "train.hard_negatives=1",
        f"train.precision={plan.precision}",
        f"train.device={device}",
    ] + [f"train.{k}={v}" for k, v in train.items()]
    return load_config(None, sets)


@contextlib.contextmanager
def _prebuilt(model, asked: dict) -> Iterator[None]:
    """``build_trainer``'s loading of ``model.name_or_path`` answered with ``model`` (built in
    memory: a 7B's folder would be 14.5 GB to write and read back); what the trainer asked for
    goes into ``asked``, and a setting the model was not built with is an error. The rest of
    ``load_model`` (its checks, the move to the device) runs as in ``train``."""
    import dpr_cache.train.trainer as trainer_module

    def load(path, **kwargs):
        lora = kwargs.get("lora")
        wanted = {
            "shared": kwargs.get("shared"),
            "pooling": kwargs.get("pooling"),
            "gradient_checkpointing": kwargs.get("gradient_checkpointing"),
            "dtype": kwargs.get("dtype"),
            "normalize": kwargs.get("normalize"),
            "lora": lora.model_dump() if lora is not None else None,
        }
        asked.update(wanted)
        built = {
            "shared": model.shared,
            "pooling": model.pooling,
            "dtype": model.weights_dtype,
            "normalize": model.normalize,
        }
        differ = {k: (wanted[k], v) for k, v in built.items() if wanted[k] != v}
        if differ or not (model.has_adapters and wanted["gradient_checkpointing"]):
            raise ValueError(f"the config asks for another model than the one built: {differ}")
        return model

    with mock.patch.object(trainer_module, "load_biencoder", load):
        yield


def _peak_and_base(device: torch.device) -> tuple[int, int | None]:
    from dpr_cache.runtime.memory import peak_memory_bytes

    base = torch.cuda.memory_allocated(device) if device.type == "cuda" else None
    return peak_memory_bytes(device), base


def trainer_step(
    model,
    plan: LlmPlan,
    shape: DecoderShape,
    batch: Batch,
    work: Path,
    device: torch.device,
    asked: dict,
    **train,
) -> dict:
    """Peak memory and seconds of one :meth:`Trainer.step` (AdamW's first update of the
    adapters included) of a trainer ``build_trainer`` makes from the config ``train``
    describes, on ``model``; a step that runs out of memory gives ``fits: False``."""
    from dpr_cache.runtime.distributed import DistEnv
    from dpr_cache.train.trainer import build_trainer

    config = _config(plan, shape, work, device, batch_size=batch.n_questions, **train)
    model.zero_grad(set_to_none=True)
    gpu_perf.free_device(device)
    _, base = _peak_and_base(device)
    with _prebuilt(model, asked):
        trainer = build_trainer(config, DistEnv(device=device), total_steps=10)
    try:
        limit = plan.pretend_limit if train.get("mode") == "full" else None
        if limit is not None and batch.n_questions > limit:
            raise torch.OutOfMemoryError(f"dry run: a batch above {limit} questions is pretended")
        result = trainer.step(batch)
        peak, _ = _peak_and_base(device)
        row = {"fits": True, "peak_bytes": peak, "step_s": result.seconds, "loss": result.loss}
    except torch.OutOfMemoryError:
        row = {"fits": False, "peak_bytes": None, "step_s": None}
    finally:
        del trainer
        model.zero_grad(set_to_none=True)
        gpu_perf.free_device(device)
    return {**row, "resident_bytes": base}


def search_largest(
    fits: Callable[[int], dict],
    start: int,
    granularity: int,
    *,
    predict: Callable[[dict[int, dict]], int | None] | None = None,
    time_ok: Callable[[int, dict[int, dict]], str | None] = lambda b, tried: None,
) -> dict:
    """The largest batch ``fits(b)["fits"]``, to ``granularity``: doubling from ``start`` until
    a try does not fit, then bisection. Where ``predict`` gives the largest batch the tries so
    far say fits, a doubling goes no further than it (or, once a try at it fitted, one step of
    ``granularity`` past it) and a bisection tries it where it lies inside the interval.
    ``time_ok(b, tried)`` returns why a try at ``b`` is not made (None: it is); the search
    then stops there, the reason recorded."""
    tried: dict[int, dict] = {}
    good = bad = None
    b: int | None = start
    stopped = None
    while b is not None:
        why = time_ok(b, tried)
        if why:
            stopped = f"B={b} not tried: {why}"
            break
        tried[b] = fits(b)
        if tried[b]["fits"]:
            good = b
        else:
            bad = b
        b = _next_try(good, bad, granularity, predict(tried) if predict else None)
    if good is None and bad is None:
        resolution = None
    elif bad is None or good is None:
        resolution = None  # no bound on one side
    else:
        resolution = bad - good
    return {
        "batch": good,
        "first_too_large": bad,
        "resolution": resolution,
        "tried": {str(k): v for k, v in tried.items()},  # in the order tried
        "stopped": stopped,
    }


def _next_try(good: int | None, bad: int | None, step: int, predicted: int | None) -> int | None:
    """The search's next batch (None: done), on the grid of ``step``."""
    if good is None:  # the first try did not fit: halve down to one step
        return None if bad <= step else max(step, bad // 2 // step * step)
    if bad is None:  # doubling, capped by the prediction
        if predicted is None:
            return 2 * good
        capped = predicted // step * step
        return good + step if capped <= good else min(2 * good, capped)
    if bad - good <= step:
        return None
    lo, hi = good + step, bad - step
    if predicted is not None and lo <= predicted // step * step <= hi:
        return predicted // step * step
    return max(lo, (good + bad) // 2 // step * step)


def linear_prediction(capacity: int, margin: float = 0.97):
    """``predict`` for :func:`search_largest`: the batch at which the fitting tries' peaks, a
    line through them (or through the one and the memory resident before it), reach ``margin``
    of ``capacity`` bytes; None with no fitting try that measured its peak."""

    def predict(tried: dict[int, dict]) -> int | None:
        points = sorted((b, r["peak_bytes"]) for b, r in tried.items() if r.get("peak_bytes"))
        if not points:
            return None
        if len(points) == 1:
            b, peak = points[0]
            base = tried[b].get("resident_bytes")
            if base is None or peak <= base:
                return None
            (b0, p0), (b1, p1) = (0, base), (b, peak)
        else:
            (b0, p0), (b1, p1) = points[-2], points[-1]
        slope = (p1 - p0) / (b1 - b0)
        if slope <= 0:
            return None
        return int(b1 + (margin * capacity - p1) / slope)

    return predict


def _families(rows: dict) -> dict:
    return {f: gpu_perf._best(rows, f) for f in ("dpr-cache", "full batch", "CachedMNRL")}


def speed_rows(
    model,
    shape: DecoderShape,
    plan: LlmPlan,
    batch_of: Callable[[int], Batch],
    rounds: int,
    warmups: int,
) -> dict:
    """At ``plan.speed_batch``: dpr-cache's GradCache at ``plan.chunk``, the full batch, and
    CachedMNRL at the same mini-batch on the same module, interleaved; the full batch at the
    largest half that fits where it runs out of memory."""
    from benchmarks.peers import CachedMNRLStep

    c, batch = plan.chunk, batch_of(plan.speed_batch)
    specs = {
        f"dpr-cache chunk {c}": ("dpr-cache", lambda: gpu_perf._own_stepper(model, c)),
        "full batch": ("full batch", lambda: gpu_perf._own_stepper(model, None)),
        f"CachedMNRL rows {c}": ("CachedMNRL", lambda: CachedMNRLStep(model, c, shape.st_folder)),
    }
    steppers, rows = {}, {}
    for name, (engine, make) in specs.items():
        rows[name] = {"engine": engine, "chunk": None if engine == "full batch" else c}
        steppers[name] = make()
    timed = gpu_perf._interleave(
        steppers, batch, model, plan.precision, rounds, host_waits=False, warmups=warmups
    )
    for name, row in timed.items():
        rows[name].update(row)
    comparison = {
        "batch": batch.n_questions,
        "precision": plan.precision,
        "rounds": rounds,
        "warmups": warmups,
        "rows": rows,
        "best": _families(rows),
    }
    return gpu_perf.add_fitting_full_batch(model, comparison, batch_of, rounds, host_waits=False)


class _Clock:
    """What is left of the section (``time_left``, seconds) less ``reserve``, and the seconds a
    measurement is expected to take from the rates measured so far."""

    def __init__(self, time_left: Callable[[], float], reserve: float) -> None:
        self.time_left, self.reserve = time_left, reserve
        self.per_question: dict[str, float] = {}  # seconds a question a step, by mode

    def learn(self, mode: str, row: dict, n_q: int) -> None:
        if row.get("step_s"):
            rate = row["step_s"] / n_q
            self.per_question[mode] = max(rate, self.per_question.get(mode, 0.0))

    def estimate(self, mode: str, n_q: int, steps: float = 1.0) -> float | None:
        rate = self.per_question.get(mode) or self.per_question.get("gradcache")
        return None if rate is None else 1.3 * rate * n_q * steps

    def why_not(self, seconds: float | None) -> str | None:
        """Why a measurement of ``seconds`` is not started (None: it is)."""
        left = self.time_left() - self.reserve
        if seconds is None or seconds <= left:
            return None
        kept = f" ({self.reserve:.0f} s kept for what follows)" if self.reserve else ""
        return f"out of time: about {seconds:.0f} s needed, {max(left, 0):.0f} s left{kept}"


def _measure(
    shape: DecoderShape,
    plan: LlmPlan,
    device: torch.device,
    work: Path,
    clock: _Clock,
    out: dict,
    *,
    search_full: bool,
    rounds: int,
    warmups: int,
) -> None:
    """One decoder's rows into ``out``: memory by batch around the speed comparison (the rows
    up to its batch first, which warm its kernels), then the largest full batch."""
    start = time.monotonic()
    model = build_decoder(shape, plan, device)
    out["build_s"] = round(time.monotonic() - start, 2)
    out["parameters"] = sum(p.numel() for p in model.parameters())
    out["trainable"] = sum(p.numel() for p in model.parameters() if p.requires_grad)
    out["trainable_dtypes"] = sorted({str(p.dtype) for p in model.parameters() if p.requires_grad})
    out["base_dtype"] = str(next(p.dtype for p in model.parameters() if not p.requires_grad))
    out["attention"] = getattr(model.query_encoder.config, "_attn_implementation", None)
    batches: dict[int, Batch] = {}

    def batch_of(n: int) -> Batch:
        if n not in batches:
            batches[n] = decoder_batch(shape, n, plan.q_len, plan.p_len)
        return batches[n]

    asked = out.setdefault("trainer_asked", {})
    step = functools.partial(trainer_step, model, plan, shape, work=work, device=device)
    memory = out.setdefault("memory", [])

    def memory_row(b: int) -> None:
        chunk = min(plan.chunk, b)
        why = clock.why_not(clock.estimate("gradcache", b))
        if why:
            memory.append({"batch": b, "chunk": chunk, "skipped": why})
            return
        row = step(batch_of(b), asked=asked, mode="gradcache", chunk_size=chunk)
        clock.learn("gradcache", row, b)
        memory.append({"batch": b, "chunk": chunk, **row})
        print(f"  {shape.name} GradCache B={b}: {_row_text(row)}", flush=True)

    try:
        for b in [b for b in plan.memory_batches if b <= plan.speed_batch]:
            memory_row(b)
        # the full batch and CachedMNRL cost about the GradCache step's each
        why = clock.why_not(clock.estimate("gradcache", plan.speed_batch, 3 * (rounds + warmups)))
        if why:
            out["speed"] = {"batch": plan.speed_batch, "skipped": why}
        else:
            out["speed"] = speed_rows(model, shape, plan, batch_of, rounds, warmups)
            print(f"  {shape.name} speed B={plan.speed_batch}: {out['speed']['best']}", flush=True)
        for b in [b for b in plan.memory_batches if b > plan.speed_batch]:
            memory_row(b)
        if search_full:
            out["largest_full_batch"] = _largest_full(plan, device, clock, step, batch_of, asked)
    finally:
        batches.clear()


def _largest_full(plan, device, clock: _Clock, step, batch_of, asked) -> dict:
    """The largest full batch that fits, its step's pairs per second (the search's own trainer
    step at that batch); on a device each try placed by :func:`linear_prediction`."""

    def fits(b: int) -> dict:
        row = step(batch_of(b), asked=asked, mode="full")
        clock.learn("full", row, b)
        print(f"  full batch B={b}: {_row_text(row)}", flush=True)
        return row

    def time_ok(b: int, tried: dict) -> str | None:
        return clock.why_not(clock.estimate("full", b))

    capacity = torch.cuda.get_device_properties(device).total_memory if device.type == "cuda" else 0
    predict = linear_prediction(capacity) if capacity else None
    found = search_largest(
        fits, plan.full_start, plan.full_granularity, predict=predict, time_ok=time_ok
    )
    best = found["tried"].get(str(found["batch"])) if found["batch"] else None
    if best and best.get("step_s"):
        found["pairs_per_s"] = found["batch"] / best["step_s"]
        found["peak_bytes"] = best["peak_bytes"]
    found["capacity_bytes"] = capacity or None
    found["predicted"] = bool(predict)
    if plan.pretend_limit is not None:
        found["pretended_limit"] = plan.pretend_limit
    return found


def _row_text(row: dict) -> str:
    if not row["fits"]:
        return "out of memory"
    return f"{row['peak_bytes'] / 1e9:.2f} GB, {row['step_s']:.2f} s"


def llm_figures(
    plan: LlmPlan,
    device: torch.device,
    work: Path,
    time_left: Callable[[], float] = lambda: math.inf,
    into: dict | None = None,
) -> dict:
    """The section's figures (see the module's docstring), put into ``into`` as measured."""
    out = {} if into is None else into
    out.update(
        plan={
            "q_len": plan.q_len,
            "p_len": plan.p_len,
            "chunk": plan.chunk,
            "speed_batch": plan.speed_batch,
            "memory_batches": plan.memory_batches,
            "hard_negatives": 1,
            "dtype": plan.dtype,
            "precision": plan.precision,
            "lora": plan.lora,
            "gradient_checkpointing": True,
            "pooling": "last",
        },
        models=[],
    )
    for shape, big in ((plan.big, True), (plan.small, False)):
        row = {"shape": asdict(shape) | {"st_folder": Path(shape.st_folder).name}, "big": big}
        out["models"].append(row)
        clock = _Clock(time_left, plan.small_reserve_s if big else 0.0)
        try:
            _measure(
                shape,
                plan,
                device,
                work,
                clock,
                row,
                search_full=big,
                rounds=plan.big_rounds if big else plan.small_rounds,
                warmups=plan.big_warmups if big else plan.small_warmups,
            )
        except (*gpu_perf.STEP_ERRORS, ImportError, OSError) as exc:  # the next decoder runs
            row["error"] = f"{type(exc).__name__}: {exc}"[:500]
            print(f"  {shape.name}: {row['error']}", flush=True)
        gpu_perf.free_device(device)  # this decoder's weights gone before the next is built
    return out


if __name__ == "__main__":  # the section alone, on the CPU: python -m benchmarks.gpu_llm
    import tempfile

    with tempfile.TemporaryDirectory() as tmp:
        print(json.dumps(llm_figures(DRY_LLM, torch.device("cpu"), Path(tmp)), indent=1)[:4000])
