"""The GPU suite's sections and their run within ``--budget-s``, ``gpu.json`` and ``gpu.md``
written after each; without CUDA a dry run of the CPU-capable parts at toy size (CI runs it)."""

from __future__ import annotations

import contextlib
import datetime
import functools
import json
import math
import os
import platform
import signal
import subprocess
import tempfile
import time
import traceback
from collections import namedtuple
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from types import SimpleNamespace
from typing import Annotated, NamedTuple

import torch
import typer

from benchmarks import harness
from benchmarks.gpu import cli, compiled, exact, fsdp, llm, perf
from benchmarks.gpu.perf import Variant
from benchmarks.gpu.report import write_page

REPO = Path(__file__).resolve().parents[2]
SQUAD = REPO / "data" / "squad" / "dev-v1.1.json.gz"
TINY = REPO / "data" / "toy" / "tiny-bert"


# One interleaved group of the speed section: warm-ups 0 after a group of the same chunks (its
# CUDA cache kept), the peers' chunks below peer_min_chunk left out (their slowest rows).
_GROUP_FIELDS = "batch rounds warmups peer_min_chunk full_batch variants"
SpeedGroup = namedtuple("SpeedGroup", _GROUP_FIELDS, defaults=[0, False, False])


_COMPILED = "reduce-overhead"  # CUDA graphs: a chunk's launches replayed at once
# Each setting (on a device, in the dry run). Memory at chunk 128: at 32, B=8,192's step went on
# the host's ~50 ms a chunk. Speed: every chunk from 32 to 512, so that a chunk's cost is fitted;
# widths rounded up to 64 (a length bucket), so a compiled step has few shapes to compile.
_PLANS = {
    "exact_sizes":       (["tiny", "base"], ["tiny"]),  # the random BERTs of the float64 proof
    "mixed_size":        ("base", "tiny"),  # the BERT of the mixed-precision bounds
    "precisions":        (["bf16", "fp16"], ["bf16"]),
    "memory_batches":    ([128, 512, 2048, 8192], [4, 8]),  # GradCache's peak at each batch
    "memory_chunk":      (128, 2),
    "speed_precision":   ("fp16", "fp32"),
    "speed_groups":      ([SpeedGroup(512, 2, 1, full_batch=True, variants=True),  # goals' first
                           SpeedGroup(2048, 1, 0, peer_min_chunk=128)],
                          [SpeedGroup(8, 1, 1, full_batch=True, variants=True),
                           SpeedGroup(16, 1, 0, peer_min_chunk=4)]),
    "speed_chunks":      ([32, 64, 128, 256, 512], [2, 4, 8, (8, 4)]),
    "speed_variants":    ([Variant(32, length_bucket=64), Variant(128, length_bucket=64)],
                          [Variant(2, length_bucket=8)]),
    "host_wait_chunks":  ([32, 128], [2]),  # dpr-cache's chunks whose host waits are counted
    "cmnrl_rows":        ([32, 64, 128, 256, 512], [2, 4, 8]),  # CachedMNRL's mini-batches
    "cmnrl_tokens":      ([32768], [512]),  # its token-budget mini-batches
    "lib_chunks":        ([32, 64, 128, 256, 512], [2, 4, (8, 4)]),  # luyug/GradCache's
    "savings_chunk":     (128, 4),  # the memory goal's chunk, where the chunks' costs show
    "savings_rounds":    (2, 1),
    "compile_mode":      (_COMPILED, None),  # a CPU compile of the tiny BERT takes minutes
    "compiled_variants": ([Variant(128, length_bucket=64, compile_mode=_COMPILED),
                           Variant(32, length_bucket=64, compile_mode=_COMPILED)], []),
    "compile_rounds":    (2, 1),
    "encode_rows":       (80_000, 300),  # the corpus of the encode rate
    "encode_batch":      (512, 64),
    "encode_workers":    (8, 1),  # 1: the device's path, tokenized in a worker process
    "model_rows":        (20_000, 200),  # passages encoded by the model alone
    "cli_steps":         (12, 3),  # steps of the toy pipeline
    "determinism":       ((False, True), (True,)),  # train.deterministic of the resume check
    "score_pairs":       (6_000, 64),  # pairs of score's cross-encoder loop
    "score_precisions":  (["bf16", "fp16", "fp32"], ["fp32", "bf16"]),
    "score_batch":       (256, 16),
    "score_rounds":      (2, 2),  # timed rounds of each precision, the order alternating
    "score_shape":       ((6, 384), (2, 64)),  # layers, width: all-MiniLM-L6-v2's on a device
    "llm":               (llm.GPU_LLM, llm.DRY_LLM),
    "fsdp":              (fsdp.GPU_FSDP, fsdp.DRY_FSDP),
}  # fmt: skip
GPU_PLAN = SimpleNamespace(**{name: gpu for name, (gpu, _) in _PLANS.items()})
DRY_PLAN = SimpleNamespace(**{name: dry for name, (_, dry) in _PLANS.items()})


def environment(device: torch.device) -> dict:
    """The device, its driver, torch and CUDA versions, the date and the host."""
    now = datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%d %H:%M UTC")
    env = {"date": now, "torch": torch.__version__, "cuda": torch.version.cuda}
    env |= {"python": platform.python_version(), "host": harness.machine_info(str(device), None)}
    env["device"] = str(device)
    if device.type != "cuda":
        return env
    props = torch.cuda.get_device_properties(device)
    env |= {"device_name": props.name, "memory_bytes": props.total_memory, "driver": None}
    env["multiprocessors"] = props.multi_processor_count
    query = ["nvidia-smi", "--query-gpu=driver_version", "--format=csv,noheader"]
    with contextlib.suppress(OSError, subprocess.SubprocessError):
        run = subprocess.run(query, capture_output=True, text=True, timeout=30)
        env["driver"] = run.stdout.strip() or None
    return env


@dataclass
class Suite:
    """What every section's function is given."""

    plan: SimpleNamespace
    device: torch.device
    work: Path
    tokenizer: str
    partial: dict  # the longer sections' figures so far, by section name
    beside: cli.Beside | None = None  # the command-line section's commands

    @property
    def cuda(self) -> bool:
        return self.device.type == "cuda"

    def base_model(self) -> Path:
        """BERT-base's shape on a device (written once), the tiny BERT on the CPU."""
        model_dir = self.work / "bert-base"
        if self.cuda and not model_dir.exists():
            harness.write_random_bert(model_dir, 768, 12, self.tokenizer)
        return model_dir if self.cuda else TINY

    def squad(self) -> Path:
        """SQuAD's DPR files, built once."""
        from dpr_cache.data.squad import build_squad

        if not (self.work / "squad" / "passages.tsv").exists():
            build_squad(SQUAD, self.work / "squad")
        return self.work / "squad"

    def freed(self) -> Suite:
        """This suite, what a stopped section left on the device freed."""
        perf.free_device(self.device)
        return self


def _exactness(s: Suite) -> dict:
    on, mode = str(s.device), s.plan.compile_mode  # compiled checks in a child, beside the rest
    run = functools.partial(compiled.exactness_in_child, on, mode)
    in_child = cli.Started(lambda on_start: run(on_start=on_start)) if mode else None
    try:
        cases, size = exact.exact_cases(s.plan.exact_sizes), s.plan.exact_sizes[-1]
        out = {"fp64": [_clocked(exact.fp64_exactness, c, s.device) for c in cases]}
        replay = functools.partial(_clocked, exact.replay_bitwise, size, s.device)
        out["replay"] = [replay(p) for p in ["fp32", *s.plan.precisions]]
        out["finite_difference"] = _clocked(exact.dropout_finite_difference, "tiny", s.device)
        not_run = {"not_run": "a dry run compiles nothing"}
        return out | {"compiled": in_child.result() if in_child else not_run}
    finally:
        if in_child is not None:  # a check that failed leaves no child running
            in_child.stop()


def _mixed(s: Suite) -> dict:
    size, device = s.plan.mixed_size, s.device
    rows = [_clocked(exact.mixed_precision, size, device, p) for p in s.plan.precisions]
    overflow = _clocked(cli.fp16_overflow, device, batch=64 if s.cuda else 8)
    return {"rows": rows, "fp16_overflow": overflow}


def _memory(s: Suite) -> dict:
    ran_beside = s.beside.started and not s.beside.done  # the toy commands, still running
    where, plan = (s.base_model(), s.work / "mem", s.device), s.plan
    rows = perf.memory_by_batch(*where, plan.memory_batches, chunk=plan.memory_chunk)
    return {"rows": rows, "beside_commands": ran_beside}


def _full_batch(s: Suite) -> dict:  # alone, once the commands beside have ended: it fills the GPU
    return perf.largest_full_batch(s.freed().base_model(), s.work / "mem", s.device)


def _speed(s: Suite) -> dict:
    from dpr_cache.model.biencoder import BiEncoder

    model = BiEncoder.from_pretrained(s.base_model(), shared=True, pooling="cls")
    model, plan = model.to(s.device).train(), s.plan
    out = s.partial["speed"] = {"comparisons": [], "tokens": []}
    squad_batch = functools.partial(perf.squad_batch, model, SQUAD, s.work / "squad")
    precision, first = plan.speed_precision if s.cuda else "fp32", None
    peers = {"chunks": plan.speed_chunks, "cmnrl_rows": plan.cmnrl_rows, "batch_of": squad_batch}
    peers |= {"cmnrl_tokens": plan.cmnrl_tokens, "lib_chunks": plan.lib_chunks}
    for group in plan.speed_groups:  # the goals' batch first: a section cut short keeps it
        batch = squad_batch(group.batch)
        first = first or batch
        q, p = (int(x["attention_mask"].sum()) for x in (batch.q_inputs, batch.p_inputs))
        out["tokens"].append({"batch": batch.n_questions, "questions": q, "passages": p})
        timing = group._asdict() | {"fresh_cache": group.warmups > 0}
        waits = {f"dpr-cache chunk {c}" for c in plan.host_wait_chunks} if first is batch else ()
        timing |= {"host_waits": waits, "variants": plan.speed_variants if group.variants else []}
        del timing["batch"]
        row = perf.speed_comparison(model, batch, precision, **peers, **timing)
        out["comparisons"].append(row)
        print(f"  speed B={group.batch} {precision}: {row['best']}", flush=True)
    sizes = (s.plan.savings_chunk, s.plan.savings_rounds)
    return out | {"savings": perf.savings(model, first, precision, *sizes)}


def _compilation(s: Suite) -> dict:
    plan, timeout = s.plan, max(30.0, _time_left(600) - 20)  # its figures printed before
    where = (s.base_model(), SQUAD, s.work / "squad", str(s.device), plan.compiled_variants)
    batch = plan.speed_groups[0].batch
    return compiled.speed_in_child(*where, batch, plan.compile_rounds, timeout=timeout)


def _encoding(s: Suite) -> dict:
    from dpr_cache.model.biencoder import BiEncoder

    plan, precision = s.plan, "fp16" if s.cuda else "fp32"
    sizes = {"batch_size": plan.encode_batch, "workers": plan.encode_workers}
    where = (s.base_model(), s.squad(), s.work, s.device.type, plan.encode_rows)
    rate = perf.encode_rate(*where, precision=precision, **sizes)
    model = BiEncoder.from_pretrained(s.base_model(), pooling="cls").to(s.device)
    passages, rows = perf.passages_path(s.work, plan.encode_rows), plan.model_rows
    alone = perf.model_encode_rate(model, passages, s.device, precision, plan.encode_batch, rows)
    flops = perf.passage_flops(model, alone["mean_tokens"])
    dtype = torch.float16 if s.cuda else torch.float32
    peak = perf.matmul_tflops(s.device, dtype, n=8192 if s.cuda else 512)
    limit_s = harness.NQ_PASSAGES * flops / (peak * 1e12)
    projected = harness.NQ_PASSAGES / rate["passages_per_s"] if "error" not in rate else None
    out = {"command": rate, "encoder_alone": alone, "flops_per_passage": flops}
    out |= {"matmul_tflops": peak, "nq_passages": harness.NQ_PASSAGES, "nq_limit_s": limit_s}
    out |= {"passage_words": perf.PASSAGE_WORDS, "nq_projected_s": projected}  # NQ's words
    return out | {"share_of_limit": limit_s / projected if projected else None}


def _teacher_scoring(s: Suite) -> dict:
    into = s.partial.setdefault("teacher_scoring", {})
    return perf.teacher_score_rate(s.plan, s.tokenizer, s.squad(), s.work, s.device, into)


def _command_tasks(s: Suite) -> dict[str, Callable[[], dict]]:
    """The command-line section's commands."""
    folder, on, precision = s.work / "cli", s.device.type, "fp16" if s.cuda else "fp32"
    tasks = {
        "pipeline": lambda: cli.toy_pipeline(folder, on, precision, s.plan.cli_steps),
        "resume": lambda: cli.resume_equality(folder, on, s.plan.determinism),
    }
    return tasks | ({"nccl": cli.nccl_collectives} if s.cuda else {})


def _command_line(s: Suite) -> dict:
    s.beside.wait()
    commands = s.partial["command_line"]
    print(f"  command line: pipeline ok={commands['pipeline']['ok']}", flush=True)
    out = {name: commands[name] for name in s.beside.tasks}
    return out | {"commands_s": s.beside.seconds, "ran_beside": s.beside.ran_beside}


def _llm(s: Suite) -> dict:  # alone, last: it fills the GPU; a 7B step at B=1,024 takes a minute
    into = s.freed().partial.setdefault("llm", {})
    return llm.llm_figures(s.plan.llm, s.device, s.work / "llm", _time_left, into)


def _fsdp(s: Suite) -> dict:  # last: it joins a process group of one, left again at its end
    return fsdp.fsdp_figures(s.plan.fsdp, s.freed().device, s.partial.setdefault("fsdp", {}))


def _too_large(s: Suite) -> dict:  # alone, once the commands beside have ended: it fills the GPU
    return cli.chunk_too_large(s.work / "cli", s.freed().base_model(), s.device.type)


class Section(NamedTuple):
    """One part of the suite, in run order."""

    name: str
    needs: str | None  # why it needs CUDA (None: it runs on the CPU too)
    estimate: float  # seconds expected on an H200 (docs/bench/gpu_history.md)
    run: Callable[[], dict]
    beside: cli.Beside | None = None  # commands, on a device started with the suite ...
    hosts_commands: bool = False  # ... when every section before runs well beside them


_COMPILE_NEEDS = "needs a GPU (a CPU compile takes minutes)"
SECTIONS = [  # llm takes most of a 600 s call
    Section("exactness",          None, 60,  _exactness, hosts_commands=True),
    Section("mixed_precision",    None, 45,  _mixed, hosts_commands=True),
    Section("command_line",       None, 125, _command_line),
    Section("memory",             None, 25,  _memory),
    Section("chunk_too_large",    "needs a GPU to run out of", 35, _too_large),
    Section("largest_full_batch", "needs a GPU to fill", 21, _full_batch),
    Section("speed",              None, 145, _speed),
    Section("encoding",           None, 50,  _encoding),
    Section("teacher_scoring",    None, 35,  _teacher_scoring),
    Section("compilation",        _COMPILE_NEEDS, 120, _compilation),
    Section("llm",                None, 380, _llm),
    Section("fsdp",               None, 45,  _fsdp),
]  # fmt: skip


def _sections(plan, device: torch.device, work: Path, tokenizer: str, partial: dict):
    """:data:`SECTIONS` bound to this run (the longer ones fill ``partial[name]`` as they go)."""
    s = Suite(plan, device, work, tokenizer, partial)
    s.beside = cli.Beside(_command_tasks(s), partial.setdefault("command_line", {}))
    bound = []
    for section in SECTIONS:
        beside = s.beside if section.run is _command_line else None
        bound.append(section._replace(run=functools.partial(section.run, s), beside=beside))
    return bound


SECTION_CAP = 3  # a section on a device stops at this many times its estimate
_deadline: float | None = None  # when the running section stops (monotonic), on a device


def _time_left(default: float = math.inf) -> float:
    """Seconds until the running section stops, or ``default`` where it has no limit."""
    return default if _deadline is None else _deadline - time.monotonic()


def _clocked(measure: Callable[..., dict], *args, **kwargs) -> dict:
    """``measure``'s row with the seconds it took, printed as it ends."""
    start = time.monotonic()
    row = measure(*args, **kwargs)
    row["seconds"] = round(time.monotonic() - start, 2)
    print(f"  {measure.__name__}{args[:1]}: {row['seconds']:.1f} s", flush=True)
    return row


def run_suite(out: Path, *, budget_s: float, tokenizer: str, dry=None, only=None) -> dict:
    """Every section that fits the budget, or those of ``only`` (the others kept from gpu.json),
    the page after each; on a device the commands start with the suite where they may."""
    cuda = torch.cuda.is_available() if dry is None else not dry
    device = torch.device("cuda", 0) if cuda else torch.device("cpu")
    if not cuda:
        torch.set_num_threads(1)  # a rehearsal: one thread, so that it costs a shared CPU little
    cli.clock_zero = time.monotonic()
    deadline = cli.clock_zero + budget_s
    report = {"dry_run": not cuda, "environment": environment(device), "only": only}
    report |= {"planned": None, "sections": {}}
    out.mkdir(parents=True, exist_ok=True)
    partial: dict[str, dict] = {}
    with tempfile.TemporaryDirectory(prefix="dpr-cache-gpu-") as tmp:
        every = _sections(GPU_PLAN if cuda else DRY_PLAN, device, Path(tmp), tokenizer, partial)
        sections = _planned(every, report, out)
        report["planned"] = [s.name for s in sections]
        for i, section in enumerate(sections):
            if cuda and section.beside and all(s.hosts_commands for s in sections[:i]):
                section.beside.ran_beside = [s.name for s in sections[:i]]
                section.beside.start()
        try:
            for section in sections:
                left, done = deadline - time.monotonic(), report["sections"]
                done[section.name] = _run_section(section, cuda, left, report, partial)
                report["sections"] = {s.name: done[s.name] for s in every if s.name in done}
                report["seconds"] = round(time.monotonic() - cli.clock_zero, 1)
                write_page(report, out)
        finally:
            for section in sections:
                if section.beside is not None:
                    section.beside.stop()
    return report


def _planned(sections: list[Section], report: dict, out: Path) -> list[Section]:
    """All sections, or those of ``report["only"]`` in its order (the others kept, dated)."""
    names, only, path = [s.name for s in sections], report["only"], out / "gpu.json"
    unknown = sorted(set(only or []) - set(names))
    if unknown:
        raise typer.BadParameter(f"unknown section(s) {unknown}; the sections are {names}")
    earlier = json.loads(path.read_text()) if only and path.exists() else {"sections": {}}
    if only and path.exists() and earlier.get("dry_run") != report["dry_run"]:
        raise typer.BadParameter(f"{path} is a {'dry' if earlier.get('dry_run') else 'GPU'} run's")
    for name in [n for n in names if only and n not in only]:
        kept = earlier["sections"].get(name)
        none = {"skipped": "not asked for (--only), none in gpu.json"}
        report["sections"][name] = {**_stamp(earlier["environment"]), **kept} if kept else none
    write_page(report, out)
    if not only:
        return sections
    return sorted((s for s in sections if s.name in only), key=lambda s: only.index(s.name))


def _run_section(section: Section, cuda: bool, left: float, report: dict, partial: dict) -> dict:
    """One section's figures, error or why skipped; on a device stopped at the budget or cap."""
    global _deadline
    if section.needs and not cuda:
        return {"skipped": section.needs}
    estimate = section.estimate
    if section.beside is not None and section.beside.done:
        estimate = 5  # its commands have ended: their results are only collected
    if cuda and left < estimate:
        if section.beside is not None:
            section.beside.stop()
        return {"skipped": f"out of time ({left:.0f} s left)"}
    limit = min(left, SECTION_CAP * estimate) if cuda else None
    stop = f", stops at {limit:.0f} s" if limit is not None else ""
    print(f"{section.name}: started, {estimate} s expected{stop}", flush=True)
    _deadline = None if limit is None else time.monotonic() + limit
    try:
        result = _timed(section.run, report["environment"], limit)
    finally:
        _deadline = None
    if section.name in partial and "error" in result:
        result["partial"] = partial[section.name]
    print(f"{section.name}: {result['seconds']:.0f} s", flush=True)
    return result


def _stamp(environment: dict) -> dict:
    device = environment.get("device_name") or environment["device"]
    return {"date": environment["date"], "device_name": device}


class SectionTimeout(Exception):
    """A section ran past the seconds left of the suite's budget, or past its cap."""


def _timed(run: Callable[[], dict], environment: dict, limit_s: float | None = None) -> dict:
    start, previous = time.monotonic(), signal.getsignal(signal.SIGALRM)

    def out_of_time(signum, frame):
        raise SectionTimeout(f"stopped after {limit_s:.0f} s (the budget left or its cap)")

    if limit_s is not None:
        signal.signal(signal.SIGALRM, out_of_time)
        signal.alarm(max(1, int(limit_s)))
    try:
        result = {"result": run()}
    except Exception as exc:  # a section's failure is a finding: record it, go on
        result = {"error": f"{type(exc).__name__}: {exc}", "traceback": traceback.format_exc()}
        if torch.cuda.is_available():
            torch.cuda.empty_cache()
    finally:
        if limit_s is not None:
            signal.alarm(0)
            signal.signal(signal.SIGALRM, previous)
    result["seconds"] = round(time.monotonic() - start, 1)
    return {**result, **_stamp(environment)}


def default_tokenizer() -> str:
    """``.gpu/tokenizer`` where it was carried to a device, else all-MiniLM-L6-v2's (30,522)."""
    carried = REPO / ".gpu" / "tokenizer"
    if carried.exists():
        return str(carried)
    from dpr_cache.model.hub import resolve_model_path

    return str(resolve_model_path(harness.MINILM))


_ONLY = "Comma-separated sections to run again; the rest are kept from OUT/gpu.json."


def main(
    out: Annotated[Path, typer.Option(help="Folder for gpu.json and gpu.md.")] = Path("docs/bench"),
    budget_s: Annotated[float, typer.Option(help="Seconds the whole suite may take.")] = 560.0,
    tokenizer: Annotated[str | None, typer.Option(help="WordPiece tokenizer folder.")] = None,
    dry_run: Annotated[bool, typer.Option(help="The CPU rehearsal even where CUDA is.")] = False,
    only: Annotated[str | None, typer.Option(help=_ONLY)] = None,
) -> None:
    """Run the GPU suite (a dry run at toy size without CUDA) and write its page."""
    # a device lent for a lease has no network: no library (nor a child) waits on the hub
    os.environ.update(HF_HUB_OFFLINE="1", HF_DATASETS_OFFLINE="1", TRANSFORMERS_OFFLINE="1")
    names = [name.strip() for name in only.split(",")] if only else None
    tokenizer = tokenizer or default_tokenizer()
    report = run_suite(out, budget_s=budget_s, tokenizer=tokenizer, dry=dry_run or None, only=names)
    print((out / "gpu.md").read_text().split("\n## ", 2)[1][:4000])
    if any("error" in s for s in report["sections"].values()):
        raise typer.Exit(1)
