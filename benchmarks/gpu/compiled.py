"""dpr-cache with its towers compiled: GradCache's exactness and the step's rate, each in a child
(``python -m benchmarks.gpu.compiled exact|speed JSON``) printing each figure as a JSON line."""

from __future__ import annotations

import functools
import json
import re
import sys
import time
from pathlib import Path

import torch

from benchmarks.gpu import exact, perf
from benchmarks.gpu.cli import child
from benchmarks.gpu.perf import Variant
from dpr_cache.model.compiled import compile_towers

# compiled, dropout on, fp32: re-forward vs first pass (their graphs' roundings differ: ~1e-6)
COMPILED_REPLAY_BOUND = 1e-4
EXACT_BUCKET = 16  # the checks' length bucket: the tiny BERT's rows take one width a tower
STEPS = 3  # under CUDA graphs the first step warms up, the second records, the third replays


def _compile(model, mode: str) -> None:
    compile_towers([model.query_encoder, model.passage_encoder], mode)


def fp64_check(device: torch.device, mode: str, size: str = "tiny") -> dict:
    """float64: GradCache's gradient on compiled towers at each step against the full batch."""
    from dpr_cache.core.engine import GradCache
    from dpr_cache.core.loss import contrastive_loss

    case = exact.ExactCase(size, 8, 3, 1)
    model = exact.make_model(size, device, torch.float64)
    q, p, ids = exact.make_batch(size, case.n_q, case.hard_negatives, device)
    exact.full_batch_grads(model, q, p, ids)
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
        errors.append(exact.max_relative_error(grads(), want))
        seconds.append(round(time.perf_counter() - start, 2))
        start = time.perf_counter()
    row = {"case": case.name, "mode": mode, "length_bucket": engine.length_bucket}
    row |= {"errors": errors, "relative_error": max(errors), "bound": exact.FP64_BOUND}
    return row | {"step_s": seconds, "ok": max(errors) <= exact.FP64_BOUND}


def replay_check(device: torch.device, mode: str, size: str = "tiny", dropout: float = 0.1) -> dict:
    """Dropout on, fp32, compiled: each chunk's re-forward against its first pass, replayed and
    not (the control), at the last step; and the first pass against the eager towers'."""
    batch = exact.make_batch(size, 8, 1, device)
    recorded = functools.partial(exact.recorded_step, batch=batch, length_bucket=EXACT_BUCKET)
    new_model = functools.partial(exact.make_model, size, device, torch.float32, dropout=dropout)
    eager_pairs = recorded(new_model(), replay_rng=True)
    model = new_model()
    _compile(model, mode)
    result = {"size": size, "dropout": dropout, "mode": mode, "bound": COMPILED_REPLAY_BOUND}
    for replay, key in ((True, "replayed"), (False, "control_without_replay")):
        for _ in range(STEPS):
            pairs = recorded(model, replay_rng=replay)
        gaps = [exact.max_relative_error([b], [a]) for a, b in pairs]
        within = sum(g <= COMPILED_REPLAY_BOUND for g in gaps)
        result[key] = {"chunks": len(gaps), "within_bound": within, "largest": max(gaps)}
        if replay:
            firsts = zip(pairs, eager_pairs, strict=True)
            gaps = [exact.max_relative_error([c], [e]) for (c, _), (e, _) in firsts]
            result["vs_eager_first_pass"] = max(gaps)
    replayed, control = result["replayed"], result["control_without_replay"]
    result["ok"] = replayed["within_bound"] == replayed["chunks"] and control["largest"] > 1e-2
    return result


def exactness(device: torch.device, mode: str):
    """The two checks, each yielded as it ends (an error is that check's result)."""
    for name, check in (("fp64", fp64_check), ("replay", replay_check)):
        start = time.perf_counter()
        try:
            row = check(device, mode)
        except Exception as exc:  # the check's finding: a compiler's error, say
            row = {"error": f"{type(exc).__name__}: {exc}"[:500], "ok": False}
        row["seconds"] = round(time.perf_counter() - start, 1)
        yield name, row


def speed(model_dir, squad_gz, squad_dir, device, variants, batch_size, rounds, precision="fp16"):
    """Each compiled variant beside the same eager and the full batch, interleaved, the towers
    compiled once; each group yielded as it ends (the compile's cost in the warm-ups)."""
    from dpr_cache.model.biencoder import BiEncoder

    def load():
        return BiEncoder.from_pretrained(model_dir, shared=True, pooling="cls").to(device).train()

    eager = load()
    batch_of = functools.partial(perf.squad_batch, eager, squad_gz, squad_dir)
    batch, to_compile, start = batch_of(batch_size), load(), time.perf_counter()
    _compile(to_compile, variants[0].compile_mode)
    yield "compile_call_s", round(time.perf_counter() - start, 2)
    done = []
    peers = {"compiled": to_compile, "others": [to_compile], "batch_of": batch_of, "rounds": rounds}
    for v in variants:
        pair = [v, v._replace(compile_mode=None)]  # compiled, and the same eager
        done.append(perf.speed_comparison(eager, batch, precision, variants=pair, **peers))
        yield "comparisons", done


def _print_each_compile() -> None:
    """A line printed as each compilation ends, where this torch has compile callbacks."""
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


_COMPILE_ENDED = re.compile(r"^compile \d+ ended: ([\d.]+) s$")


def _in_child(kind: str, options: dict, timeout: float, on_start=None) -> dict:
    """The child's printed figures, each compile's seconds, and where it failed why."""
    cmd = [sys.executable, "-m", "benchmarks.gpu.compiled", kind, json.dumps(options, default=str)]
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
    return {"mode": mode, **_in_child("exact", {"mode": mode, "device": device}, timeout, on_start)}


def speed_in_child(model_dir, squad_gz, squad_dir, device, variants, batch_size, rounds, timeout):
    paths = {"model_dir": model_dir, "squad_gz": squad_gz, "squad_dir": squad_dir}
    options = {**paths, "device": device, "batch_size": batch_size, "rounds": rounds}
    options["variants"] = variants
    return {"mode": variants[0].compile_mode, **_in_child("speed", options, timeout)}


def main(kind: str, options: str) -> None:
    """The child: ``exact`` or ``speed`` with ``options`` (JSON), each figure a JSON line."""
    args = json.loads(options)
    device = torch.device(args.pop("device"))
    _print_each_compile()
    if kind == "exact":
        found = exactness(device, args["mode"])
    else:
        paths = [Path(args.pop(k)) for k in ("model_dir", "squad_gz", "squad_dir")]
        variants = [Variant(*v) for v in args.pop("variants")]
        found = speed(*paths, device, variants, **args)
    for key, value in found:
        print(json.dumps({"key": key, "value": value}), flush=True)


if __name__ == "__main__":
    main(*sys.argv[1:])
