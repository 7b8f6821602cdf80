"""Peak memory and time of ``contrastive_loss``, direct or tiled, each run in a fresh process
(peak RSS, ``ru_maxrss``, is a high-water mark over the whole process); one JSON line::

    python -m benchmarks.loss --batch 65536 --dim 768 --tile 4096
    python -m benchmarks.loss --batch 16384 --direct                # the untiled loss
    python -m benchmarks.loss --batch 4096 --dim 128 --tokens 32,256 --tile 64   # MaxSim

The sweep saved in ``docs/bench/loss.jsonl`` is rows of this command.
"""

from __future__ import annotations

import argparse
import json
import time

from dpr_cache.runtime.memory import peak_rss_bytes, rss_bytes
from dpr_cache.runtime.processes import run_json_child

DEFAULT_TILE = 4096  # a 64 MB block buffer at fp32 (8192's: 256 MB); docs/bench/loss_memory.md


def _inputs(batch: int, dim: int, tokens: tuple[int, int] | None, seed: int):
    """Random fp32 question and passage reps: [batch, dim] scaled so scores spread over about
    one unit, or unit token vectors [batch, L, dim] of ``tokens`` (question, passage) lengths."""
    import torch

    gen = torch.Generator().manual_seed(seed)
    if tokens is None:
        scale = dim**-0.25
        return (torch.randn(batch, dim, generator=gen).mul_(scale).requires_grad_() for _ in "qp")
    shapes = [(batch, length, dim) for length in tokens]
    units = (torch.nn.functional.normalize(torch.randn(s, generator=gen), dim=-1) for s in shapes)
    return (t.requires_grad_() for t in units)


def _run_child(
    batch: int, dim: int, tile: int | None, *, backward: bool, seed: int, tokens=None
) -> dict:
    import torch

    from dpr_cache.core.loss import contrastive_loss

    rss_import, peak_import = rss_bytes(), peak_rss_bytes()
    q, p = _inputs(batch, dim, tokens, seed)
    rss_inputs, peak_inputs = rss_bytes(), peak_rss_bytes()
    t0, c0 = time.perf_counter(), time.process_time()
    loss = contrastive_loss(q, p, tile_size=tile)
    t1, c1 = time.perf_counter(), time.process_time()
    backward_s = backward_cpu_s = None
    if backward:
        loss.backward()
        backward_s, backward_cpu_s = time.perf_counter() - t1, time.process_time() - c1
    peak = peak_rss_bytes()
    mode = "direct" if tile is None else "tiled"
    row = dict(batch=batch, dim=dim, tile=tile, mode=mode, backward=backward)
    row["tokens"] = list(tokens) if tokens is not None else None
    row.update(threads=torch.get_num_threads(), torch=torch.__version__, loss=float(loss))
    row.update(rss_after_import=rss_import, peak_after_import=peak_import)
    row.update(rss_after_inputs=rss_inputs, peak_after_inputs=peak_inputs, peak_rss=peak)
    row["peak_over_inputs"] = peak - (rss_inputs or peak_inputs)  # current RSS where /proc has it
    row.update(forward_s=t1 - t0, backward_s=backward_s)
    row.update(forward_cpu_s=c1 - c0, backward_cpu_s=backward_cpu_s)
    row["ns_per_score"] = (t1 - t0 + (backward_s or 0.0)) / batch**2 * 1e9
    return row


def measure_loss_memory(
    batch: int,
    dim: int = 768,
    tile: int | None = DEFAULT_TILE,
    *,
    backward=True,
    seed=0,
    tokens=None,
) -> dict:
    """``contrastive_loss`` on random fp32 [batch, dim] inputs in a fresh subprocess (``tile``
    None: the direct loss): memory in bytes (``peak_rss``, ``peak_over_inputs`` = peak minus the
    RSS once the inputs exist) and seconds (wall ``forward_s``, ``backward_s``; process CPU
    ``forward_cpu_s``, ``backward_cpu_s``). ``tokens``: MaxSim over unit token vectors of
    these (question, passage) lengths instead."""
    args = ["--child", "--batch", str(batch), "--dim", str(dim), "--seed", str(seed)]
    args += ["--tokens", ",".join(map(str, tokens))] if tokens is not None else []
    args += ["--direct"] if tile is None else ["--tile", str(tile)]
    return run_json_child("benchmarks.loss", args + ([] if backward else ["--no-backward"]))


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(prog="python -m benchmarks.loss", description=__doc__)
    ap.add_argument("--batch", type=int, default=16384)
    ap.add_argument("--dim", type=int, default=768)
    ap.add_argument("--tile", type=int, default=DEFAULT_TILE)
    ap.add_argument("--direct", action="store_true", help="untiled loss (full score matrix)")
    ap.add_argument("--no-backward", dest="backward", action="store_false")
    ap.add_argument("--seed", type=int, default=0)
    pair = lambda text: tuple(int(x) for x in text.split(","))  # noqa: E731
    ap.add_argument("--tokens", type=pair, help="Q,P: MaxSim over token vectors")
    ap.add_argument("--child", action="store_true", help=argparse.SUPPRESS)
    args = ap.parse_args(argv)
    run = _run_child if args.child else measure_loss_memory
    tile = None if args.direct else args.tile
    kw = {"backward": args.backward, "seed": args.seed, "tokens": args.tokens}
    print(json.dumps(run(args.batch, args.dim, tile, **kw)))


if __name__ == "__main__":
    main()
