"""dpr-cache with its towers compiled (``compile_towers``): GradCache's exactness under compilation
and the training step's rate, the compile's one-time cost apart. Each runs in a child process
(``python -m benchmarks.gpu_compiled exact|speed``), so that what compiling leaves stays out of the
suite's other figures and a compile that hangs is stopped; the child prints each figure as a JSON
line as soon as it is measured, so a child stopped part way keeps those.
"""

from __future__ import annotations

import argparse
import functools
import json
import re
import sys
import time
from dataclasses import replace
from pathlib import Path

import torch

from benchmarks import gpu_exact, gpu_perf
from benchmarks.gpu_cli import child
from benchmarks.gpu_perf import Variant
from benchmarks.harness import option_args
from dpr_cache.model.compiled import compile_towers

COMPILED_REPLAY_BOUND = 1e-4
"""Compiled towers, dropout on, fp32: a chunk's re-forward reps against its first pass's (largest
difference over the largest rep). The passes run different compiled graphs whose roundings differ:
the same masks land near 1e-6, new masks near 1e-1."""
EXACT_BUCKET = 16  # the checks' length bucket: the tiny BERT's rows take one width a tower
STEPS = 3  # under CUDA graphs the first step warms up, the second records, the third replays


def _compile(model, mode: str) -> None:
    compile_towers([model.query_encoder, model.passage_encoder], mode)


def _relative(got: list[torch.Tensor], want: list[torch.Tensor]) -> float:
    """Largest difference over the largest reference value."""
    scale = max(w.abs().max().item() for w in want)
    return max((g - w).abs().max().item() for g, w in zip(got, want, strict=True)) / scale


def fp64_check(device: torch.device, mode: str, size: str = "tiny") -> dict:
    """float64, no dropout: GradCache's gradient on compiled towers at each of :data:`STEPS`
    steps against one eager forward and backward of the whole batch."""
    from dpr_cache.core.engine import GradCache
    from dpr_cache.core.loss import contrastive_loss

    case = gpu_exact.ExactCase(size, 8, 3, 1)
    model = gpu_exact.make_model(size, device, torch.float64)
    q, p, ids = gpu_exact.make_batch(size, case.n_q, case.hard_negatives, device)
    gpu_exact.full_batch_grads(model, q, p, ids)
    params = list(model.parameters())  # by the parameter: a compiled module renames them

    def grads() -> list[torch.Tensor]:
        return [torch.zeros_like(p) if p.grad is None else p.grad.detach().clone() for p in params]

    want, start = grads(), time.perf_counter()
    _compile(model, mode)
    towers = (model.encode_query, model.encode_passage)
    engine = GradCache(*towers, contrastive_loss, case.chunk, length_bucket=EXACT_BUCKET)
    errors, seconds = [], []
    for _ in range(STEPS):
        model.zero_grad(set_to_none=True)
        engine.step(q, p, p_ids=ids)
        errors.append(_relative(grads(), want))
        seconds.append(round(time.perf_counter() - start, 2))
        start = time.perf_counter()
    row = {"case": case.name, "mode": mode, "length_bucket": engine.length_bucket}
    row |= {"errors": errors, "relative_error": max(errors), "bound": gpu_exact.FP64_BOUND}
    return row | {"step_s": seconds, "ok": max(errors) <= gpu_exact.FP64_BOUND}


def replay_check(device: torch.device, mode: str, size: str = "tiny", dropout: float = 0.1) -> dict:
    """Dropout on, fp32, compiled towers, at the last of :data:`STEPS` steps: each chunk's
    re-forward reps against its first pass's with the RNG replayed (within
    :data:`COMPILED_REPLAY_BOUND`) and without (the control: far apart); and the compiled first
    pass against the eager towers' under the same seed."""
    batch = gpu_exact.make_batch(size, 8, 1, device)
    recorded = functools.partial(gpu_exact.recorded_step, batch=batch, length_bucket=EXACT_BUCKET)
    new_model = functools.partial(
        gpu_exact.make_model, size, device, torch.float32, dropout=dropout
    )
    eager_pairs = recorded(new_model(), replay_rng=True)
    model = new_model()
    _compile(model, mode)
    result = {"size": size, "dropout": dropout, "mode": mode, "bound": COMPILED_REPLAY_BOUND}
    for replay, key in ((True, "replayed"), (False, "control_without_replay")):
        for _ in range(STEPS):
            pairs = recorded(model, replay_rng=replay)
        gaps = [_relative([b], [a]) for a, b in pairs]
        within = sum(g <= COMPILED_REPLAY_BOUND for g in gaps)
        result[key] = {"chunks": len(gaps), "within_bound": within, "largest": max(gaps)}
        if replay:
            firsts = zip(pairs, eager_pairs, strict=True)
            result["vs_eager_first_pass"] = max(_relative([c], [e]) for (c, _), (e, _) in firsts)
    replayed, control = result["replayed"], result["control_without_replay"]
    result["ok"] = replayed["within_bound"] == replayed["chunks"] and control["largest"] > 1e-2
    return result


def exactness(device: torch.device, mode: str):
    """The two checks, each yielded as it ends (an error is that check's result), then the
    compiler's counters."""
    for name, check in (("fp64", fp64_check), ("replay", replay_check)):
        start = time.perf_counter()
        try:
            row = check(device, mode)
        except Exception as exc:  # the check's finding: a compiler's error, say
            row = {"error": f"{type(exc).__name__}: {exc}"[:500], "ok": False}
        row["seconds"] = round(time.perf_counter() - start, 1)
        yield name, row
    yield "compiler", _compiler_counters()


def speed(model_dir, squad_gz, squad_dir, device, variants, batch_size, rounds, precision="fp16"):
    """Each compiled variant in a group of its own beside the same setting eager and the full batch
    (on an eager model of its own), interleaved at ``batch_size``, the towers compiled once in the
    first variant's mode; each group yielded as it ends (``comparisons``: all so far), then the
    compiler's counters. The compile's one-time cost is in the compiled rows' warm-ups."""
    from dpr_cache.model.biencoder import BiEncoder

    def load():
        return BiEncoder.from_pretrained(model_dir, shared=True, pooling="cls").to(device).train()

    eager = load()
    batch_of = functools.partial(gpu_perf.squad_batch, eager, squad_gz, squad_dir)
    batch, to_compile, start = batch_of(batch_size), load(), time.perf_counter()
    _compile(to_compile, variants[0].compile_mode)
    yield "compile_call_s", round(time.perf_counter() - start, 2)
    done = []
    peers = {"chunks": [], "cmnrl_rows": [], "cmnrl_tokens": [], "lib_chunks": []}
    for v in variants:
        comparison = gpu_perf.speed_comparison(
            eager,
            batch,
            precision,
            **peers,
            variants=[v, replace(v, compile_mode=None)],  # compiled, and the same eager
            compiled=to_compile,
            rounds=rounds,
            host_waits=False,
            others=[to_compile],
        )
        done.append(gpu_perf.add_fitting_full_batch(eager, comparison, batch_of, rounds, False))
        yield "comparisons", done
        yield "compiler", _compiler_counters()


def _print_each_compile() -> None:
    """A line printed as each compilation ends (its seconds, the count so far), where this torch
    has compile callbacks: a child stopped mid-compile still says what it compiled."""
    try:
        from torch._dynamo.callback import callback_handler
    except ImportError:
        return
    clock = {"start": time.perf_counter(), "n": 0}

    def ended(*_args) -> None:
        clock["n"] += 1
        took = time.perf_counter() - clock["start"]
        print(f"    compile {clock['n']} ended: {took:.1f} s", flush=True)

    callback_handler.register_start_callback(lambda *_: clock.update(start=time.perf_counter()))
    callback_handler.register_end_callback(ended)


def _compiler_counters() -> dict:
    """torch.compile's counts in this process (graphs captured, recompiles, graph breaks) and its
    recompile limit (a frame recompiled that often runs eager from then on)."""
    try:
        import torch._dynamo.config as dynamo_config
        from torch._dynamo.utils import counters
    except ImportError:
        return {}
    limit = getattr(dynamo_config, "recompile_limit", None)
    return {
        "stats": {k: int(v) for k, v in counters.get("stats", {}).items()},
        "recompiles": int(sum(counters.get("recompiles", {}).values())),
        "graph_breaks": int(sum(counters.get("graph_break", {}).values())),
        "recompile_limit": getattr(dynamo_config, "cache_size_limit", None)
        if limit is None
        else limit,
    }


_COMPILE_ENDED = re.compile(r"^compile \d+ ended: ([\d.]+) s$")


def _in_child(args: list[str], timeout: float, on_start=None) -> dict:
    """``python -m benchmarks.gpu_compiled ARGS`` for ``timeout`` seconds at most: the figures it
    printed, each compilation's seconds, and where it failed or ran out of time its exit, last
    lines and last progress lines. ``on_start`` as :func:`child` takes it."""
    cmd = [sys.executable, "-m", "benchmarks.gpu_compiled", *args]
    run = child(cmd, timeout, on_start=on_start)
    found, progress, compiles = {}, [], []
    for line in run["stdout"].splitlines():
        try:
            item = json.loads(line)
        except ValueError:
            progress.append(line.strip())
            ended = _COMPILE_ENDED.match(line.strip())
            compiles += [float(ended[1])] if ended else []
            continue
        if isinstance(item, dict) and "key" in item:
            found[item["key"]] = item["value"]
    found |= {"seconds": run["seconds"], "compiles_s": compiles}
    if run["rc"] != 0:
        lines = run["stderr"].strip().splitlines()
        why = f"out of time after {timeout:.0f} s" if run["rc"] is None else f"exit {run['rc']}"
        found["error"] = {"why": why, "last_lines": lines[-12:], "progress": progress[-12:]}
    return found


def exactness_in_child(device: str, mode: str, timeout: float = 150, on_start=None) -> dict:
    return {
        "mode": mode,
        **_in_child(["exact", "--device", device, "--mode", mode], timeout, on_start),
    }


def speed_in_child(model_dir, squad_gz, squad_dir, device, variants, batch_size, rounds, timeout):
    spec = json.dumps([[v.chunk, v.length_bucket, v.compile_mode] for v in variants])
    paths = {"--model": model_dir, "--squad-gz": squad_gz, "--squad-dir": squad_dir}
    options = {"--device": device, **paths, "--variants": spec}
    options |= {"--batch": batch_size, "--rounds": rounds}
    return {
        "mode": variants[0].compile_mode,
        **_in_child(["speed", *option_args(options)], timeout),
    }


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("kind", choices=["exact", "speed"])
    parser.add_argument("--device", default="cuda")
    parser.add_argument("--mode", default="reduce-overhead")
    for path in ("--model", "--squad-gz", "--squad-dir"):
        parser.add_argument(path, type=Path)
    parser.add_argument("--variants", default="[]", help="JSON: [[chunk, bucket, mode], ...]")
    parser.add_argument("--batch", type=int, default=512)
    parser.add_argument("--rounds", type=int, default=2)
    args = parser.parse_args(argv)
    device = torch.device(args.device)
    _print_each_compile()
    if args.kind == "exact":
        found = exactness(device, args.mode)
    else:
        variants = [Variant(c, b, m) for c, b, m in json.loads(args.variants)]
        paths = (args.model, args.squad_gz, args.squad_dir)
        found = speed(*paths, device, variants, args.batch, args.rounds)
    for key, value in found:
        print(json.dumps({"key": key, "value": value}), flush=True)


if __name__ == "__main__":
    main()
