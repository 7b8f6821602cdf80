"""The GPU page: ``gpu.json`` as measured and ``gpu.md`` to read, with the goals judged on them:
the GPU issue's, issue 57's (decoder LLMs, ``llm``) and issue 58's (FSDP2 on one GPU, ``fsdp``).
Speed's goals name their batch, precision and chunk; a chunk's cost is fitted per engine."""

from __future__ import annotations

import re
from pathlib import Path

from benchmarks.harness import cpu_text
from dpr_cache.runtime.atomic import write_json_atomic, write_text_atomic

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


def _cell(v) -> str:
    """A figure as the page writes one it does not judge: yes/no, five significant digits (three
    below 0.01, none past 1,000, thousands grouped), a list or a dict of figures on one line."""
    if isinstance(v, bool) or v is None:
        return {True: "yes", False: "no", None: "–"}[v]
    if isinstance(v, float):
        return f"{v:,.0f}" if abs(v) >= 1000 else f"{v:.5g}" if abs(v) >= 0.01 else f"{v:.3g}"
    if isinstance(v, int):
        return f"{v:,}"
    if isinstance(v, dict):
        return ", ".join(f"{_key(k)} {_cell(x)}" for k, x in v.items())
    if isinstance(v, list):
        return ", ".join(_cell(x) for x in v)
    return str(v).replace("|", "\\|").replace("\n", " ")


def _key(name) -> str:
    return str(name).replace("_", " ")


def _fields(title: str, d: dict, skip=()) -> list[str]:
    """A dict's figures on one line after a blank one: "title: key value; key value"."""
    shown = "; ".join(f"{_key(k)} {_cell(v)}" for k, v in d.items() if k not in skip)
    return ["", f"{title}: {shown}."]


def _grid(rows: list[dict] | dict[str, dict], first: str = "") -> list[str]:
    """Rows of figures as a table, a column per field; a dict of rows keyed in column ``first``."""
    if isinstance(rows, dict):
        rows = [{first: k, **r} for k, r in rows.items()]
    cols = list(dict.fromkeys(k for r in rows for k in r))
    numeric = {c for c in cols if all(_number(r.get(c)) for r in rows)}
    head = " | ".join(_key(c) + (":" if c in numeric else "") for c in cols)
    return _table(head, "", [" | ".join(_cell(r.get(c)) for c in cols) for r in rows])


def _number(v) -> bool:
    return isinstance(v, int | float) and not isinstance(v, bool)


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
        name = f"{r['precision']}, B=16, chunk 4: GradCache vs full batch"
        target = f"<= {r['ceiling']:.0e}, fp64 gap <= {r['ratio_bound']}x the full batch's"
        out.append(_goal(name, f"{r['gradcache_vs_full']:.1e} {gaps}", target, r["ok"]))
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
    name = "fp64, B=7 and 8, chunks 2 to 4: GradCache = full batch"
    out = [_goal(name, f"{worst:.1e}", "<= 1e-10", worst <= 1e-10)]
    name = f"{precisions}, B=8, chunk 3: replayed reps bitwise equal (control differs)"
    out.append(_goal(name, "yes" if replay else "no", "yes", replay))
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
    name = f"{how}: encode NQ's {NQ_PASSAGES:,} passages, projected (from passages of {sample})"
    target = f"<= {ENCODE_GOAL_MIN} min"
    return _goal(name, f"{minutes:.0f} min ({share})", target, minutes <= ENCODE_GOAL_MIN)


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
        lines += ["**Dry run on the CPU** (no CUDA): toy sizes, no figure here is a GPU's.", ""]
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
        *_goals_table("goal", report.get("goals", [])),
    ]
    for name, section in report["sections"].items():
        lines += ["", f"## {name.replace('_', ' ').capitalize()}", ""]
        lines += _section(name, section, env, device)
    if report.get("device_memory"):
        lines += ["", "## Device memory while the suite ran", *_device_memory(report)]
    return "\n".join(lines) + "\n"


def _section(name: str, section: dict, env: dict, device: str) -> list[str]:
    """A section's status line, then its figures (or what it measured before it stopped)."""
    if "skipped" in section:
        return [f"Skipped: {section['skipped']}."]
    if "error" not in section:
        when, where = section.get("date", env["date"]), section.get("device_name", device)
        kept = f", run {when}" if (when, where) != (env["date"], device) else ""
        kept += f" on {where}" if kept and where != device else ""
        return [f"{section['seconds']:.0f} s{kept}.", *_SECTION[name](section["result"])]
    lines = [f"Failed after {section['seconds']} s: `{section['error']}`"]
    if section.get("partial") and name in _PARTIAL_SHOWN:
        lines += ["", "What it measured before it stopped:", *_SECTION[name](section["partial"])]
    elif section.get("partial"):
        lines += ["", "What it measured before it stopped is in gpu.json (`partial`)."]
    return lines


def _goals_table(title: str, judged: list[dict]) -> list[str]:
    rows = [{**g, "met": MET[g["met"]]} for g in judged]
    return _table(
        f"{title} | measured | target | met", "{goal} | {measured} | {target} | {met}", rows
    )


def _device_memory(report: dict) -> list[str]:
    r = report["device_memory"]
    if "error" in r:
        return ["", f"Not read: `{r['error']}`."]
    rows = {
        n: {**s, "under 1 GiB free": r["full_samples"].get(n, 0)} for n, s in r["sections"].items()
    }
    processes = [
        {**p, "pid": str(p["pid"]), "command": _short(p.get("command") or "–")[:120]}
        for p in r["processes"]
    ]
    lines = [
        "",
        f"`cudaMemGetInfo` twice a second (every process on the {r['total_gb']:.0f} GB device) "
        "under each section; own: the suite's reserved memory then; at s: the peak's time.",
        *_grid(rows, "section"),
    ]
    if processes:
        lines += ["", "Processes `nvidia-smi` named (every 3 s), the most each held:"]
    return lines + (_grid(processes[:12]) if processes else [])


def _exactness(r: dict) -> list[str]:
    replay = [{**x, "a": x["replayed"], "b": x["control_without_replay"]} for x in r["replay"]]
    return [
        "",
        "float64, GradCache against the full batch's plain autograd (random BERTs, tiny: 2 layers "
        "of 32, base: 12 of 768): the largest gradient difference over the largest gradient.",
        *_table(
            "case | relative error: | bound: | ok",
            "{case} | {relative_error:.1e} | {bound:.0e} | {ok}",
            r["fp64"],
        ),
        "",
        "Dropout 0.1, every chunk re-encoded: chunks whose re-forward equals the first pass.",
        *_table(
            "model | autocast | replayed: | without replay (control):",
            "{size} | {precision} | {a[bitwise_equal]}/{a[chunks]} "
            "| {b[bitwise_equal]}/{b[chunks]}",
            replay,
        ),
        *_fields(
            "Finite difference (float64; the gradient along a random direction against a central "
            "difference of the loss; control: without the RNG replay)",
            r["finite_difference"],
        ),
        *_compiled_exactness(r.get("compiled")),
    ]


def _compiled_exactness(c: dict | None) -> list[str]:
    """The compiled towers' float64 gradient and dropout replay."""
    if c is None or c.get("not_run"):
        return ["", f"Compiled towers: not checked ({c['not_run']})."] if c else []
    compiles = f"; {compiles_text(c)}" if compiles_text(c) else ""
    lines = [
        "",
        f"Compiled towers (`compile_towers`, mode `{c['mode']}`), in a process of its own "
        f"({c['seconds']:.0f} s{compiles}), each check over 3 steps (the first compiling):",
    ]
    for key, what in (("fp64", "float64 against the eager full batch"), ("replay", "replay")):
        lines += _fields(f"- {what}", c[key]) if c.get(key) else []
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
    return [
        "",
        "GradCache (B=16, chunk 4, one hard negative) against the full batch under the same "
        "autocast, both against float64: relative gradient norms; the dtypes of loss, reps, cache.",
        *_table(
            "model | precision | GradCache vs full: | full vs fp64: | GradCache vs fp64: "
            "| loss, reps, cache | ok",
            "{size} | {precision} | {gradcache_vs_full:.1e} | {full_vs_fp64:.1e} "
            "| {gradcache_vs_fp64:.1e} | {dtypes[loss]}, {dtypes[reps]}, {dtypes[cache]} | {ok}",
            r["rows"],
        ),
        *_fields("fp16 overflow (the toy trainer at a loss scale of 2^40)", r["fp16_overflow"]),
    ]


def _memory(r: dict) -> list[str]:
    lines = [
        "",
        "One `Trainer.step`'s peak `max_memory_allocated` (dry run: peak RSS), BERT-base's shape, "
        "32-token questions, 256-token passages, one hard negative, bf16; step s: its first step.",
    ]
    if r.get("beside_commands"):
        lines += ["", "The rows ran beside the toy commands (step seconds under their load)."]
    return lines + _memory_rows(r["rows"])


def _memory_rows(rows: list[dict]) -> list[str]:
    """Batch, chunk, peak and step seconds (or why not) of each try."""
    cells = []
    for x in rows:
        tail = f"{_gb(x.get('peak_bytes'))} | out of memory"
        if x.get("skipped"):
            tail = f"{x['skipped']} |"
        elif x.get("fits", bool(x.get("step_s"))):
            tail = f"{_gb(x['peak_bytes'])} | {x['step_s']:.2f}"
        cells.append(f"{x['batch']:,} | {x['chunk']} | {tail}")
    return _table("batch: | chunk: | peak: | step s:", "", cells) if cells else []


def _largest(r: dict) -> list[str]:
    """The largest full batch that fits (doubling, then bisection), and every batch tried."""
    tried = ", ".join(f"{b} ({_tried(t)})" for b, t in r["tried"].items())
    found = "none fitted"
    if r["batch"] is not None:
        found = f"**{r['batch']:,}** questions ({_gb(r.get('peak_bytes'))})"
        found += f", B={r['first_too_large']:,} too large" if r.get("first_too_large") else ""
    how = "; each try after the first placed by the peaks' line" if r.get("predicted") else ""
    lines = ["", f"Largest full batch (`train.mode: full`) that fits: {found}{how}; tried {tried}."]
    if r.get("pretended_limit") is not None:
        lines.append(f"(Dry run: above {r['pretended_limit']} questions pretended out of memory.)")
    return lines + ([f"The search stopped: {r['stopped']}."] if r.get("stopped") else [])


def _tried(t: bool | dict) -> str:
    if isinstance(t, bool):
        return "fits" if t else "out of memory"
    return _gb(t.get("peak_bytes")) if t.get("fits") else "out of memory"


def _encoding(r: dict) -> list[str]:
    cmd = r["command"]
    if "error" in cmd:
        return ["", f"`dpr-cache encode` failed: {cmd['error']}"]
    words = f"{r['passage_words']} words" if r.get("passage_words") else "72 words on average"
    return [
        "",
        f"`dpr-cache encode` on SQuAD passages of {words} (NQ's: 100); passages/s past the first "
        f"batch. NQ's {NQ_PASSAGES:,} passages at that rate: **{r['nq_projected_s'] / 3600:.2f} "
        f"h** on this device, against {DPR_ENCODE}; the compute limit "
        f"({r['flops_per_passage'] / 1e9:.3g} GFLOP a passage at a large matrix product's "
        f"{r['matmul_tflops']:.3g} TFLOP/s) is {r['nq_limit_s'] / 60:.1f} min, "
        f"{r['share_of_limit']:.0%} of it reached.",
        *_fields("The command (its seconds start to end; timings: `encode.json`'s)", cmd),
        *_fields("The encoder alone on tokenized passages", r["encoder_alone"]),
    ]


def _command_line(r: dict) -> list[str]:
    pipeline = r.get("pipeline", {})
    rows = [
        {**x, "command": _short(x["command"]), "last_line": _cell(x["last_line"][:100])}
        for x in pipeline.get("commands", [])
    ]
    head, fmt = "command | exit: | s: | last line", "`{command}` | {rc} | {seconds} | {last_line}"
    if any("started_s" in row for row in rows):  # a run that recorded the starts
        head = head.replace(" | exit:", " | start s (from the suite's): | exit:")
        fmt = fmt.replace(" | {rc}", " | {started_s:.0f} | {rc}")
    lines = _table(head, fmt, rows)
    if pipeline.get("metrics"):
        toy = "Toy eval (a few steps of the toy config: a run of the commands, not a model)"
        lines += _fields(toy, pipeline["metrics"], skip=("measured",))
    for key in ("eval_resident", "eval_resident_cpu"):  # recorded by 2026-11-28's run
        if pipeline.get(key):
            run = pipeline[key]
            skip = ("readings", "largest_mappings")
            lines += _fields(f"`{key}`: the toy eval's resident GB", run, skip)
            lines += _grid(run["readings"], "reading")
            maps = [{**m, "mapping": m["mapping"].rsplit("/", 1)[-1]} for m in run.get(skip[1], [])]
            lines += ["", "Its largest mappings where the search planned its blocks:", *_grid(maps)]
    if r.get("ran_beside"):
        lines += [
            "",
            f"These commands ran beside {', '.join(r['ran_beside'])}, {r['commands_s']:.0f} s "
            "from first to last; this section's seconds are the wait for them.",
        ]
    if "resume" in r:
        lines += ["", "Reruns and resumes (dropout on, fp32, SIGKILL after step 3's checkpoint):"]
        lines += _grid(r["resume"], "kernels")
    return lines + (_fields("NCCL, a process group of one", r["nccl"]) if "nccl" in r else [])


def _chunk_too_large(r: dict) -> list[str]:
    lines = [
        "",
        f"`train` with a chunk of {r['chunk']:,} questions (256-token passages) on BERT-base's "
        f"shape: exit {r['rc']} after {r['seconds']} s: `{r['last_line']}`",
    ]
    if r.get("stack"):
        lines += ["", "Where it was when stopped:", "", "```", *r["stack"][-12:], "```"]
    return lines


def _short(command: str) -> str:
    """A command without its --set pairs, which only point it at the suite's folders."""
    return re.sub(r" --set \S+", "", command)


def _teacher_scoring(r: dict) -> list[str]:
    shape = r["model"]
    lines = [
        "",
        f"`score`'s cross-encoder loop ({shape['layers']} layers x {shape['hidden']}), pairs "
        f"length-sorted; rows in the order run; NQ (h): NQ's {r['nq_pairs']:,} training pairs.",
        *_fields(
            "Settings", r, ("rows", "model_alone", "first_pass", "profiles", "model", "nq_pairs")
        ),
        *_grid(r["rows"]),
    ]
    if "model_alone" in r:
        lines += ["", "The model alone (its best round), the batches already on the device:"]
        lines += _grid(r["model_alone"])
    if r.get("first_pass") and r["first_pass"]["seconds"]:
        new = "A new shape's cost (the model alone's first pass, then the same batches again)"
        lines += _fields(new, r["first_pass"])
    profiles = {p: {**prof, "top": _top(prof)} for p, prof in r.get("profiles", {}).items()}
    if profiles:
        lines += ["", "Each precision's longest batch under the profiler (ms):"]
        lines += _grid(profiles, "precision")
    return lines


def _top(profile: dict) -> str:
    return ", ".join(
        f"`{t['op'][:60]}` {t['ms']:.1f} ms ({t['calls']}x)" for t in profile.get("top", [])
    )


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
    fit = {"a_s": a, "b_ms": b * 1e3, "points": len(points), "chunks": [min(ns), max(ns)]}
    return fit | {"largest_residual_ms": worst}


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
            labels = [c for _, _, c in sorted(pts, key=lambda p: -p[0])]
            out[engine] = fit | {"chunk_labels": labels}
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
        labels = ", ".join(sorted(timed, key=lambda c: [int(x) for x in c.split("/")])) or "none"
        measured = f"not measured (this run timed dpr-cache at chunks {labels})"
        return _goal(name, measured, want, None)
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
    return (r or {}).get("comparisons", [])


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
    """The speed section: each comparison's table and fits, then the savings."""
    tokens = r["tokens"] if isinstance(r["tokens"], list) else [r["tokens"]]
    held = "; ".join(f"B={t['batch']:,}: {t['questions']:,} + {t['passages']:,}" for t in tokens)
    lines = [
        "",
        "A shared-tower BERT-base-shaped model on SQuAD's text at natural lengths (question + "
        f"passage tokens: {held}), one hard negative; each setting's step timed once a round, "
        "rounds interleaved, the median. Chunks a step: questions' + passages' (chunk q/p: q "
        "questions, p passages); host waits: the step's waits for the device, where from.",
    ]
    for comp in r["comparisons"]:
        lines += _settings(comp) + _fits(comp)
    s = r.get("savings")
    if s is None:
        return [*lines, "", "GradCache's savings: not reached."]
    saving = f"GradCache's savings at B={s['batch']}, {s['precision']}, chunk {s['chunk']}"
    return lines + _fields(f"{saving}, the speed-up each gives (1 = none)", s["speedup_of_each"])


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
        warm = comp.get("warmups", 1)
        after = f"{warm} warm-up(s)" if warm else "no warm-up of its own (the CUDA cache kept)"
        notes.append(f"{comp['rounds']} timed round(s) after {after}")
    if comp.get("peer_min_chunk"):
        notes.append(f"the peers' chunks below {comp['peer_min_chunk']} left out (the slowest)")
    return f" ({'; '.join(notes)})" if notes else ""


def _fits(comp: dict) -> list[str]:
    """Each engine's step = a + b x chunks a step."""
    found = fits(comp)
    rows = [
        f"{e} | {f['b_ms']:.1f} | {f['a_s']:.3f} | {_fit_span(f)} | {f['largest_residual_ms']:.0f}"
        for e, f in found.items()
    ]
    title = "Each engine's step fitted as a + b x chunks a step (least squares; the residual:"
    head = "engine | b: ms a chunk: | a: s a step: | over | largest residual ms:"
    return ["", f"{title} how straight the line is):", *_table(head, "", rows)] if found else []


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
        text += f" (a frame recompiled {counters['recompile_limit']} times runs eager from then on)"
    return text


def render_compilation(r: dict) -> list[str]:
    """The compiled rows at the goals' batch, the compile's one-time cost apart."""
    lines = [
        "",
        f"dpr-cache's towers compiled (mode `{r.get('mode')}`) in a process of their own, each "
        "setting beside itself eager and the full batch; the warm-up steps are not in pairs/s.",
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
    best_full = max(fulls, key=lambda f: f[1], default=None)
    peers = [
        (f"CachedMNRL (same adapter, mini-batch {c})", ("", cmnrl), LLM_OVER_CMNRL),
        ("the largest full batch that fits", best_full, LLM_OVER_FULL),
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


def render_llm(r: dict) -> list[str]:
    """Decoder LLMs as the towers (issue 57): the goals, then each model's figures."""
    judged = _llm_goals(r)
    lines = [
        "",
        "Decoder LLMs as the towers (issue 57), random weights built on the device, LoRA "
        "adapters, one shared tower; memory: the first `Trainer.step`'s peak (dry run: peak "
        "RSS); pairs/s: the steppers' steps interleaved, CachedMNRL on the same peft module.",
        *_fields("Plan", r["plan"]),
    ]
    lines += _goals_table("goal (issue 57)", judged) if judged else []
    for m in r.get("models", []):
        lines += _llm_model(m)
    return lines


def _llm_model(m: dict) -> list[str]:
    s = m["shape"]
    rest = {k: v for k, v in s.items() if k not in ("name", "layers", "hidden")}
    lines = ["", f"### {s['name']} ({s['layers']} layers x {s['hidden']}, {_cell(rest)})"]
    skip = ("shape", "big", "memory", "speed", "largest_full_batch", "error")
    lines += _fields("Model", m, skip) if "parameters" in m else []
    lines += ["", f"Stopped: `{m['error']}`"] if m.get("error") else []
    lines += _memory_rows(m.get("memory") or [])
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
    return lines + (_largest(largest) if largest else [])


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
    ex, memory = r.get("exactness"), r.get("memory")
    lines = [
        "",
        "FSDP2 (`train.shard: fsdp`) on **one GPU, in a process group of one**: nothing to "
        "divide, so fsdp / none measures FSDP's own overhead. Two GPUs were not available; the "
        "division at 2 and 4 ranks is counted on the CPU in [sharding.md](sharding.md).",
    ]
    if ex:
        title = "Exactness: a random BERT in float64, `sharded_step` against the full batch"
        lines += _fields(title, ex, skip=("rows",))
        lines += _table(
            "gradient sync | relative gap: | bound: | equal",
            "once a {sync} | {relative_error:.1e} | {bound:.0e} | {ok}",
            ex["rows"],
        )
    if not memory:
        return lines
    title = "Memory (bytes; peak: `max_memory_allocated`, a dry run's peak RSS; held: after it)"
    lines += [*_fields(f"{title}, one GradCache step with AdamW of a random BERT", r["plan"])]
    lines += _grid(memory)
    by = {row["shard"]: row for row in memory}
    if {"none", "fsdp"} <= set(by):
        none, fsdp = by["none"], by["fsdp"]
        peak, held = fsdp["peak_bytes"] / none["peak_bytes"], fsdp["held"] / none["held"]
        lines += [
            "",
            f"fsdp / none: peak {peak:.3f}x, held {held:.3f}x (one rank: FSDP's overhead).",
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
    "largest_full_batch": _largest,
    "llm": render_llm,
    "fsdp": render_fsdp,
}
