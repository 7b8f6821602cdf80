"""The command line on a device (the toy config's ``train`` in fp16, a kill and ``--resume``,
``index``, ``eval``, ``verify``; bit-exact reruns; an fp16 overflow; a chunk too large; NCCL's
collectives), each command a fresh process as a user runs it, those independent of each other at
the same time (:func:`in_parallel`); and the watch of the device's memory while the suite runs."""

from __future__ import annotations

import json
import os
import shutil
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

from benchmarks.harness import proc_field

TOY = "configs/toy.yaml"
clock_zero = time.monotonic()  # the suite's start (run_suite sets it): children's start times
_WORKERS = max(1, len(os.sched_getaffinity(0)) // 2)  # tasks at a time: 1 on 2 cores, 8 on 16
_running: set[subprocess.Popen] = set()
_lock = threading.Lock()
_stopped = threading.Event()


def child(
    cmd: list[str],
    timeout: float,
    env: dict | None = None,
    on_start: Callable[[subprocess.Popen], object] | None = None,
) -> dict:
    """Run ``cmd`` to its end or for ``timeout`` seconds: its exit code (None: out of time, sent
    SIGABRT, which the child's fault handler answers with every thread's stack), start (s from
    :data:`clock_zero`), seconds, stdout and stderr; killed where its caller is interrupted."""
    started_s = round(time.monotonic() - clock_zero, 1)
    start = time.perf_counter()
    env = {**os.environ, "PYTHONFAULTHANDLER": "1", **(env or {})}
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
        _forget(proc)
    seconds = round(time.perf_counter() - start, 2)
    return {
        "rc": rc,
        "started_s": started_s,
        "seconds": seconds,
        "stdout": stdout,
        "stderr": stderr,
    }


def _start(cmd: list[str], **popen) -> subprocess.Popen:
    """A child in a process group of its own, known to :func:`stop_all` until :func:`_forget`."""
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


def _forget(proc: subprocess.Popen) -> None:
    with _lock:
        _running.discard(proc)


def stop_all() -> None:
    """Every running child killed, none other started until the main thread starts again."""
    with _lock:
        _stopped.set()
        for proc in _running:
            _kill(proc)


def in_parallel(tasks: dict[str, Callable[[], Any]], into: dict[str, Any]) -> dict[str, Any]:
    """Each task in a thread, its result put in ``into`` as it ends; interrupted, every child
    still running killed and no other started."""
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
    """``task(on_start)`` (``on_start`` passed to :func:`child`) run in a thread, collected with
    :meth:`result`; a wait interrupted stops it (its own children killed, no other)."""

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
        """The task's result (its error raised), waited for in short waits, so that a signal's
        handler runs between them."""
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
    """Commands (:func:`in_parallel`) started with the suite on a device, beside sections that
    neither time anything nor fill the GPU, and awaited in their own section's place."""

    def __init__(self, tasks: dict[str, Callable[[], Any]], into: dict[str, Any]):
        super().__init__(lambda on_start: in_parallel(tasks, into), start=False)
        self.tasks, self.into = tasks, into
        self.ran_beside: list[str] = []  # the sections that ran while they did

    def wait(self) -> dict[str, Any]:
        return self.result()

    def stop(self) -> None:
        if self.started:
            stop_all()
            self._done.wait(60)


def cli(*args: str, timeout: float = 300) -> dict:
    """``python -m dpr_cache ARGS``: exit code (None: out of time, with its stack), start,
    seconds, last stderr line, stdout's last lines."""
    run = child([sys.executable, "-m", "dpr_cache", *args], timeout)
    lines = run["stderr"].strip().splitlines()
    row = {"command": "dpr-cache " + " ".join(args), "rc": run["rc"]}
    row |= {k: run[k] for k in ("started_s", "seconds")}
    row["last_line"] = lines[-1] if lines else ""
    row["stdout"] = run["stdout"].strip().splitlines()[-12:]
    if run["rc"] is None:  # its stderr ends with the stack the fault handler printed
        row.update(last_line=f"out of time after {timeout:.0f} s", stack=lines[-40:])
    return row


def _sets(out: Path, section: str, device: str, **extra) -> list[str]:
    """``--set`` pairs: the run's folders (a data cache of its own) and its section's device."""
    values = {"output_dir": out, "data.cache_dir": out / "cache", f"{section}.device": device}
    values |= {"train.num_threads": "null"} if section == "train" else {}
    return [arg for k, v in {**values, **extra}.items() for arg in ("--set", f"{k}={v}")]


def _command(out: Path, command: str, device: str, **extra) -> list[str]:
    return [command, "--config", TOY, *_sets(out, command, device, **extra)]


def toy_pipeline(work: Path, device: str, precision: str = "fp16", steps: int = 12) -> dict:
    """train -> index -> eval on the toy config, and beside them ``verify`` (float64, and on a
    GPU float32), every command on ``device``."""
    out = work / "pipeline"

    def train_index_eval() -> list[dict]:
        train = {"train.precision": precision, "train.max_steps": steps}
        rows = [cli(*_command(out, "train", device, **train), "-q")]
        for name in ("index", "eval"):
            rows.append(cli(*_command(out, name, device, **{f"{name}.precision": precision})))
        return rows

    def verify(*flags: str) -> Callable[[], list[dict]]:
        folder = work / f"verify{''.join(flags).replace('-', '_')}"
        return lambda: [cli("verify", "--config", TOY, *_sets(folder, "train", device), *flags)]

    tasks = {"train": train_index_eval, "verify double": verify("--double")}
    if device == "cuda":  # fp32 on the GPU: matrix products of other shapes, the bound 1e-4
        tasks["verify"] = verify()
    done = in_parallel(tasks, {})
    rows = [row for name in tasks for row in done[name]]
    metrics, log = out / "eval" / "metrics.json", out / "train_log.jsonl"
    out = {
        "commands": rows,
        "metrics": json.loads(metrics.read_text()) if metrics.exists() else None,
    }
    out["logged_steps"] = len(log.read_text().splitlines()) if log.exists() else 0
    return out | {"ok": all(r["rc"] == 0 for r in rows)}


def _difference(a: Path, b: Path) -> dict:
    """Whether two model folders hold equal weights bit for bit, and the largest difference."""
    from safetensors.torch import load_file

    def weights(model: Path) -> list[torch.Tensor]:
        towers = ("query_encoder", "passage_encoder")
        return [t for w in towers for t in load_file(model / w / "model.safetensors").values()]

    pairs = list(zip(weights(a), weights(b), strict=True))
    worst = max((x.float() - y.float()).abs().max().item() for x, y in pairs)
    return {"bitwise_equal": all(torch.equal(x, y) for x, y in pairs), "max_abs_diff": worst}


def _train_killed_then_resumed(out: Path, sets: list[str], kill_after: int) -> dict:
    """Train until checkpoint ``kill_after`` is on disk, SIGKILL, then ``--resume``."""
    cmd = [sys.executable, "-m", "dpr_cache", "train", "--config", TOY, *sets, "-q"]
    proc = _start(cmd, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    marker = out / "checkpoints" / f"step-{kill_after:08d}" / "state.pt"
    deadline = time.time() + 300
    while not marker.exists() and proc.poll() is None and time.time() < deadline:
        time.sleep(0.02)
    killed = proc.poll() is None
    proc.send_signal(signal.SIGKILL)
    proc.wait()
    _forget(proc)
    killed_mid_run = killed and marker.exists() and not (out / "model").exists()
    resumed = cli("train", "--config", TOY, *sets, "--resume", "-q")
    return {"killed_mid_run": killed_mid_run, "resume": resumed}


def resume_equality(
    work: Path, device: str, steps: int = 8, every: int = 3, settings=(False, True)
) -> dict:
    """Per setting of ``train.deterministic`` in ``settings``: two unbroken runs and one killed
    after step ``every`` and resumed (dropout on, fp32), compared bit for bit. The three runs
    of every setting run at the same time."""
    tasks: dict[str, Callable[[], dict]] = {}
    for det in settings:
        sets = {"train.max_steps": steps, "train.checkpoint_every": every}
        sets["train.deterministic"] = str(det).lower()
        for name in ("a", "b", "killed"):
            folder = work / f"resume-{det}-{name}"
            args = _sets(folder, "train", device, **sets)
            tasks[f"{det} {name}"] = (
                (lambda f=folder, a=args: _train_killed_then_resumed(f, a, every))
                if name == "killed"
                else (lambda a=args: cli("train", "--config", TOY, *a, "-q"))
            )
    done = in_parallel(tasks, {})
    out = {}
    for det in settings:
        key = "deterministic" if det else "default kernels"
        broken = done[f"{det} killed"]
        codes = [done[f"{det} a"], done[f"{det} b"], broken["resume"]]
        if any(c["rc"] != 0 for c in codes):
            out[key] = {"error": [c["last_line"] for c in codes if c["rc"] != 0]}
            continue
        model = {name: work / f"resume-{det}-{name}" / "model" for name in ("a", "b", "killed")}
        out[key] = {"two_unbroken_runs": _difference(model["a"], model["b"])}
        out[key]["resumed_vs_unbroken"] = _difference(model["killed"], model["a"])
        out[key]["killed_mid_run"] = broken["killed_mid_run"]
    return out


def fp16_overflow(device: torch.device, steps: int = 8, batch: int = 64) -> dict:
    """The toy trainer in fp16 at a loss scale of 2^40: GradScaler skips the steps that overflow
    (weights untouched), backing off by 2^-16 a skip, and the trainer reports each."""
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
    """``train`` with ``batch`` questions of 256-token passages in one chunk (on BERT-base's shape
    some hundred GB): one ``error:`` line naming a chunk that fits, exit 2; stopped after 100 s."""
    settings = {"model.name_or_path": model_dir, "train.batch_size": batch}
    settings |= {"train.chunk_size": batch, "train.max_steps": 1, "train.precision": "bf16"}
    settings |= {"model.max_passage_length": 256, "train.loss_tile_size": min(batch, 4096)}
    data = work / "long.jsonl"
    words = " ".join(f"word{i % 97}" for i in range(400))  # passages that fill 256 tokens
    with open(data, "w") as f:
        for i in range(batch):
            ctx = {"title": f"t{i}", "text": words, "passage_id": str(i)}
            neg = {"title": f"n{i}", "text": words, "passage_id": f"n{i}"}
            record = {"question": f"question {i} " * 8, "answers": ["x"]}
            f.write(json.dumps({**record, "positive_ctxs": [ctx], "hard_negative_ctxs": [neg]}))
            f.write("\n")
    args = _command(work / "too-large", "train", device, **settings)
    row = cli(*args, "--set", f"data.train={data}", "-q", timeout=100)
    last = row["last_line"]
    ok = row["rc"] == 2 and last.startswith("error: train.chunk_size") and "fits" in last
    return {**row, "chunk": batch, "ok": ok}


def nccl_collectives(timeout: float = 120) -> dict:
    """NCCL in a process group of one (two ranks need two GPUs) in a fresh process: the gather of
    the passage reps with its gradient and the loss's mean over ranks."""
    run = child([sys.executable, "-m", "benchmarks.gpu_cli", "nccl-child"], timeout)
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


GB = 1e9
FULL_BYTES = 2**30  # under this much free, a moment is counted as the device being full
SMI_TIMEOUT_S = 5


class DeviceWatch:
    """A thread that reads the device's memory in use (every process) and this process's reserved
    share under the section running; every 3 s the processes ``nvidia-smi`` names."""

    def __init__(self, device: torch.device, start: float, every_s: float = 0.5):
        self.device, self.start, self.every_s = device, start, every_s
        self.section = "start"
        self.samples: list[tuple[float, str, int, int]] = []
        self.processes: dict[int, dict] = {}
        self.total = torch.cuda.mem_get_info(device)[1]
        self._stop = threading.Event()
        self._lock = threading.Lock()  # the samples and processes, read while written
        self._thread = threading.Thread(target=self._run, daemon=True)
        self._smi = shutil.which("nvidia-smi")

    @classmethod
    def begin_on(cls, device: torch.device, start: float, every_s: float = 0.5):
        """A watch of ``device`` started now; None where it is no CUDA device here."""
        if device.type != "cuda" or not torch.cuda.is_available():
            return None
        watch = cls(device, start, every_s)
        watch._thread.start()
        return watch

    def summary(self) -> dict:
        with self._lock:
            return summarize(self.samples, self.total, self.processes)

    def end(self) -> dict:
        self._stop.set()
        self._thread.join(SMI_TIMEOUT_S + 5)
        return self.summary()

    def _run(self) -> None:
        polls = 0
        while not self._stop.wait(self.every_s):
            try:
                free, _ = torch.cuda.mem_get_info(self.device)
                mine = torch.cuda.memory_reserved(self.device)
            except RuntimeError:
                continue
            t = round(time.monotonic() - self.start, 1)
            with self._lock:
                self.samples.append((t, self.section, self.total - free, mine))
            polls += 1
            if self._smi and polls % 6 == 1:
                self._poll_processes(t)

    def _poll_processes(self, t: float) -> None:
        query = [self._smi, "--query-compute-apps=pid,used_memory", "--format=csv,noheader"]
        try:
            run = subprocess.run(query, capture_output=True, text=True, timeout=SMI_TIMEOUT_S)
        except (OSError, subprocess.SubprocessError):
            return
        for pid, used in parse_compute_apps(run.stdout):
            command = _command_line(pid) if pid not in self.processes else None
            with self._lock:
                seen = self.processes.setdefault(pid, {"peak_bytes": 0, "first_s": t})
                seen["last_s"] = t
                if used > seen["peak_bytes"]:
                    seen.update(peak_bytes=used, peak_s=t, section=self.section)
                seen.setdefault("command", command)


def parse_compute_apps(text: str) -> list[tuple[int, int]]:
    """``(pid, bytes)`` from ``nvidia-smi --query-compute-apps=pid,used_memory
    --format=csv,noheader`` (lines ``1234, 5678 MiB``); lines it cannot read are left out."""
    rows = []
    for line in text.splitlines():
        parts = [p.strip() for p in line.split(",")]
        if len(parts) != 2 or not parts[0].isdigit():
            continue
        value, _, unit = parts[1].partition(" ")
        scale = {"MiB": 2**20, "GiB": 2**30, "KiB": 2**10}.get(unit)
        if scale is not None and value.replace(".", "", 1).isdigit():
            rows.append((int(parts[0]), int(float(value) * scale)))
    return rows


def _command_line(pid: int) -> str | None:
    """The command line of ``pid`` where it is this process or descends from it (``nvidia-smi``
    may report another namespace's ids, which name some other process here); else None."""
    me, seen = os.getpid(), pid
    for _ in range(64):
        if seen == me:
            try:
                raw = Path(f"/proc/{pid}/cmdline").read_bytes()
            except OSError:
                return None
            return raw.replace(b"\0", b" ").decode(errors="replace").strip()[:200] or None
        parent = proc_field(f"/proc/{seen}/status", "PPid:") if seen > 1 else None
        if parent is None:
            return None
        seen = int(parent)
    return None


def summarize(samples: list[tuple[float, str, int, int]], total: int, processes: dict) -> dict:
    """Per section the most memory in use (and this process's share then) and the moments under
    ``FULL_BYTES`` free; a reading a second; each process named, largest first."""
    sections: dict[str, dict] = {}
    full: dict[str, int] = {}
    series, second = [], None  # the first reading of each whole second
    for t, section, used, mine in samples:
        row = sections.setdefault(section, {"samples": 0, "peak_used_gb": -1.0})
        row["samples"] += 1
        if used / GB > row["peak_used_gb"]:
            row.update(peak_used_gb=round(used / GB, 2), own_gb=round(mine / GB, 2), at_s=t)
        if total - used < FULL_BYTES:
            full[section] = full.get(section, 0) + 1
        if int(t) != second:
            second = int(t)
            series.append([t, round(used / GB, 2), round(mine / GB, 2)])
    named = sorted(processes.items(), key=lambda item: -item[1]["peak_bytes"])
    named = [
        {"pid": pid, **{k: v for k, v in p.items() if k != "peak_bytes"}}
        | {"peak_gb": round(p["peak_bytes"] / GB, 2)}
        for pid, p in named
    ]
    out = {"total_gb": round(total / GB, 2), "series": series}  # [s, GB in use, the suite's GB]
    return out | {"sections": sections, "full_samples": full, "processes": named}


if __name__ == "__main__" and sys.argv[1:] == ["nccl-child"]:
    _nccl_child()
