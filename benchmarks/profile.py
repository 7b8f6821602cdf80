"""Where a GradCache step's time goes: each engine phase (:data:`PHASES`) timed by wrapping its
method, then AdamW's step, the median over ``repeats`` steps after ``warmup``, dropout on, then
off (eval mode); one JSON line (the spec, its collate time, each phase's seconds)::

    python -m benchmarks.profile '{"mode": "gradcache", "batch": 128, "text": "..."}'
"""

from __future__ import annotations

import dataclasses
import statistics
import time
from collections import defaultdict

import torch

from benchmarks.point import PointSpec, child_main, load_point, point_stepper

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
    step = _timed(lambda: engine.step(q, p, p_ids=ids), "step", record)
    out: dict = {**dataclasses.asdict(spec), "collate_s": collate_s}
    for dropout in (True, False):
        model.train(dropout)
        steps = []
        for _ in range(spec.warmup + spec.repeats):
            record.clear()
            model.zero_grad(set_to_none=True)
            step()
            _timed(optimizer.step, "optimizer", record)()
            steps.append(dict(record))
        out["dropout_on" if dropout else "dropout_off"] = {
            phase: statistics.median(s.get(phase, 0.0) for s in steps[spec.warmup :])
            for phase in (*PHASES, "optimizer", "step")
        }
    out["threads_used"] = torch.get_num_threads()
    return out


def main(argv: list[str] | None = None) -> None:
    child_main("benchmarks.profile", profile_point, argv)


if __name__ == "__main__":
    main()
