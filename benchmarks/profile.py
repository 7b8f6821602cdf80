"""Where a GradCache training step's time goes, phase by phase, on one benchmark point.

Phases: collate (tokenizing the batch), split (ordering and chunking), the graph-less forward
of both towers, the forward of the kept last chunks, the loss and its gradient (the cache), the
re-forward with backward, and the optimizer (AdamW, as the trainer's). Each phase is timed by
wrapping the engine's method of the same name, over ``repeats`` steps after ``warmup``, first
with the model's dropout on, then off (eval mode): the difference is what drawing dropout masks
costs in each phase. Meant to run in a fresh process:

    python -m benchmarks.profile '{"mode": "gradcache", "batch": 128, "text": "..."}'

prints one JSON line: the spec and, per dropout setting, the median seconds of each phase.
"""

from __future__ import annotations

import dataclasses
import json
import statistics
import sys
import time
from collections import defaultdict

import torch

from benchmarks.point import PointSpec, load_point, point_stepper

__all__ = ["PHASES", "profile_point"]

PHASES = ("split", "forward_no_grad", "forward_last", "build_cache", "forward_backward")


def _timed(method, phase: str, record: dict[str, float]):
    def wrapper(*args, **kwargs):
        start = time.perf_counter()
        try:
            return method(*args, **kwargs)
        finally:
            record[phase] += time.perf_counter() - start

    return wrapper


def profile_point(spec: PointSpec) -> dict:
    """Median seconds per phase of ``spec``'s GradCache step, dropout on and off."""
    if spec.mode != "gradcache":
        raise ValueError(f"profile needs mode gradcache, got {spec.mode!r}")
    if spec.threads:
        torch.set_num_threads(spec.threads)
    torch.manual_seed(spec.seed)
    model, q, p, ids, collate_s = load_point(spec)
    engine = point_stepper(spec, model)
    record: dict[str, float] = defaultdict(float)
    for phase in PHASES:
        setattr(engine, phase, _timed(getattr(engine, phase), phase, record))
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-12)  # a step that changes ~nothing
    out: dict = {**dataclasses.asdict(spec), "collate_s": collate_s}
    for dropout in (True, False):
        model.train(dropout)
        steps = []
        for i in range(spec.warmup + spec.repeats):
            record.clear()
            model.zero_grad(set_to_none=True)
            start = time.perf_counter()
            engine.step(q, p, p_ids=ids)
            record["step"] = time.perf_counter() - start
            start = time.perf_counter()
            optimizer.step()
            record["optimizer"] = time.perf_counter() - start
            if i >= spec.warmup:
                steps.append(dict(record))
        out["dropout_on" if dropout else "dropout_off"] = {
            phase: statistics.median(s.get(phase, 0.0) for s in steps)
            for phase in (*PHASES, "optimizer", "step")
        }
    out["threads_used"] = torch.get_num_threads()
    return out


def main(argv: list[str] | None = None) -> None:
    """Profile the point given as a JSON object; print the result as one JSON line."""
    argv = sys.argv[1:] if argv is None else argv
    if len(argv) != 1:
        raise SystemExit("usage: python -m benchmarks.profile '<json PointSpec>'")
    from dpr_cache.runtime.quiet import quiet_libraries

    quiet_libraries()
    print(json.dumps(profile_point(PointSpec(**json.loads(argv[0])))), flush=True)


if __name__ == "__main__":
    main()
