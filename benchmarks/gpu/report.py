"""The GPU page, ``gpu.md``, from ``gpu.json``, and the goals judged on it (the GPU issue's, issue
57's on decoders, issue 58's on FSDP2); :func:`_figures` draws every section's figures."""

from __future__ import annotations

import functools
import re
import statistics
from pathlib import Path

from benchmarks.harness import NQ_PASSAGES, cpu_text
from dpr_cache.runtime.atomic import write_json_atomic, write_text_atomic

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
# Kept in gpu.json, not drawn: printed output, timings of each round, profiles, counters.
_HIDDEN = {"stdout", "times_s", "profiles", "compiler", "allocator", "largest_mappings", "best"}
_CODE = {"stack", "progress", "last_lines"}  # lines drawn as they were printed
_NOTES = {
    "exactness": "GradCache against the full batch in float64 (relative error); replay: "
    "chunks whose re-forward under dropout equals the first pass, and without the RNG replay.",
    "memory": "One `Trainer.step`'s peak `max_memory_allocated` (dry run: peak RSS), BERT-base's "
    "shape, 256-token passages, one hard negative; step s: its first step.",
    "speed": "A BERT-base-shaped tower on SQuAD's text, one hard negative, steps timed in "
    "interleaved rounds (the median). Chunks a step: questions' + passages' (chunk q/p).",
    "encoding": f"`dpr-cache encode`, projected to NQ's {NQ_PASSAGES:,} passages (DPR: "
    f"{DPR_ENCODE}).",
    "fsdp": "FSDP2 (`train.shard: fsdp`) on **one GPU, in a process group of one**: nothing to "
    "divide, so fsdp / none measures FSDP's own overhead. Two GPUs were not available; the "
    "division at 2 and 4 ranks is counted on the CPU in [sharding.md](sharding.md).",
}


def write_page(report: dict, out: Path, source: Path | None = None) -> Path:
    """``gpu.md`` (and ``gpu.json`` with its goals) in ``out``."""
    report["goals"] = goals(report)
    write_json_atomic(out / "gpu.json", report)
    write_text_atomic(out / "gpu.md", markdown(report))
    return out / "gpu.md"


render = write_page  # the name benchmarks.pages calls


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
    out += [_encode_goal(enc)] if enc and enc.get("nq_projected_s") else []
    out += _llm_goals(_result(report, "llm")) + _fsdp_goals(_result(report, "fsdp"))
    large = _result(report, "chunk_too_large")
    if large:
        name = "a chunk too large: one line naming a chunk that fits"
        target = "exit 2, `error: train.chunk_size ...`"
        out.append(_goal(name, f"exit {large['rc']}", target, large["ok"]))
    return out + ([] if report.get("dry_run", True) else [_suite_goal(report)])


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
    """The float64 gradient and the dropout replay with the towers compiled (failed: why)."""
    grad = "fp64, B=8, chunk 3, towers compiled: GradCache = eager full batch"
    replay = "fp32, B=8, chunk 3, towers compiled: re-forward = first pass to fp32 rounding"
    if c.get("not_run"):
        targets = ((grad, "<= 1e-10"), (replay, "all within 1e-04, control > 1e-2"))
        return [_goal(g, f"not measured ({c['not_run']})", t, None) for g, t in targets]
    fp64, rep = c.get("fp64") or {}, c.get("replay") or {}
    why = [f"failed: {r['error'][:120]}" if "error" in r else None for r in (fp64, rep)]
    stop = f"not reached ({(c.get('error') or {}).get('why', 'no figure')})"
    err = fp64.get("relative_error")
    measured = why[0] or stop if err is None else f"{err:.1e} (mode {c['mode']})"
    out = [_goal(grad, measured, "<= 1e-10", err is not None and err <= 1e-10)]
    if "replayed" not in rep:
        return [*out, _goal(replay, why[1] or stop, "all within 1e-04", False)]
    a, b, bound = rep["replayed"], rep["control_without_replay"], f"{rep['bound']:.0e}"
    measured = f"{a['within_bound']}/{a['chunks']} chunks within {bound} (largest "
    measured += f"{a['largest']:.1e}); without replay {b['largest']:.1e}"
    return [*out, _goal(replay, measured, f"all within {bound}, control > 1e-2", rep["ok"])]


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


_NAMED = re.compile(
    r"^(?P<engine>dpr-cache|GradCache library) chunk (?P<q>\d+)(?:/(?P<p>\d+))?$"
    r"|^(?P<cmnrl>CachedMNRL) rows (?P<rows>\d+)$|^(?P<full>full batch)( B=\d+)?$"
)


def setting_of(name: str, row: dict, batch: int) -> dict:
    """A row's engine, chunk and chunks a step: as recorded, or read from its name (older runs)."""
    if "engine" in row:
        return {k: row.get(k) for k in ("engine", "chunk", "chunks")}
    m = _NAMED.match(name)
    if m is None or m["full"]:
        engine = "full batch" if m else re.sub(r" tokens \d+$", " tokens", name)
        return {"engine": engine, "chunk": None, "chunks": [1, 1] if m else None}
    q = int(m["q"] or m["rows"])
    p = int(m["p"] or q)
    chunks = [-(-batch // q), 2 * -(-batch // q) if m["cmnrl"] else -(-2 * batch // p)]
    return {"engine": m["engine"] or m["cmnrl"], "chunk": m[0].split()[-1], "chunks": chunks}


def chunks_text(counts: list[int] | None, engine: str, prose: bool = False) -> str:
    """Chunks a step in words ("16 + 32")."""
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
    rows = comparison["rows"].items()
    return [(n, r, setting_of(n, r, comparison["batch"])) for n, r in rows if "pairs_per_s" in r]


def chunk_cost_fit(points: list[tuple[int, float]]) -> dict | None:
    """``step s = a + b ms x chunks a step`` by least squares (None below two chunk counts)."""
    ns = [n for n, _ in points]
    if len(set(ns)) < 2:
        return None
    b, a = statistics.linear_regression(ns, [t for _, t in points])
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
        labels = [c for _, _, c in sorted(pts, key=lambda p: -p[0])]
        chunks = f"chunks {labels[0]} to {labels[-1]}" if len(labels) > 1 else "its chunks"
        if fit is not None:
            span = f" ({fit['chunks'][1]} to {fit['chunks'][0]} chunks a step)"
            out[engine] = fit | {"over": chunks + span}
    return out


def _joined(comps: list[dict]) -> dict:
    """The groups' rows in one comparison, each group's full batch left out (for the fits)."""
    rows = {n: row for c in comps for n, row in c["rows"].items() if not n.startswith("full batch")}
    return {**comps[0], "rows": rows}


def speed_goals(speed: dict | None, compiled: dict | None) -> list[dict]:
    """At B=512, fp16: dpr-cache over the full batch, over each peer, and a chunk's cost."""
    goal = (GOAL_BATCH, GOAL_PRECISION)
    comps = (speed or {}).get("comparisons", [])
    comp = next((c for c in comps if (c["batch"], c["precision"]) == goal), None)
    if comp is None:
        return []
    at = [c for c in (compiled or {}).get("comparisons", []) if c.get("batch") == GOAL_BATCH]
    out = [_full_batch_goal(comp, at, c, t) for c, t in FULL_BATCH_GOALS]
    out += [_peer_goal(comp, c, peer, form) for c in PEER_GOAL_CHUNKS for peer, form in PEERS]
    return [*out, _chunk_cost_goal(comp, at)]


def _full_batch_goal(comp, compiled: list[dict], chunk: int, target: float) -> dict:
    """dpr-cache's fastest setting at ``chunk`` over the full batch timed beside it."""
    name = f"B={GOAL_BATCH} {GOAL_PRECISION}, chunk {chunk}: dpr-cache over the full batch"
    want = f">= {target}x the full batch of {GOAL_BATCH} (or the largest that fits)"
    tries = []
    for group, engines in [(comp, "dpr-cache"), *((c, "dpr-cache compiled") for c in compiled)]:
        full = group["best"].get("full batch")
        for setting, row, s in _timed_rows(group) if full else []:
            if s["engine"].startswith(engines) and s["chunk"] == str(chunk):
                tries.append((row["pairs_per_s"] / full["pairs_per_s"], setting, row, s, full))
    if not tries:
        timed = {s["chunk"] for _, _, s in _timed_rows(comp) if s["engine"] == "dpr-cache"}
        labels = ", ".join(sorted(timed, key=lambda c: [int(x) for x in c.split("/")])) or "none"
        why = f"not measured (this run timed dpr-cache at chunks {labels})"
        return _goal(name, why, want, None)
    ratio, setting, row, s, full = max(tries, key=lambda t: t[0])
    measured = f"{ratio:.2f}x: {setting} ({chunks_text(s['chunks'], s['engine'], prose=True)}), "
    measured += f"{row['pairs_per_s']:,.0f} pairs/s against {full['setting']}'s "
    measured += f"{full['pairs_per_s']:,.0f}"
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
    measured = f"{fit['b_ms']:.1f} ms: {engine}, {fit['over']}, a = {fit['a_s']:.2f} s"
    if engine != "dpr-cache" and "dpr-cache" in ours:
        measured += f"; eager {ours['dpr-cache']['b_ms']:.1f} ms"
    return _goal(name, measured, want, fit["b_ms"] <= CHUNK_COST_GOAL_MS)


def _llm_goals(r: dict | None) -> list[dict]:
    """Issue 57's GPU goals on the goals' decoder (the 7B's on a device): memory, then speed."""
    model = next((m for m in (r or {}).get("models", []) if m.get("big")), None)
    if model is None:
        return []
    plan = r["plan"]
    head = f"{model['shape']['name']} shape, LoRA r={plan['lora']['r']}, chunk {plan['chunk']}"
    by_batch = {row["batch"]: row for row in model.get("memory", [])}
    first, last = plan["memory_batches"][0], plan["memory_batches"][-1]
    top, low = by_batch.get(last, {}), by_batch.get(first, {})
    fits, why = top.get("fits"), top.get("skipped") or (model.get("error") or "")[:100]
    why = "out of memory" if fits is False else f"not measured ({why})" if why else "not measured"
    gb = top["peak_bytes"] / 1e9 if fits else None
    measured, met = (f"{gb:.1f} GB", gb <= LLM_GOAL_GB) if fits else (why, fits)
    out = [_goal(f"{head}: B={last:,} in one step", measured, f"<= {LLM_GOAL_GB} GB", met)]
    name, want = f"{head}: memory at B={last:,} over B={first}", f"<= {LLM_MEMORY_RATIO}x"
    ratio = top["peak_bytes"] / low["peak_bytes"] if fits and low.get("fits") else None
    measured = "not measured" if ratio is None else f"{ratio:.2f}x"
    out.append(_goal(name, measured, want, None if ratio is None else ratio <= LLM_MEMORY_RATIO))
    return out + _llm_speed_goals(model, head, plan)


def _llm_speed_goals(model: dict, head: str, plan: dict) -> list[dict]:
    """dpr-cache over CachedMNRL on the same adapter and over the fastest full batch measured."""
    speed = model.get("speed") or {}
    rows = {n: r for n, r in speed.get("rows", {}).items() if r.get("pairs_per_s")}
    ours = rows.get(f"dpr-cache chunk {plan['chunk']}", {}).get("pairs_per_s")
    cmnrl = rows.get(f"CachedMNRL rows {plan['chunk']}", {}).get("pairs_per_s")
    why = speed.get("skipped") or (speed and not ours and "dpr-cache's step failed")
    unmeasured = f"not measured ({why})" if why else "not measured"
    full = [(n, r) for n, r in rows.items() if r.get("engine") == "full batch"]
    fulls = [(n if "B=" in n else f"{n} B={speed['batch']}", r["pairs_per_s"]) for n, r in full]
    largest = model.get("largest_full_batch") or {}
    if largest.get("pairs_per_s"):
        fulls.append((f"largest full batch B={largest['batch']}", largest["pairs_per_s"]))
    best = max(fulls, key=lambda f: f[1], default=(None, None))
    out = []
    for what, setting, theirs, target in [
        (f"CachedMNRL (same adapter, mini-batch {plan['chunk']})", "", cmnrl, LLM_OVER_CMNRL),
        ("the largest full batch that fits", f", {best[0]}", best[1], LLM_OVER_FULL),
    ]:
        name, want = f"{head}: B={plan['speed_batch']}, dpr-cache over {what}", f">= {target}x"
        if not ours or not theirs:
            out.append(_goal(name, unmeasured, want, None))
            continue
        measured = f"{ours / theirs:.2f}x ({ours:.2f} / {theirs:.2f} pairs/s{setting})"
        out.append(_goal(name, measured, want, ours / theirs >= target))
    return out


def _fsdp_goals(r: dict | None) -> list[dict]:
    """The sharded GradCache gradient equals the full batch's in float64, each sync."""
    ex, out = (r or {}).get("exactness") or {}, []
    for row in ex.get("rows", []):
        name = f"FSDP2 on one GPU (a group of one), sync per {row['sync']}: sharded GradCache "
        name += f"(B={ex['batch']}, chunk {ex['chunk']}) vs the unsharded full batch, float64"
        error, bound = f"{row['relative_error']:.1e}", f"<= {row['bound']:.0e}"
        out.append(_goal(name, error, bound, row["ok"]))
    return out


def markdown(report: dict) -> str:
    """The page's markdown."""
    env = report["environment"]
    device = env.get("device_name") or env["device"]
    dry = ["**Dry run on the CPU** (no CUDA): toy sizes, no figure here is a GPU's.", ""]
    driver = f", driver {env['driver']}" if env.get("driver") else ""
    memory = f", {env['memory_bytes'] / 2**30:.0f} GiB" if env.get("memory_bytes") else ""
    judged = [{**g, "met": MET[g["met"]]} for g in report.get("goals", [])]
    lines = [
        "# dpr-cache on a GPU",
        "",
        *(dry if report["dry_run"] else []),
        f"Device: **{device}**{driver}{memory}",
        f"torch {env['torch']}, CUDA {env['cuda']}, Python {env['python']}; {env['date']};",
        f"Host: {cpu_text(env['host'])}; transformers {env['host']['transformers']}.",
        f"The suite took {report.get('seconds', 0):.0f} s: `python -m benchmarks.gpu --out DIR`.",
        f"The GPU runs so far, what each missed and what fixed it: [{HISTORY}]({HISTORY}).",
        "",
        "## Goals",
        *_grid(judged, "goal"),
    ]
    for name, section in report["sections"].items():
        lines += ["", f"## {name.replace('_', ' ').capitalize()}", ""]
        lines += _section(name, section, env, device)
    return "\n".join(lines) + "\n"


def _section(name: str, section: dict, env: dict, device: str) -> list[str]:
    """A section's status line, its note, then its figures (or those before it stopped)."""
    draw = _SECTION.get(name, _figures)
    note = ["", _NOTES[name]] if name in _NOTES else []
    if "skipped" in section:
        return [f"Skipped: {section['skipped']}."]
    if "error" not in section:
        when, where = section.get("date", env["date"]), section.get("device_name", device)
        kept = f", run {when}" if (when, where) != (env["date"], device) else ""
        kept += f" on {where}" if kept and where != device else ""
        return [f"{section['seconds']:.0f} s{kept}.", *note, *draw(section["result"])]
    lines = [f"Failed after {section['seconds']} s: `{section['error']}`", ""]
    if section.get("partial") and name in _PARTIAL_SHOWN:
        return [*lines, "What it measured before it stopped:", *note, *draw(section["partial"])]
    if section.get("partial"):
        return [*lines, "What it measured before it stopped is in gpu.json (`partial`)."]
    return lines[:1]


def _table(head: str, rows: list[str]) -> list[str]:
    """A table after a blank line: ``head`` its titles ("a | b:", ":" aligning right)."""
    titles = head.split(" | ")
    rule = "|" + "".join("--:|" if t.endswith(":") else "---|" for t in titles)
    head = " | ".join(t.removesuffix(":") for t in titles)
    return ["", f"| {head} |", rule, *(f"| {c} |" for c in rows)]


def _cell(v, key: str = "") -> str:
    """A figure on the page: bytes in GB, five digits, on one line, no --set pairs in a command."""
    if isinstance(v, bool) or v is None:
        return {True: "yes", False: "no", None: "–"}[v]
    if _number(v) and key.endswith("bytes"):
        return f"{v / 1e9:.2f} GB"
    if isinstance(v, float):
        return f"{v:,.0f}" if abs(v) >= 1000 else f"{v:.5g}" if abs(v) >= 0.01 else f"{v:.3g}"
    if isinstance(v, int):
        return f"{v:,}"
    if isinstance(v, dict):
        return ", ".join(f"{k.replace('_', ' ')} {_cell(x, k)}" for k, x in v.items())
    if isinstance(v, list):
        return ", ".join(_cell(x, key) for x in v)
    return re.sub(r" --set \S+", "", str(v)).replace("|", "\\|").replace("\n", " ")


def _number(v) -> bool:
    return isinstance(v, int | float) and not isinstance(v, bool)


def _figures(d: dict, title: str = "") -> list[str]:
    """A dict's figures: the flat ones on one line, then each table, printed lines and dict."""
    shown = {k: v for k, v in d.items() if k not in _HIDDEN and v not in ([], {})}
    flat = {k: v for k, v in shown.items() if k not in _CODE and _flat(v)}
    figures = "; ".join(f"{k.replace('_', ' ')} {_cell(v, k)}" for k, v in flat.items())
    lines = ["", f"{title or 'Figures'}: {figures}."] if flat else []
    for key, v in shown.items():
        name = ", ".join([*([title] if title else []), key.replace("_", " ")])
        rows = v if isinstance(v, list) else list(v.values()) if isinstance(v, dict) else []
        if key in _CODE:
            lines += ["", f"{name}:", "", "```", *v, "```"]
        elif rows and all(isinstance(x, dict) for x in rows):
            lines += ["", f"{name}:", *_grid(v, key)]
        elif key not in flat:
            lines += _figures(v, name)
    return lines


def _flat(v) -> bool:
    """A figure, or a list or a dict of them (no rows, no printed lines): one cell."""
    if isinstance(v, dict):
        return not _CODE & v.keys() and not any(isinstance(x, dict | list) for x in v.values())
    return not (isinstance(v, list) and v and all(isinstance(x, dict) for x in v))


def _grid(rows: list[dict] | dict[str, dict], first: str) -> list[str]:
    """Rows of figures as a table; a dict of rows keyed in column ``first``."""
    if isinstance(rows, dict):
        rows = [{first: k, **r} for k, r in rows.items()]
    cols = [c for c in dict.fromkeys(k for r in rows for k in r) if c not in _HIDDEN]
    numeric = {c for c in cols if all(_number(r.get(c)) for r in rows)}
    head = " | ".join(c.replace("_", " ") + (":" if c in numeric else "") for c in cols)
    return _table(head, [" | ".join(_cell(r.get(c), c) for c in cols) for r in rows])


def render_speed(r: dict, joined: bool = False) -> list[str]:
    """Each comparison's settings and chunk cost (``joined``: one fit of all), then the rest."""
    comps = r.get("comparisons", [])
    lines = [line for comp in comps for line in _settings(comp) + ([] if joined else _fits(comp))]
    lines += _fits(_joined(comps)) if joined and len(comps) > 1 else []
    return lines + _figures({k: v for k, v in r.items() if k != "comparisons"})


render_compilation = functools.partial(render_speed, joined=True)


def _settings(comp: dict) -> list[str]:
    """One comparison's settings as a table, and how it was timed."""
    extra = {"syncs": "host waits a step", "warmup_s": "warm-up s"}
    extra = {k: t for k, t in extra.items() if any(k in row for row in comp["rows"].values())}
    rows = []
    for name, row in comp["rows"].items():
        s = setting_of(name, row, comp["batch"])
        rate = f"{row['pairs_per_s']:.0f} | {row['step_s']:.3f}" if "pairs_per_s" in row else ""
        cells = [name, rate or f"{row.get('failed', 'not timed')} |"]
        cells.append(chunks_text(s["chunks"], s["engine"]))
        rows.append(" | ".join(cells + [_extra(k, row.get(k)) for k in extra]))
    head = " | ".join(["setting | pairs/s: | step s: | chunks a step", *extra.values()])
    notes = []
    if "rounds" in comp:
        warm = comp.get("warmups", 1)
        after = f"{warm} warm-up(s)" if warm else "no warm-up of its own (the CUDA cache kept)"
        notes.append(f"{comp['rounds']} timed round(s) after {after}")
    if comp.get("peer_min_chunk"):
        notes.append(f"the peers' chunks below {comp['peer_min_chunk']} left out (the slowest)")
    timed = f" ({'; '.join(notes)})" if notes else ""
    return ["", f"B={comp['batch']}, {comp['precision']}{timed}:", *_table(head, rows)]


def _extra(key: str, v) -> str:
    """A setting's warm-up steps, or its host waits and where most came from ("" if none)."""
    if v is None or key != "syncs":
        return "" if v is None else _cell(v)
    top = ", ".join(f"`{where}` {n}" for where, n in v["top"].items())
    return f"{v['count']}" + (f" ({top})" if top else "")


def _fits(comp: dict) -> list[str]:
    """Each engine's step = a + b x chunks a step."""
    cells = "{} | {b_ms:.1f} | {a_s:.3f} | {over} | {largest_residual_ms:.0f}"
    rows = [cells.format(e, **f) for e, f in fits(comp).items()]
    title = "Each engine's step fitted as a + b x chunks a step (least squares; the residual:"
    head = "engine | b: ms a chunk: | a: s a step: | over | largest residual ms:"
    return ["", f"{title} how straight the line is):", *_table(head, rows)] if rows else []


def render_llm(r: dict) -> list[str]:
    """The plan, then each decoder's figures under its shape."""
    lines = _figures(r["plan"], "Plan")
    for m in r.get("models", []):
        s = m["shape"]
        rest = {k: v for k, v in s.items() if k not in ("name", "layers", "hidden")}
        lines += ["", f"### {s['name']} ({s['layers']} layers x {s['hidden']}, {_cell(rest)})"]
        lines += _figures({k: v for k, v in m.items() if k not in ("shape", "big")})
    return lines


def render_fsdp(r: dict) -> list[str]:
    """FSDP's figures, then one step's memory under fsdp over none."""
    by = {row["shard"]: row for row in r.get("memory") or []}
    if not {"none", "fsdp"} <= set(by):
        return _figures(r)
    peak, held = (by["fsdp"][k] / by["none"][k] for k in ("peak_bytes", "held"))
    return [*_figures(r), "", f"fsdp / none: peak {peak:.3f}x, held {held:.3f}x (one rank)."]


_SECTION = {"speed": render_speed, "compilation": render_compilation}
_SECTION |= {"llm": render_llm, "fsdp": render_fsdp}
