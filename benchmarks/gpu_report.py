"""The GPU page from the suite's figures: ``gpu.json`` as measured and ``gpu.md`` to read, with
the goals checked against them: the GPU issue's, issue 57's (decoder LLMs, the ``llm`` section)
and issue 58's (FSDP2 in a process group of one, the ``fsdp`` section). Speed's goals name their
batch, precision and chunk; the cost of a chunk is fitted per engine (step = a + b x chunks)."""

from __future__ import annotations

import re
from pathlib import Path

from benchmarks.harness import cpu_text
from dpr_cache.runtime.atomic import write_json_atomic, write_text_atomic

__all__ = ["write_page", "goals", "markdown", "render", "setting_of", "chunks_text", "speed_goals"]

NQ_PASSAGES = 21_015_324
DPR_ENCODE = "about 8.8 hours on 8 GPUs, some 70 GPU-hours (DPR's paper)"
ENCODE_GOAL_MIN = 30
HISTORY = "gpu_history.md"  # the runs so far, what each missed and what fixed it
_PARTIAL_SHOWN = ("speed", "command_line", "llm", "fsdp")  # figures before a stop, judged too
MET = {True: "yes", False: "**no**", None: "–"}
GOAL_BATCH, GOAL_PRECISION = 512, "fp16"
CHUNK_COST_GOAL_MS = 5.0
FULL_BATCH_GOALS = ((128, 1.0), (64, 0.9), (32, 0.8))  # chunk, dpr-cache over the full batch
PEER_GOAL, PEER_GOAL_CHUNKS = 1.5, (32, 64, 128)  # over each peer at the same chunk
PEERS = (("CachedMNRL", "CachedMNRL rows {}"), ("GradCache library", "GradCache library chunk {}"))
LLM_GOAL_GB = 80  # issue 57: B = 1,024 in one step on one 80 GB GPU
LLM_MEMORY_RATIO, LLM_OVER_CMNRL, LLM_OVER_FULL = 1.2, 1.3, 0.8


def render(report: dict, folder: Path, source: Path | None = None) -> Path:
    """``gpu.md`` (and ``gpu.json`` with its goals) in ``folder``."""
    write_page(report, folder)
    return folder / "gpu.md"


def write_page(report: dict, out: Path) -> None:
    report["goals"] = goals(report)
    write_json_atomic(out / "gpu.json", report)
    write_text_atomic(out / "gpu.md", markdown(report))


def _table(head: str, fmt: str, rows) -> list[str]:
    """A table after a blank line: ``head`` its titles ("a | b:", ":" aligning right), ``fmt`` a
    row's cells from its fields ("{a} | {b:,}"), a row that is a string its cells already."""
    titles = head.split(" | ")
    rule = "|" + "".join("--:|" if t.endswith(":") else "---|" for t in titles)
    cells = [r if isinstance(r, str) else fmt.format_map(_words(r)) for r in rows]
    head = " | ".join(t.removesuffix(":") for t in titles)
    return ["", f"| {head} |", rule, *(f"| {c} |" for c in cells)]


def _words(row: dict) -> dict:
    """A row's yes/no fields as the page writes them (:data:`MET`)."""
    return {k: MET[v] if isinstance(v, bool) else v for k, v in row.items()}


def _gb(n: float | None) -> str:
    return "–" if n is None else f"{n / 1e9:.2f} GB"


def _result(report: dict, name: str) -> dict | None:
    """A section's result, or for :data:`_PARTIAL_SHOWN` what it measured before it stopped."""
    section = report["sections"].get(name, {})
    if name in _PARTIAL_SHOWN and "error" in section:
        return section.get("partial")
    return section.get("result")


def _goal(name: str, measured: str, target: str, met: bool | None) -> dict:
    met = None if met is None else bool(met)
    return {"goal": name, "measured": measured, "target": target, "met": met}


def goals(report: dict) -> list[dict]:
    """The issues' goals, each with its figure and whether the run met it (None: not measured)."""
    out = _exactness_goals(_result(report, "exactness"))
    for r in (_result(report, "mixed_precision") or {}).get("rows", []):
        gaps = f"(fp64 gap {r['gradcache_vs_fp64']:.1e}, the full batch's {r['full_vs_fp64']:.1e})"
        out.append(
            _goal(
                f"{r['precision']}, B=16, chunk 4: GradCache vs full batch",
                f"{r['gradcache_vs_full']:.1e} {gaps}",
                f"<= {r['ceiling']:.0e}, fp64 gap <= {r['ratio_bound']}x the full batch's",
                r["ok"],
            )
        )
    rows = [r for r in (_result(report, "memory") or {}).get("rows", []) if r["fits"]]
    if len(rows) >= 2:
        ratio, last = rows[-1]["peak_bytes"] / rows[0]["peak_bytes"], rows[-1]
        name = f"{last.get('precision', 'bf16')}, chunk {last['chunk']}: memory at "
        name += f"B={last['batch']} over B={rows[0]['batch']}"
        out.append(_goal(name, f"{ratio:.2f}x", "<= 1.2x", ratio <= 1.2))
    out += speed_goals(_result(report, "speed"), _result(report, "compilation"))
    enc = _result(report, "encoding")
    if enc and enc.get("nq_projected_s"):
        out.append(_encode_goal(enc))
    out += _llm_goals(_result(report, "llm")) + _fsdp_goals(_result(report, "fsdp"))
    large = _result(report, "chunk_too_large")
    if large:
        name = "a chunk too large: one line naming a chunk that fits"
        target = "exit 2, `error: train.chunk_size ...`"
        out.append(_goal(name, f"exit {large['rc']}", target, large["ok"]))
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
    name = f"{precisions}, B=8, chunk 3: replayed reps bitwise equal (control differs)"
    out = [
        _goal(
            "fp64, B=7 and 8, chunks 2 to 4: GradCache = full batch",
            f"{worst:.1e}",
            "<= 1e-10",
            worst <= 1e-10,
        ),
        _goal(name, "yes" if replay else "no", "yes", replay),
    ]
    return out + (_compiled_goals(ex["compiled"]) if "compiled" in ex else [])


def _compiled_goals(c: dict) -> list[dict]:
    """The float64 gradient and the dropout replay with the towers compiled."""
    grad = "fp64, B=8, chunk 3, towers compiled: GradCache = eager full batch"
    replay = "fp32, B=8, chunk 3, towers compiled: re-forward = first pass to fp32 rounding"
    if c.get("not_run"):
        targets = ((grad, "<= 1e-10"), (replay, "all within 1e-04, control > 1e-2"))
        return [_goal(g, f"not measured ({c['not_run']})", t, None) for g, t in targets]
    fp64, rep = c.get("fp64"), c.get("replay")
    if fp64 and "relative_error" in fp64:
        err = fp64["relative_error"]
        out = [_goal(grad, f"{err:.1e} (mode {c['mode']})", "<= 1e-10", err <= 1e-10)]
    else:
        out = [_goal(grad, _compiled_failure(c, fp64), "<= 1e-10", False)]
    if rep and "replayed" in rep:
        a, b = rep["replayed"], rep["control_without_replay"]
        measured = (
            f"{a['within_bound']}/{a['chunks']} chunks within {rep['bound']:.0e} (largest "
            f"{a['largest']:.1e}); without replay {b['largest']:.1e}"
        )
        target = f"all within {rep['bound']:.0e}, control > 1e-2"
        return [*out, _goal(replay, measured, target, rep["ok"])]
    return [*out, _goal(replay, _compiled_failure(c, rep), "all within 1e-04", False)]


def _compiled_failure(c: dict, row: dict | None) -> str:
    """Why a compiled check has no figure: its own error, or the child's."""
    if row and "error" in row:
        return f"failed: {row['error'][:120]}"
    return f"not reached ({(c.get('error') or {}).get('why', 'no figure')})"


def _encode_goal(enc: dict) -> dict:
    """encode's projection to NQ, with its passages' words and its share of the compute limit."""
    words = enc.get("passage_words")
    sample = f"{words} words each" if words else "72 words on average, NQ's are 100"
    share = f"{enc['share_of_limit']:.0%} of the compute limit's {enc['nq_limit_s'] / 60:.1f} min"
    cmd = enc.get("command", {})
    how = f"{cmd.get('precision', 'fp16')}, batches of {cmd.get('batch_size', 512)}"
    minutes = enc["nq_projected_s"] / 60
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


def markdown(report: dict) -> str:
    """The page's markdown."""
    env, dry = report["environment"], report["dry_run"]
    device = env.get("device_name") or env["device"]
    lines = ["# dpr-cache on a GPU", ""]
    if dry:
        lines += [
            "**Dry run on the CPU** (no CUDA here): the CPU-capable parts at toy size, to rehearse "
            "the suite; none of these figures is a GPU figure. `python -m benchmarks.gpu` on a "
            "machine with CUDA writes the real page.",
            "",
        ]
    driver = f", driver {env['driver']}" if env.get("driver") else ""
    memory = f", {env['memory_bytes'] / 2**30:.0f} GiB" if env.get("memory_bytes") else ""
    lines += [
        f"Device: **{device}**{driver}{memory}",
        f"torch {env['torch']}, CUDA {env['cuda']}, Python {env['python']}; {env['date']};",
        f"Host: {cpu_text(env['host'])}; transformers {env['host']['transformers']}.",
        f"The suite took {report.get('seconds', 0):.0f} s: `python -m benchmarks.gpu --out DIR`.",
        f"The GPU runs so far, what each missed and what fixed it: [{HISTORY}]({HISTORY}).",
        "",
        "## Goals",
        *(["", "A dry run's figures are CPU rehearsals: the goals are GPU goals."] if dry else []),
        *_goals_table("goal", report.get("goals", [])),
    ]
    for name, section in report["sections"].items():
        lines += ["", f"## {name.replace('_', ' ').capitalize()}", ""]
        if "skipped" in section:
            lines.append(f"Skipped: {section['skipped']}.")
        elif "error" in section:
            lines.append(f"Failed after {section['seconds']} s: `{section['error']}`")
            if section.get("partial") and name in _PARTIAL_SHOWN:
                lines += ["", "What it measured before it stopped:"]
                lines += _SECTION[name](section["partial"])
            elif section.get("partial"):
                lines += ["", "What it measured before it stopped is in gpu.json (`partial`)."]
        else:
            lines.append(f"{section['seconds']:.0f} s{_elsewhere(section, env, device)}.")
            lines += _SECTION[name](section["result"])
    if report.get("device_memory"):
        lines += ["", "## Device memory while the suite ran", *_device_memory(report)]
    return "\n".join(lines) + "\n"


def _goals_table(title: str, judged: list[dict]) -> list[str]:
    rows = [{**g, "met": MET[g["met"]]} for g in judged]
    return _table(
        f"{title} | measured | target | met", "{goal} | {measured} | {target} | {met}", rows
    )


def _elsewhere(section: dict, env: dict, device: str) -> str:
    """ ", run DATE on DEVICE" for a section kept from an earlier run, else nothing."""
    when, where = section.get("date", env["date"]), section.get("device_name", device)
    if (when, where) == (env["date"], device):
        return ""
    return f", run {when}" + (f" on {where}" if where != device else "")


def _device_memory(report: dict) -> list[str]:
    r = report["device_memory"]
    if "error" in r:
        return ["", f"Not read: `{r['error']}`."]
    rows = [{**s, "name": n, "full": r["full_samples"].get(n, 0)} for n, s in r["sections"].items()]
    lines = [
        "",
        f"Read twice a second (`cudaMemGetInfo`: every process on the {r['total_gb']:.0f} GB "
        "device together) under the section running; the suite's own: its CUDA allocator's "
        "reserved memory then. The commands beside the first sections are in the rest.",
        *_table(
            "section | readings: | most in use (GB): | the suite's own: | at s: "
            "| under 1 GiB free:",
            "{name} | {samples} | {peak_used_gb:.2f} | {own_gb:.2f} | {at_s:.0f} | {full}",
            rows,
        ),
    ]
    if r.get("processes"):
        rows = [
            {"section": "–", **p, "command": _short(p.get("command") or "–")[:120]}
            for p in r["processes"][:12]
        ]
        lines += [
            "",
            "Processes `nvidia-smi` named (polled every 3 s), the most each held:",
            *_table(
                "pid: | command | most (GB): | in section | seen from s: | to s:",
                "{pid} | `{command}` | {peak_gb:.2f} | {section} | {first_s:.0f} | {last_s:.0f}",
                rows,
            ),
        ]
    return lines


def _exactness(r: dict) -> list[str]:
    fd = r["finite_difference"]
    replay = [{**x, "a": x["replayed"], "b": x["control_without_replay"]} for x in r["replay"]]
    return [
        "",
        "float64, GradCache against one forward and backward of the whole batch (plain autograd), "
        "random BERTs (`tiny`: 2 layers of 32; `base`: BERT-base's 12 layers of 768), ragged "
        "rows, a repeated passage masked by id. Error: largest gradient difference over the "
        "largest gradient.",
        *_table(
            "case | relative error: | bound: | ok",
            "{case} | {relative_error:.1e} | {bound:.0e} | {ok}",
            r["fp64"],
        ),
        "",
        "Dropout 0.1 on, every chunk re-encoded (kept last graph off): chunks whose "
        "re-forward reps equal their first pass's bit for bit.",
        *_table(
            "model | autocast | replayed: | without replay (control):",
            "{size} | {precision} | {a[bitwise_equal]}/{a[chunks]} "
            "| {b[bitwise_equal]}/{b[chunks]}",
            replay,
        ),
        "",
        f"Dropout 0.3, float64: GradCache's gradient along a random direction against a "
        f"central difference of its loss: {fd['error']:.1e} (bound {fd['bound']:.0e}); "
        f"without the RNG replay {fd['control_error']:.1e}.",
        *_compiled_exactness(r.get("compiled")),
    ]


def _compiled_exactness(c: dict | None) -> list[str]:
    """The compiled towers' float64 gradient and dropout replay, in words."""
    if c is None or c.get("not_run"):
        return ["", f"Compiled towers: not checked ({c['not_run']})."] if c else []
    compiles = f"; {compiles_text(c)}" if compiles_text(c) else ""
    lines = [
        "",
        f"Compiled towers (`compile_towers`, mode `{c['mode']}`), in a process of its own "
        f"started with this section ({c['seconds']:.0f} s{compiles}), each check over 3 steps "
        "(under CUDA graphs: a warm-up, a recording, a replay):",
    ]
    fp64, rep = c.get("fp64") or {}, c.get("replay") or {}
    if "relative_error" in fp64:
        errors = ", ".join(f"{e:.1e}" for e in fp64["errors"])
        bucket = f", length bucket {fp64['length_bucket']}" if fp64.get("length_bucket") else ""
        lines.append(
            f"- float64, {fp64['case']}{bucket}: GradCache on the compiled towers against the "
            f"eager full batch, step by step {errors} (bound {fp64['bound']:.0e}); the steps took "
            f"{', '.join(f'{x:.1f}' for x in fp64['step_s'])} s, the first compiling."
        )
    elif fp64:
        lines.append(f"- float64: failed, `{fp64.get('error')}`")
    if "replayed" in rep:
        a, b = rep["replayed"], rep["control_without_replay"]
        lines.append(
            f"- dropout {rep['dropout']}, fp32, every chunk re-encoded: each chunk's re-forward "
            f"reps against its first pass's, to fp32's rounding (the two passes run different "
            f"compiled graphs): {a['within_bound']}/{a['chunks']} within {rep['bound']:.0e} "
            f"(largest {a['largest']:.1e}); without the replay (control) largest "
            f"{b['largest']:.1e}. The compiled first pass against the eager towers' under the "
            f"same seed: {rep['vs_eager_first_pass']:.1e} (near fp32's rounding: compiled dropout "
            "draws eager's masks; far: masks of its own, replayed alike)."
        )
    elif rep:
        lines.append(f"- dropout replay: failed, `{rep.get('error')}`")
    return lines + _child_end(c)


def _child_end(c: dict) -> list[str]:
    """A compiling child's counters, and where it stopped, its last lines."""
    lines = []
    if c.get("compiler"):
        lines = ["", f"The compiler in that process: {counters_text(c['compiler'])}."]
    if c.get("error"):
        e = c["error"]
        lines += ["", f"The child stopped ({e['why']}); its last lines:", "", "```"]
        lines += [*e.get("progress", []), *e.get("last_lines", []), "```"]
    return lines


def _mixed(r: dict) -> list[str]:
    o = r["fp16_overflow"]
    return [
        "",
        "GradCache (chunk 4, 16 questions, one hard negative) against the full batch under the "
        "same autocast (fp16 with a GradScaler, gradients unscaled), both against float64; "
        "relative norm of the gradient difference; the dtypes the loss and the cache saw:",
        *_table(
            "model | precision | GradCache vs full: | full vs fp64: | GradCache vs fp64: "
            "| loss, reps, cache | ok",
            "{size} | {precision} | {gradcache_vs_full:.1e} | {full_vs_fp64:.1e} "
            "| {gradcache_vs_fp64:.1e} | {dtypes[loss]}, {dtypes[reps]}, {dtypes[cache]} | {ok}",
            r["rows"],
        ),
        "",
        f"fp16 overflow: the toy trainer with a loss scale of 2^40 skipped {o['skipped']} "
        f"of {o['steps']} steps (weights untouched: {o['weights_untouched_when_skipped']}); "
        f"the scale ended at {o['last_scale']:.0f}.",
    ]


def _memory(r: dict) -> list[str]:
    lines = [
        "",
        "Peak `torch.cuda.max_memory_allocated` (the dry run: the process's peak RSS) of one "
        "training step (`Trainer.step`: GradCache, the tiled loss, AdamW's first update) on "
        "BERT-base's shape, 32-token questions and 256-token passages with every position "
        "attended, one hard negative, bf16 autocast. Step s: each fresh trainer's first step (a "
        "memory probe, not a rate: the speed section's is).",
    ]
    if r.get("beside_commands"):
        lines += [
            "",
            "The rows ran beside the toy commands (each peak is this process's own; the step "
            "seconds are under their load).",
        ]
    rows = [
        f"{x['batch']:,} | {x['chunk']} | {_gb(x['peak_bytes'])} | "
        + (f"{x['step_s']:.2f}" if x["step_s"] else "out of memory")
        for x in r["rows"]
    ]
    lines += _table("batch: | chunk: | peak: | step s:", "", rows)
    if r.get("largest_full_batch"):  # a gpu.json whose memory section holds the search
        lines += _largest_full_batch(r["largest_full_batch"])
    return lines


def _largest_full_batch(r: dict) -> list[str]:
    return [
        "",
        f"Largest full batch (`train.mode: full`) that fits: {r['batch']} questions "
        f"({_gb(r['peak_bytes'])}); tried {r['tried']}.",
    ]


def _encoding(r: dict) -> list[str]:
    cmd, alone = r["command"], r["encoder_alone"]
    if "error" in cmd:
        return ["", f"`dpr-cache encode` failed: {cmd['error']}"]
    t = cmd["timings"]
    sample = "passages cut from SQuAD's paragraphs at 100 words (72 on average: NQ's are 100)"
    if r.get("passage_words"):
        sample = (
            f"passages of {r['passage_words']} words, NQ's length (each SQuAD article's "
            "paragraphs joined and cut every 100 words, the shorter tail left out)"
        )
    words = f", {alone['mean_words']:.0f} words" if "mean_words" in alone else ""
    return [
        "",
        f"`dpr-cache encode` ({cmd['precision']}, batches of {cmd['batch_size']}, passages cut at "
        f"{cmd['max_length']} tokens, length-sorted) on {sample}: {cmd['passages']:,} passages in "
        f"{cmd['seconds']:.1f} s from the command's start to its end; of these (`encode.json`'s "
        f"timings) {t['open_seconds']:.1f} s reading the TSV into Arrow and "
        f"{t['encode_seconds']:.1f} s encoding, {t['first_batch_seconds']:.1f} s of it to the "
        f"first batch of {t['first_batch_passages']} (the workers' start, the first rows "
        f"tokenized, the first kernels). Reading plus encoding past the first batch: "
        f"{cmd['passages_per_s']:,.0f} passages/s. The encoder alone on tokenized passages (mean "
        f"{alone['mean_tokens']:.0f} tokens{words}): {alone['passages_per_s']:,.0f} passages/s.",
        "",
        f"NQ's {NQ_PASSAGES:,} passages at that rate: **{r['nq_projected_s'] / 3600:.2f} h** "
        f"on this one device, against {DPR_ENCODE}. The compute limit, "
        f"{r['flops_per_passage'] / 1e9:.3g} GFLOP a passage at the measured "
        f"{r['matmul_tflops']:.3g} TFLOP/s of a large matrix product, is "
        f"{r['nq_limit_s'] / 60:.1f} min: the command reaches {r['share_of_limit']:.0%} of it.",
    ]


def _eval_resident(pipeline: dict) -> list[str]:
    """The eval's resident memory by stage, where a run recorded it (2026-11-28's; no longer)."""
    r, on_cpu = pipeline.get("eval_resident"), pipeline.get("eval_resident_cpu")
    if not r or not r.get("readings") or not on_cpu:
        return []
    held = ", ".join(
        f"`{Path(m['mapping']).name}` {m['rss_gb']:.2f} ({m['anon_gb']:.2f} anonymous)"
        for m in r["largest_mappings"]
    )
    plan = "search plans its blocks"
    cpu, device = on_cpu["readings"][plan], r["readings"][plan]
    return [
        "",
        f"The toy eval run again, its resident memory (GB) read after each import and stage (exit "
        f"{r['rc']}; `index.memory_gb` {r['memory_gb']}; transparent huge pages: "
        f"{r['transparent_hugepage']}):",
        *_table(
            "reading | s since start: | resident: | anonymous: | in huge pages: | file-backed:",
            "{stage} | {age_s:.1f} | {rss_gb:.2f} | {anon_gb:.2f} | {huge_gb:.2f} | {file_gb:.2f}",
            [{"stage": stage, **m} for stage, m in r["readings"].items()],
        ),
        "",
        f"Where the search planned its blocks, the largest mappings (GB): {held}. The same eval "
        f"on the machine's CPU there: {cpu['rss_gb']:.2f} GB resident (anonymous "
        f"{cpu['anon_gb']:.2f}, file-backed {cpu['file_gb']:.2f}), against "
        f"{device['rss_gb']:.2f} GB with the device.",
    ]


def _command_line(r: dict) -> list[str]:
    pipeline = r.get("pipeline", {})
    rows = [
        {**x, "command": _short(x["command"]), "last_line": x["last_line"][:100]}
        for x in pipeline.get("commands", [])
    ]
    head, fmt = "command | exit: | s: | last line", "`{command}` | {rc} | {seconds} | {last_line}"
    if any("started_s" in row for row in rows):  # a run that recorded the starts
        head = head.replace(" | exit:", " | start s (from the suite's): | exit:")
        fmt = fmt.replace(" | {rc}", " | {started_s:.0f} | {rc}")
    lines = _table(head, fmt, rows)
    m = pipeline.get("metrics")
    if m:
        lines += [
            "",
            f"Toy eval ({m['n_questions']} questions; a few steps of the toy config, a run of the "
            f"commands, not a model): top-1 {m['top1']}, top-20 {m['top20']}, top-100 "
            f"{m['top100']}, MRR@10 {m['mrr@10']}.",
        ]
    lines += _eval_resident(pipeline)
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
    rows = []
    for key, row in r["resume"].items():
        if "error" in row:
            rows.append(f"{key} | error: {row['error']} | |")
            continue
        a, b = row["two_unbroken_runs"], row["resumed_vs_unbroken"]
        worst = max(a["max_abs_diff"], b["max_abs_diff"])
        rows.append(f"{key} | {a['bitwise_equal']} | {b['bitwise_equal']} | {worst:.1e}")
    lines = [
        "",
        "Bit-exact reruns and resumes (dropout on, fp32; a run killed with SIGKILL once "
        "its step-3 checkpoint is on disk, then `--resume`):",
        *_table(
            "kernels | two unbroken runs equal | resumed = unbroken | largest difference:", "", rows
        ),
    ]
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


def _short(command: str) -> str:
    """A command without its --set pairs, which only point it at the suite's folders."""
    return re.sub(r" --set \S+", "", command)


def _teacher_scoring(r: dict) -> list[str]:
    shape, rounds = r["model"], "round" in r["rows"][0]
    minilm = " (all-MiniLM-L6-v2's shape)" if (shape["layers"], shape["hidden"]) == (6, 384) else ""
    mean = f" (mean {r['mean_tokens']:.0f})" if "mean_tokens" in r else ""
    order = " (each round's order the last one's reversed, every batch's shape run once first)"
    head = "round: | precision | pairs: | seconds: | pairs/s: | NQ (h):"
    fmt = (
        "{round} | {precision} | {pairs:,} | {seconds:.1f} | {pairs_a_second:,.0f} | {nq_hours:.2f}"
    )
    if not rounds:
        head, fmt = head.removeprefix("round: | "), fmt.removeprefix("{round} | ")
    lines = [
        "",
        f"`score`'s cross-encoder loop, a cross-encoder of {shape['layers']} layers x "
        f"{shape['hidden']}{minilm}, pairs cut at {r['max_length']} tokens{mean}, length-sorted "
        f"batches of {r['batch_size']}; NQ's training set is {r['nq_pairs']:,} pairs (58,880 "
        f"questions x 31 passages), in the order run{order if rounds else ''}:",
        *_table(head, fmt, r["rows"]),
    ]
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
            *_table(
                "precision | seconds: | pairs/s:",
                "{precision} | {seconds:.2f} | {pairs_a_second:,.0f}",
                r["model_alone"],
            ),
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
    """What a new shape costs at each precision: a first pass against the same batches again."""
    if not first or not first["seconds"]:
        return []
    again, n = first.get("again_seconds", {}), first["new_lengths"]
    rows = []
    for precision, cold in first["seconds"].items():  # in the order run
        warm = again.get(precision)
        extra = "–" if warm is None or not n else f"{(cold - warm) / n * 1e3:.1f}"
        rows.append(
            f"{precision} | {cold:.2f} | {'–' if warm is None else f'{warm:.2f}'} | {extra}"
        )
    return [
        "",
        "What a new shape costs: the model alone's first pass at each precision, before the "
        f"rounds and in the order {', '.join(first['order'])}, over the {first['batches']} "
        f"batches after the longest ({first['pairs']:,} pairs, {n} length{'s' if n != 1 else ''} "
        "not run by the longest), each precision's one-time start paid first on the longest "
        "batch; then the same batches again, after the rounds:",
        *_table("precision | first pass s: | again s: | more a new length (ms):", "", rows),
    ]


_NAMED = re.compile(
    r"^(?P<engine>dpr-cache|GradCache library) chunk (?P<q>\d+)(?:/(?P<p>\d+))?$"
    r"|^CachedMNRL rows (?P<rows>\d+)$|^(?P<tokens>CachedMNRL|dpr-cache) tokens \d+$"
    r"|^full batch( B=\d+)?$"
)


def setting_of(name: str, row: dict, batch: int) -> dict:
    """A row's engine, chunk and chunks a step ([questions, passages]; None for a token budget):
    as recorded, or read from its name (one hard negative: twice as many passages)."""
    if "engine" in row:
        return {k: row.get(k) for k in ("engine", "chunk", "chunks")}
    m = _NAMED.match(name)
    if m is None:
        return {"engine": name, "chunk": None, "chunks": None}
    if m["engine"]:
        q, p = int(m["q"]), int(m["p"] or m["q"])
        chunks = [-(-batch // q), -(-2 * batch // p)]
        return {"engine": m["engine"], "chunk": f"{q}/{p}" if m["p"] else str(q), "chunks": chunks}
    if m["rows"]:
        per = -(-batch // int(m["rows"]))
        return {"engine": "CachedMNRL", "chunk": m["rows"], "chunks": [per, 2 * per]}
    if name.startswith("full batch"):
        return {"engine": "full batch", "chunk": None, "chunks": [1, 1]}
    return {"engine": f"{m['tokens']} tokens", "chunk": None, "chunks": None}


def chunks_text(counts: list[int] | None, engine: str, prose: bool = False) -> str:
    """Chunks a step in words ("16 + 32", in ``prose`` "16 + 32 chunks a step"); one a tower
    named, and for dpr-cache that nothing is then re-encoded."""
    if engine == "full batch":
        return "the whole batch"
    if not counts:
        return "chunks by tokens" if engine == "CachedMNRL tokens" else "–"
    if counts == [1, 1]:
        ours = engine.startswith("dpr-cache")
        return "one chunk a tower" + (": nothing re-encoded, no GradCache work" if ours else "")
    return f"{counts[0]} + {counts[1]}" + (" chunks a step" if prose else "")


def _timed_rows(comparison: dict) -> list[tuple[str, dict, dict]]:
    """(name, row, setting) of each timed row of a comparison."""
    return [
        (name, row, setting_of(name, row, comparison["batch"]))
        for name, row in comparison["rows"].items()
        if "pairs_per_s" in row
    ]


def chunk_cost_fit(points: list[tuple[int, float]]) -> dict | None:
    """Least squares ``step s = a + b x chunks a step`` over (chunks, step s) points (``b``, the
    cost of a chunk, in ms); None below two distinct chunk counts."""
    ns = [n for n, _ in points]
    if len(set(ns)) < 2:
        return None
    mean_n, mean_t = sum(ns) / len(ns), sum(t for _, t in points) / len(points)
    b = sum((n - mean_n) * (t - mean_t) for n, t in points) / sum((n - mean_n) ** 2 for n in ns)
    a = mean_t - b * mean_n
    worst = max(abs(t - (a + b * n)) for n, t in points) * 1e3
    return {"a_s": a, "b_ms": b * 1e3, "points": len(points), "chunks": [min(ns), max(ns)]} | {
        "largest_residual_ms": worst
    }


def fits(comparison: dict) -> dict[str, dict]:
    """Each engine's fit at this comparison's batch, over its rows with a chunk count."""
    points: dict[str, list[tuple[int, float, str]]] = {}
    for _, row, s in _timed_rows(comparison):
        if s["chunks"] and s["engine"] != "full batch":
            points.setdefault(s["engine"], []).append((sum(s["chunks"]), row["step_s"], s["chunk"]))
    out = {}
    for engine, pts in points.items():
        fit = chunk_cost_fit([(n, t) for n, t, _ in pts])
        if fit is not None:
            out[engine] = fit | {
                "chunk_labels": [c for _, _, c in sorted(pts, key=lambda p: -p[0])]
            }
    return out


def _joined(comps: list[dict]) -> dict:
    """The groups' rows in one comparison, each group's full batch left out (for the fits)."""
    rows = {n: row for c in comps for n, row in c["rows"].items() if not n.startswith("full batch")}
    return {**comps[0], "rows": rows}


def _full(comp: dict) -> tuple[str, float] | None:
    best = comp["best"].get("full batch")
    return (best["setting"], best["pairs_per_s"]) if best else None


def _full_batch_goal(comp, compiled: list[dict], chunk: int, target: float) -> dict:
    """dpr-cache's fastest setting at ``chunk`` over the full batch timed beside it."""
    name = f"B={GOAL_BATCH} {GOAL_PRECISION}, chunk {chunk}: dpr-cache over the full batch"
    want = f">= {target}x the full batch of {GOAL_BATCH} (or the largest that fits)"
    tries = []
    for group, engines in [(comp, "dpr-cache"), *((c, "dpr-cache compiled") for c in compiled)]:
        full = _full(group)
        for setting, row, s in _timed_rows(group) if full else []:
            if s["engine"].startswith(engines) and s["chunk"] == str(chunk):
                tries.append((row["pairs_per_s"] / full[1], setting, row, s, full))
    if not tries:
        timed = {s["chunk"] for _, _, s in _timed_rows(comp) if s["engine"] == "dpr-cache"}
        labels = ", ".join(sorted(timed, key=_chunk_key)) or "none"
        return _goal(
            name, f"not measured (this run timed dpr-cache at chunks {labels})", want, None
        )
    ratio, setting, row, s, full = max(tries, key=lambda t: t[0])
    measured = (
        f"{ratio:.2f}x: {setting} ({chunks_text(s['chunks'], s['engine'], prose=True)}), "
        f"{row['pairs_per_s']:,.0f} pairs/s against {full[0]}'s {full[1]:,.0f}"
    )
    eager = [t for t in tries if t[3]["engine"] == "dpr-cache"]
    if eager and eager[0][1] != setting:
        measured += f"; eager {eager[0][0]:.2f}x"
    return _goal(name, measured, want, ratio >= target)


def _peer_goal(comp, chunk: int, peer: str, pattern: str) -> dict:
    """dpr-cache (eager) over ``peer`` at the same chunk."""
    name = f"B={GOAL_BATCH} {GOAL_PRECISION}, chunk {chunk}: dpr-cache over {peer}"
    want = f">= {PEER_GOAL}x {pattern.format(chunk)}"
    ours = comp["rows"].get(f"dpr-cache chunk {chunk}", {}).get("pairs_per_s")
    theirs = comp["rows"].get(pattern.format(chunk), {}).get("pairs_per_s")
    if not ours or not theirs:
        return _goal(name, "not measured (not both timed in this run)", want, None)
    measured = f"{ours / theirs:.2f}x ({ours:,.0f} against {theirs:,.0f} pairs/s)"
    return _goal(name, measured, want, ours / theirs >= PEER_GOAL)


def _chunk_cost_goal(comp, compiled: list[dict]) -> dict:
    """The smallest cost of a chunk of dpr-cache's engines (eager, variants, compiled)."""
    name = f"B={GOAL_BATCH} {GOAL_PRECISION}: the cost of a chunk, dpr-cache "
    name += "(step = a + b x chunks a step, fitted)"
    want = f"<= {CHUNK_COST_GOAL_MS:g} ms"
    ours = {e: f for e, f in fits(comp).items() if e.startswith("dpr-cache")}
    if compiled:
        ours.update({e: f for e, f in fits(_joined(compiled)).items() if "compiled" in e})
    if not ours:
        return _goal(name, "not measured (fewer than two chunk counts timed)", want, None)
    engine, fit = min(ours.items(), key=lambda item: item[1]["b_ms"])
    measured = f"{fit['b_ms']:.1f} ms: {engine}, {_fit_span(fit)}, a = {fit['a_s']:.2f} s"
    if engine != "dpr-cache" and "dpr-cache" in ours:
        measured += f"; eager {ours['dpr-cache']['b_ms']:.1f} ms"
    return _goal(name, measured, want, fit["b_ms"] <= CHUNK_COST_GOAL_MS)


def _fit_span(fit: dict) -> str:
    labels = fit.get("chunk_labels") or []
    chunks = f"chunks {labels[0]} to {labels[-1]}" if len(labels) > 1 else "its chunks"
    return f"{chunks} ({fit['chunks'][1]} to {fit['chunks'][0]} chunks a step)"


def _groups(r: dict | None) -> list[dict]:
    """A speed or compilation section's comparisons (one, in runs that kept one)."""
    r = r or {}
    return r.get("comparisons") or ([r["comparison"]] if r.get("comparison") else [])


def speed_goals(speed: dict | None, compiled: dict | None) -> list[dict]:
    """The speed goals at B=512, fp16 (none without that comparison): over the full batch, over
    each peer, and the cost of a chunk."""
    goal = (GOAL_BATCH, GOAL_PRECISION)
    comp = next((c for c in _groups(speed) if (c["batch"], c["precision"]) == goal), None)
    if comp is None:
        return []
    at = [c for c in _groups(compiled) if c.get("batch") == GOAL_BATCH]
    out = [_full_batch_goal(comp, at, c, t) for c, t in FULL_BATCH_GOALS]
    out += [_peer_goal(comp, c, peer, form) for c in PEER_GOAL_CHUNKS for peer, form in PEERS]
    return [*out, _chunk_cost_goal(comp, at)]


def _host_waits(syncs: dict | None) -> str:
    """``count`` (and where most came from) of :func:`benchmarks.gpu_perf.count_syncs`."""
    if syncs is None:
        return ""
    top = ", ".join(f"`{where}` {n}" for where, n in syncs["top"].items())
    return f"{syncs['count']}" + (f" ({top})" if top else "")


def _allocator(counts: dict | None) -> str:
    """The allocator's calls a step, in words (– where this torch does not count one)."""
    if counts is None:
        return ""
    keys = {"num_device_alloc": "malloc", "num_device_free": "free", "num_alloc_retries": "flushes"}
    return ", ".join(
        f"{'–' if counts.get(k) is None else f'{counts[k]:g}'} {what}" for k, what in keys.items()
    )


def render_speed(r: dict) -> list[str]:
    """The speed section: each comparison's table, its table by chunk and fits, the savings."""
    tokens = r["tokens"] if isinstance(r["tokens"], list) else [r["tokens"]]
    held = "; ".join(
        f"the batch of {t['batch']:,} holds {t['questions']:,} question and "
        f"{t['passages']:,} passage tokens"
        for t in tokens
    )
    lines = [
        "",
        f"A shared-tower BERT-base-shaped model on SQuAD's training text at natural lengths "
        f"({held}), one hard negative; each setting's step (forward, loss, backward) timed once a "
        "round, rounds interleaved, the median. Chunks a step: of questions + of passages "
        "(dpr-cache re-encodes all but each tower's last, the peers every one); chunk q/p: q "
        "questions, p passages. Host waits: the times one step waited for the device (CUDA's "
        "synchronization warnings), where from; allocator: a step's cudaMalloc, cudaFree and "
        "cache flushes (each group from an emptied cache unless said).",
    ]
    for comp in r["comparisons"]:
        lines += _settings(comp) + _by_chunk(comp) + _by_tokens(comp) + _fits(comp)
        lines += _best_line(comp)
    s = r.get("savings")
    if s is None:
        return [*lines, "", "GradCache's savings: not reached."]
    lines += [
        "",
        f"GradCache's savings at B={s['batch']}, {s['precision']}, chunk {s['chunk']}: "
        "the speed-up each gives (1.00 = none):",
    ]
    rows = [f"{k} | {'–' if v is None else v}" for k, v in s["speedup_of_each"].items()]
    return lines + _table("saving | speed-up:", "", rows)


def _settings(comp: dict) -> list[str]:
    """One batch and precision, how it was timed, each setting's row (its host waits, allocator
    calls and compiled warm-up steps where recorded)."""
    extra = {
        "syncs": ("host waits a step", _host_waits),
        "allocator": ("allocator a step", _allocator),
        "warmup_s": ("warm-up steps s", lambda w: ", ".join(f"{x:.1f}" for x in w or [])),
    }
    shown = [k for k in extra if any(k in row for row in comp["rows"].values())]
    shown = [k for k in shown if k != "warmup_s" or comp.get("compiled")]
    rows = []
    for name, row in comp["rows"].items():
        s = setting_of(name, row, comp["batch"])
        rate = f"{row['pairs_per_s']:.0f} | {row['step_s']:.3f}" if "pairs_per_s" in row else ""
        rate = rate or f"{row.get('failed', 'not timed')} |"
        cells = [name, rate, chunks_text(s["chunks"], s["engine"])]
        rows.append(" | ".join(cells + [extra[k][1](row.get(k)) for k in shown]))
    head = " | ".join(
        ["setting | pairs/s: | step s: | chunks a step", *(extra[k][0] for k in shown)]
    )
    return [
        "",
        f"B={comp['batch']}, {comp['precision']}{_how_timed(comp)}:",
        *_table(head, "", rows),
    ]


def _how_timed(comp: dict) -> str:
    """How a comparison was timed, where it departs from one warm-up and three rounds."""
    notes = []
    if "rounds" in comp:
        warm, n = comp.get("warmups", 1), comp["rounds"]
        after = f"{warm} warm-up{'s' if warm != 1 else ''}" if warm else "no warm-up of its own"
        notes.append(f"{n} timed round{'s' if n != 1 else ''} after {after}")
        if not warm:
            notes.append(
                "the group before ran the same chunk sizes and its CUDA cache is kept, so a "
                "first step's costs (new widths, allocations: the allocator column) count"
            )
    if comp.get("peer_min_chunk"):
        notes.append(f"the peers' chunks below {comp['peer_min_chunk']} left out (the slowest)")
    return f" ({'; '.join(notes)})" if notes else ""


def _chunk_key(label: str) -> list[int]:
    return [int(x) for x in label.split("/")]


def _pivot(comp: dict, title: str, head: str, cells: dict[str, dict[str, str]], cols) -> list[str]:
    """Pairs/s of ``cells`` (a row's label: its pairs/s by column) at this comparison's batch."""
    rows = [" | ".join([label, *(row.get(c, "–") for c in cols)]) for label, row in cells.items()]
    at = f" at B={comp['batch']}, {comp['precision']} (– not timed):"
    return ["", title + at, *_table(head, "", rows)]


def _by_tokens(comp: dict) -> list[str]:
    """Pairs/s at each token budget: dpr-cache's token-budget chunks and CachedMNRL's."""
    cells: dict[str, dict[str, str]] = {}
    for name, row, s in _timed_rows(comp):
        if s["engine"] in ("dpr-cache tokens", "CachedMNRL tokens"):
            budget = f"{int(name.rsplit(' ', 1)[1]):,}"
            cells.setdefault(budget, {})[s["engine"]] = f"{row['pairs_per_s']:,.0f}"
    head = "tokens a chunk: | dpr-cache (train.chunk_tokens): | CachedMNRL (mini_batch_num_tokens):"
    engines = ("dpr-cache tokens", "CachedMNRL tokens")
    cells = dict(sorted(cells.items(), key=lambda item: int(item[0].replace(",", ""))))
    return _pivot(comp, "Pairs/s at each token budget", head, cells, engines) if cells else []


def _by_chunk(comp: dict) -> list[str]:
    """Pairs/s by chunk, an engine a row (where two chunks or more were timed)."""
    cells: dict[str, dict[str, str]] = {"chunks a step": {}}
    for _, row, s in _timed_rows(comp):
        if s["chunk"] is not None and s["engine"] != "full batch":
            cells.setdefault(s["engine"], {})[s["chunk"]] = f"{row['pairs_per_s']:,.0f}"
            cells["chunks a step"][s["chunk"]] = "{} + {}".format(*s["chunks"])
    labels = sorted(cells["chunks a step"], key=_chunk_key)
    if len(labels) < 2:
        return []
    head = " | ".join(["engine", *(f"chunk {c}:" for c in labels)])
    lines = _pivot(comp, "Pairs/s by chunk", head, cells, labels)
    full = _full(comp) if "full batch" in comp.get("best", {}) else None
    return lines + (["", f"Beside them, {full[0]}: {full[1]:,.0f} pairs/s."] if full else [])


def _fits(comp: dict) -> list[str]:
    """Each engine's step = a + b x chunks a step."""
    found = fits(comp)
    rows = [
        f"{e} | {f['b_ms']:.1f} | {f['a_s']:.3f} | {_fit_span(f)} | {f['largest_residual_ms']:.0f}"
        for e, f in found.items()
    ]
    title = (
        "The cost of a chunk: each engine's step seconds fitted as a + b x chunks a step "
        "(least squares over its chunks; the largest residual says how straight the line is):"
    )
    head = "engine | b: ms a chunk: | a: s a step: | over | largest residual ms:"
    return ["", title, *_table(head, "", rows)] if found else []


def _best_line(comp: dict) -> list[str]:
    """Each family's fastest setting, named with its chunks, against the full batch."""
    best = comp.get("best", {})
    ours, full = best.get("dpr-cache"), best.get("full batch")
    if not ours or not full:
        return []
    s = setting_of(ours["setting"], comp["rows"][ours["setting"]], comp["batch"])
    rate = ours["pairs_per_s"]
    line = (
        f"Fastest of each: {ours['setting']} ({chunks_text(s['chunks'], s['engine'], prose=True)}) "
        f"at {rate:,.0f} pairs/s is {rate / full['pairs_per_s']:.2f}x {full['setting']}"
    )
    for theirs in filter(None, (best.get(f) for f in ("CachedMNRL", "GradCache library"))):
        line += f", {rate / theirs['pairs_per_s']:.2f}x {theirs['setting']}"
    return ["", line + "."]


def compiles_text(r: dict) -> str:
    """torch.compile's compilations in a child, in words ("" where none were counted)."""
    each = r.get("compiles_s") or []
    if not each:
        return ""
    s = "s" if len(each) != 1 else ""
    return f"{len(each)} compilation{s} ({sum(each):.0f} s in all, the longest {max(each):.1f} s)"


def counters_text(counters: dict) -> str:
    """torch.compile's counters in a child, in words."""
    stats = ", ".join(f"{k} {v}" for k, v in counters.get("stats", {}).items())
    text = f"{counters.get('recompiles', 0)} recompiles, {counters.get('graph_breaks', 0)} graph "
    text += "breaks" + (f"; {stats}" if stats else "")
    if counters.get("recompile_limit") is not None:
        text += (
            f" (a frame recompiled {counters['recompile_limit']} times runs eager from then on: "
            "a `recompile_limit` warning in the child's output says it happened)"
        )
    return text


def render_compilation(r: dict) -> list[str]:
    """The compiled rows at the goals' batch, the compile's one-time cost apart."""
    lines = [
        "",
        f"dpr-cache's towers compiled (`compile_towers`, mode `{r.get('mode')}`) in a process of "
        "its own, each setting in a group beside itself eager and the full batch, interleaved "
        "(the fits join the groups); its first two warm-up steps (compiling, recording CUDA "
        "graphs) are the one-time cost, not in pairs/s.",
    ]
    if r.get("compile_call_s") is not None:
        lines += ["", f"`compile_towers` itself returned in {r['compile_call_s']:.1f} s."]
    if compiles_text(r):
        lines += ["", f"The process ran {compiles_text(r)}."]
    comps = _groups(r)
    for comp in comps:
        lines += _settings({**comp, "compiled": True})
    return lines + (_fits(_joined(comps)) if len(comps) > 1 else []) + _child_end(r)


def _llm_goals(r: dict | None) -> list[dict]:
    """Issue 57's GPU goals on the goals' decoder (the 7B's on a device)."""
    model = next((m for m in (r or {}).get("models", []) if m.get("big")), None)
    if model is None:
        return []
    plan = r["plan"]
    head = f"{model['shape']['name']} shape, LoRA r={plan['lora']['r']}, chunk {plan['chunk']}"
    by_batch = {row["batch"]: row for row in model.get("memory", [])}
    first, last = plan["memory_batches"][0], plan["memory_batches"][-1]
    top, low = by_batch.get(last, {}), by_batch.get(first, {})
    name, want = f"{head}: B={last:,} in one step", f"<= {LLM_GOAL_GB} GB"
    if top.get("fits"):
        gb = top["peak_bytes"] / 1e9
        out = [_goal(name, f"{gb:.1f} GB", want, gb <= LLM_GOAL_GB)]
    else:
        why = "out of memory" if top.get("fits") is False else _why(top, model)
        out = [_goal(name, why, want, top.get("fits"))]
    name, want = f"{head}: memory at B={last:,} over B={first}", f"<= {LLM_MEMORY_RATIO}x"
    if top.get("fits") and low.get("fits"):
        ratio = top["peak_bytes"] / low["peak_bytes"]
        out.append(_goal(name, f"{ratio:.2f}x", want, ratio <= LLM_MEMORY_RATIO))
    else:
        out.append(_goal(name, "not measured", want, None))
    return out + _llm_speed_goals(model, head, plan)


def _why(row: dict, model: dict) -> str:
    if row.get("skipped") or model.get("error"):
        return f"not measured ({row.get('skipped') or model['error'][:100]})"
    return "not measured"


def _llm_speed_goals(model: dict, head: str, plan: dict) -> list[dict]:
    """dpr-cache over CachedMNRL on the same adapter and over the fastest full batch measured."""
    speed = model.get("speed") or {}
    b, c, rows = plan["speed_batch"], plan["chunk"], speed.get("rows", {})
    ours = (rows.get(f"dpr-cache chunk {c}") or {}).get("pairs_per_s")
    cmnrl = (rows.get(f"CachedMNRL rows {c}") or {}).get("pairs_per_s")
    unmeasured = "not measured"
    if speed.get("skipped"):
        unmeasured = f"not measured ({speed['skipped']})"
    elif speed and not ours:
        unmeasured = "not measured (dpr-cache's step failed)"
    fulls = [
        (f"full batch B={n.split('B=')[1] if 'B=' in n else speed['batch']}", row["pairs_per_s"])
        for n, row in rows.items()
        if row.get("engine") == "full batch" and row.get("pairs_per_s")
    ]
    largest = model.get("largest_full_batch") or {}
    if largest.get("pairs_per_s"):
        fulls.append((f"largest full batch B={largest['batch']}", largest["pairs_per_s"]))
    peers = [
        (f"CachedMNRL (same adapter, mini-batch {c})", ("", cmnrl), LLM_OVER_CMNRL),
        (
            "the largest full batch that fits",
            max(fulls, key=lambda f: f[1], default=None),
            LLM_OVER_FULL,
        ),
    ]
    out = []
    for what, theirs, target in peers:
        name, want = f"{head}: B={b}, dpr-cache over {what}", f">= {target}x"
        if not ours or not theirs or not theirs[1]:
            out.append(_goal(name, unmeasured, want, None))
            continue
        ratio, setting = ours / theirs[1], f", {theirs[0]}" if theirs[0] else ""
        measured = f"{ratio:.2f}x ({ours:.2f} / {theirs[1]:.2f} pairs/s{setting})"
        out.append(_goal(name, measured, want, ratio >= target))
    return out


def _count(n: int) -> str:
    """A parameter count in words: 7.24B, 41.9M, 16,384."""
    if n >= 1e9:
        return f"{n / 1e9:.3g}B"
    return f"{n / 1e6:.3g}M" if n >= 1e6 else f"{n:,}"


def render_llm(r: dict) -> list[str]:
    """Decoder LLMs as the towers (issue 57): the goals, then each model's figures."""
    plan, lora = r["plan"], r["plan"]["lora"]
    targets = lora["target_modules"]
    layers = "every linear layer" if targets == "all-linear" else ", ".join(targets)
    judged = _llm_goals(r)
    lines = [
        "",
        f"Decoder LLMs as the towers (issue 57), random weights built on the device in "
        f"{plan['dtype']}: LoRA r={lora['r']} (alpha {lora['alpha']}, dropout {lora['dropout']}) "
        f"on {layers} (fp32 adapters, the base frozen), gradient checkpointing, last-token "
        f"pooling, one shared tower, {plan['q_len']}-token questions and {plan['p_len']}-token "
        f"passages, one hard negative, {plan['precision']} autocast. Memory: the peak (a dry "
        "run: peak RSS) of the first `Trainer.step` (AdamW included) of `build_trainer`'s "
        "trainer. Pairs/s: the steppers' steps interleaved; CachedMNRL on the same peft module.",
    ]
    lines += _goals_table("goal (issue 57)", judged) if judged else []
    for m in r.get("models", []):
        lines += _llm_model(m)
    return lines


def _llm_model(m: dict) -> list[str]:
    s = m["shape"]
    lines = [
        "",
        f"### {s['name']} ({s['layers']} layers x {s['hidden']}, {s['heads']} heads, "
        f"{s['kv_heads']} KV heads, MLP {s['intermediate']:,}, vocabulary {s['vocab']:,})",
        "",
    ]
    if "parameters" in m:
        lines.append(
            f"{_count(m['parameters'])} parameters, {_count(m['trainable'])} of them "
            f"trainable ({', '.join(m['trainable_dtypes'])}), the base {m['base_dtype']}; "
            f"attention {m['attention']}; built on the device in {m['build_s']:.1f} s."
        )
    if m.get("error"):
        lines += ["", f"Stopped: `{m['error']}`"]
    rows = [
        f"{x['batch']:,} | {x['chunk']} | "
        + (f"{x['skipped']} |" if x.get("skipped") else f"{_gb(x.get('peak_bytes'))} | ")
        + ("" if x.get("skipped") else f"{x['step_s']:.2f}" if x.get("fits") else "out of memory")
        for x in m.get("memory") or []
    ]
    lines += _table("batch: | chunk: | peak: | step s:", "", rows) if rows else []
    speed, largest = m.get("speed"), m.get("largest_full_batch")
    if speed and speed.get("skipped"):
        lines += ["", f"Pairs/s at B={speed['batch']}: skipped, {speed['skipped']}."]
    elif speed:
        rows = [
            f"{name} | {row['pairs_per_s']:.2f} | {row['step_s']:.2f}"
            if "pairs_per_s" in row
            else f"{name} | {row.get('failed', 'not timed')} |"
            for name, row in speed["rows"].items()
        ]
        if largest and largest.get("pairs_per_s"):
            step = largest["batch"] / largest["pairs_per_s"]
            rows.append(
                f"largest full batch B={largest['batch']} (the search's trainer step) | "
                f"{largest['pairs_per_s']:.2f} | {step:.2f}"
            )
        lines += [
            "",
            f"Pairs/s at B={speed['batch']} ({speed['precision']}, the median of "
            f"{speed['rounds']} round(s) after {speed['warmups']} warm-up(s)):",
            *_table("setting | pairs/s: | step s:", "", rows),
        ]
    return lines + (_llm_largest(largest) if largest else [])


def _llm_largest(r: dict) -> list[str]:
    tries = ", ".join(
        f"{b} ({_gb(t['peak_bytes']) if t['fits'] else 'out of memory'})"
        for b, t in r["tried"].items()
    )
    how = "doubling, then bisection"
    if r.get("predicted"):
        how += ", each try after the first placed where a line through the peaks reaches 97% of "
        how += "the device's memory"
    found = "none fitted"
    if r["batch"] is not None:
        found = f"**{r['batch']:,}** questions ({_gb(r.get('peak_bytes'))})"
        if r.get("first_too_large"):
            found += f", B={r['first_too_large']:,} out of memory"
    lines = [
        "",
        f"Largest full batch (`train.mode: full`) that fits: {found}; {how}; tried {tries}.",
    ]
    if r.get("pretended_limit") is not None:
        limit = r["pretended_limit"]
        lines.append(f"(Dry run: a full batch above {limit} questions is pretended out of memory.)")
    return lines + ([f"The search stopped: {r['stopped']}."] if r.get("stopped") else [])


def _fsdp_goals(r: dict | None) -> list[dict]:
    """The sharded GradCache gradient equals the full batch's in float64, each sync."""
    ex = (r or {}).get("exactness")
    if not ex:
        return []
    return [
        _goal(
            f"FSDP2 on one GPU (a group of one), sync per {row['sync']}: sharded GradCache "
            f"(B={ex['batch']}, chunk {ex['chunk']}) vs the unsharded full batch, float64",
            f"{row['relative_error']:.1e}",
            f"<= {row['bound']:.0e}",
            row["ok"],
        )
        for row in ex["rows"]
    ]


def render_fsdp(r: dict) -> list[str]:
    """FSDP2 in a process group of one: float64 exactness, one step's memory against none."""
    ex, plan, memory = r.get("exactness"), r["plan"], r.get("memory")
    lines = [
        "",
        "FSDP2 (`train.shard: fsdp`, the trainer's own `shard_towers`) on **one GPU, in a process "
        "group of one**. With one GPU there is nothing to divide: each parameter's shard is the "
        "whole parameter, so the ratio fsdp / none below measures FSDP's own overhead (its "
        "gathered and bf16 copies of a block, its buffers), not the division across ranks that "
        "FSDP promises. Two GPUs were not available; the division at 2 and 4 ranks is counted "
        "on the CPU in [sharding.md](sharding.md).",
    ]
    if ex:
        lines += [
            "",
            f"Exactness: a random BERT ({ex['layers']} layers of {ex['hidden']}) in float64, "
            f"B={ex['batch']} with one hard negative: `verify`'s `sharded_step` (GradCache at "
            f"chunk {ex['chunk']} over the sharded towers, the gradient gathered whole) against "
            "`compare_steps`' unsharded full batch.",
            *_table(
                "gradient sync | relative gap: | bound: | equal",
                "once a {sync} | {relative_error:.1e} | {bound:.0e} | {ok}",
                ex["rows"],
            ),
        ]
    if not memory:
        return lines
    mb = ("peak_bytes", "parameters", "gradients", "optimizer_state", "held")
    rows = [
        " | ".join([x["shard"], *(f"{x[k] / 1e6:,.1f}" for k in mb), f"{x['seconds']:.2f}"])
        for x in memory
    ]
    lines += [
        "",
        f"Memory: one GradCache training step of a random BERT ({plan['layers']} layers of "
        f"{plan['hidden']}, MLP {plan['intermediate']:,}, {plan['vocab']:,} words; separate "
        f"towers), B={plan['batch']}, chunk {plan['chunk']}, {plan['q_len']}-token questions "
        f"and {plan['p_len']}-token passages with one hard negative, {plan['precision']} "
        "autocast (and FSDP's bf16 policy, gradients reduced in fp32, where sharded), AdamW's "
        "update included. Peak: `torch.cuda.max_memory_allocated` (a dry run: the process's "
        "peak RSS); held: the bytes of parameters, gradients and AdamW's state after the "
        "step (a DTensor's local shard). MB = 10^6 bytes.",
        *_table(
            "train.shard | peak MB: | parameters MB: | gradients MB: | AdamW state MB: "
            "| held MB: | step s:",
            "",
            rows,
        ),
    ]
    by = {row["shard"]: row for row in memory}
    if {"none", "fsdp"} <= set(by):
        none, fsdp = by["none"], by["fsdp"]
        lines += [
            "",
            f"fsdp / none: peak {fsdp['peak_bytes'] / none['peak_bytes']:.3f}x, held "
            f"{fsdp['held'] / none['held']:.3f}x (one rank: FSDP's overhead, not a division).",
        ]
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
}
