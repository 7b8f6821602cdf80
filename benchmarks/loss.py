"""Peak memory and time of ``contrastive_loss``, direct or tiled, each run in a fresh process.

Peak resident memory is ``getrusage(RUSAGE_SELF).ru_maxrss``, a high-water mark over the whole
process, so every measurement runs in a subprocess of its own::

    python -m benchmarks.loss --batch 65536 --dim 768 --tile 4096   # one JSON line
    python -m benchmarks.loss --batch 16384 --direct                # the untiled loss
    python -m benchmarks.loss --sweep                               # markdown table
"""

from __future__ import annotations

import argparse
import json
import sys
from collections.abc import Iterable

from dpr_cache.runtime.memory import available_bytes, peak_rss_bytes, rss_bytes
from dpr_cache.runtime.processes import run_json_child

__all__ = [
    "DEFAULT_TILE",
    "SWEEP_BATCHES",
    "estimated_peak_bytes",
    "memory_shortfall",
    "loss_mode",
    "sweep_points",
    "measure_loss_memory",
    "sweep",
    "sweep_table",
]

DEFAULT_TILE = 4096
"""At B=16384, d=768 on 2 CPU cores 4096 and 8192 tie for fastest (1024 and 2048 are 1.4-2.5x
slower); 4096 keeps the block buffer at 64 MB. See docs/bench/loss_memory.md."""

SWEEP_BATCHES = (1024, 4096, 16384, 65536, 262144)
DIRECT_MAX_BATCH = 16384
"""Largest batch the sweep runs untiled: B^2 fp32 scores and ~3 such temporaries fit in ~12 GB."""


def estimated_peak_bytes(batch: int, dim: int, tile: int | None) -> int:
    """Rough peak RSS of one forward + backward, to skip points the machine cannot hold.

    Tiled: about eight fp32 [B, d] buffers (inputs, their grads, the backward's temporaries) plus
    three tile x tile blocks. Direct: about five fp32 [B, B] matrices. Plus ~0.4 GB for torch.
    """
    base = 400 * 2**20
    if tile is None:
        return base + 5 * batch * batch * 4 + 8 * batch * dim * 4
    return base + 8 * batch * dim * 4 + 3 * tile * tile * 4


def loss_mode(tile: int | None) -> str:
    """``direct`` for the untiled loss (``tile=None``), else ``tiled``."""
    return "direct" if tile is None else "tiled"


def sweep_points(
    batches: Iterable[int], tile: int, direct_max: int
) -> list[tuple[int, int | None]]:
    """(batch, tile) in sweep order: per batch the direct loss (``None``, only up to
    ``direct_max``) then the tiled one."""
    return [(b, t) for b in batches for t in ([None] if b <= direct_max else []) + [tile]]


def memory_shortfall(batch: int, dim: int, tile: int | None) -> str | None:
    """Why this point should be skipped ("needs ~X GB, Y GB available"), or None if it fits.

    A point fits if its estimate is at most 80% of the memory available now (Linux
    ``MemAvailable``); where that is unknown every point is run.
    """
    need, free = estimated_peak_bytes(batch, dim, tile), available_bytes()
    if free is None or need <= 0.8 * free:
        return None
    return f"needs ~{need / 1e9:.1f} GB, {free / 1e9:.1f} GB available"


def _run_child(batch: int, dim: int, tile: int | None, backward: bool, seed: int) -> dict:
    """Measure one loss in this process; meant to run in a fresh interpreter."""
    import time

    import torch

    from dpr_cache.core.loss import contrastive_loss

    rss_import, peak_import = rss_bytes(), peak_rss_bytes()
    gen = torch.Generator().manual_seed(seed)
    scale = dim**-0.25  # scores q.p of unit-order spread, as with trained encoders
    q = torch.randn(batch, dim, generator=gen).mul_(scale).requires_grad_()
    p = torch.randn(batch, dim, generator=gen).mul_(scale).requires_grad_()
    rss_inputs, peak_inputs = rss_bytes(), peak_rss_bytes()

    t0, c0 = time.perf_counter(), time.process_time()
    loss = contrastive_loss(q, p, tile_size=tile)
    t1, c1 = time.perf_counter(), time.process_time()
    backward_s = backward_cpu_s = None
    if backward:
        loss.backward()
        backward_s, backward_cpu_s = time.perf_counter() - t1, time.process_time() - c1
    forward_s = t1 - t0
    peak = peak_rss_bytes()
    baseline = rss_inputs or peak_inputs  # current RSS where /proc has it: conservative
    total_s = forward_s + (backward_s or 0.0)
    return {
        "batch": batch,
        "dim": dim,
        "tile": tile,
        "mode": loss_mode(tile),
        "backward": backward,
        "threads": torch.get_num_threads(),
        "torch": torch.__version__,
        "loss": float(loss),
        "rss_after_import": rss_import,
        "peak_after_import": peak_import,
        "rss_after_inputs": rss_inputs,
        "peak_after_inputs": peak_inputs,
        "peak_rss": peak,
        "peak_over_inputs": peak - baseline,
        "forward_s": forward_s,
        "backward_s": backward_s,
        "forward_cpu_s": c1 - c0,
        "backward_cpu_s": backward_cpu_s,
        "ns_per_score": total_s / batch**2 * 1e9,
    }


def measure_loss_memory(
    batch: int,
    dim: int = 768,
    tile: int | None = DEFAULT_TILE,
    *,
    backward: bool = True,
    seed: int = 0,
) -> dict:
    """Run ``contrastive_loss`` on random fp32 [batch, dim] inputs in a fresh subprocess.

    ``tile=None`` is the direct (untiled) loss. Returns the child's figures: memory in bytes
    (``peak_rss``; ``rss_after_import``/``rss_after_inputs`` baselines; ``peak_over_inputs`` =
    peak minus the RSS once the inputs exist) and seconds (``forward_s``, ``backward_s`` wall;
    ``forward_cpu_s``, ``backward_cpu_s`` process CPU time, summed over threads).
    """
    args = ["--child", "--batch", str(batch), "--dim", str(dim), "--seed", str(seed)]
    args += ["--direct"] if tile is None else ["--tile", str(tile)]
    if not backward:
        args.append("--no-backward")
    return run_json_child("benchmarks.loss", args)


def sweep(
    batches: tuple[int, ...] = SWEEP_BATCHES,
    dim: int = 768,
    tile: int = DEFAULT_TILE,
    *,
    direct_max: int = DIRECT_MAX_BATCH,
    echo: bool = False,
) -> list[dict]:
    """Direct (up to ``direct_max``) and tiled loss at each batch size, one subprocess each."""
    rows = []
    for b, t in sweep_points(batches, tile, direct_max):
        if why := memory_shortfall(b, dim, t):
            print(f"B={b} {loss_mode(t)}: skipped, {why}", file=sys.stderr)
            continue
        row = measure_loss_memory(b, dim, t)
        if echo:
            print(json.dumps(row), flush=True)
        rows.append(row)
    return rows


def sweep_table(rows: list[dict]) -> str:
    """Markdown table: B, mode, peak RSS GB, forward s, backward s, ns per score (fwd+bwd)."""
    lines = [
        "| B | mode | peak RSS GB | over inputs GB | forward s | backward s | ns / score |",
        "|---:|---|---:|---:|---:|---:|---:|",
    ]
    for r in rows:
        mode = "direct" if r["tile"] is None else f"tiled ({r['tile']})"
        lines.append(
            f"| {r['batch']} | {mode} | {r['peak_rss'] / 1e9:.2f} | "
            f"{r['peak_over_inputs'] / 1e9:.2f} | {r['forward_s']:.2f} | "
            f"{r['backward_s'] or 0.0:.2f} | {r['ns_per_score']:.2f} |"
        )
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> None:
    """Command line: one run (JSON line) or ``--sweep`` (JSON lines, then a markdown table)."""
    ap = argparse.ArgumentParser(prog="python -m benchmarks.loss", description=__doc__)
    ap.add_argument("--batch", type=int, default=16384)
    ap.add_argument("--dim", type=int, default=768)
    ap.add_argument("--tile", type=int, default=DEFAULT_TILE)
    ap.add_argument("--direct", action="store_true", help="untiled loss (full score matrix)")
    ap.add_argument("--no-backward", dest="backward", action="store_false")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--sweep", action="store_true", help=f"direct and tiled over {SWEEP_BATCHES}")
    ap.add_argument("--child", action="store_true", help=argparse.SUPPRESS)
    args = ap.parse_args(argv)
    tile = None if args.direct else args.tile
    if args.child:
        print(json.dumps(_run_child(args.batch, args.dim, tile, args.backward, args.seed)))
    elif args.sweep:
        print(sweep_table(sweep(dim=args.dim, tile=args.tile, echo=True)))
    else:
        row = measure_loss_memory(
            args.batch, args.dim, tile, backward=args.backward, seed=args.seed
        )
        print(json.dumps(row))


if __name__ == "__main__":
    main()
