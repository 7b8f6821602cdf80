"""The command line on a device: ``train`` (the toy config, fp16), a kill and ``--resume``,
``index``, ``eval`` and ``verify``; whether a resumed run and two unbroken runs are equal bit for
bit, with deterministic kernels off and on; an fp16 overflow skipped and counted; a chunk too
large for the GPU stopped with one line; NCCL's collectives.

Each command runs as a user runs it (``python -m dpr_cache ...``) in a fresh process, on copies of
the toy config's outputs under a work folder. Commands that do not need each other's outputs run
at the same time (:func:`in_parallel`): a process's start-up (imports, the CUDA context) is most
of a toy command's time.
"""

from __future__ import annotations

import importlib
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

from benchmarks.harness import proc_field, transparent_hugepages
from dpr_cache.runtime.processes import rank_process

__all__ = [
    "in_parallel",
    "Beside",
    "Started",
    "child",
    "cli",
    "resident_by_stage",
    "toy_pipeline",
    "resume_equality",
    "fp16_overflow",
    "chunk_too_large",
    "nccl_collectives",
]

TOY = "configs/toy.yaml"
clock_zero = time.monotonic()  # the suite's start (run_suite sets it): children's start times
RESIDENT_BUDGET_GB = 12  # the eval's memory child's index.memory_gb


def child(
    cmd: list[str],
    timeout: float,
    env: dict | None = None,
    on_start: Callable[[subprocess.Popen], object] | None = None,
) -> dict:
    """Run ``cmd`` to its end or for ``timeout`` seconds: its exit code (None when it ran out of
    time), seconds, stdout and stderr. A child out of time is sent SIGABRT, which Python's
    fault handler (on in the child) answers by printing every thread's stack to stderr, so
    that a hang on a device names the line it hung on. A child whose caller is interrupted (the
    section's time is up) is killed, so that it holds no device after its section. Its start,
    in seconds from :data:`clock_zero`, lines it up with the suite's other readings.
    ``on_start`` is given the process once started (:class:`Started` keeps it, to kill)."""
    started_s = round(time.monotonic() - clock_zero, 1)
    start = time.perf_counter()
    proc = _start(
        cmd,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        env={**os.environ, "PYTHONFAULTHANDLER": "1", **(env or {})},
    )
    if on_start is not None:
        on_start(proc)
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
            rc = None
    except BaseException:  # the caller interrupted, even while the stack was being printed
        _kill(proc)
        proc.communicate()
        raise
    finally:
        _forget(proc)
    return {
        "rc": rc,
        "started_s": started_s,
        "seconds": round(time.perf_counter() - start, 2),
        "stdout": stdout,
        "stderr": stderr,
    }


_WORKERS = max(1, len(os.sched_getaffinity(0)) // 2)
"""Tasks at a time, at each level of :func:`in_parallel`: on a 2-core machine one (the commands
one after another, as a process of a CPU run needs its cores), on a GPU machine's 16 cores 8."""
_running: set[subprocess.Popen] = set()
_lock = threading.Lock()
_stopped = threading.Event()


def _start(cmd: list[str], **popen) -> subprocess.Popen:
    """A child process in a process group of its own, known to :func:`in_parallel` until
    :func:`_forget`; none from a task's thread once the commands were stopped (the main thread
    starts what it asks for)."""
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


def in_parallel(tasks: dict[str, Callable[[], Any]], into: dict[str, Any]) -> dict[str, Any]:
    """Each task in a thread of its own (a task runs its commands in order), its result put in
    ``into`` under its name as it ends (a section cut short keeps what finished). Interrupted
    (the section's time is up), it kills every child still running and starts no other."""
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


class Beside:
    """Tasks started now (:func:`in_parallel`, in a thread of its own) and awaited later: commands
    that need neither the device's whole memory nor its timing run while the suite measures
    other things. :meth:`wait` interrupted (the section's time is up) stops every command."""

    def __init__(self, tasks: dict[str, Callable[[], Any]], into: dict[str, Any]):
        self.tasks, self.into = tasks, into
        self.error: BaseException | None = None
        self.seconds: float | None = None
        self.started = False
        self.ran_beside: list[str] = []  # the sections that ran while they did
        # waited on, not the thread: on Python 3.11 and 3.12 a Thread.join that a signal's handler
        # interrupts can mark a running thread as ended
        self._done = threading.Event()

    def start(self) -> None:
        _stopped.clear()
        self.started = True
        threading.Thread(target=self._run, name="beside", daemon=True).start()

    def _run(self) -> None:
        start = time.perf_counter()
        try:
            in_parallel(self.tasks, self.into)
        except BaseException as exc:  # raised again in the thread that waits
            self.error = exc
        finally:
            self.seconds = round(time.perf_counter() - start, 2)
            self._done.set()

    @property
    def done(self) -> bool:
        return self._done.is_set()

    def wait(self) -> dict[str, Any]:
        """The tasks' results, started here if they were not yet."""
        if not self.started:
            self.start()
        try:
            while not self._done.wait(0.2):  # short waits: a signal's handler runs between
                pass
        except BaseException:
            self.stop()
            raise
        if self.error is not None:
            raise self.error
        return self.into

    def stop(self) -> None:
        """Every command stopped and reaped, none started after (a section out of time)."""
        if self.started:
            stop_all()
            self._done.wait(60)


class Started:
    """One task that runs a child (``task(on_start)``, passing ``on_start`` to :func:`child`),
    started now in a thread and collected later with :meth:`result`. A wait interrupted (the
    section's time is up) kills that child alone: the commands beside run on."""

    def __init__(self, task: Callable[[Callable[[subprocess.Popen], object]], Any]):
        if threading.current_thread() is threading.main_thread():
            _stopped.clear()  # a new start, as in_parallel's from the main thread
        self._procs: list[subprocess.Popen] = []
        self._out: dict[str, Any] = {}
        self._done = threading.Event()

        def run() -> None:
            try:
                self._out["result"] = task(self._procs.append)
            except BaseException as exc:  # raised again in the thread that collects
                self._out["error"] = exc
            finally:
                self._done.set()

        threading.Thread(target=run, name="started", daemon=True).start()

    def result(self) -> Any:
        """The task's result (its error raised), waited for in short waits, so that a signal's
        handler runs between them."""
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
        """Its child killed (and every process it started), where still running."""
        for proc in self._procs:
            if proc.poll() is None:
                _kill(proc)


def stop_all() -> None:
    """Every running child killed, and no other started until the next :func:`in_parallel`
    from the main thread or :meth:`Beside.start`."""
    with _lock:
        _stopped.set()
        for proc in _running:
            _kill(proc)


def cli(*args: str, timeout: float = 300, env: dict | None = None) -> dict:
    """Run ``python -m dpr_cache ARGS``: its exit code (None: out of time, with the stack it
    hung in), seconds, last stderr line."""
    run = child([sys.executable, "-m", "dpr_cache", *args], timeout, env)
    lines = run["stderr"].strip().splitlines()
    last = lines[-1] if lines else ""
    if run["rc"] is None:  # its stderr ends with the stack the fault handler printed
        last = f"out of time after {timeout:.0f} s"
    row = {
        "command": "dpr-cache " + " ".join(args),
        "rc": run["rc"],
        "started_s": run["started_s"],
        "seconds": run["seconds"],
        "last_line": last,
        "stdout": run["stdout"].strip().splitlines()[-12:],
    }
    if run["rc"] is None:
        row["stack"] = lines[-40:]
    return row


def _sets(out: Path, section: str, device: str, **extra) -> list[str]:
    """``--set`` pairs: the run's folders (its own data cache, so that runs at the same time
    share nothing), and the device of the one config section the command reads (``index`` and
    ``eval`` refuse a ``train.device`` they would not use)."""
    values = {
        "output_dir": out,
        "data.cache_dir": out / "cache",
        f"{section}.device": device,
        **({"train.num_threads": "null"} if section == "train" else {}),
        **extra,
    }
    return [arg for k, v in values.items() for arg in ("--set", f"{k}={v}")]


def toy_pipeline(work: Path, device: str, precision: str = "fp16", steps: int = 12) -> dict:
    """train -> index -> eval on the toy config, and beside them ``verify`` (float64, and on a
    GPU float32), every command on ``device``; beside the eval, the same eval again in a process
    that reads its resident memory by stage (:func:`resident_by_stage`), and on a device once
    more with the eval on the CPU, so that what the device adds to the process stands apart."""
    out = work / "pipeline"
    train = {"train.precision": precision, "train.max_steps": steps}

    def args(command: str) -> list[str]:  # index or eval, on the device, at the precision
        sets = _sets(out, command, device, **{f"{command}.precision": precision})
        return [command, "--config", TOY, *sets]

    def train_index_eval() -> list[dict]:
        rows = [cli("train", "--config", TOY, *_sets(out, "train", device, **train), "-q")]
        rows.append(cli(*args("index")))
        # a budget the eval on a GPU meets, so that the child's search runs to its end
        budget = ["--set", f"index.memory_gb={RESIDENT_BUDGET_GB}"]
        eval_resident = [*args("eval"), *budget, "--out", str(out / "eval-resident")]
        evals = {
            "eval": lambda: cli(*args("eval")),
            "resident": lambda: resident_by_stage(eval_resident),
        }
        if device != "cpu":  # the same on the machine's CPU: what the device adds, set apart
            on_cpu = ["--set", "eval.device=cpu", "--set", "eval.precision=fp32"]
            cpu_out = ["--out", str(out / "eval-resident-cpu")]
            evals["on_cpu"] = lambda: resident_by_stage([*args("eval"), *budget, *on_cpu, *cpu_out])
        done = in_parallel(evals, {})
        found["eval_resident"] = done.get("resident")
        found["eval_resident_cpu"] = done.get("on_cpu")
        return [*rows, done["eval"]]

    def verify(*flags: str) -> Callable[[], list[dict]]:
        folder = work / f"verify{''.join(flags).replace('-', '_')}"
        return lambda: [cli("verify", "--config", TOY, *_sets(folder, "train", device), *flags)]

    found: dict[str, Any] = {}  # the eval run again beside the pipeline's, for its memory
    tasks = {"train": train_index_eval, "verify double": verify("--double")}
    if device == "cuda":  # fp32 on the GPU: matrix products of other shapes, the bound 1e-4
        tasks["verify"] = verify()
    done = in_parallel(tasks, {})
    rows = [row for name in tasks for row in done[name]]
    metrics = out / "eval" / "metrics.json"
    log = out / "train_log.jsonl"
    return {
        "commands": rows,
        "metrics": json.loads(metrics.read_text()) if metrics.exists() else None,
        "logged_steps": len(log.read_text().splitlines()) if log.exists() else 0,
        "ok": all(r["rc"] == 0 for r in rows),
        "eval_resident": found.get("eval_resident"),
        "eval_resident_cpu": found.get("eval_resident_cpu"),  # a device's run only
    }


def resident_by_stage(args: list[str], timeout: float = 180) -> dict:
    """A command run again in a fresh process that reads its resident memory (total, anonymous,
    in transparent huge pages, file-backed; GB) and its age (seconds since it started) after
    each import, after each of the command's stages and where its search plans its blocks, so
    that a process over its memory budget shows where the memory came from, and a slow start
    where its time went. Each reading is a line of the child's output as it is
    taken, so a child that crashes or runs out of time keeps those before. The readings, the
    exit code (None: out of time), the last line of its stderr and the kernel's transparent
    huge page mode; and where the search plans its blocks, the mappings that hold the most
    (:func:`largest_mappings`)."""
    cmd = [sys.executable, "-m", "benchmarks.gpu_cli", "resident-child", *args]
    run = child(cmd, timeout)
    readings, mappings = {}, []
    for line in run["stdout"].splitlines():
        try:
            reading = json.loads(line)
        except ValueError:
            continue  # the command's own output
        if isinstance(reading, dict) and "stage" in reading:
            readings[reading.pop("stage")] = reading
        elif isinstance(reading, dict) and "mappings" in reading:
            mappings = reading["mappings"]
    last = (run["stderr"].strip().splitlines() or [""])[-1]
    if run["rc"] is None:
        last = f"out of time after {timeout:.0f} s ({last})"
    return {
        "started_s": run["started_s"],
        "readings": readings,
        "largest_mappings": mappings,
        "memory_gb": (
            [a.split("=", 1)[1] for a in args if a.startswith("index.memory_gb=")] or [None]
        )[-1],
        "rc": run["rc"],
        "last_line": last,
        "transparent_hugepage": transparent_hugepages(),
    }


def _process_age() -> float | None:
    """Seconds since this process started (``/proc/self/stat``'s start time against
    ``/proc/uptime``); None where unreadable."""
    try:
        start_ticks = int(Path("/proc/self/stat").read_text().rsplit(")", 1)[1].split()[19])
        uptime = float(Path("/proc/uptime").read_text().split()[0])
    except (OSError, ValueError, IndexError):
        return None
    return round(uptime - start_ticks / os.sysconf("SC_CLK_TCK"), 2)


def _resident() -> dict[str, float]:
    fields = {
        ("/proc/self/status", "VmRSS"): "rss_gb",
        ("/proc/self/status", "RssAnon"): "anon_gb",
        ("/proc/self/status", "RssFile"): "file_gb",
        # anonymous memory in transparent huge pages: a 2 MB page is resident whole
        ("/proc/self/smaps_rollup", "AnonHugePages"): "huge_gb",
    }
    reading = {"age_s": _process_age()}
    for (path, key), name in fields.items():
        value = proc_field(path, key)  # "123 kB"
        if value is not None:
            reading[name] = round(int(value.split()[0]) * 1024 / 1e9, 3)
    return reading


def largest_mappings(n: int = 8) -> list[dict]:
    """The ``n`` files (or ``[anonymous]``, ``[heap]``...) whose mappings in this process hold the
    most resident memory (``/proc/self/smaps``): each one's resident and anonymous GB, the
    anonymous part being its private copies (a library's relocated data, say)."""
    totals: dict[str, list[int]] = {}
    name = "[anonymous]"
    try:
        lines = Path("/proc/self/smaps").read_text().splitlines()
    except OSError:
        return []
    for line in lines:
        head = line.split(maxsplit=5)
        if len(head) >= 5 and "-" in head[0] and not head[0].endswith(":"):
            name = head[5] if len(head) == 6 else "[anonymous]"
        elif head and head[0] in ("Rss:", "Anonymous:"):
            kb = totals.setdefault(name, [0, 0])
            kb[head[0] == "Anonymous:"] += int(head[1])
    top = sorted(totals.items(), key=lambda item: -item[1][0])[:n]
    return [
        {"mapping": m, "rss_gb": round(rss * 1024 / 1e9, 3), "anon_gb": round(anon * 1024 / 1e9, 3)}
        for m, (rss, anon) in top
    ]


def _resident_child(args: list[str]) -> None:
    seen: dict[str, int] = {}

    def read(stage: str) -> None:
        seen[stage] = seen.get(stage, 0) + 1
        name = stage if seen[stage] == 1 else f"{stage} ({seen[stage]})"
        print(json.dumps({"stage": name, **_resident()}), flush=True)

    read("import torch")  # this module's own imports
    for module in (
        "transformers",
        "faiss",
        "datasets",
        "dpr_cache.cli.app",
        "dpr_cache.retrieval.drivers.eval",
    ):
        importlib.import_module(module)
        read(f"import {module}")
    from dpr_cache.cli.app import app
    from dpr_cache.retrieval.dense import search
    from dpr_cache.runtime.laps import Laps

    lap, plan = Laps.lap, search.plan_blocks

    def lap_read(self, name: str) -> None:
        lap(self, name)
        read(f"after: {name}")

    def plan_read(*a, **k):
        read("search plans its blocks")
        print(json.dumps({"mappings": largest_mappings()}), flush=True)
        return plan(*a, **k)

    Laps.lap, search.plan_blocks = lap_read, plan_read
    sys.exit(app(args, standalone_mode=False))  # an error is printed and returned as its code


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
    extra = {"train.max_steps": steps, "train.checkpoint_every": every}
    tasks: dict[str, Callable[[], dict]] = {}
    folders = {}
    for deterministic in settings:
        sets = {**extra, "train.deterministic": str(deterministic).lower()}
        for name in ("a", "b", "killed"):
            folder = folders[deterministic, name] = work / f"resume-{deterministic}-{name}"
            args = _sets(folder, "train", device, **sets)
            if name == "killed":
                tasks[f"{deterministic} {name}"] = lambda f=folder, a=args: (
                    _train_killed_then_resumed(f, a, every)
                )
            else:
                tasks[f"{deterministic} {name}"] = lambda a=args: cli(
                    "train", "--config", TOY, *a, "-q"
                )
    done = in_parallel(tasks, {})
    out = {}
    for deterministic in settings:
        key = "deterministic" if deterministic else "default kernels"
        broken = done[f"{deterministic} killed"]
        codes = [done[f"{deterministic} a"], done[f"{deterministic} b"], broken["resume"]]
        if any(c["rc"] != 0 for c in codes):
            out[key] = {"error": [c["last_line"] for c in codes if c["rc"] != 0]}
            continue
        model = {name: folders[deterministic, name] / "model" for name in ("a", "b", "killed")}
        out[key] = {
            "two_unbroken_runs": _difference(model["a"], model["b"]),
            "resumed_vs_unbroken": _difference(model["killed"], model["a"]),
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
    dataset, batches, _ = training_data(config, env)
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


def chunk_too_large(work: Path, model_dir: Path, device: str, batch: int = 2048) -> dict:
    """``train`` with a chunk far beyond the GPU (``batch`` questions in one chunk, 256-token
    passages, one hard negative: on BERT-base's shape some hundred GB of activations): one
    ``error:`` line naming a chunk that fits, exit 2, no traceback. A command still running
    after 100 s is stopped with the stack it was in."""
    out = work / "too-large"
    sets = _sets(
        out,
        "train",
        device,
        **{
            "model.name_or_path": model_dir,
            "train.batch_size": batch,
            "train.chunk_size": batch,
            "train.max_steps": 1,
            "train.precision": "bf16",
            "model.max_passage_length": 256,
            "train.loss_tile_size": min(batch, 4096),
        },
    )
    data = work / "long.jsonl"
    _long_training_file(data, batch)
    row = cli("train", "--config", TOY, *sets, "--set", f"data.train={data}", "-q", timeout=100)
    return {
        **row,
        "chunk": batch,
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
    from dpr_cache.runtime.processes import free_port

    port = free_port()
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


RANK_TIMEOUT = 30  # DPR_CACHE_DIST_TIMEOUT of the frozen rank's run, seconds


def rank_faults(work: Path, model_dir: Path) -> dict:
    """The fault rows a GPU changes, on two GPUs (NCCL refuses two ranks on one device): a rank
    frozen in a sharded run under NCCL, and one rank of two out of GPU memory.
    ``tests/faults/test_sharded.py`` makes the same checks on gloo ranks on the CPU."""
    gpus = torch.cuda.device_count()
    if gpus < 2:
        return {
            "not_run": f"needs two GPUs (NCCL refuses two ranks on one); this device has {gpus}"
        }
    return {
        "frozen_rank": frozen_rank(work / "frozen"),
        "rank_out_of_memory": rank_out_of_memory(work, model_dir),
    }


def _ranks_train(out: Path, *extra: str, env: dict | None = None) -> subprocess.Popen:
    """The toy config sharded on 2 NCCL ranks under torchrun, in the background."""
    settings = {"train.shard": "fsdp", "train.max_steps": 12, "train.checkpoint_every": 2}
    settings |= {"train.deterministic": "true", "train.precision": "bf16"}
    cmd = [sys.executable, "-m", "torch.distributed.run", "--nproc_per_node=2", "-m"]
    cmd += ["dpr_cache", "train", "--config", TOY, "-q", *_sets(out, "train", "cuda", **settings)]
    full = {**os.environ, "OMP_NUM_THREADS": "1", **(env or {})}
    return _start(
        [*cmd, *extra], env=full, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True
    )


def _ended(proc: subprocess.Popen, timeout: float) -> str:
    """``proc``'s stderr once it has ended (killed, with its group, past ``timeout`` s)."""
    try:
        _, err = proc.communicate(timeout=timeout)
    except subprocess.TimeoutExpired:
        _kill(proc)
        _, err = proc.communicate()
    _forget(proc)
    return err


def _error_lines(stderr: str) -> list[str]:
    return [line for line in stderr.splitlines() if line.startswith("error: ")][:4]


def frozen_rank(out: Path) -> dict:
    """Rank 1 frozen (SIGSTOP) after step 3: how long rank 0 waits (goal: the timeout plus 10 s),
    its line, and whether ``--resume`` ends with the unbroken run's weights."""
    _ended(_ranks_train(out / "unbroken"), 600)
    agent = _ranks_train(out / "cut", env={"DPR_CACHE_DIST_TIMEOUT": str(RANK_TIMEOUT)})
    log = out / "cut" / "train_log.jsonl"
    deadline = time.monotonic() + 300
    while not (log.is_file() and log.read_text().count("\n") >= 3):
        if agent.poll() is not None or time.monotonic() > deadline:
            return {"ok": False, "lines": _error_lines(_ended(agent, 5)), "error": "no step 3"}
        time.sleep(0.05)
    frozen, survivor = rank_process(agent.pid, 1), rank_process(agent.pid, 0)
    os.kill(frozen, signal.SIGSTOP)
    frozen_at = time.monotonic()
    while os.path.exists(f"/proc/{survivor}") and time.monotonic() - frozen_at < RANK_TIMEOUT + 120:
        time.sleep(0.1)
    gave_up_s = round(time.monotonic() - frozen_at, 1)
    os.kill(frozen, signal.SIGKILL)
    lines = _error_lines(_ended(agent, 120))
    resumed = _ranks_train(out / "cut", "--resume")
    resumed_lines = _error_lines(_ended(resumed, 600))
    same = _difference(out / "unbroken" / "model", out / "cut" / "model")
    named = bool(lines) and f"rank 1 (pid {frozen}, not answering)" in lines[0]
    return {
        "timeout_s": RANK_TIMEOUT,
        "gave_up_s": gave_up_s,
        "lines": lines,
        "resumed_lines": resumed_lines,
        "resumed": same,
        "ok": named and gave_up_s <= RANK_TIMEOUT + 10 and same["bitwise_equal"],
    }


def rank_out_of_memory(work: Path, model_dir: Path) -> dict:
    """Rank 1's GPU held by another process but for 1 GiB while a sharded BERT-base run at
    chunk 128 starts there: rank 1's line names the setting to lower, rank 0's the rank."""
    hog = _start(
        [sys.executable, "-c", _HOG],
        env={**os.environ, "CUDA_VISIBLE_DEVICES": "1"},
        stdout=subprocess.PIPE,
        text=True,
    )
    try:
        if hog.stdout.readline().strip() != "held":
            return {"ok": False, "error": "the process holding GPU 1 did not start"}
        settings = {"model.name_or_path": model_dir, "train.batch_size": 256}
        settings |= {"train.chunk_size": 128, "model.max_passage_length": 256}
        extra = [arg for k, v in settings.items() for arg in ("--set", f"{k}={v}")]
        env = {"DPR_CACHE_DIST_TIMEOUT": str(RANK_TIMEOUT)}
        lines = _error_lines(_ended(_ranks_train(work / "oom", *extra, env=env), 300))
    finally:
        _kill(hog)
        hog.wait()
        _forget(hog)
    said_memory = any("memory" in line and "train.chunk_size" in line for line in lines)
    said_rank = any(line.startswith("error: rank 0:") and "rank 1" in line for line in lines)
    return {"lines": lines, "ok": said_memory and said_rank}


_HOG = """
import time, torch
free, _ = torch.cuda.mem_get_info(0)
held = torch.empty(free - 2**30, dtype=torch.uint8, device="cuda:0")
print("held", flush=True)
time.sleep(3600)
"""


def clean(work: Path) -> None:
    shutil.rmtree(work, ignore_errors=True)


if __name__ == "__main__":
    if sys.argv[1:] == ["nccl-child"]:
        _nccl_child()
    elif sys.argv[1:2] == ["resident-child"]:
        _resident_child(sys.argv[2:])
