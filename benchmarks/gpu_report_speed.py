"""The GPU page's speed: each setting's pairs per second with its chunks a step, the table by
chunk, the cost of a chunk fitted per engine (step = a + b x chunks a step), the compiled rows,
and the speed goals, each naming its batch, precision and chunk."""

from __future__ import annotations

import re

__all__ = [
    "GOAL_BATCH",
    "GOAL_PRECISION",
    "setting_of",
    "chunks_text",
    "chunk_cost_fit",
    "fits",
    "speed_goals",
    "render_speed",
    "render_compilation",
    "compiles_text",
    "counters_text",
]

GOAL_BATCH, GOAL_PRECISION = 512, "fp16"
CHUNK_COST_GOAL_MS = 5.0
FULL_BATCH_GOALS = ((128, 1.0), (64, 0.9), (32, 0.8))  # chunk, dpr-cache over the full batch
PEER_GOAL, PEER_GOAL_CHUNKS = 1.5, (32, 64, 128)  # over each peer at the same chunk
PEERS = (("CachedMNRL", "CachedMNRL rows {}"), ("GradCache library", "GradCache library chunk {}"))

_NAMED = re.compile(
    r"^(?P<engine>dpr-cache|GradCache library) chunk (?P<q>\d+)(?:/(?P<p>\d+))?$"
    r"|^CachedMNRL rows (?P<rows>\d+)$|^(?P<tokens>CachedMNRL|dpr-cache) tokens \d+$"
    r"|^full batch( B=\d+)?$"
)


def setting_of(name: str, row: dict, batch: int) -> dict:
    """A row's engine, chunk and chunks a step ([questions, passages]; None where a token
    budget decides): as recorded, or for a run that did not record them, read from its name
    (the speed section's batches hold one hard negative: twice as many passages)."""
    if "engine" in row:
        return {k: row.get(k) for k in ("engine", "chunk", "chunks")}
    m = _NAMED.match(name)
    n_q, n_p = batch, 2 * batch
    if m is None:
        return {"engine": name, "chunk": None, "chunks": None}
    if m["engine"]:
        q, p = int(m["q"]), int(m["p"] or m["q"])
        chunk = f"{q}/{p}" if m["p"] else str(q)
        return {"engine": m["engine"], "chunk": chunk, "chunks": _counts(n_q, n_p, q, p)}
    if m["rows"]:
        per = -(-n_q // int(m["rows"]))
        return {"engine": "CachedMNRL", "chunk": m["rows"], "chunks": [per, 2 * per]}
    if name.startswith("full batch"):
        return {"engine": "full batch", "chunk": None, "chunks": [1, 1]}
    return {"engine": f"{m['tokens']} tokens", "chunk": None, "chunks": None}


def _counts(n_q: int, n_p: int, q: int, p: int) -> list[int]:
    return [-(-n_q // q), -(-n_p // p)]


def chunks_text(counts: list[int] | None, engine: str, prose: bool = False) -> str:
    """Chunks a step in words: "16 + 32" (questions + passages; in ``prose``, "16 + 32 chunks
    a step"); one chunk a tower named, and for dpr-cache that nothing is then re-encoded (the
    full batch's work: no GradCache)."""
    if engine == "full batch":
        return "the whole batch"
    if not counts:
        return "chunks by tokens" if engine == "CachedMNRL tokens" else "–"
    if counts == [1, 1]:
        if engine.startswith("dpr-cache"):
            return "one chunk a tower: nothing re-encoded, no GradCache work"
        return "one chunk a tower"
    return f"{counts[0]} + {counts[1]}" + (" chunks a step" if prose else "")


def _timed_rows(comparison: dict) -> list[tuple[str, dict, dict]]:
    """(name, row, setting) of each timed row of a comparison."""
    return [
        (name, row, setting_of(name, row, comparison["batch"]))
        for name, row in comparison["rows"].items()
        if "pairs_per_s" in row
    ]


def chunk_cost_fit(points: list[tuple[int, float]]) -> dict | None:
    """Least squares ``step s = a + b x chunks a step`` over (chunks, step s) points: ``b``, the
    cost of a chunk, in ms; None below two distinct chunk counts."""
    ns = [n for n, _ in points]
    if len(set(ns)) < 2:
        return None
    mean_n = sum(ns) / len(ns)
    mean_t = sum(t for _, t in points) / len(points)
    b = sum((n - mean_n) * (t - mean_t) for n, t in points) / sum((n - mean_n) ** 2 for n in ns)
    a = mean_t - b * mean_n
    worst = max(abs(t - (a + b * n)) for n, t in points)
    return {
        "a_s": a,
        "b_ms": b * 1e3,
        "points": len(points),
        "chunks": [min(ns), max(ns)],
        "largest_residual_ms": worst * 1e3,
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
            fit["chunk_labels"] = [c for _, _, c in sorted(pts, key=lambda p: -p[0])]
            out[engine] = fit
    return out


def _goal_comparison(speed: dict | None) -> dict | None:
    for comp in (speed or {}).get("comparisons", []):
        if comp["batch"] == GOAL_BATCH and comp["precision"] == GOAL_PRECISION:
            return comp
    return None


def _compiled_comparisons(compiled: dict | None) -> list[dict]:
    """The compiled groups at the goals' batch (one per compiled setting)."""
    compiled = compiled or {}
    comps = compiled.get("comparisons") or (
        [compiled["comparison"]] if "comparison" in compiled else []
    )
    return [c for c in comps if c.get("batch") == GOAL_BATCH]


def _joined(comps: list[dict]) -> dict | None:
    """The groups' rows in one comparison, each group's full batch left out (for the fits)."""
    if not comps:
        return None
    rows = {
        name: row
        for comp in comps
        for name, row in comp["rows"].items()
        if not name.startswith("full batch")
    }
    return {**comps[0], "rows": rows}


def _full(comp: dict) -> tuple[str, float] | None:
    best = comp["best"].get("full batch")
    return (best["setting"], best["pairs_per_s"]) if best else None


def _at_chunk(comp: dict, chunk: int, engine_prefix: str) -> list[tuple[str, dict, dict]]:
    return [
        (n, r, s)
        for n, r, s in _timed_rows(comp)
        if s["engine"].startswith(engine_prefix) and s["chunk"] == str(chunk)
    ]


def _timed_chunks(comp: dict) -> str:
    labels = sorted(
        {s["chunk"] for _, _, s in _timed_rows(comp) if s["engine"] == "dpr-cache"},
        key=lambda c: [int(x) for x in c.split("/")],
    )
    return ", ".join(labels) or "none"


def _full_batch_goal(comp, compiled: list[dict], chunk: int, target: float) -> tuple:
    """dpr-cache at ``chunk`` (its fastest setting: eager, a variant, compiled) over the full
    batch timed beside it."""
    name = f"B={GOAL_BATCH} {GOAL_PRECISION}, chunk {chunk}: dpr-cache over the full batch"
    want = f">= {target}x the full batch of {GOAL_BATCH} (or the largest that fits)"
    tries = []
    groups = [(comp, "dpr-cache"), *((c, "dpr-cache compiled") for c in compiled)]
    for group, engines in groups:
        full = _full(group)
        for setting, row, s in _at_chunk(group, chunk, engines) if full else []:
            tries.append((row["pairs_per_s"] / full[1], setting, row, s, full))
    if not tries:
        why = f"not measured (this run timed dpr-cache at chunks {_timed_chunks(comp)})"
        return name, why, want, None
    ratio, setting, row, s, full = max(tries, key=lambda t: t[0])
    measured = (
        f"{ratio:.2f}x: {setting} ({chunks_text(s['chunks'], s['engine'], prose=True)}), "
        f"{row['pairs_per_s']:,.0f} pairs/s against {full[0]}'s {full[1]:,.0f}"
    )
    eager = [t for t in tries if t[3]["engine"] == "dpr-cache"]
    if eager and eager[0][1] != setting:
        measured += f"; eager {eager[0][0]:.2f}x"
    return name, measured, want, ratio >= target


def _peer_goal(comp, chunk: int, peer: str, pattern: str) -> tuple:
    """dpr-cache (eager) over ``peer`` at the same chunk."""
    name = f"B={GOAL_BATCH} {GOAL_PRECISION}, chunk {chunk}: dpr-cache over {peer}"
    want = f">= {PEER_GOAL}x {pattern.format(chunk)}"
    rows = comp["rows"]
    ours = rows.get(f"dpr-cache chunk {chunk}", {}).get("pairs_per_s")
    theirs = rows.get(pattern.format(chunk), {}).get("pairs_per_s")
    if not ours or not theirs:
        return name, "not measured (not both timed in this run)", want, None
    ratio = ours / theirs
    return (
        name,
        f"{ratio:.2f}x ({ours:,.0f} against {theirs:,.0f} pairs/s)",
        want,
        ratio >= PEER_GOAL,
    )


def _chunk_cost_goal(comp, compiled: list[dict]) -> tuple:
    """The smallest cost of a chunk of dpr-cache's engines (eager, variants, compiled)."""
    name = (
        f"B={GOAL_BATCH} {GOAL_PRECISION}: the cost of a chunk, dpr-cache "
        "(step = a + b x chunks a step, fitted)"
    )
    want = f"<= {CHUNK_COST_GOAL_MS:g} ms"
    ours = {e: f for e, f in fits(comp).items() if e.startswith("dpr-cache")}
    joined = _joined(compiled)
    if joined:
        ours.update({e: f for e, f in fits(joined).items() if "compiled" in e})
    if not ours:
        return name, "not measured (fewer than two chunk counts timed)", want, None
    engine, fit = min(ours.items(), key=lambda item: item[1]["b_ms"])
    measured = f"{fit['b_ms']:.1f} ms: {engine}, {_fit_span(fit)}, a = {fit['a_s']:.2f} s"
    if engine != "dpr-cache" and "dpr-cache" in ours:
        measured += f"; eager {ours['dpr-cache']['b_ms']:.1f} ms"
    return name, measured, want, fit["b_ms"] <= CHUNK_COST_GOAL_MS


def _fit_span(fit: dict) -> str:
    labels = fit.get("chunk_labels") or []
    chunks = f"chunks {labels[0]} to {labels[-1]}" if len(labels) > 1 else "its chunks"
    return f"{chunks} ({fit['chunks'][1]} to {fit['chunks'][0]} chunks a step)"


def speed_goals(speed: dict | None, compiled: dict | None) -> list[tuple]:
    """(goal, measured, target, met) of each speed goal at B=512, fp16: dpr-cache at chunks
    128, 64 and 32 over the full batch, over each peer at chunks 32, 64 and 128, and the
    cost of a chunk. None where this run has no comparison at that batch and precision."""
    comp = _goal_comparison(speed)
    if comp is None:
        return []
    comp_compiled = _compiled_comparisons(compiled)
    out = [_full_batch_goal(comp, comp_compiled, c, t) for c, t in FULL_BATCH_GOALS]
    for chunk in PEER_GOAL_CHUNKS:
        out += [_peer_goal(comp, chunk, peer, pattern) for peer, pattern in PEERS]
    out.append(_chunk_cost_goal(comp, comp_compiled))
    return out


def _host_waits(syncs: dict | None) -> str:
    """``count`` (and where most came from) of :func:`benchmarks.gpu_perf.count_syncs`."""
    if syncs is None:
        return ""
    top = ", ".join(f"`{where}` {n}" for where, n in syncs["top"].items())
    return f"{syncs['count']}" + (f" ({top})" if top else "")


def _allocator(counts: dict | None) -> str:
    """:data:`benchmarks.gpu_perf._ALLOCATOR_COUNTS` a step, in words (– where this torch
    does not count it)."""
    if counts is None:
        return ""

    def n(key: str) -> str:
        return "–" if counts.get(key) is None else f"{counts[key]:g}"

    return (
        f"{n('num_device_alloc')} malloc, {n('num_device_free')} free, "
        f"{n('num_alloc_retries')} flushes"
    )


def _tokens_text(tokens) -> str:
    """The batches' real tokens (one dict in runs of one batch's figures, else a list)."""
    items = tokens if isinstance(tokens, list) else [tokens]
    return "; ".join(
        f"the batch of {t['batch']:,} holds {t['questions']:,} question and "
        f"{t['passages']:,} passage tokens"
        for t in items
    )


def render_speed(r: dict) -> list[str]:
    """The speed section: each comparison's table, its table by chunk and fits, the savings."""
    lines = [
        "",
        "One shared-tower BERT-base-shaped model, SQuAD's training questions and paragraphs at",
        f"natural lengths ({_tokens_text(r['tokens'])}), one hard negative; every setting's step",
        "(forward, loss, backward; no optimizer) timed once a round, rounds interleaved in one",
        "process; the median over rounds. Chunks a step: chunks of questions + chunks of",
        "passages (CachedMNRL: mini-batches of questions + of positives and hard negatives);",
        "dpr-cache re-encodes every chunk but the last of each tower, the peers every chunk.",
        "Host waits (where measured): the times one step made the",
        "host wait for the device (CUDA's synchronization warnings, one extra step), with the",
        "lines that made it wait most. Chunk q/p: q questions and p passages a chunk",
        "(`train.chunk_size`, `train.p_chunk_size`). Allocator (where measured): a timed step's",
        "cudaMalloc and cudaFree calls and cache flushes (a cudaFree waits for the device; each",
        "group of settings starts from an emptied cache unless said otherwise).",
    ]
    for comp in r["comparisons"]:
        lines += _comparison(comp)
    return lines + _savings(r.get("savings"))


def _comparison(comp: dict) -> list[str]:
    """One batch and precision: how it was timed, its rows, its table by chunk, its fits."""
    rows = comp["rows"]
    waits = any("syncs" in row for row in rows.values())
    alloc = any("allocator" in row for row in rows.values())
    lines = ["", f"B={comp['batch']}, {comp['precision']}{_how_timed(comp)}:", ""]
    lines += [
        "| setting | pairs/s | step s | chunks a step |"
        + (" host waits a step |" if waits else "")
        + (" allocator a step |" if alloc else ""),
        "|---|--:|--:|---|" + ("---|" if waits else "") + ("---|" if alloc else ""),
    ]
    for name, row in rows.items():
        s = setting_of(name, row, comp["batch"])
        if "pairs_per_s" in row:
            cells = [name, f"{row['pairs_per_s']:.0f}", f"{row['step_s']:.3f}"]
        else:
            cells = [name, row.get("failed", "not timed"), ""]
        cells.append(chunks_text(s["chunks"], s["engine"]))
        if waits:
            cells.append(_host_waits(row.get("syncs")))
        if alloc:
            cells.append(_allocator(row.get("allocator")))
        lines.append("| " + " | ".join(cells) + " |")
    return lines + _by_chunk(comp) + _by_tokens(comp) + _fits(comp) + _best_line(comp)


def _how_timed(comp: dict) -> str:
    """How a comparison was timed, where it departs from one warm-up and three rounds."""
    notes = []
    if "rounds" in comp:
        warm = comp.get("warmups", 1)
        notes.append(
            f"{comp['rounds']} timed round{'s' if comp['rounds'] != 1 else ''} after "
            + (f"{warm} warm-up{'s' if warm != 1 else ''}" if warm else "no warm-up of its own")
        )
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


def _by_tokens(comp: dict) -> list[str]:
    """Pairs/s at each token budget: dpr-cache's token-budget chunks and CachedMNRL's."""
    table: dict[str, dict[str, str]] = {}
    for name, row, s in _timed_rows(comp):
        if s["engine"] in ("dpr-cache tokens", "CachedMNRL tokens"):
            budget = name.rsplit(" ", 1)[1]
            table.setdefault(budget, {})[s["engine"]] = f"{row['pairs_per_s']:,.0f}"
    if not table:
        return []
    lines = [
        "",
        f"Pairs/s at each token budget at B={comp['batch']}, {comp['precision']} (– not timed):",
        "",
        "| tokens a chunk | dpr-cache (train.chunk_tokens) | CachedMNRL (mini_batch_num_tokens) |",
        "|--:|--:|--:|",
    ]
    for budget in sorted(table, key=int):
        cells = table[budget]
        lines.append(
            f"| {int(budget):,} | {cells.get('dpr-cache tokens', '–')} | "
            f"{cells.get('CachedMNRL tokens', '–')} |"
        )
    return lines


def _by_chunk(comp: dict) -> list[str]:
    """Pairs/s by chunk, an engine a row (where two chunks or more were timed)."""
    table: dict[str, dict[str, str]] = {}
    counts: dict[str, list[int]] = {}
    for _, row, s in _timed_rows(comp):
        if s["chunk"] is None or s["engine"] == "full batch":
            continue
        table.setdefault(s["engine"], {})[s["chunk"]] = f"{row['pairs_per_s']:,.0f}"
        counts.setdefault(s["chunk"], s["chunks"])
    labels = sorted(counts, key=_chunk_key)
    if len(labels) < 2:
        return []
    lines = [
        "",
        f"Pairs/s by chunk at B={comp['batch']}, {comp['precision']} (– not timed):",
        "",
        "| engine | " + " | ".join(f"chunk {c}" for c in labels) + " |",
        "|---|" + "--:|" * len(labels),
        "| chunks a step | "
        + " | ".join(f"{counts[c][0]} + {counts[c][1]}" for c in labels)
        + " |",
    ]
    for engine, cells in table.items():
        lines.append(f"| {engine} | " + " | ".join(cells.get(c, "–") for c in labels) + " |")
    full = _full(comp) if "full batch" in comp.get("best", {}) else None
    if full:
        lines += ["", f"Beside them, {full[0]}: {full[1]:,.0f} pairs/s."]
    return lines


def _fits(comp: dict) -> list[str]:
    """Each engine's step = a + b x chunks a step."""
    found = fits(comp)
    if not found:
        return []
    lines = [
        "",
        "The cost of a chunk: each engine's step seconds fitted as a + b x chunks a step "
        "(least squares over its chunks; the largest residual says how straight the line is):",
        "",
        "| engine | b: ms a chunk | a: s a step | over | largest residual ms |",
        "|---|--:|--:|---|--:|",
    ]
    for engine, f in found.items():
        lines.append(
            f"| {engine} | {f['b_ms']:.1f} | {f['a_s']:.3f} | {_fit_span(f)} | "
            f"{f['largest_residual_ms']:.0f} |"
        )
    return lines


def _best_line(comp: dict) -> list[str]:
    """Each family's fastest setting, named with its chunks, against the full batch."""
    best = comp.get("best", {})
    ours, full = best.get("dpr-cache"), best.get("full batch")
    if not ours or not full:
        return []
    row = comp["rows"][ours["setting"]]
    s = setting_of(ours["setting"], row, comp["batch"])
    rate = ours["pairs_per_s"]
    line = (
        f"Fastest of each: {ours['setting']} ({chunks_text(s['chunks'], s['engine'], prose=True)}) "
        f"at {rate:,.0f} pairs/s is {rate / full['pairs_per_s']:.2f}x {full['setting']}"
    )
    for family in ("CachedMNRL", "GradCache library"):
        theirs = best.get(family)
        if theirs:
            line += f", {rate / theirs['pairs_per_s']:.2f}x {theirs['setting']}"
    return ["", line + "."]


def _savings(s: dict | None) -> list[str]:
    if s is None:
        return ["", "GradCache's savings: not reached."]
    lines = [
        "",
        f"GradCache's savings at B={s['batch']}, {s['precision']}, chunk {s['chunk']}: "
        "the speed-up each gives (1.00 = none):",
        "",
        "| saving | speed-up |",
        "|---|--:|",
    ]
    for name, value in s["speedup_of_each"].items():
        lines.append(f"| {name} | {value if value is not None else '–'} |")
    return lines


def compiles_text(r: dict) -> str:
    """torch.compile's compilations in a child, in words ("" where none were counted)."""
    each = r.get("compiles_s") or []
    if not each:
        return ""
    return (
        f"{len(each)} compilation{'s' if len(each) != 1 else ''} ({sum(each):.0f} s in all, "
        f"the longest {max(each):.1f} s)"
    )


def counters_text(counters: dict) -> str:
    """torch.compile's counters in a child, in words."""
    stats = ", ".join(f"{k} {v}" for k, v in counters.get("stats", {}).items())
    text = (
        f"{counters.get('recompiles', 0)} recompiles, {counters.get('graph_breaks', 0)} graph "
        f"breaks" + (f"; {stats}" if stats else "")
    )
    if counters.get("recompile_limit") is not None:
        text += (
            f" (a frame recompiled {counters['recompile_limit']} times runs eager from then on: "
            "a `recompile_limit` warning in the child's output says it happened)"
        )
    return text


def _compiled_group(comp: dict) -> list[str]:
    """One compiled setting's group: its rows with their warm-up steps."""
    lines = [
        "",
        f"B={comp['batch']}, {comp['precision']}{_how_timed(comp)}:",
        "",
        "| setting | pairs/s | step s | chunks a step | warm-up steps s |",
        "|---|--:|--:|---|---|",
    ]
    for name, row in comp["rows"].items():
        s = setting_of(name, row, comp["batch"])
        warm = ", ".join(f"{x:.1f}" for x in row.get("warmup_s", []))
        if "pairs_per_s" in row:
            rate = [f"{row['pairs_per_s']:.0f}", f"{row['step_s']:.3f}"]
        else:
            rate = [row.get("failed", "not timed"), ""]
        chunks = chunks_text(s["chunks"], s["engine"])
        lines.append(f"| {name} | {' | '.join(rate)} | {chunks} | {warm} |")
    return lines


def render_compilation(r: dict) -> list[str]:
    """The compiled rows at the goals' batch, the compile's one-time cost apart."""
    lines = [
        "",
        f"dpr-cache's towers compiled (`compile_towers`, mode `{r.get('mode')}`) in a process of "
        "its own: each compiled setting in a group of its own, in order, beside the same setting "
        "eager and the full batch (a model of its own), interleaved; the fits join the groups. "
        "A compiled setting's first warm-up step compiles and its second records "
        "what the first left (new shapes, CUDA graphs): their seconds are the compile's "
        "one-time cost, not in pairs/s.",
    ]
    if r.get("compile_call_s") is not None:
        lines += ["", f"`compile_towers` itself returned in {r['compile_call_s']:.1f} s."]
    if compiles_text(r):
        lines += ["", f"The process ran {compiles_text(r)}."]
    comps = r.get("comparisons") or ([r["comparison"]] if r.get("comparison") else [])
    for comp in comps:
        lines += _compiled_group(comp)
    if len(comps) > 1:
        lines += _fits(_joined(comps))
    if r.get("compiler"):
        lines += ["", f"The compiler in that process: {counters_text(r['compiler'])}."]
    if r.get("error"):
        e = r["error"]
        lines += ["", f"The child stopped ({e['why']}); its last lines:", "", "```"]
        lines += [*e.get("progress", []), *e.get("last_lines", []), "```"]
    return lines
