"""The command line on a device (the toy pipeline, a kill and ``--resume``, bit-exact reruns, an
fp16 overflow, a chunk too large, NCCL), each command a fresh process, independent ones at once."""

from __future__ import annotations

import functools
import itertools
import json
import os
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import torch

TOY = "configs/toy.yaml"
clock_zero = time.monotonic()  # the suite's start (run_suite sets it): children's start times
_WORKERS = max(1, len(os.sched_getaffinity(0)) // 2)  # tasks at a time: 1 on 2 cores, 8 on 16
_running: set[subprocess.Popen] = set()
_lock = threading.Lock()
_stopped = threading.Event()


def child(cmd: list[str], timeout: float, on_start: Callable | None = None) -> dict:
    """``cmd``'s exit code (None: out of time, sent SIGABRT for its stacks), start, seconds and
    output; killed where its caller is interrupted."""
    started_s, start = round(time.monotonic() - clock_zero, 1), time.perf_counter()
    env = {**os.environ, "PYTHONFAULTHANDLER": "1"}
    proc = _start(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env)
    if on_start is not None:
        on_start(proc)
    rc = None
    try:
        try:
            stdout, stderr = proc.communicate(timeout=timeout)
            rc = proc.returncode
        except subprocess.TimeoutExpired:
            proc.send_signal(signal.SIGABRT)
            try:
                stdout, stderr = proc.communicate(timeout=15)
            except subprocess.TimeoutExpired:
                _kill(proc)
                stdout, stderr = proc.communicate()
    except BaseException:  # the caller interrupted, even while the stack was being printed
        _kill(proc)
        proc.communicate()
        raise
    finally:
        with _lock:
            _running.discard(proc)
    run = {"rc": rc, "started_s": started_s, "stdout": stdout, "stderr": stderr}
    return run | {"seconds": round(time.perf_counter() - start, 2)}


def _start(cmd: list[str], **popen) -> subprocess.Popen:
    """A child in a process group of its own, known to :func:`stop_all`."""
    with _lock:
        if _stopped.is_set() and threading.current_thread() is not threading.main_thread():
            raise RuntimeError("stopped: the section's time is up")
        proc = subprocess.Popen(cmd, start_new_session=True, **popen)
        _running.add(proc)
    return proc


def _kill(proc: subprocess.Popen) -> None:
    """SIGKILL to the child and every process it started (its process group)."""
    try:
        os.killpg(proc.pid, signal.SIGKILL)
    except (ProcessLookupError, PermissionError):
        proc.kill()


def stop_all() -> None:
    """Every running child killed, none other started until the main thread starts again."""
    with _lock:
        _stopped.set()
        for proc in _running:
            _kill(proc)


def in_parallel(tasks: dict[str, Callable[[], Any]], into: dict[str, Any]) -> dict[str, Any]:
    """Each task in a thread, its result into ``into``; interrupted, every child killed."""
    if threading.current_thread() is threading.main_thread():
        _stopped.clear()
    pool = ThreadPoolExecutor(max_workers=min(len(tasks), _WORKERS))

    def run(name: str, task: Callable[[], Any]) -> None:
        result = task()
        with _lock:  # nothing lands in ``into`` once stopped: it may be on its way to a page
            if not _stopped.is_set():
                into[name] = result

    futures = [pool.submit(run, name, task) for name, task in tasks.items()]
    try:
        for future in futures:
            future.result()
    except BaseException:
        stop_all()
        raise
    finally:
        pool.shutdown(wait=False, cancel_futures=True)
    return into


class Started:
    """``task(on_start)`` run in a thread, collected with :meth:`result` (interrupted: stopped)."""

    def __init__(self, task: Callable[[Callable[[subprocess.Popen], object]], Any], start=True):
        self._task, self._procs, self._out = task, [], {}
        self.started, self.seconds = False, None
        self._done = threading.Event()  # not a Thread.join, which a signal may cut short (3.12)
        if start:
            self.start()

    def start(self) -> None:
        if threading.current_thread() is threading.main_thread():
            _stopped.clear()
        self.started = True
        threading.Thread(target=self._run, daemon=True).start()

    def _run(self) -> None:
        start = time.perf_counter()
        try:
            self._out["result"] = self._task(self._procs.append)
        except BaseException as exc:  # raised again in the thread that collects
            self._out["error"] = exc
        finally:
            self.seconds = round(time.perf_counter() - start, 2)
            self._done.set()

    @property
    def done(self) -> bool:
        return self._done.is_set()

    def result(self) -> Any:
        """The task's result, waited for in short waits (a signal's handler runs between)."""
        if not self.started:
            self.start()
        try:
            while not self._done.wait(0.2):
                pass
        except BaseException:
            self.stop()
            raise
        if "error" in self._out:
            raise self._out["error"]
        return self._out["result"]

    def stop(self) -> None:
        for proc in self._procs:
            if proc.poll() is None:
                _kill(proc)


class Beside(Started):
    """Commands started with the suite beside sections that neither time nor fill the GPU."""

    def __init__(self, tasks: dict[str, Callable[[], Any]], into: dict[str, Any]):
        super().__init__(lambda on_start: in_parallel(tasks, into), start=False)
        self.tasks = tasks
        self.ran_beside: list[str] = []  # the sections that ran while they did

    wait = Started.result

    def stop(self) -> None:
        if self.started:
            stop_all()
            self._done.wait(60)


def cli(*args: str, timeout: float = 300) -> dict:
    """``python -m dpr_cache ARGS``: :func:`child`'s row with its output's last lines."""
    run = child([sys.executable, "-m", "dpr_cache", *args], timeout)
    lines = run["stderr"].strip().splitlines() or [""]
    row = {"command": "dpr-cache " + " ".join(args), "rc": run["rc"], "started_s": run["started_s"]}
    row |= {"seconds": run["seconds"], "last_line": lines[-1]}
    row["stdout"] = run["stdout"].strip().splitlines()[-12:]
    if run["rc"] is None:  # its stderr ends with the stack the fault handler printed
        row.update(last_line=f"out of time after {timeout:.0f} s", stack=lines[-40:])
    return row


def _command(out: Path, command: str, device: str, section: str = "", **extra) -> list[str]:
    """``command`` on the toy config, its folders (a data cache of its own) and device set."""
    section = section or command
    values = {"output_dir": out, "data.cache_dir": out / "cache", f"{section}.device": device}
    values |= {"train.num_threads": "null"} if section == "train" else {}
    sets = [arg for k, v in {**values, **extra}.items() for arg in ("--set", f"{k}={v}")]
    return [command, "--config", TOY, *sets]


def toy_pipeline(work: Path, device: str, precision: str = "fp16", steps: int = 12) -> dict:
    """train -> index -> eval on the toy config, ``verify`` beside them, on ``device``."""
    out = work / "pipeline"

    def train_index_eval() -> list[dict]:
        train = {"train.precision": precision, "train.max_steps": steps}
        rows = [cli(*_command(out, "train", device, **train), "-q")]
        for name in ("index", "eval"):
            rows.append(cli(*_command(out, name, device, **{f"{name}.precision": precision})))
        return rows

    def verify(*flags: str) -> Callable[[], list[dict]]:
        folder = work / f"verify{''.join(flags).replace('-', '_')}"
        return lambda: [cli(*_command(folder, "verify", device, "train"), *flags)]

    tasks = {"train": train_index_eval, "verify double": verify("--double")}
    if device == "cuda":  # fp32 on the GPU: matrix products of other shapes, the bound 1e-4
        tasks["verify"] = verify()
    done = in_parallel(tasks, {})
    rows = [row for name in tasks for row in done[name]]
    metrics, log = out / "eval" / "metrics.json", out / "train_log.jsonl"
    result = {"commands": rows, "ok": all(r["rc"] == 0 for r in rows)}
    result["metrics"] = json.loads(metrics.read_text()) if metrics.exists() else None
    return result | {"logged_steps": len(log.read_text().splitlines()) if log.exists() else 0}


def _difference(a: Path, b: Path) -> dict:
    """Whether two model folders hold equal weights bit for bit, and the largest difference."""
    from safetensors.torch import load_file

    def weights(model: Path) -> list[torch.Tensor]:
        towers = ("query_encoder", "passage_encoder")
        return [t for w in towers for t in load_file(model / w / "model.safetensors").values()]

    pairs = list(zip(weights(a), weights(b), strict=True))
    worst = max((x.float() - y.float()).abs().max().item() for x, y in pairs)
    return {"bitwise_equal": all(torch.equal(x, y) for x, y in pairs), "max_abs_diff": worst}


def _train_killed_then_resumed(out: Path, train: list[str], kill_after: int) -> dict:
    """``train`` until checkpoint ``kill_after`` is on disk, SIGKILL, then ``--resume``."""
    cmd = [sys.executable, "-m", "dpr_cache", *train, "-q"]
    proc = _start(cmd, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    marker = out / "checkpoints" / f"step-{kill_after:08d}" / "state.pt"
    deadline = time.time() + 300
    while not marker.exists() and proc.poll() is None and time.time() < deadline:
        time.sleep(0.02)
    killed = proc.poll() is None
    _kill(proc)
    proc.wait()
    with _lock:
        _running.discard(proc)
    killed_mid_run = killed and marker.exists() and not (out / "model").exists()
    resumed = cli(*train, "--resume", "-q")
    return resumed | {"killed_mid_run": killed_mid_run}


def resume_equality(work: Path, device: str, settings=(False, True), steps=8, every=3) -> dict:
    """Per ``train.deterministic``: two unbroken runs and one killed and resumed, bit for bit."""
    tasks: dict[str, Callable[[], dict]] = {}
    for det, name in itertools.product(settings, ("a", "b", "killed")):
        sets = {"train.max_steps": steps, "train.checkpoint_every": every}
        folder, sets["train.deterministic"] = work / f"resume-{det}-{name}", str(det).lower()
        args, key = _command(folder, "train", device, **sets), f"{det} {name}"
        if name == "killed":
            tasks[key] = functools.partial(_train_killed_then_resumed, folder, args, every)
        else:
            tasks[key] = functools.partial(cli, *args, "-q")
    done = in_parallel(tasks, {})
    out = {}
    for det in settings:
        key, runs = "deterministic" if det else "default kernels", ("a", "b", "killed")
        rows = {name: done[f"{det} {name}"] for name in runs}
        if any(row["rc"] != 0 for row in rows.values()):
            out[key] = {"error": [row["last_line"] for row in rows.values() if row["rc"] != 0]}
            continue
        model = {name: work / f"resume-{det}-{name}" / "model" for name in runs}
        out[key] = {"two_unbroken_runs": _difference(model["a"], model["b"])}
        out[key]["resumed_vs_unbroken"] = _difference(model["killed"], model["a"])
        out[key]["killed_mid_run"] = rows["killed"]["killed_mid_run"]
    return out


def fp16_overflow(device: torch.device, steps: int = 8, batch: int = 64) -> dict:
    """The toy trainer in fp16 at a loss scale of 2^40: the overflowing steps skipped."""
    from dpr_cache.config import load_config
    from dpr_cache.runtime.distributed import DistEnv
    from dpr_cache.train.trainer import batch_recipe, build_trainer, training_data

    sets = [f"train.batch_size={batch}", f"train.chunk_size={min(16, batch)}"]
    sets += ["train.precision=fp16", f"train.device={device}", "train.num_threads=null"]
    config = load_config(TOY, sets)
    env = DistEnv(device=device)
    dataset, batches, _ = training_data(config, env)
    trainer = build_trainer(config, env, steps)
    scaler = torch.amp.GradScaler(device.type, init_scale=2.0**40, backoff_factor=2.0**-16)
    trainer.scaler = trainer.stepper.scaler = scaler
    recipe = batch_recipe(config, trainer.model)
    skipped, unchanged, scales = 0, True, []
    for step in range(steps):
        before = [p.detach().clone() for p in trainer.model.parameters()]
        result = trainer.step(recipe.batch(dataset, batches, trainer.model.tokenizer, step))
        scales.append(result.loss_scale)
        if result.skipped:
            skipped += 1
            after = list(trainer.model.parameters())
            unchanged &= all(torch.equal(a, b) for a, b in zip(before, after, strict=True))
    out = {"steps": steps, "skipped": skipped, "weights_untouched_when_skipped": unchanged}
    out |= {"first_scale": 2.0**40, "last_scale": scales[-1]}
    return out | {"ok": 0 < skipped < steps and unchanged}


def chunk_too_large(work: Path, model_dir: Path, device: str, batch: int = 2048) -> dict:
    """``train`` with a chunk of some hundred GB: one ``error:`` line naming one that fits."""
    settings = {"model.name_or_path": model_dir, "train.batch_size": batch}
    settings |= {"train.chunk_size": batch, "train.max_steps": 1, "train.precision": "bf16"}
    settings |= {"model.max_passage_length": 256, "train.loss_tile_size": min(batch, 4096)}
    data, words = work / "long.jsonl", " ".join(f"word{i % 97}" for i in range(400))  # 256 tokens
    with open(data, "w") as f:
        for i in range(batch):
            ctx, neg = ({"title": f"{t}{i}", "text": words, "passage_id": f"{t}{i}"} for t in "tn")
            record = {"question": f"question {i} " * 8, "answers": ["x"], "positive_ctxs": [ctx]}
            f.write(json.dumps({**record, "hard_negative_ctxs": [neg]}) + "\n")
    args = _command(work / "too-large", "train", device, **settings)
    row = cli(*args, "--set", f"data.train={data}", "-q", timeout=100)
    last = row["last_line"]
    ok = row["rc"] == 2 and last.startswith("error: train.chunk_size") and "fits" in last
    return {**row, "chunk": batch, "ok": ok}


def nccl_collectives(timeout: float = 120) -> dict:
    """NCCL in a process group of one in a fresh process: the gather and the mean over ranks."""
    run = child([sys.executable, "-m", "benchmarks.gpu.cli", "nccl-child"], timeout)
    lines = run["stdout"].strip().splitlines()
    if run["rc"] != 0 or not lines:
        return {"ok": False, "error": (run["stderr"].strip().splitlines() or ["failed"])[-1]}
    return json.loads(lines[-1])


def _nccl_child() -> None:
    import torch.distributed as dist

    from dpr_cache.core.gather import gather_with_grad
    from dpr_cache.runtime.distributed import DistEnv, all_mean
    from dpr_cache.runtime.processes import free_port

    port = free_port()
    dist.init_process_group("nccl", init_method=f"tcp://127.0.0.1:{port}", rank=0, world_size=1)
    device = torch.device("cuda", 0)
    local = torch.randn(6, 8, device=device, requires_grad=True)
    gathered = gather_with_grad(local)
    weight = torch.randn_like(gathered)
    (gathered * weight).sum().backward()
    mean = all_mean(torch.tensor(2.5, device=device), DistEnv(0, 1, 0, device))
    row = {"backend": dist.get_backend(), "mean": mean}
    row["gather_equal"] = bool(torch.equal(gathered.detach(), local.detach()))
    row["gradient_equal"] = bool(torch.equal(local.grad, weight))
    row["ok"] = row["gather_equal"] and row["gradient_equal"] and mean == 2.5
    dist.destroy_process_group()
    print(json.dumps(row), flush=True)


if __name__ == "__main__" and sys.argv[1:] == ["nccl-child"]:
    _nccl_child()
