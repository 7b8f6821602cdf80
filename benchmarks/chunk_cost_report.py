"""``chunk_cost.json`` as a page, ``chunk_cost.md``: the machine and the command, the engines'
steps at equal chunk counts, each engine's cost of a chunk (the fitted slope, the tokens beside
it), its step seconds by chunk count, and a chunk's parts."""

from __future__ import annotations

from pathlib import Path

from benchmarks.machine import cpu_text
from benchmarks.scale_report import markdown_table
from benchmarks.synthetic_report import run_text
from dpr_cache.core.engine import RELEASE_EVERY
from dpr_cache.runtime.atomic import write_text_atomic

__all__ = ["PAGE", "markdown", "write_page"]

PAGE = "chunk_cost.md"

PARTS = [
    ("aten_ops", "aten ops dispatched", "{:,.0f}", 1),
    ("aten_self_s", "aten ops' own time (ms)", "{:.2f}", 1e3),
    (
        "other_ops_self_s",
        "other recorded ops' own time: autograd nodes and the like (ms)",
        "{:.2f}",
        1e3,
    ),
    (
        "unrecorded_s",
        "outside any recorded op: Python, module calls, the profiler (ms)",
        "{:.2f}",
        1e3,
    ),
    ("wall_s", "profiled wall time (ms)", "{:.2f}", 1e3),
    ("autograd_nodes", "autograd nodes run in the backward", "{:,.0f}", 1),
    ("allocations", "allocations (profiler's memory events)", "{:,.0f}", 1),
    ("module_forwards", "nn.Module forwards", "{:,.0f}", 1),
    ("python_calls", "Python function calls (cProfile)", "{:,.0f}", 1),
    ("host_syncs", "host waits on the GPU (CUDA only)", "{:,.1f}", 1),
]
"""(key, label, format, scale) of each row of the parts table."""


def _ms(seconds: float | None, digits: int = 2) -> str:
    """Seconds as milliseconds ("–" for None)."""
    return "–" if seconds is None else f"{1e3 * seconds:.{digits}f}"


def _count(value: float) -> str:
    """A count a chunk: whole from 10 up, one decimal below (a call every few chunks shows)."""
    return f"{value:,.0f}" if abs(value) >= 10 else f"{value:.1f}"


def token_lines(result: dict) -> list[str]:
    """How much the tokens an engine encodes change from the fewest chunks to the most: that
    arithmetic is in its slope too."""
    engines = result["engines"]
    points = len(next(iter(engines.values()))["points"]) if engines else 0
    shares = {n: e["points"][-1]["tokens"] / e["points"][0]["tokens"] for n, e in engines.items()}
    falling = [f"`{n}`'s tokens fall {100 * (1 - r):.0f}%" for n, r in shares.items() if r < 1]
    fall = (
        f" {' and '.join(falling)} as the chunks grow, which lowers that slope." if falling else ""
    )
    return [
        f"The ± is the slope's standard error from the {points} medians ({points - 2} degrees of "
        "freedom): a rough guide at so few points. Tokens: every pass's, padding included. "
        "dpr-cache re-encodes all but the last chunk of each tower (one chunk a tower: nothing is "
        "encoded twice), and cuts each chunk to its longest row (smaller chunks of rows ordered by "
        f"length carry less padding).{fall} A slope includes the arithmetic of the tokens that "
        "change with the chunks, so compare engines at equal chunk counts (above) before their "
        "slopes.",
    ]


def setup_text(result: dict) -> list[str]:
    """The model, the batch, the chunking and the timing, in words."""
    plan, batch = result["plan"], result["batch"]
    q, p = batch["questions"], batch["passages"]
    chunks = ", ".join(str(n) for n in plan["chunks"])
    group = 1 + plan["hard_negatives"]
    return [
        f"Model: a random BERT of {plan['layers']} layers, hidden {plan['hidden']}, "
        f"{plan['heads']} heads, intermediate {plan['intermediate']}, one tower for questions and"
        f" passages, [CLS] pooling, fp32, train mode with dropout {plan['dropout']:g}: dpr-cache "
        "with its fast CPU dropout (as the trainer runs it), the peers with PyTorch's.",
        "",
        f"Batch: B = {q['rows']} questions of {q['shortest']} to {q['longest']} tokens (mean "
        f"{q['mean']:.1f}) and {p['rows']} passages ({plan['hard_negatives']} hard negative a "
        f"question) of {p['shortest']} to {p['longest']} tokens (mean {p['mean']:.1f}), random "
        "token ids, padded to the longest row; the same batch at every chunk count.",
        "",
        f"Chunks: {chunks} question chunks a step, each chunk of the same rows in both towers, so"
        f" {group} times as many passage chunks (sentence-transformers' CachedMNRL chunks each of"
        f" its {1 + group} columns, questions, positives and negatives, alike): a step holds "
        f"{1 + group} x the question chunks. Step = zero_grad + the engine's step (no optimizer);"
        f" {plan['rounds']} rounds, every engine and chunk count once a round in a shuffled "
        "order, after one warm-up step each; each point is its median over the rounds.",
        "",
        "dpr-cache's step is built as the trainer builds it: after every "
        f"{RELEASE_EVERY} graph-less chunks it hands freed heap pages back to the system "
        "(glibc's `malloc_trim`, which bounds a CPU run's resident memory); the peers do not, "
        "and that cost is in dpr-cache's figures.",
    ]


def equal_chunks_lines(result: dict) -> list[str]:
    """Each engine's step at every chunk count all engines ran, and each ratio's pair over the
    same count: what was measured, before any fit."""
    engines = result["engines"]
    steps = {n: {pt["chunks"]: pt["step_s"] for pt in e["points"]} for n, e in engines.items()}
    counts = sorted(set.intersection(*(set(v) for v in steps.values()))) if steps else []
    pairs = [(r["engine"], r["peer"]) for r in result["ratios"]]
    rows = [
        [
            n,
            *(f"{steps[e][n]:.3f}" for e in engines),
            *(f"{steps[a][n] / steps[b][n]:.2f}" for a, b in pairs),
        ]
        for n in counts
    ]
    header = [
        "chunks a step",
        *(f"`{e}` s" for e in engines),
        *(f"`{a}` / `{b}`" for a, b in pairs),
    ]
    return [
        "Each engine's step (median seconds) at the same number of chunks a step, and each own "
        "engine's step over each peer's at that count:",
        "",
        *markdown_table(header, rows),
        *crossing_lines(result, counts),
    ]


def crossing_lines(result: dict, counts: list[int]) -> list[str]:
    """Where each pair's fitted lines cross, and whether that lies inside the measured counts."""
    lines = []
    for r in result["ratios"]:
        a, b = result["engines"][r["engine"]]["fit"], result["engines"][r["peer"]]["fit"]
        if a["b_s"] == b["b_s"]:
            continue
        cross = (b["a_s"] - a["a_s"]) / (a["b_s"] - b["b_s"])
        if cross <= 0:
            continue
        inside = counts and counts[0] <= cross <= counts[-1]
        where = "inside the counts measured" if inside else "outside the counts measured"
        lines.append(f"- `{r['engine']}` and `{r['peer']}`: near {cross:.0f} chunks, {where}")
    if not lines:
        return []
    return ["", "Where the fitted lines below cross (an extrapolation where outside):", "", *lines]


def fit_table(result: dict) -> list[str]:
    """Each engine's fitted line: the cost of a chunk, the fixed cost and the residuals."""
    rows = []
    for name, e in result["engines"].items():
        f = e["fit"]
        se = f" ± {_ms(f['b_stderr_s'])}" if f["b_stderr_s"] is not None else ""
        worst = f"{100 * f['max_relative_residual']:.1f}%"
        first, last = e["points"][0]["tokens"], e["points"][-1]["tokens"]
        tokens = f"{first:,} → {last:,} ({last / first:.2f})"
        rows.append(
            [
                f"`{name}`",
                f"**{_ms(f['b_s'])}**{se}",
                f"{f['a_s']:.3f}",
                _ms(f["residual_rms_s"]),
                worst,
                tokens,
            ]
        )
    header = [
        "engine",
        "cost of a chunk b (ms) ± its standard error",
        "fixed a (s)",
        "residual RMS (ms)",
        "largest residual",
        "tokens a step, fewest → most chunks",
    ]
    return markdown_table(header, rows)


def ratio_lines(result: dict) -> list[str]:
    """The own engines' cost of a chunk over each peer's, one line each."""
    return [f"- `{r['engine']}` / `{r['peer']}`: **{r['ratio']:.2f}**" for r in result["ratios"]]


def points_table(engine: dict) -> list[str]:
    """An engine's steps by chunk count: the chunking, what it encodes, measured and fitted."""
    rows = []
    for pt in engine["points"]:
        times = pt["times_s"]
        rows.append(
            [
                pt["question_chunks"],
                pt["chunk_rows"],
                pt["chunks"],
                pt["forwards"],
                f"{pt['tokens']:,}",
                f"{pt['step_s']:.3f}",
                f"{min(times):.3f} – {max(times):.3f}",
                f"{pt['fitted_s']:.3f}",
            ]
        )
    header = [
        "question chunks",
        "rows a chunk",
        "chunks a step",
        "encoder forwards",
        "tokens encoded",
        "step s (median)",
        "min – max",
        "fitted s",
    ]
    return markdown_table(header, rows)


def parts_table(result: dict) -> list[str]:
    """A chunk's parts, one column per engine profiled."""
    engines = {n: e for n, e in result["engines"].items() if e.get("parts")}
    rows = []
    for key, label, fmt, scale in PARTS:
        values = [e["parts"]["per_chunk"].get(key) for e in engines.values()]
        cells = ["n/a" if v is None else fmt.format(scale * v) for v in values]
        rows.append([label, *cells])
    rows.append(
        [
            "timed cost of a chunk b, unprofiled (ms)",
            *(_ms(e["fit"]["b_s"]) for e in engines.values()),
        ]
    )
    return markdown_table(["a chunk's", *(f"`{n}`" for n in engines)], rows)


def dearest_lines(name: str, parts: dict) -> list[str]:
    """An engine's dearest aten ops and modules (by count) and Python functions (by own time),
    per chunk."""
    ops = ", ".join(f"`{k}` {_count(v)}" for k, v in parts["aten_by_count"])
    modules = ", ".join(f"`{k}` {_count(v)}" for k, v in parts["modules_by_count"])
    functions = ", ".join(
        f"`{k}` {1e6 * v[1]:,.0f} us ({_count(v[0])} calls)"
        for k, v in parts["functions_by_own_time"]
    )
    return [
        f"**`{name}`**, a chunk: aten ops by count: {ops}.",
        "",
        f"Modules by count: {modules}.",
        "",
        f"Python functions by own time (under cProfile): {functions}.",
    ]


def parts_text(result: dict) -> list[str]:
    """The parts section: how they were measured, the table and the dearest lists."""
    engines = {n: e for n, e in result["engines"].items() if e.get("parts")}
    if not engines:
        return []
    spans = {tuple(e["parts"]["chunks"]) for e in engines.values()}
    span = " and ".join(f"{a} and {b} chunks" for a, b in sorted(spans))
    out = [
        "## A chunk's parts",
        "",
        f"One step of each engine profiled at {span} a step, the difference divided by the "
        "difference in chunks. `torch.profiler` (CPU ops, memory events) gives the ops, their own"
        " time, the autograd nodes and the allocations; a second step under cProfile with a "
        "global module hook gives the Python calls and the module forwards. The profiler "
        "slows every op, so the profiled wall time exceeds the timed cost of a chunk; the counts"
        " are exact. Host waits on the GPU are counted on CUDA only "
        "(`torch.cuda.set_sync_debug_mode`).",
        "",
        *parts_table(result),
    ]
    for name, e in engines.items():
        out += ["", *dearest_lines(name, e["parts"])]
    return out


def markdown(result: dict) -> str:
    """chunk_cost.md from ``chunk_cost.json``."""
    m = result["machine"]
    out = ["# The cost of a chunk, on the CPU", ""]
    if result["plan"].get("dry_run"):
        out += [
            "**A dry run** (`--dry-run`): a small model and two rounds check the code; its "
            "figures are no measurement of this machine.",
            "",
        ]
    out += [
        f"Machine: {cpu_text(m)}; torch {m['torch']} ({m['threads']} threads), {m['device']}. "
        f"{run_text(result)}",
        "",
        f"Command: `{result['command']}`",
        "",
        *setup_text(result),
        "",
        "## The step at equal chunk counts",
        "",
        *equal_chunks_lines(result),
        "",
        "## The cost of a chunk, fitted",
        "",
        "A least-squares line, step seconds = a + b x chunks a step, over each engine's medians:",
        "",
        *fit_table(result),
        "",
        *token_lines(result),
    ]
    if result["ratios"]:
        out += ["", "Ratios of the cost of a chunk:", "", *ratio_lines(result)]
    for skip in result.get("skipped") or []:
        out += ["", f"Not run: `{skip['engine']}`, {skip['why']}."]
    out += ["", "## Step seconds by chunk count"]
    for name, engine in result["engines"].items():
        out += ["", f"`{name}`:", "", *points_table(engine)]
    parts = parts_text(result)
    return "\n".join([*out, *([""] + parts if parts else []), ""])


def write_page(result: dict, folder: Path) -> Path:
    """Write :data:`PAGE` from ``result`` into ``folder``."""
    return write_text_atomic(Path(folder) / PAGE, markdown(result))
