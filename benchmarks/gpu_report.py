"""The GPU page from the suite's figures: ``gpu.json`` as measured and ``gpu.md`` to read, with
the goals of the GPU issue checked against them."""

from __future__ import annotations

from pathlib import Path

from benchmarks.gpu_report_fsdp import fsdp_goals, render_fsdp
from benchmarks.gpu_report_llm import llm_goals, render_llm
from benchmarks.gpu_report_speed import (
    compiles_text,
    counters_text,
    render_compilation,
    render_speed,
    speed_goals,
)
from benchmarks.harness import cpu_text
from dpr_cache.runtime.atomic import write_json_atomic, write_text_atomic

__all__ = ["write_page", "goals", "markdown", "render"]

NQ_PASSAGES = 21_015_324
DPR_ENCODE = "about 8.8 hours on 8 GPUs, some 70 GPU-hours (DPR's paper)"


def render(report: dict, folder: Path, source: Path | None = None) -> Path:
    """``gpu.md`` (and ``gpu.json`` with its goals) in ``folder``."""
    write_page(report, folder)
    return folder / "gpu.md"


def write_page(report: dict, out: Path) -> None:
    report["goals"] = goals(report)
    write_json_atomic(out / "gpu.json", report)
    write_text_atomic(out / "gpu.md", markdown(report))


_PARTIAL_SHOWN = (
    "speed",
    "command_line",
    "llm",
    "fsdp",
)  # figures before a stop: reported (and judged)
ENCODE_GOAL_MIN = 30
HISTORY = "gpu_history.md"  # the runs so far, what each missed and what fixed it


def _result(report: dict, name: str) -> dict | None:
    """A section's figures: its result, or for :data:`_PARTIAL_SHOWN` what it measured before
    it stopped."""
    section = report["sections"].get(name, {})
    if name in _PARTIAL_SHOWN and "error" in section:
        return section.get("partial")
    return section.get("result")


def _goal(name: str, measured: str, target: str, met: bool | None) -> dict:
    return {
        "goal": name,
        "measured": measured,
        "target": target,
        "met": None if met is None else bool(met),
    }


def goals(report: dict) -> list[dict]:
    """The issue's goals, each with its figure and whether the run met it (None: not measured)."""
    out = _exactness_goals(_result(report, "exactness"))
    mixed = _result(report, "mixed_precision")
    if mixed:
        for r in mixed["rows"]:
            out.append(
                _goal(
                    f"{r['precision']}, B=16, chunk 4: GradCache vs full batch",
                    f"{r['gradcache_vs_full']:.1e} (fp64 gap {r['gradcache_vs_fp64']:.1e}, "
                    f"the full batch's {r['full_vs_fp64']:.1e})",
                    f"<= {r['ceiling']:.0e}, fp64 gap <= {r['ratio_bound']}x the full batch's",
                    r["ok"],
                )
            )
    mem = _result(report, "memory")
    if mem:
        rows = [r for r in mem["rows"] if r["fits"]]
        if len(rows) >= 2:
            ratio = rows[-1]["peak_bytes"] / rows[0]["peak_bytes"]
            out.append(
                _goal(
                    f"{rows[-1].get('precision', 'bf16')}, chunk {rows[-1]['chunk']}: memory at "
                    f"B={rows[-1]['batch']} over B={rows[0]['batch']}",
                    f"{ratio:.2f}x",
                    "<= 1.2x",
                    ratio <= 1.2,
                )
            )
    speed = _result(report, "speed")
    out += [_goal(*g) for g in speed_goals(speed, _result(report, "compilation"))]
    enc = _result(report, "encoding")
    if enc and enc.get("nq_projected_s"):
        out.append(_encode_goal(enc))
    out += [_goal(*g) for g in llm_goals(_result(report, "llm"))]
    out += [_goal(*g) for g in fsdp_goals(_result(report, "fsdp"))]
    large = _result(report, "chunk_too_large")
    if large:
        out.append(
            _goal(
                "a chunk too large: one line naming a chunk that fits",
                f"exit {large['rc']}",
                "exit 2, `error: train.chunk_size ...`",
                large["ok"],
            )
        )
    if not report.get("dry_run", True):
        out.append(_suite_goal(report))
    return out


def _exactness_goals(ex: dict | None) -> list[dict]:
    """GradCache = the full batch in float64, the replay bitwise, and under compilation."""
    if not ex:
        return []
    worst = max(r["relative_error"] for r in ex["fp64"])
    replay = all(r["ok"] for r in ex["replay"])
    precisions = "/".join(r["precision"] for r in ex["replay"])
    out = [
        _goal(
            "fp64, B=7 and 8, chunks 2 to 4: GradCache = full batch",
            f"{worst:.1e}",
            "<= 1e-10",
            worst <= 1e-10,
        ),
        _goal(
            f"{precisions}, B=8, chunk 3: replayed reps bitwise equal (control differs)",
            "yes" if replay else "no",
            "yes",
            replay,
        ),
    ]
    if "compiled" in ex:
        out += _compiled_goals(ex["compiled"])
    return out


def _compiled_goals(c: dict) -> list[dict]:
    """The float64 gradient and the dropout replay with the towers compiled."""
    grad = "fp64, B=8, chunk 3, towers compiled: GradCache = eager full batch"
    replay = "fp32, B=8, chunk 3, towers compiled: re-forward = first pass to fp32 rounding"
    why = c.get("not_run")
    if why:
        targets = ((grad, "<= 1e-10"), (replay, "all within 1e-04, control > 1e-2"))
        return [_goal(g, f"not measured ({why})", t, None) for g, t in targets]
    out = []
    fp64, rep = c.get("fp64"), c.get("replay")
    if fp64 and "relative_error" in fp64:
        err = fp64["relative_error"]
        out.append(_goal(grad, f"{err:.1e} (mode {c['mode']})", "<= 1e-10", err <= 1e-10))
    else:
        out.append(_goal(grad, _compiled_failure(c, fp64), "<= 1e-10", False))
    if rep and "replayed" in rep:
        a, b = rep["replayed"], rep["control_without_replay"]
        measured = (
            f"{a['within_bound']}/{a['chunks']} chunks within {rep['bound']:.0e} (largest "
            f"{a['largest']:.1e}); without replay {b['largest']:.1e}"
        )
        out.append(
            _goal(replay, measured, f"all within {rep['bound']:.0e}, control > 1e-2", rep["ok"])
        )
    else:
        out.append(_goal(replay, _compiled_failure(c, rep), "all within 1e-04", False))
    return out


def _compiled_failure(c: dict, row: dict | None) -> str:
    """Why a compiled check has no figure: its own error, or the child's."""
    if row and "error" in row:
        return f"failed: {row['error'][:120]}"
    child = c.get("error") or {}
    return f"not reached ({child.get('why', 'no figure')})"


def _encode_goal(enc: dict) -> dict:
    """encode's projection to NQ, with the words its passages held and its share of the
    compute limit."""
    minutes = enc["nq_projected_s"] / 60
    words = enc.get("passage_words")
    sample = f"{words} words each" if words else "72 words on average, NQ's are 100"
    share = f"{enc['share_of_limit']:.0%} of the compute limit's {enc['nq_limit_s'] / 60:.1f} min"
    cmd = enc.get("command", {})
    how = f"{cmd.get('precision', 'fp16')}, batches of {cmd.get('batch_size', 512)}"
    return _goal(
        f"{how}: encode NQ's {NQ_PASSAGES:,} passages, projected (from passages of {sample})",
        f"{minutes:.0f} min ({share})",
        f"<= {ENCODE_GOAL_MIN} min",
        minutes <= ENCODE_GOAL_MIN,
    )


def _suite_goal(report: dict) -> dict:
    """The whole suite's minutes, judged only where one run ran every section to its end."""
    sections = report["sections"]
    minutes = report.get("seconds", 0) / 60
    measured, met = f"{minutes:.1f} min", minutes <= 6
    if "only" not in report or report["only"]:
        measured, met = "not run whole (--only: sections joined from runs)", None
    elif any("skipped" in s for s in sections.values()):
        measured, met = "not run whole (a section skipped)", None
    elif not set(report.get("planned") or ["?"]) <= set(sections):
        measured, met = "not run whole (cut short)", None
    compiled = sections.get("compilation", {})
    if met is not None and "seconds" in compiled:
        measured += f" (of which compilation {compiled['seconds']:.0f} s)"
    return _goal("the whole suite in one run", measured, "<= 6 min", met)


def _fmt_bytes(n: int | None) -> str:
    return "–" if n is None else f"{n / 1e9:.2f} GB"


def _elsewhere(section: dict, env: dict, device: str) -> str:
    """ ", run DATE on DEVICE" for a section kept from an earlier run, else nothing."""
    when = section.get("date", env["date"])
    where = section.get("device_name", device)
    if (when, where) == (env["date"], device):
        return ""
    return f", run {when}" + (f" on {where}" if where != device else "")


def markdown(report: dict) -> str:
    """The page's markdown."""
    env = report["environment"]
    dry = report["dry_run"]
    lines = ["# dpr-cache on a GPU", ""]
    if dry:
        lines += [
            "**Dry run on the CPU** (no CUDA here): the CPU-capable parts at toy size, to rehearse",
            "the suite; none of these figures is a GPU figure. `python -m benchmarks.gpu` on a",
            "machine with CUDA writes the real page.",
            "",
        ]
    device = env.get("device_name") or env["device"]
    lines += [
        f"Device: **{device}**"
        + (f", driver {env['driver']}" if env.get("driver") else "")
        + (f", {env['memory_bytes'] / 2**30:.0f} GiB" if env.get("memory_bytes") else ""),
        f"torch {env['torch']}, CUDA {env['cuda']}, Python {env['python']}; {env['date']};",
        f"Host: {cpu_text(env['host'])}; transformers {env['host']['transformers']}.",
        f"The suite took {report.get('seconds', 0):.0f} s: `python -m benchmarks.gpu --out DIR`.",
        f"The GPU runs so far, what each missed and what fixed it: [{HISTORY}]({HISTORY}).",
        "",
        "## Goals",
        "",
        *(["A dry run's figures are CPU rehearsals: the goals are GPU goals.", ""] if dry else []),
        "| goal | measured | target | met |",
        "|---|---|---|---|",
    ]
    for g in report.get("goals", []):
        met = {True: "yes", False: "**no**", None: "–"}[g["met"]]
        lines.append(f"| {g['goal']} | {g['measured']} | {g['target']} | {met} |")
    for name, section in report["sections"].items():
        lines += ["", f"## {name.replace('_', ' ').capitalize()}", ""]
        if "skipped" in section:
            lines.append(f"Skipped: {section['skipped']}.")
            continue
        if "error" in section:
            lines += [f"Failed after {section['seconds']} s: `{section['error']}`"]
            if section.get("partial") and name in _PARTIAL_SHOWN:
                lines += ["", "What it measured before it stopped:"]
                lines += _SECTION[name](section["partial"])
            elif section.get("partial"):
                lines += ["", "What it measured before it stopped is in gpu.json (`partial`)."]
            continue
        lines.append(f"{section['seconds']:.0f} s{_elsewhere(section, env, device)}.")
        lines += _SECTION[name](section["result"])
    if report.get("device_memory"):
        lines += _device_memory(report["device_memory"])
    return "\n".join(lines) + "\n"


def _device_memory(r: dict) -> list[str]:
    if "error" in r:
        return ["", "## Device memory while the suite ran", "", f"Not read: `{r['error']}`."]
    lines = [
        "",
        "## Device memory while the suite ran",
        "",
        f"Read twice a second (`cudaMemGetInfo`: every process on the {r['total_gb']:.0f} GB "
        "device together), under the section the suite was in; the suite's own share is its "
        "CUDA allocator's reserved memory at that moment. The commands that run beside the first "
        "sections are in the rest.",
        "",
        "| section | readings | most in use (GB) | the suite's own | at s | under 1 GiB free |",
        "|---|--:|--:|--:|--:|--:|",
    ]
    for name, row in r["sections"].items():
        lines.append(
            f"| {name} | {row['samples']} | {row['peak_used_gb']:.2f} | {row['own_gb']:.2f} | "
            f"{row['at_s']:.0f} | {r['full_samples'].get(name, 0)} |"
        )
    if r.get("processes"):
        lines += [
            "",
            "Processes `nvidia-smi` named (polled every 3 s), the most each held:",
            "",
            "| pid | command | most (GB) | in section | seen from s | to s |",
            "|--:|---|--:|---|--:|--:|",
        ]
        for p in r["processes"][:12]:
            command = _short(p.get("command") or "–")[:120]
            lines.append(
                f"| {p['pid']} | `{command}` | {p['peak_gb']:.2f} | {p.get('section', '–')} | "
                f"{p['first_s']:.0f} | {p['last_s']:.0f} |"
            )
    return lines


def _exactness(r: dict) -> list[str]:
    lines = [
        "",
        "float64, GradCache against one forward and backward of the whole batch (plain autograd),",
        "random BERTs (`tiny`: 2 layers of 32; `base`: BERT-base's 12 layers of 768), ragged",
        "rows, a repeated passage masked by id. Error: largest gradient difference over the",
        "largest gradient.",
        "",
        "| case | relative error | bound | ok |",
        "|---|--:|--:|---|",
    ]
    for row in r["fp64"]:
        lines.append(
            f"| {row['case']} | {row['relative_error']:.1e} | {row['bound']:.0e} | "
            f"{'yes' if row['ok'] else '**no**'} |"
        )
    lines += [
        "",
        "Dropout 0.1 on, every chunk re-encoded (kept last graph off): chunks whose "
        "re-forward reps equal their first pass's bit for bit.",
        "",
        "| model | autocast | replayed | without replay (control) |",
        "|---|---|--:|--:|",
    ]
    for row in r["replay"]:
        a, b = row["replayed"], row["control_without_replay"]
        lines.append(
            f"| {row['size']} | {row['precision']} | {a['bitwise_equal']}/{a['chunks']} | "
            f"{b['bitwise_equal']}/{b['chunks']} |"
        )
    fd = r["finite_difference"]
    lines += [
        "",
        f"Dropout 0.3, float64: GradCache's gradient along a random direction against a "
        f"central difference of its loss: {fd['error']:.1e} (bound {fd['bound']:.0e}); "
        f"without the RNG replay {fd['control_error']:.1e}.",
    ]
    return lines + _compiled_exactness(r.get("compiled"))


def _compiled_exactness(c: dict | None) -> list[str]:
    """The compiled towers' float64 gradient and dropout replay, in words."""
    if c is None:
        return []
    why = c.get("not_run")
    if why:
        return ["", f"Compiled towers: not checked ({why})."]
    lines = [
        "",
        f"Compiled towers (`compile_towers`, mode `{c['mode']}`), in a process of its own "
        f"started with this section ({c['seconds']:.0f} s"
        + (f"; {compiles_text(c)}" if compiles_text(c) else "")
        + "), each check over 3 steps (under CUDA graphs: a warm-up, a recording, a replay):",
    ]
    fp64, rep = c.get("fp64") or {}, c.get("replay") or {}
    if "relative_error" in fp64:
        errors = ", ".join(f"{e:.1e}" for e in fp64["errors"])
        bucket = f", length bucket {fp64['length_bucket']}" if fp64.get("length_bucket") else ""
        lines.append(
            f"- float64, {fp64['case']}{bucket}: GradCache on the compiled towers against the "
            "eager full "
            f"batch, step by step {errors} (bound {fp64['bound']:.0e}); the steps took "
            f"{', '.join(f'{x:.1f}' for x in fp64['step_s'])} s, the first compiling."
        )
    elif fp64:
        lines.append(f"- float64: failed, `{fp64.get('error')}`")
    if "replayed" in rep:
        a, b = rep["replayed"], rep["control_without_replay"]
        lines.append(
            f"- dropout {rep['dropout']}, fp32, every chunk re-encoded: each chunk's re-forward "
            f"reps against its first pass's, compared to fp32's rounding, not bit for bit (the "
            f"two passes run different compiled graphs): {a['within_bound']}/{a['chunks']} "
            f"within {rep['bound']:.0e} (largest {a['largest']:.1e}); without the replay "
            f"(control) largest {b['largest']:.1e}. The compiled first pass against the eager "
            f"towers' under the same seed: {rep['vs_eager_first_pass']:.1e} (near fp32's "
            "rounding: compiled dropout draws eager's masks; far: masks of its own, replayed "
            "alike)."
        )
    elif rep:
        lines.append(f"- dropout replay: failed, `{rep.get('error')}`")
    if c.get("compiler"):
        lines += ["", f"The compiler in that process: {counters_text(c['compiler'])}."]
    if c.get("error"):
        e = c["error"]
        lines += ["", f"The child stopped ({e['why']}); its last lines:", "", "```"]
        lines += [*e.get("progress", []), *e.get("last_lines", []), "```"]
    return lines


def _mixed(r: dict) -> list[str]:
    lines = [
        "",
        "GradCache (chunk 4, 16 questions, one hard negative) against the full batch under the",
        "same autocast (fp16 with a GradScaler, gradients unscaled), both against float64;",
        "relative norm of the gradient difference. The dtypes the loss and the cache saw:",
        "",
        "| model | precision | GradCache vs full | full vs fp64 | GradCache vs fp64 "
        "| loss, reps, cache | ok |",
        "|---|---|--:|--:|--:|---|---|",
    ]
    for row in r["rows"]:
        d = row["dtypes"]
        lines.append(
            f"| {row['size']} | {row['precision']} | {row['gradcache_vs_full']:.1e} | "
            f"{row['full_vs_fp64']:.1e} | {row['gradcache_vs_fp64']:.1e} | "
            f"{d['loss']}, {d['reps']}, {d['cache']} | {'yes' if row['ok'] else '**no**'} |"
        )
    o = r["fp16_overflow"]
    lines += [
        "",
        f"fp16 overflow: the toy trainer with a loss scale of 2^40 skipped {o['skipped']} "
        f"of {o['steps']} steps (weights untouched: {o['weights_untouched_when_skipped']}); "
        f"the scale ended at {o['last_scale']:.0f}.",
    ]
    return lines


def _memory(r: dict) -> list[str]:
    lines = [
        "",
        "Peak `torch.cuda.max_memory_allocated` (the dry run: the process's peak RSS) of one",
        "training step (`Trainer.step`: GradCache, the tiled loss, AdamW's first update) on",
        "BERT-base's shape, 32-token questions and 256-token passages with every position",
        "attended, one hard negative, bf16 autocast. Step s is each fresh trainer's first step",
        "(AdamW's state made, kernels picked for new shapes; the first row also pays the",
        "process's first training kernels): a memory probe, not a rate (the speed section's is).",
        "",
        "| batch | chunk | peak | step s |",
        "|--:|--:|--:|--:|",
    ]
    if r.get("beside_commands"):
        lines[-2:-2] = [
            "The rows ran beside the toy commands (other processes: each peak is this one's own;",
            "the step seconds are under their load).",
            "",
        ]
    for row in r["rows"]:
        step = f"{row['step_s']:.2f}" if row["step_s"] else "out of memory"
        lines.append(
            f"| {row['batch']:,} | {row['chunk']} | {_fmt_bytes(row['peak_bytes'])} | {step} |"
        )
    if r.get("largest_full_batch"):  # a gpu.json whose memory section holds the search
        lines += _largest_full_batch(r["largest_full_batch"])
    return lines


def _largest_full_batch(r: dict) -> list[str]:
    return [
        "",
        f"Largest full batch (`train.mode: full`) that fits: {r['batch']} questions "
        f"({_fmt_bytes(r['peak_bytes'])}); tried {r['tried']}.",
    ]


def _encoding(r: dict) -> list[str]:
    cmd = r["command"]
    if "error" in cmd:
        return ["", f"`dpr-cache encode` failed: {cmd['error']}"]
    if "runs" in cmd:  # a gpu.json of two encode runs: the rate between them
        runs = ", ".join(f"{x['passages']:,} passages in {x['seconds']:.1f} s" for x in cmd["runs"])
        rate = (
            f"{runs}; the marginal rate {cmd['marginal_passages_per_s']:,.0f} passages/s leaves "
            "start-up out."
        )
    else:
        t = cmd["timings"]
        rate = (
            f"{cmd['passages']:,} passages in {cmd['seconds']:.1f} s from the command's start to "
            f"its end; of these (`encode.json`'s timings) {t['open_seconds']:.1f} s reading the "
            f"TSV into Arrow and {t['encode_seconds']:.1f} s encoding, "
            f"{t['first_batch_seconds']:.1f} s of it to the first batch of "
            f"{t['first_batch_passages']} (the tokenizing workers' start, the first rows "
            f"tokenized, the first kernels). Reading (a passage's share) plus encoding past the "
            f"first batch: {cmd['passages_per_s']:,.0f} passages/s."
        )
    alone = r["encoder_alone"]
    if r.get("passage_words"):
        sample = (
            f"passages of {r['passage_words']} words, NQ's length (each SQuAD article's "
            "paragraphs joined and cut every 100 words, the shorter tail left out)"
        )
    else:
        sample = "passages cut from SQuAD's paragraphs at 100 words (72 on average: NQ's are 100)"
    words = f", {alone['mean_words']:.0f} words" if "mean_words" in alone else ""
    return [
        "",
        f"`dpr-cache encode` ({cmd['precision']}, batches of {cmd['batch_size']}, passages cut at "
        f"{cmd['max_length']} tokens, length-sorted) on {sample}:",
        f"{rate} The encoder alone on tokenized passages (mean "
        f"{alone['mean_tokens']:.0f} tokens{words}): {alone['passages_per_s']:,.0f} passages/s.",
        "",
        f"NQ's {NQ_PASSAGES:,} passages at that rate: **{r['nq_projected_s'] / 3600:.2f} h** "
        f"on this one device, against {DPR_ENCODE}. The compute limit, "
        f"{r['flops_per_passage'] / 1e9:.3g} GFLOP a passage at the measured "
        f"{r['matmul_tflops']:.3g} TFLOP/s of a large matrix product, is "
        f"{r['nq_limit_s'] / 60:.1f} min: the command reaches {r['share_of_limit']:.0%} of it.",
    ]


def _eval_resident(r: dict | None) -> list[str]:
    if not r:
        return []
    if not r.get("readings"):
        return ["", f"The toy eval's memory by stage: no readings (exit {r.get('rc')}: {r})."]
    lines = [
        "",
        f"The toy eval run again, its resident memory (GB) read after each import and stage, "
        f"with the seconds since its process started "
        f"(exit {r['rc']}; the budget `index.memory_gb` bounds the whole process"
        + (f", here {r['memory_gb']} GB so that it runs through" if r.get("memory_gb") else "")
        + f"; transparent huge pages: {r.get('transparent_hugepage')}):",
        "",
        "| reading | s since start | resident | anonymous | in huge pages | file-backed |",
        "|---|--:|--:|--:|--:|--:|",
    ]
    for stage, m in r["readings"].items():
        huge = f"{m['huge_gb']:.2f}" if "huge_gb" in m else "–"
        age = f"{m['age_s']:.1f}" if m.get("age_s") is not None else "–"
        lines.append(
            f"| {stage} | {age} | {m['rss_gb']:.2f} | {m['anon_gb']:.2f} | {huge} "
            f"| {m['file_gb']:.2f} |"
        )
    if r.get("largest_mappings"):
        held = ", ".join(
            f"`{Path(m['mapping']).name}` {m['rss_gb']:.2f} ({m['anon_gb']:.2f} anonymous)"
            for m in r["largest_mappings"]
        )
        lines += ["", f"Where the search planned its blocks, the largest mappings (GB): {held}."]
    return lines


def _eval_on_cpu(pipeline: dict) -> list[str]:
    """The eval's memory on the machine's CPU beside its memory with the device, both where
    the search plans its blocks."""
    on_cpu = pipeline.get("eval_resident_cpu")
    if not on_cpu:
        return []
    plan = "search plans its blocks"
    cpu = on_cpu.get("readings", {}).get(plan)
    if cpu is None:
        return [
            "",
            f"The same eval on the machine's CPU did not reach its search (exit "
            f"{on_cpu.get('rc')}: {on_cpu.get('last_line')}).",
        ]
    device = (pipeline.get("eval_resident") or {}).get("readings", {}).get(plan)
    beside = f", against {device['rss_gb']:.2f} GB with the device" if device else ""
    return [
        "",
        f"The same eval on the machine's CPU (`eval.device=cpu`), where its search plans its "
        f"blocks: {cpu['rss_gb']:.2f} GB resident (anonymous {cpu['anon_gb']:.2f}, file-backed "
        f"{cpu['file_gb']:.2f}){beside}.",
    ]


def _command_line(r: dict) -> list[str]:
    rows = r.get("pipeline", {}).get("commands", [])
    timed = any("started_s" in row for row in rows)  # a run that recorded the starts
    lines = [""]
    if timed:
        lines += [
            "Each command's start is in seconds from the suite's, to be read beside the "
            "device's memory at the page's end.",
            "",
        ]
    lines += [
        "| command |" + (" start s |" if timed else "") + " exit | s | last line |",
        "|---|" + ("--:|" if timed else "") + "--:|--:|---|",
    ]
    for row in rows:
        start = f" {row['started_s']:.0f} |" if timed else ""
        lines.append(
            f"| `{_short(row['command'])}` |{start} {row['rc']} | {row['seconds']} | "
            f"{row['last_line'][:100]} |"
        )
    if r.get("pipeline", {}).get("metrics"):
        m = r["pipeline"]["metrics"]
        lines += [
            "",
            f"Toy eval ({m['n_questions']} questions; a few steps of the toy config, a run of the "
            f"commands, not a model): top-1 {m['top1']}, top-20 {m['top20']}, top-100 "
            f"{m['top100']}, MRR@10 {m['mrr@10']}.",
        ]
    lines += _eval_resident(r.get("pipeline", {}).get("eval_resident"))
    lines += _eval_on_cpu(r.get("pipeline", {}))
    if r.get("ran_beside"):
        lines += [
            "",
            f"These commands started with the suite and ran beside {', '.join(r['ran_beside'])} "
            f"(which time nothing): {r['commands_s']:.0f} s from the first to the last; this "
            "section's seconds are the wait for them after those sections.",
        ]
    return lines + _resumes(r)


def _resumes(r: dict) -> list[str]:
    """The bit-exact reruns and resumes, and NCCL's check."""
    if "resume" not in r:
        return []
    lines = [
        "",
        "Bit-exact reruns and resumes (dropout on, fp32; a run killed with SIGKILL once "
        "its step-3 checkpoint is on disk, then `--resume`):",
        "",
        "| kernels | two unbroken runs equal | resumed = unbroken | largest difference |",
        "|---|---|---|--:|",
    ]
    for key, row in r["resume"].items():
        if "error" in row:
            lines.append(f"| {key} | error: {row['error']} | | |")
            continue
        a, b = row["two_unbroken_runs"], row["resumed_vs_unbroken"]
        lines.append(
            f"| {key} | {a['bitwise_equal']} | {b['bitwise_equal']} | "
            f"{max(a['max_abs_diff'], b['max_abs_diff']):.1e} |"
        )
    if "nccl" in r:
        lines += ["", f"NCCL, a process group of one (two ranks need two GPUs): {r['nccl']}."]
    return lines


def _chunk_too_large(r: dict) -> list[str]:
    lines = [
        "",
        f"`train` with a chunk of {r['chunk']:,} questions (256-token passages, one hard "
        "negative) on BERT-base's shape, far beyond the GPU's memory:",
        "",
        f"exit {r['rc']} after {r['seconds']} s: `{r['last_line']}`",
    ]
    if r.get("stack"):
        lines += ["", "Where it was when stopped:", "", "```", *r["stack"][-12:], "```"]
    return lines


def _rank_faults(r: dict) -> list[str]:
    if "not_run" in r:
        return ["", f"Not run: {r['not_run']}."]
    frozen, oom = r["frozen_rank"], r["rank_out_of_memory"]
    lines = [
        "",
        f"Rank 1 of a sharded run frozen (SIGSTOP) under NCCL, timeout {frozen.get('timeout_s')} "
        f"s: rank 0 gave up in {frozen.get('gave_up_s')} s; `--resume` "
        f"{'ended' if frozen.get('resumed', {}).get('bitwise_equal') else 'did not end'} with the "
        f"unbroken run's weights; ok: {frozen['ok']}.",
        "",
        *[f"    {line}" for line in frozen.get("lines", [])],
        "",
        f"Rank 1's GPU held by another process but for 1 GiB: ok: {oom['ok']}.",
        "",
        *[f"    {line}" for line in oom.get("lines", [])],
    ]
    return lines


def _short(command: str) -> str:
    """A command without its --set pairs, which only point it at the suite's folders."""
    words, out, skip = command.split(), [], False
    for w in words:
        if skip:
            skip = False
            continue
        if w == "--set":
            skip = True
            continue
        out.append(w)
    return " ".join(out)


def _teacher_scoring(r: dict) -> list[str]:
    shape = r["model"]
    rounds = "round" in r["rows"][0]
    lines = [
        "",
        f"`score`'s cross-encoder loop, a cross-encoder of {shape['layers']} layers x "
        f"{shape['hidden']}"
        + (" (all-MiniLM-L6-v2's shape)" if (shape["layers"], shape["hidden"]) == (6, 384) else "")
        + f", pairs cut at {r['max_length']} tokens"
        + (f" (mean {r['mean_tokens']:.0f})" if "mean_tokens" in r else "")
        + f", length-sorted batches of {r['batch_size']}; NQ's training set is "
        f"{r['nq_pairs']:,} pairs (58,880 questions x 31 passages), in the order run"
        + (
            " (each round's order the last one's reversed, every batch's shape run once first)"
            if rounds
            else ""
        )
        + ":",
        "",
        ("| round " if rounds else "") + "| precision | pairs | seconds | pairs/s | NQ (h) |",
        ("|--:" if rounds else "") + "|---|--:|--:|--:|--:|",
    ]
    for row in r["rows"]:
        lines.append(
            (f"| {row['round']} " if rounds else "")
            + f"| {row['precision']} | {row['pairs']:,} | {row['seconds']:.1f} | "
            f"{row['pairs_a_second']:,.0f} | {row['nq_hours']:.2f} |"
        )
    if "tokenize_s" in r:
        lines += [
            "",
            f"Of each row's seconds, tokenizing the pairs (on the CPU) takes {r['tokenize_s']:.1f} "
            "s, timed alone.",
        ]
    if "model_alone" in r:
        lines += [
            "",
            "The model alone (the best of its rounds), on the same batches already padded on "
            "the device (what the loop spends beyond it is the host's: tokenizing, padding, "
            "copying, each batch waiting on the last):",
            "",
            "| precision | seconds | pairs/s |",
            "|---|--:|--:|",
        ]
        lines += [
            f"| {a['precision']} | {a['seconds']:.2f} | {a['pairs_a_second']:,.0f} |"
            for a in r["model_alone"]
        ]
    return lines + _first_pass(r.get("first_pass")) + _profiles(r.get("profiles", {}))


def _profiles(profiles: dict) -> list[str]:
    """Each precision's longest batch under the profiler."""
    lines = []
    for precision, prof in profiles.items():
        if "error" in prof:
            lines += ["", f"The profile of {precision}'s longest batch failed: {prof['error']}"]
            continue
        top = ", ".join(f"`{t['op'][:60]}` {t['ms']:.1f} ms ({t['calls']}x)" for t in prof["top"])
        lines += [
            "",
            f"{precision}'s longest batch under the profiler: {prof['wall_ms']:.1f} ms from call "
            f"to result, {prof['self_ms']:.1f} ms of "
            f"{'kernels' if prof['on'] == 'device' else 'operators'}' time on the {prof['on']}; "
            f"the most: {top}.",
        ]
    return lines


def _first_pass(first: dict | None) -> list[str]:
    """The model alone's first pass over shapes not yet run, against the same batches again:
    what a new shape costs at each precision."""
    if not first or not first["seconds"]:
        return []
    again = first.get("again_seconds", {})
    lengths = first["new_lengths"]
    lines = [
        "",
        "What a new shape costs: the model alone's first pass at each precision, before the "
        f"rounds and in the order {', '.join(first['order'])}, over the {first['batches']} "
        f"batches after the longest ({first['pairs']:,} pairs, {lengths} "
        f"length{'s' if lengths != 1 else ''} not run by the longest), each precision's "
        "one-time start paid first on the longest batch; then the same batches again, after "
        "the rounds:",
        "",
        "| precision | first pass s | again s | more a new length (ms) |",
        "|---|--:|--:|--:|",
    ]
    for precision, cold in first["seconds"].items():  # in the order run
        warm = again.get(precision)
        extra = "–" if warm is None or not lengths else f"{(cold - warm) / lengths * 1e3:.1f}"
        lines.append(
            f"| {precision} | {cold:.2f} | {'–' if warm is None else f'{warm:.2f}'} | {extra} |"
        )
    return lines


_SECTION = {
    "exactness": _exactness,
    "mixed_precision": _mixed,
    "memory": _memory,
    "speed": render_speed,
    "compilation": render_compilation,
    "encoding": _encoding,
    "teacher_scoring": _teacher_scoring,
    "command_line": _command_line,
    "chunk_too_large": _chunk_too_large,
    "largest_full_batch": _largest_full_batch,
    "llm": render_llm,
    "fsdp": render_fsdp,
    "rank_faults": _rank_faults,
}
