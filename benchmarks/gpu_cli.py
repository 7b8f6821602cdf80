"""The command line on a device: ``train`` (the toy config, fp16), a kill and ``--resume``,
``index``, ``eval`` and ``verify``; whether a resumed run and two unbroken runs are equal bit for
bit, with deterministic kernels off and on; an fp16 overflow skipped and counted; a chunk too
large for the GPU stopped with one line; NCCL's collectives.

Each command runs as a user runs it (``python -m dpr_cache ...``) in a fresh process, on copies of
the toy config's outputs under a work folder.
"""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

import torch

__all__ = [
    "child",
    "cli",
    "toy_pipeline",
    "resume_equality",
    "fp16_overflow",
    "chunk_too_large",
    "nccl_collectives",
]

TOY = "configs/toy.yaml"


def child(cmd: list[str], timeout: float, env: dict | None = None) -> dict:
    """Run ``cmd`` to its end or for ``timeout`` seconds: its exit code (None when it ran out of
    time), seconds, stdout and stderr. A child out of time is sent SIGABRT, which Python's
    fault handler (on in the child) answers by printing every thread's stack to stderr, so
    that a hang on a device names the line it hung on. A child whose caller is interrupted (the
    section's time is up) is killed, so that it holds no device after its section."""
    start = time.perf_counter()
    proc = subprocess.Popen(
        cmd,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        env={**os.environ, "PYTHONFAULTHANDLER": "1", **(env or {})},
    )
    try:
        stdout, stderr = proc.communicate(timeout=timeout)
        rc = proc.returncode
    except subprocess.TimeoutExpired:
        proc.send_signal(signal.SIGABRT)
        try:
            stdout, stderr = proc.communicate(timeout=30)
        except subprocess.TimeoutExpired:
            proc.kill()
            stdout, stderr = proc.communicate()
        rc = None
    except BaseException:
        proc.kill()
        proc.communicate()
        raise
    return {
        "rc": rc,
        "seconds": round(time.perf_counter() - start, 2),
        "stdout": stdout,
        "stderr": stderr,
    }


def cli(*args: str, timeout: float = 300, env: dict | None = None) -> dict:
    """Run ``python -m dpr_cache ARGS``: its exit code (None: out of time, with the stack it
    hung in), seconds, last stderr line."""
    run = child([sys.executable, "-m", "dpr_cache", *args], timeout, env)
    lines = run["stderr"].strip().splitlines()
    row = {
        "command": "dpr-cache " + " ".join(args),
        "rc": run["rc"],
        "seconds": run["seconds"],
        "last_line": lines[-1] if lines else "",
        "stdout": run["stdout"].strip().splitlines()[-12:],
    }
    if run["rc"] is None:
        row["stack"] = lines[-40:]
    return row


def _sets(out: Path, section: str, device: str, **extra) -> list[str]:
    """``--set`` pairs: the run's folders, and the device of the one config section the command
    reads (``index`` and ``eval`` refuse a ``train.device`` they would not use)."""
    values = {
        "output_dir": out,
        "data.cache_dir": out.parent / "cache",
        f"{section}.device": device,
        **({"train.num_threads": "null"} if section == "train" else {}),
        **extra,
    }
    return [arg for k, v in values.items() for arg in ("--set", f"{k}={v}")]


def toy_pipeline(work: Path, device: str, precision: str = "fp16", steps: int = 12) -> dict:
    """train -> index -> eval -> verify on the toy config, every step on ``device``."""
    out = work / "pipeline"
    train = {"train.precision": precision, "train.max_steps": steps}
    rows = [cli("train", "--config", TOY, *_sets(out, "train", device, **train), "-q")]
    for command in ("index", "eval"):
        sets = _sets(out, command, device, **{f"{command}.precision": precision})
        rows.append(cli(command, "--config", TOY, *sets))
    verify = _sets(work / "verify", "train", device)
    rows.append(cli("verify", "--config", TOY, *verify, "--double"))
    if device == "cuda":  # fp32 on the GPU: matrix products of other shapes, the bound 1e-4
        rows.append(cli("verify", "--config", TOY, *verify))
    metrics = out / "eval" / "metrics.json"
    log = out / "train_log.jsonl"
    return {
        "commands": rows,
        "metrics": json.loads(metrics.read_text()) if metrics.exists() else None,
        "logged_steps": len(log.read_text().splitlines()) if log.exists() else 0,
        "ok": all(r["rc"] == 0 for r in rows),
    }


def _weights(model_dir: Path) -> dict[str, torch.Tensor]:
    from safetensors.torch import load_file

    return {
        f"{tower}/{name}": t
        for tower in ("query_encoder", "passage_encoder")
        for name, t in load_file(model_dir / tower / "model.safetensors").items()
    }


def _difference(a: Path, b: Path) -> dict:
    """Whether two model folders hold equal weights bit for bit, and the largest difference."""
    wa, wb = _weights(a), _weights(b)
    worst = max((wa[k].float() - wb[k].float()).abs().max().item() for k in wa)
    return {"bitwise_equal": all(torch.equal(wa[k], wb[k]) for k in wa), "max_abs_diff": worst}


def _train_killed_then_resumed(out: Path, sets: list[str], kill_after: int) -> dict:
    """Train until checkpoint ``kill_after`` is on disk, SIGKILL, then ``--resume``."""
    cmd = [sys.executable, "-m", "dpr_cache", "train", "--config", TOY, *sets, "-q"]
    proc = subprocess.Popen(cmd, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
    marker = out / "checkpoints" / f"step-{kill_after:08d}" / "state.pt"
    deadline = time.time() + 300
    while not marker.exists() and proc.poll() is None and time.time() < deadline:
        time.sleep(0.02)
    killed = proc.poll() is None
    proc.send_signal(signal.SIGKILL)
    proc.wait()
    killed_mid_run = killed and marker.exists() and not (out / "model").exists()
    resumed = cli("train", "--config", TOY, *sets, "--resume", "-q")
    return {"killed_mid_run": killed_mid_run, "resume": resumed}


def resume_equality(
    work: Path, device: str, steps: int = 8, every: int = 3, settings=(False, True)
) -> dict:
    """Per setting of ``train.deterministic`` in ``settings``: two unbroken runs and one killed
    after step ``every`` and resumed (dropout on, fp32), compared bit for bit."""
    out = {}
    for deterministic in settings:
        key = "deterministic" if deterministic else "default kernels"
        extra = {
            "train.max_steps": steps,
            "train.checkpoint_every": every,
            "train.deterministic": str(deterministic).lower(),
        }
        runs = {name: work / f"resume-{deterministic}-{name}" for name in ("a", "b", "killed")}
        codes = []
        for name in ("a", "b"):
            codes.append(
                cli("train", "--config", TOY, *_sets(runs[name], "train", device, **extra), "-q")
            )
        broken = _train_killed_then_resumed(
            runs["killed"], _sets(runs["killed"], "train", device, **extra), every
        )
        codes.append(broken["resume"])
        if any(c["rc"] != 0 for c in codes):
            out[key] = {"error": [c["last_line"] for c in codes if c["rc"] != 0]}
            continue
        out[key] = {
            "two_unbroken_runs": _difference(runs["a"] / "model", runs["b"] / "model"),
            "resumed_vs_unbroken": _difference(runs["killed"] / "model", runs["a"] / "model"),
            "killed_mid_run": broken["killed_mid_run"],
        }
    return out


def fp16_overflow(device: torch.device, steps: int = 8, batch: int = 64) -> dict:
    """The toy trainer in fp16 with a loss scale of 2^40: the first step overflows in fp16's
    backward, so GradScaler skips it (weights untouched) and backs the scale off (by 2^-16 a
    skip here, so that a few steps reach a scale that fits), and the trainer reports each
    skipped step."""
    from dpr_cache.config import load_config
    from dpr_cache.runtime.distributed import DistEnv
    from dpr_cache.train.trainer import batch_recipe, build_trainer, training_data

    sets = [f"train.batch_size={batch}", f"train.chunk_size={min(16, batch)}"]
    config = load_config(
        TOY, ["train.precision=fp16", f"train.device={device}", "train.num_threads=null", *sets]
    )
    env = DistEnv(device=device)
    dataset, batches = training_data(config, env)
    trainer = build_trainer(config, env, steps)
    scaler = torch.amp.GradScaler(device.type, init_scale=2.0**40, backoff_factor=2.0**-16)
    trainer.scaler = trainer.stepper.scaler = scaler
    recipe = batch_recipe(config, trainer.model)
    skipped, unchanged, scales = 0, True, []
    for step in range(steps):
        before = [p.detach().clone() for p in trainer.model.parameters()]
        batch = recipe.batch(dataset, batches, trainer.model.tokenizer, step)
        result = trainer.step(batch)
        scales.append(result.loss_scale)
        if result.skipped:
            skipped += 1
            after = list(trainer.model.parameters())
            unchanged &= all(torch.equal(a, b) for a, b in zip(before, after, strict=True))
    return {
        "steps": steps,
        "skipped": skipped,
        "weights_untouched_when_skipped": unchanged,
        "first_scale": 2.0**40,
        "last_scale": scales[-1],
        "ok": 0 < skipped < steps and unchanged,
    }


def chunk_too_large(work: Path, model_dir: Path, device: str) -> dict:
    """``train`` with a chunk far beyond the GPU: one ``error:`` line naming a chunk that fits,
    exit 2, no traceback."""
    out = work / "too-large"
    sets = _sets(
        out,
        "train",
        device,
        **{
            "model.name_or_path": model_dir,
            "train.batch_size": 8192,
            "train.chunk_size": 8192,
            "train.max_steps": 1,
            "train.precision": "bf16",
            "model.max_passage_length": 256,
            "train.loss_tile_size": 4096,
        },
    )
    data = work / "long.jsonl"
    _long_training_file(data, 8192)
    row = cli("train", "--config", TOY, *sets, "--set", f"data.train={data}", "-q", timeout=400)
    return {
        **row,
        "ok": row["rc"] == 2
        and row["last_line"].startswith("error: train.chunk_size")
        and "fits" in row["last_line"],
    }


def _long_training_file(path: Path, questions: int) -> None:
    """Questions whose passages fill 256 tokens, so a chunk's memory is what its size says."""
    words = " ".join(f"word{i % 97}" for i in range(400))
    with open(path, "w") as f:
        for i in range(questions):
            ctx = {"title": f"t{i}", "text": words, "passage_id": str(i)}
            neg = {"title": f"n{i}", "text": words, "passage_id": f"n{i}"}
            record = {
                "question": f"question {i} " * 8,
                "answers": ["x"],
                "positive_ctxs": [ctx],
                "hard_negative_ctxs": [neg],
            }
            f.write(json.dumps(record) + "\n")


def nccl_collectives(timeout: float = 120) -> dict:
    """NCCL on one GPU: a process group of one (two ranks would need two GPUs: NCCL refuses
    two ranks on one device) running the collectives training uses, the gather of the
    passage reps with its gradient and the loss's mean over ranks, in a fresh process."""
    run = child([sys.executable, "-m", "benchmarks.gpu_cli", "nccl-child"], timeout)
    lines = run["stdout"].strip().splitlines()
    if run["rc"] != 0 or not lines:
        return {"ok": False, "error": (run["stderr"].strip().splitlines() or ["failed"])[-1]}
    return json.loads(lines[-1])


def _nccl_child() -> None:
    import torch.distributed as dist

    from dpr_cache.core.gather import gather_with_grad
    from dpr_cache.runtime.distributed import DistEnv, all_mean

    port = _free_port()
    dist.init_process_group("nccl", init_method=f"tcp://127.0.0.1:{port}", rank=0, world_size=1)
    device = torch.device("cuda", 0)
    local = torch.randn(6, 8, device=device, requires_grad=True)
    gathered = gather_with_grad(local)
    weight = torch.randn_like(gathered)
    (gathered * weight).sum().backward()
    mean = all_mean(torch.tensor(2.5, device=device), DistEnv(0, 1, 0, device))
    row = {
        "backend": dist.get_backend(),
        "gather_equal": bool(torch.equal(gathered.detach(), local.detach())),
        "gradient_equal": bool(torch.equal(local.grad, weight)),
        "mean": mean,
    }
    row["ok"] = row["gather_equal"] and row["gradient_equal"] and mean == 2.5
    dist.destroy_process_group()
    print(json.dumps(row), flush=True)


def _free_port() -> int:
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def clean(work: Path) -> None:
    shutil.rmtree(work, ignore_errors=True)


if __name__ == "__main__":
    if sys.argv[1:] == ["nccl-child"]:
        _nccl_child()
