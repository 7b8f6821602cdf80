"""dpr-cache with its towers compiled (``torch.compile``, through
``dpr_cache.model.compiled.compile_towers``): GradCache's exactness under compilation, and the
training step's rate with the compile's one-time cost set apart.

Each runs in a child process of its own (``python -m benchmarks.gpu_compiled exact|speed``):
what compiling leaves in a process (the compiler's caches, the memory CUDA graphs hold) stays
out of the suite's other figures, and a compile that hangs is stopped with its stack. The child
prints each figure as a JSON line as soon as it is measured, so a child stopped part way keeps
those.
"""

from __future__ import annotations

import argparse
import json
import re
import sys
import time
from collections.abc import Iterator
from dataclasses import replace
from pathlib import Path

import torch

from benchmarks import gpu_exact, gpu_perf
from benchmarks.gpu_cli import child
from benchmarks.gpu_perf import Variant
from dpr_cache.model.compiled import compile_towers

__all__ = [
    "COMPILED_REPLAY_BOUND",
    "fp64_check",
    "replay_check",
    "exactness_in_child",
    "speed",
    "speed_in_child",
]

COMPILED_REPLAY_BOUND = 1e-4
"""Compiled towers, dropout on, fp32: a chunk's re-forward reps against its first pass's
(largest difference over the largest rep). The two passes run different compiled graphs (one
without autograd, one for the backward) whose roundings differ, so the replay is judged to
fp32's rounding, not bit for bit: the same masks land near 1e-6, a mask drawn anew near
dropout's own effect, 1e-1."""
EXACT_BUCKET = 16
"""The checks' length bucket: the tiny BERT's rows (9 and 12 tokens at most) then take one
width a tower, so that its compiled shapes are few."""
STEPS = 3
"""Steps each check runs: under CUDA graphs the first warms up, the second records, the third
replays the recorded graphs."""


def _compile(model, mode: str) -> None:
    """``model``'s towers compiled in place in ``mode`` (one, where they are shared)."""
    compile_towers([model.query_encoder, model.passage_encoder], mode)


def _engine(encode_q, encode_p, chunk: int, **options):
    """GradCache on these encoders, chunk widths rounded up to :data:`EXACT_BUCKET`."""
    from dpr_cache.core.engine import GradCache
    from dpr_cache.core.loss import contrastive_loss

    return GradCache(
        encode_q, encode_p, contrastive_loss, chunk, length_bucket=EXACT_BUCKET, **options
    )


def _grads(params: list[torch.Tensor]) -> list[torch.Tensor]:
    """Each parameter's gradient, by the parameter itself (a compiled module renames them)."""
    return [p.grad.detach().clone() if p.grad is not None else torch.zeros_like(p) for p in params]


def _relative(got: list[torch.Tensor], want: list[torch.Tensor]) -> float:
    """Largest difference over the largest reference value."""
    scale = max(w.abs().max().item() for w in want)
    return max((g - w).abs().max().item() for g, w in zip(got, want, strict=True)) / scale


def fp64_check(device: torch.device, mode: str, size: str = "tiny") -> dict:
    """float64, no dropout: the gradient of GradCache on compiled towers, at each of
    :data:`STEPS` steps, against one eager forward and backward of the whole batch."""
    case = gpu_exact.ExactCase(size, 8, 3, 1)
    model = gpu_exact.make_model(size, device, torch.float64)
    params = list(model.parameters())
    q, p, ids = gpu_exact.make_batch(size, case.n_q, case.hard_negatives, device)
    gpu_exact.full_batch_grads(model, q, p, ids)
    want = _grads(params)
    start = time.perf_counter()
    _compile(model, mode)
    engine = _engine(model.encode_query, model.encode_passage, case.chunk)
    errors, seconds = [], []
    for _ in range(STEPS):
        model.zero_grad(set_to_none=True)
        engine.step(q, p, p_ids=ids)
        errors.append(_relative(_grads(params), want))
        seconds.append(round(time.perf_counter() - start, 2))
        start = time.perf_counter()
    worst = max(errors)
    return {
        "case": case.name,
        "mode": mode,
        "length_bucket": engine.length_bucket,
        "errors": errors,
        "relative_error": worst,
        "bound": gpu_exact.FP64_BOUND,
        "step_s": seconds,
        "ok": worst <= gpu_exact.FP64_BOUND,
    }


def _first_and_again(size: str, encode_q, encode_p, model, replay: bool, device) -> list:
    """One GradCache step (dropout on, every chunk re-encoded, seed 7) with each encoder's
    outputs recorded: (first pass, re-forward) reps of every chunk."""
    q, p, ids = gpu_exact.make_batch(size, 8, 1, device)
    rec_q, rec_p = gpu_exact._Recorder(encode_q), gpu_exact._Recorder(encode_p)
    engine = _engine(rec_q, rec_p, 3, keep_last_graph=False, replay_rng=replay)
    model.zero_grad(set_to_none=True)
    torch.manual_seed(7)
    engine.step(q, p, p_ids=ids)
    pairs = []
    for rec in (rec_q, rec_p):
        n = len(rec.outputs) // 2
        pairs += list(zip(rec.outputs[:n], rec.outputs[n:], strict=True))
    return pairs


def replay_check(device: torch.device, mode: str, size: str = "tiny", dropout: float = 0.1) -> dict:
    """Dropout on, fp32, compiled towers: each chunk's re-forward reps against its first pass's
    with the RNG replayed (the same masks: within :data:`COMPILED_REPLAY_BOUND`) and without
    (the control: far apart), at the last of :data:`STEPS` steps; and the compiled first pass
    against the eager towers' under the same seed (whether compiled dropout draws eager's
    masks)."""
    eager = gpu_exact.make_model(size, device, torch.float32, dropout=dropout)
    eager_pairs = _first_and_again(
        size, eager.encode_query, eager.encode_passage, eager, True, device
    )
    model = gpu_exact.make_model(size, device, torch.float32, dropout=dropout)
    _compile(model, mode)
    result = {"size": size, "dropout": dropout, "mode": mode, "bound": COMPILED_REPLAY_BOUND}
    for replay in (True, False):
        for _ in range(STEPS):
            pairs = _first_and_again(
                size, model.encode_query, model.encode_passage, model, replay, device
            )
        gaps = [_relative([b], [a]) for a, b in pairs]
        key = "replayed" if replay else "control_without_replay"
        result[key] = {
            "chunks": len(gaps),
            "within_bound": sum(g <= COMPILED_REPLAY_BOUND for g in gaps),
            "largest": max(gaps),
        }
        if replay:
            result["vs_eager_first_pass"] = max(
                _relative([c], [e]) for (c, _), (e, _) in zip(pairs, eager_pairs, strict=True)
            )
    result["ok"] = (
        result["replayed"]["within_bound"] == result["replayed"]["chunks"]
        and result["control_without_replay"]["largest"] > 1e-2
    )
    return result


def exactness(device: torch.device, mode: str) -> Iterator[tuple[str, dict]]:
    """The two checks, each as it ends (an error is that check's result)."""
    for name, check in (("fp64", fp64_check), ("replay", replay_check)):
        start = time.perf_counter()
        try:
            row = check(device, mode)
        except Exception as exc:  # the check's finding: a compiler's error, say
            row = {"error": f"{type(exc).__name__}: {exc}"[:500], "ok": False}
        row["seconds"] = round(time.perf_counter() - start, 1)
        yield name, row


def speed(
    model_dir: Path,
    squad_gz: Path,
    squad_dir: Path,
    device: torch.device,
    variants: list[Variant],
    batch_size: int,
    rounds: int,
    precision: str = "fp16",
) -> Iterator[tuple[str, dict]]:
    """Each compiled variant in a group of its own, in order, its step beside the same
    setting eager and the full batch (a model of its own, eager), interleaved at
    ``batch_size``, the towers compiled once for all of them in the first variant's mode. Each
    group is yielded as it ends (``comparisons``, every group so far), so that a stop in a later
    variant's compilations keeps an earlier one's rows. The compile's one-time cost is in each
    compiled row's warm-up steps (the first compiles), not in its pairs/s; the compiler's
    counters after each group."""
    from dpr_cache.model.biencoder import BiEncoder

    def load():
        model = BiEncoder.from_pretrained(model_dir, shared=True, pooling="cls")
        return model.to(device).train()

    eager = load()
    batch = gpu_perf.squad_batch(eager, squad_gz, squad_dir, batch_size)
    to_compile = load()
    start = time.perf_counter()
    _compile(to_compile, variants[0].compile_mode)
    yield "compile_call_s", round(time.perf_counter() - start, 2)
    done = []
    for v in variants:
        comparison = gpu_perf.speed_comparison(
            eager,
            batch,
            precision,
            chunks=[],
            cmnrl_rows=[],
            cmnrl_tokens=[],
            lib_chunks=[],
            variants=[v, replace(v, compile_mode=None)],  # compiled, and the same eager
            compiled=to_compile,
            rounds=rounds,
            host_waits=False,
            others=[to_compile],
        )
        done.append(
            gpu_perf.add_fitting_full_batch(
                eager,
                comparison,
                lambda n: gpu_perf.squad_batch(eager, squad_gz, squad_dir, n),
                rounds,
                host_waits=False,
            )
        )
        yield "comparisons", done
        yield "compiler", _compiler_counters()


def _print_each_compile() -> None:
    """A line printed as each of torch.compile's compilations ends (its seconds, the count so
    far), where this torch has compile callbacks: a child stopped mid-compile still says how
    many graphs it compiled and how long each took."""
    try:
        from torch._dynamo.callback import callback_handler
    except ImportError:
        return
    clock = {"start": time.perf_counter(), "n": 0}

    def started(*_args) -> None:
        clock["start"] = time.perf_counter()

    def ended(*_args) -> None:
        clock["n"] += 1
        took = time.perf_counter() - clock["start"]
        print(f"    compile {clock['n']} ended: {took:.1f} s", flush=True)

    callback_handler.register_start_callback(started)
    callback_handler.register_end_callback(ended)


def _compiler_counters() -> dict:
    """torch.compile's counts in this process (graphs captured, recompiles, graph breaks) and
    its recompile limit (a frame recompiled that often runs eager from then on), where this
    torch keeps them."""
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
    """``python -m benchmarks.gpu_compiled ARGS`` for ``timeout`` seconds at most: the figures
    it printed (each a JSON line), and where it failed or ran out of time, its exit code, last
    lines and its last progress lines. ``on_start`` as :func:`child` takes it."""
    cmd = [sys.executable, "-m", "benchmarks.gpu_compiled", *args]
    run = child(cmd, timeout, on_start=on_start)
    found, progress, compiles = {}, [], []
    for line in run["stdout"].splitlines():
        try:
            item = json.loads(line)
        except ValueError:
            progress.append(line.strip())
            ended = _COMPILE_ENDED.match(line.strip())
            if ended:
                compiles.append(float(ended[1]))
            continue
        if isinstance(item, dict) and "key" in item:
            found[item["key"]] = item["value"]
    found["seconds"] = run["seconds"]
    found["compiles_s"] = compiles  # each compilation's seconds, in order
    if run["rc"] != 0:
        lines = run["stderr"].strip().splitlines()
        why = f"out of time after {timeout:.0f} s" if run["rc"] is None else f"exit {run['rc']}"
        found["error"] = {"why": why, "last_lines": lines[-12:], "progress": progress[-12:]}
    return found


def exactness_in_child(device: str, mode: str, timeout: float = 150, on_start=None) -> dict:
    """:func:`exactness` in a child."""
    args = ["exact", "--device", device, "--mode", mode]
    return {"mode": mode, **_in_child(args, timeout, on_start)}


def speed_in_child(
    model_dir: Path,
    squad_gz: Path,
    squad_dir: Path,
    device: str,
    variants: list[Variant],
    batch_size: int,
    rounds: int,
    timeout: float,
) -> dict:
    """:func:`speed` in a child."""
    spec = [[v.chunk, v.length_bucket, v.compile_mode] for v in variants]
    args = [
        "speed",
        "--device",
        device,
        "--model",
        str(model_dir),
        "--squad-gz",
        str(squad_gz),
        "--squad-dir",
        str(squad_dir),
        "--variants",
        json.dumps(spec),
        "--batch",
        str(batch_size),
        "--rounds",
        str(rounds),
    ]
    return {"mode": variants[0].compile_mode, **_in_child(args, timeout)}


def _emit(key: str, value) -> None:
    print(json.dumps({"key": key, "value": value}), flush=True)


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("kind", choices=["exact", "speed"])
    parser.add_argument("--device", default="cuda")
    parser.add_argument("--mode", default="reduce-overhead")
    parser.add_argument("--model", type=Path)
    parser.add_argument("--squad-gz", type=Path)
    parser.add_argument("--squad-dir", type=Path)
    parser.add_argument("--variants", default="[]", help="JSON: [[chunk, bucket, mode], ...]")
    parser.add_argument("--batch", type=int, default=512)
    parser.add_argument("--rounds", type=int, default=2)
    args = parser.parse_args(argv)
    device = torch.device(args.device)
    _print_each_compile()
    if args.kind == "exact":
        for name, row in exactness(device, args.mode):
            _emit(name, row)
        _emit("compiler", _compiler_counters())
        return
    variants = [Variant(c, b, m) for c, b, m in json.loads(args.variants)]
    steps = speed(
        args.model, args.squad_gz, args.squad_dir, device, variants, args.batch, args.rounds
    )
    for name, value in steps:
        _emit(name, value)


if __name__ == "__main__":
    main()
