"""The ``llm`` section (issue 57): random decoders of Mistral-7B's and Qwen2-0.5B's shapes trained
as ``configs/llm_lora.yaml`` trains them: a step's peak memory by batch, the 7B's largest full
batch, and pairs per second against the full batch and CachedMNRL; what would not fit in the time
left is skipped. The dry run uses two tiny decoders, a pretended limit its "out of memory"."""

from __future__ import annotations

import contextlib
import functools
import time
from collections import namedtuple
from pathlib import Path
from unittest import mock

import torch

from benchmarks.gpu import perf
from benchmarks.gpu.perf import search_largest
from dpr_cache.data.collate import Batch

TOY = Path(__file__).resolve().parents[2] / "data" / "toy"
LLAMA, QWEN = str(TOY / "tiny-llama"), str(TOY / "tiny-qwen2")

# family: transformers' model_type; eos: the id ending every text (read by last-token pooling);
# tied: input and output embeddings tied; st_folder: a toy of the family for sentence-transformers
DecoderShape = namedtuple(
    "DecoderShape", "name family layers hidden heads kv_heads intermediate vocab eos tied st_folder"
)
MISTRAL_7B = DecoderShape("Mistral-7B", "mistral", 32, 4096, 32, 8, 14336, 32000, 2, False, LLAMA)
QWEN2_05B = DecoderShape("Qwen2-0.5B", "qwen2", 24, 896, 14, 2, 4864, 151936, 151643, True, QWEN)
TINY_MISTRAL = MISTRAL_7B._replace(name="tiny (Mistral family)", layers=2, hidden=32, heads=4)
TINY_MISTRAL = TINY_MISTRAL._replace(kv_heads=2, intermediate=64, vocab=512)
TINY_QWEN2 = DecoderShape("tiny (Qwen2 family)", "qwen2", 2, 32, 4, 2, 64, 512, 0, True, QWEN)
LORA = {"r": 16, "alpha": 32, "dropout": 0.1, "target_modules": "all-linear"}

_PLAN = {  # field: (on a device, in the dry run)
    "big":              (MISTRAL_7B,      TINY_MISTRAL),  # the goals' decoder
    "small":            (QWEN2_05B,       TINY_QWEN2),  # the faster row (memory, speed)
    "q_len":            (64,              8),
    "p_len":            (256,             16),
    "memory_batches":   ([64, 256, 1024], [4, 8, 16]),
    "chunk":            (32,              2),  # configs/llm_lora.yaml's
    "speed_batch":      (256,             8),
    "rounds":           ((1, 2),          (1, 1)),  # big, small; a 7B step at B=256 is ~20 s
    "warmups":          ((0, 1),          (0, 1)),  # the 7B's kernels warmed by its memory rows
    "full_start":       (128,             2),  # the largest full batch's first try
    "full_granularity": (32,              2),  # ... and the resolution it stops at
    "small_reserve_s":  (60,              0),  # seconds the big decoder leaves to the small one
    "pretend_limit":    (None,            11),  # a full batch above it "runs out of memory"
    "dtype":            ("bf16",          "bf16"),  # model.dtype
    "precision":        ("bf16",          "bf16"),  # train.precision (autocast)
    "lora":             (LORA,            LORA),
}  # fmt: skip
LlmPlan = namedtuple("LlmPlan", _PLAN)
GPU_LLM = LlmPlan(*(gpu for gpu, _ in _PLAN.values()))
DRY_LLM = LlmPlan(*(dry for _, dry in _PLAN.values()))


_CONFIG_NAMES = {"vocab": "vocab_size", "hidden": "hidden_size", "layers": "num_hidden_layers"}
_CONFIG_NAMES |= {"heads": "num_attention_heads", "kv_heads": "num_key_value_heads"}
_CONFIG_NAMES |= {"intermediate": "intermediate_size", "eos": "eos_token_id"}


def _decoder_config(shape: DecoderShape, dtype: torch.dtype):
    from transformers import AutoConfig

    sizes = {name: getattr(shape, field) for field, name in _CONFIG_NAMES.items()}
    if shape.family == "mistral":
        sizes |= {"rms_norm_eps": 1e-5, "bos_token_id": 1, "sliding_window": 4096}
    else:
        sizes |= {"rms_norm_eps": 1e-6, "bos_token_id": None}
    options = {"max_position_embeddings": 32768, "attention_dropout": 0.0, "dtype": dtype}
    return AutoConfig.for_model(shape.family, tie_word_embeddings=shape.tied, **sizes, **options)


def build_decoder(shape: DecoderShape, plan: LlmPlan, device: torch.device):
    """A shared-tower BiEncoder of ``shape`` on ``device``, as ``plan`` describes it."""
    from dpr_cache.config import LoraConfig
    from dpr_cache.model.biencoder import BiEncoder
    from dpr_cache.model.decoders import torch_dtype

    torch.manual_seed(0)
    options = {"shared": True, "pooling": "last", "gradient_checkpointing": True}
    config, lora = _decoder_config(shape, torch_dtype(plan.dtype)), LoraConfig(**plan.lora)
    with torch.device(device):
        model = BiEncoder.from_config(config, normalize=False, lora=lora, **options)
    model.weights_dtype = plan.dtype
    model.max_query_length, model.max_passage_length = plan.q_len, plan.p_len
    return model.train()


def decoder_batch(shape: DecoderShape, n_q: int, q_len: int, p_len: int) -> Batch:
    """:func:`~benchmarks.gpu.perf.synthetic_pairs` for a decoder: no token types, EOS last."""
    batch = perf.synthetic_pairs(shape.vocab, n_q, q_len, p_len)
    for rows in (batch.q_inputs, batch.p_inputs):
        del rows["token_type_ids"]
        rows["input_ids"][:, -1] = shape.eos
    return batch


def _config(plan: LlmPlan, shape: DecoderShape, work: Path, device: torch.device, **train):
    """The run config a user would write for this model, with ``train`` keys."""
    from dpr_cache.config import load_config

    lora = ", ".join(f"{k}: {v}" for k, v in plan.lora.items())
    model = [f"name_or_path={work / shape.family}", "shared=true", "pooling=last"]  # see _prebuilt
    model += ["normalize=false", f"dtype={plan.dtype}", "gradient_checkpointing=true"]
    model += [f"max_query_length={plan.q_len}", f"max_passage_length={plan.p_len}"]
    runs = {"lr": "1e-4", "temperature": "1.0", "hard_negatives": 1, "precision": plan.precision}
    sets = [f"output_dir={work}", *(f"model.{s}" for s in model), f"model.lora={{{lora}}}"]
    runs |= {"device": device, **train}
    return load_config(None, sets + [f"train.{k}={v}" for k, v in runs.items()])


@contextlib.contextmanager
def _prebuilt(model, asked: dict):
    """``build_trainer``'s loading answered with ``model`` (a 7B's folder would be 14.5 GB); what
    it asked for into ``asked``, a setting the model was not built with an error."""
    import dpr_cache.train.trainer as trainer_module

    def load(path, **kwargs):
        keys = ("shared", "pooling", "gradient_checkpointing", "dtype", "normalize")
        wanted = {k: kwargs.get(k) for k in keys}
        wanted["lora"] = kwargs["lora"].model_dump() if kwargs.get("lora") is not None else None
        asked.update(wanted)
        built = {k: getattr(model, k) for k in ("shared", "pooling", "normalize")}
        built["dtype"] = model.weights_dtype
        differ = {k: (wanted[k], v) for k, v in built.items() if wanted[k] != v}
        if differ or not (model.has_adapters and wanted["gradient_checkpointing"]):
            raise ValueError(f"the config asks for another model than the one built: {differ}")
        return model

    with mock.patch.object(trainer_module, "load_biencoder", load):
        yield


def trainer_step(model, plan, shape, batch: Batch, work: Path, device, asked: dict, **train):
    """Peak memory and seconds of one ``Trainer.step`` from the config ``train`` describes."""
    from dpr_cache.runtime.distributed import DistEnv
    from dpr_cache.train.trainer import build_trainer

    config = _config(plan, shape, work, device, batch_size=batch.n_questions, **train)
    model.zero_grad(set_to_none=True)
    perf.free_device(device)
    base = torch.cuda.memory_allocated(device) if device.type == "cuda" else None
    with _prebuilt(model, asked):
        trainer = build_trainer(config, DistEnv(device=device), total_steps=10)
    limit = plan.pretend_limit if train.get("mode") == "full" else None
    try:
        if limit is not None and batch.n_questions > limit:  # the dry run's pretended OOM
            row = {"peak_bytes": None, "step_s": None, "fits": False}
        else:
            row = perf.step_row(trainer, batch, device)
    finally:
        del trainer
        model.zero_grad(set_to_none=True)
        perf.free_device(device)
    return {**row, "resident_bytes": base}


def linear_prediction(capacity: int, margin: float = 0.97):
    """``predict`` for :func:`search_largest`: where a line through the fitting tries' peaks (or
    one and the memory resident before it) reaches ``margin`` of ``capacity``."""

    def predict(tried: dict[int, dict]) -> int | None:
        points = sorted((b, r["peak_bytes"]) for b, r in tried.items() if r.get("peak_bytes"))
        if len(points) == 1:
            base = tried[points[0][0]].get("resident_bytes")
            points = [(0, base)] + points if base is not None and points[0][1] > base else []
        if not points:
            return None
        (b0, p0), (b1, p1) = points[-2:]
        slope = (p1 - p0) / (b1 - b0)
        return int(b1 + (margin * capacity - p1) / slope) if slope > 0 else None

    return predict


class _Clock:
    """The section's seconds left less ``reserve``, against a measurement's expected seconds."""

    def __init__(self, time_left, reserve: float) -> None:
        self.time_left, self.reserve = time_left, reserve
        self.per_question: dict[str, float] = {}  # seconds a question a step, by mode

    def learn(self, mode: str, row: dict, n_q: int) -> None:
        if row.get("step_s"):
            self.per_question[mode] = max(row["step_s"] / n_q, self.per_question.get(mode, 0.0))

    def why_not(self, mode: str, n_q: int, steps: float = 1.0) -> str | None:
        """Why a measurement of ``steps`` steps at ``n_q`` is not started (None: it is)."""
        rate = self.per_question.get(mode) or self.per_question.get("gradcache")
        seconds, left = rate and 1.3 * rate * n_q * steps, self.time_left() - self.reserve
        if seconds is None or seconds <= left:
            return None
        kept = f" ({self.reserve:.0f} s kept for what follows)" if self.reserve else ""
        return f"out of time: about {seconds:.0f} s needed, {max(left, 0):.0f} s left{kept}"


def _measure(shape, plan: LlmPlan, device, work: Path, clock: _Clock, out: dict, big: bool) -> None:
    """One decoder's rows into ``out``: memory by batch around the speed comparison, then
    (``big``) the largest full batch."""
    start = time.monotonic()
    model = build_decoder(shape, plan, device)
    params = list(model.parameters())
    out["build_s"] = round(time.monotonic() - start, 2)
    out["parameters"] = sum(p.numel() for p in params)
    out["trainable"] = sum(p.numel() for p in params if p.requires_grad)
    out["trainable_dtypes"] = sorted({str(p.dtype) for p in params if p.requires_grad})
    out["base_dtype"] = str(next(p.dtype for p in params if not p.requires_grad))
    out["attention"] = getattr(model.query_encoder.config, "_attn_implementation", None)
    batch_of = functools.cache(lambda n: decoder_batch(shape, n, plan.q_len, plan.p_len))
    where = {"work": work, "device": device, "asked": out.setdefault("trainer_asked", {})}
    step = functools.partial(trainer_step, model, plan, shape, **where)
    memory = out.setdefault("memory", [])
    for b in sorted(plan.memory_batches, key=lambda b: b > plan.speed_batch):
        if b > plan.speed_batch and "speed" not in out:
            out["speed"] = _speed(model, shape, plan, batch_of, clock, big)
        chunk, why = min(plan.chunk, b), clock.why_not("gradcache", b)
        row = {"skipped": why} if why else step(batch_of(b), mode="gradcache", chunk_size=chunk)
        row = {"batch": b, "chunk": chunk, **row}
        memory.append(row)
        clock.learn("gradcache", row, b)
        print(f"  {shape.name} GradCache B={b}: {_row_text(row)}", flush=True)
    if "speed" not in out:
        out["speed"] = _speed(model, shape, plan, batch_of, clock, big)
    if big:
        out["largest_full_batch"] = _largest_full(plan, device, clock, step, batch_of)
    batch_of.cache_clear()


def _speed(model, shape, plan: LlmPlan, batch_of, clock: _Clock, big: bool) -> dict:
    """dpr-cache, the full batch and CachedMNRL interleaved at ``plan.speed_batch``."""
    rounds, warmups = plan.rounds[not big], plan.warmups[not big]
    # the full batch and CachedMNRL cost about the GradCache step's each
    why = clock.why_not("gradcache", plan.speed_batch, 3 * (rounds + warmups))
    if why:
        return {"batch": plan.speed_batch, "skipped": why}
    peers = {"chunks": [plan.chunk], "cmnrl_rows": [plan.chunk], "cmnrl_folder": shape.st_folder}
    peers |= {"rounds": rounds, "warmups": warmups, "batch_of": batch_of}
    speed = perf.speed_comparison(model, batch_of(plan.speed_batch), plan.precision, **peers)
    print(f"  {shape.name} speed B={plan.speed_batch}: {speed['best']}", flush=True)
    return speed


def _largest_full(plan: LlmPlan, device, clock: _Clock, step, batch_of) -> dict:
    """The largest full batch that fits and its pairs per second (on a device predicted)."""

    def fits(b: int) -> dict:
        row = step(batch_of(b), mode="full")
        clock.learn("full", row, b)
        print(f"  full batch B={b}: {_row_text(row)}", flush=True)
        return row

    capacity = torch.cuda.get_device_properties(device).total_memory if device.type == "cuda" else 0
    predict = linear_prediction(capacity) if capacity else None
    options = {"predict": predict, "time_ok": lambda b, tried: clock.why_not("full", b)}
    found = search_largest(fits, plan.full_start, plan.full_granularity, **options)
    best = found["tried"].get(str(found["batch"])) if found["batch"] else None
    if best and best.get("step_s"):
        found |= {"pairs_per_s": found["batch"] / best["step_s"], "peak_bytes": best["peak_bytes"]}
    found |= {"capacity_bytes": capacity or None, "predicted": bool(predict)}
    if plan.pretend_limit is not None:
        found["pretended_limit"] = plan.pretend_limit
    return found


def _row_text(row: dict) -> str:
    if "skipped" in row or not row["fits"]:
        return row.get("skipped", "out of memory")
    return f"{row['peak_bytes'] / 1e9:.2f} GB, {row['step_s']:.2f} s"


_PLAN_KEYS = "q_len p_len chunk speed_batch memory_batches dtype precision lora".split()


def llm_figures(plan: LlmPlan, device, work: Path, time_left, out: dict) -> dict:
    """The section's figures (see the module's docstring), put into ``out`` as measured."""
    out["plan"] = {k: getattr(plan, k) for k in _PLAN_KEYS} | {"hard_negatives": 1}
    out["plan"] |= {"gradient_checkpointing": True, "pooling": "last"}
    out["models"] = []
    for shape, big in ((plan.big, True), (plan.small, False)):
        row = {"shape": shape._asdict() | {"st_folder": Path(shape.st_folder).name}, "big": big}
        out["models"].append(row)
        clock = _Clock(time_left, plan.small_reserve_s if big else 0.0)
        try:
            _measure(shape, plan, device, work, clock, row, big)
        except (*perf.STEP_ERRORS, ImportError, OSError) as exc:  # the next decoder runs
            row["error"] = f"{type(exc).__name__}: {exc}"[:500]
            print(f"  {shape.name}: {row['error']}", flush=True)
        perf.free_device(device)  # this decoder's weights gone before the next is built
    return out
