"""``mine.json`` as a page: ``mine.md``, the measured runs and the projection to NQ's size."""

from __future__ import annotations

import json
import math
from pathlib import Path

from benchmarks.machine import cpu_text
from benchmarks.scale_report import markdown_table
from dpr_cache.runtime.atomic import write_text_atomic
from dpr_cache.runtime.memory import HEADROOM_GB

__all__ = ["projection", "write_report"]

NQ_QUESTIONS = 58_880  # biencoder-nq-train.json
NQ_PASSAGES = 21_015_324  # psgs_w100.tsv
ID_TABLE_BYTES = 16  # a passage's id hash and row, the table that finds the positives
LOAD = "load the model, index and passages"
SEARCH = "search"
READ = "read the candidates"
FIND = "find the positives"
RULES = "apply the rules"
EVAL_QUESTIONS = 3_610  # the scale page's eval: NQ test's questions, top 100 each
EVAL_READ = "read passages, match answers, write retrieval.json"
EVAL_MAP = "map hits to passages"


def projection(results: dict, scale: dict | None) -> list[tuple[str, float, str]] | None:
    """(stage, seconds, how) for NQ's 58,880 questions over 21M passages, from the larger small
    run's per-question seconds, the measured search of one part at 21M times the parts, and the
    candidates read at the slower of the two measured rates (here; at 21M in ``scale``). Where
    NQ would cost more than the synthetic data (the rules looking at every candidate, not the
    first 30), the projection takes the dearer case: the total is an upper bound."""
    if "small" not in results or "scan" not in results:
        return None
    small, scan = results["small"], results["scan"]
    run = max(small["runs"].values(), key=lambda r: r["questions"])
    n, part, depth = run["questions"], small["part"], small["depth"]
    parts = math.ceil(NQ_QUESTIONS / part)
    evals = scale.get("eval") if scale else None
    out = []
    for stage, seconds in run["stages"].items():
        if stage == LOAD:
            out.append((stage, seconds, "as measured (once)"))
        elif stage == SEARCH:
            last = NQ_QUESTIONS - (parts - 1) * part
            out.append(
                (
                    stage,
                    parts * scan["seconds"],
                    f"{parts} parts x {scan['seconds']:.1f} s (one part at 21M; the last,"
                    f" {last:,} questions, counted whole)",
                )
            )
        elif stage == READ:
            here = seconds / (n * depth)
            how = f"{NQ_QUESTIONS:,} x {depth} at {1e6 * here:.1f} us a candidate (here)"
            if evals:  # the 21M eval read its hits from a 21M Arrow cache
                there = evals["stages"][EVAL_READ] / (EVAL_QUESTIONS * 100)
                if there > here:
                    here = there
                    how = (
                        f"{NQ_QUESTIONS:,} x {depth} at {1e6 * there:.1f} us a candidate"
                        " (the scale page's eval at 21M, slower than here; its stage also"
                        " matched answers and wrote its file)"
                    )
            out.append((stage, NQ_QUESTIONS * depth * here, how))
        elif stage == RULES:
            looked = run["candidates"] / n  # the synthetic answers never match: ~30 looked at
            each = seconds / run["candidates"]
            how = (
                f"{1e6 * each:.1f} us a candidate, all {depth} a question looked at (here"
                f" {looked:.1f}: no synthetic passage held another's answer)"
            )
            out.append((stage, NQ_QUESTIONS * depth * each, how))
        else:
            each = seconds / n
            out.append((stage, each * NQ_QUESTIONS, f"{each * 1e3:.2f} ms a question"))
        if stage == FIND and evals:  # built once per passages file
            how = (
                f"the scale page's eval at 21M: the same table built, "
                f"{EVAL_QUESTIONS * 100:,} ids looked up"
            )
            out.append((f"{FIND}: the id table, once", evals["stages"][EVAL_MAP], how))
    return out


def _load(step: dict) -> str:
    """The load average a step recorded before it ran (or, failing that, after)."""
    for key, when in (("load_average", "at the start"), ("load_average_after", "at the end")):
        if step.get(key):
            return (
                f"Load average {when}: "
                + " / ".join(f"{x:.2f}" for x in step[key])
                + " (1, 5, 15 min)"
            )
    return "Load average: not recorded"


def _listed(results: dict) -> str:
    runs = results["small"]["runs"].values()
    peaks = " and ".join(f"{r['peak_rss_gb']:.2f}" for r in runs)
    counts = " and ".join(f"{r['questions']:,}" for r in runs)
    return f"{peaks} GB at {counts} questions"


def write_report(results: dict, out: Path, source: Path | None = None) -> Path:
    """Write ``out/mine.md`` from what has been measured, with ``source/scale.json`` (default
    ``out``) for the 21M read rate and ``source/mine_notes.md`` appended, where they are."""
    source = out if source is None else source
    scale_path = source / "scale.json"
    scale = json.loads(scale_path.read_text()) if scale_path.is_file() else None
    machines = results.get("machines", {})
    lines = [
        "# `dpr-cache mine` at NQ's size, projected from measured rates",
        "",
        "Written by `python -m benchmarks.mine --work runs/mine-bench --out docs/bench`"
        " (resumable; each command a fresh process measured by `wait4`). All data is"
        " **synthetic**, in NQ's structure: no NQ file can be downloaded here.",
        "",
    ]
    lines += [f"Machine ({step}): {cpu_text(m)}." for step, m in machines.items()]
    small = results.get("small")
    if small:
        lines += [
            "",
            "## Measured: the whole command over a small corpus",
            "",
            f"A random BERT ({small['layers']} layers, {small['dim']}-d, CLS pooling;"
            f" BERT-base has 12 and 768) indexed {small['passages']:,} passages"
            " (`dpr-cache index`, not part of the figures); `dpr-cache mine"
            f" --depth {small['depth']} --negatives {small['negatives']} --batch"
            f" {small['part']} --memory-gb {small['memory_gb']}` over training files in"
            f" NQ's structure ({small['contexts']} contexts a question, the positive among"
            f" the passages). {_load(small)}.",
            "",
        ]
        runs = list(small["runs"].values())
        stages = list(runs[-1]["stages"])
        lines += markdown_table(
            ["questions", "training file GB", "wall s", "peak RSS GB", *stages],
            [
                [
                    f"{r['questions']:,}",
                    r["train_gb"],
                    r["seconds"],
                    r["peak_rss_gb"],
                    *(r["stages"].get(s, "-") for s in stages),
                ]
                for r in runs
            ],
        )
    scan = results.get("scan")
    if scan:
        lines += [
            "",
            "## Measured: one part's search at 21M",
            "",
            f"Exact top-{scan['k']} of {scan['queries']:,} queries over"
            f" {scan['rows']:,} synthetic {small['dim'] if small else 768}-d float16"
            f" vectors ({scan['disk_gb']} GB, streamed from disk), `--memory-gb"
            f" {scan['memory_gb']}`: {scan['seconds']} s, peak RSS {scan['peak_rss_gb']}"
            f" GB, {scan['gflops']} GFLOP/s (plain float32 matmul here:"
            f" {scan['matmul_gflops']}). {_load(scan)}.",
        ]
    rows = projection(results, scale)
    if rows:
        total = sum(s for _, s, _ in rows)
        lines += [
            "",
            f"## Projected: {NQ_QUESTIONS:,} questions over {NQ_PASSAGES:,} passages",
            "",
            "The stages that grow with the questions are scaled from the larger run"
            " above, the search from one part measured at full size; where NQ would cost"
            " more than the synthetic data, the dearer case is taken, so the total is an"
            " upper bound.",
            "",
        ]
        lines += markdown_table(
            ["stage", "projected s", "from"], [[stage, f"{s:,.0f}", how] for stage, s, how in rows]
        )
        lines += [
            f"| **total** | **{total:,.0f}** ({total / 3600:.1f} h) | |",
            "",
            "Peak memory: `--memory-gb` bounds the whole process (the search plans its"
            " blocks in what the process does not already hold), so at NQ's size the peak"
            f" stays within the budget (unset, {HEADROOM_GB:g} GB over what the process holds"
            " at its first search). What mine itself holds does not"
            f" grow with the questions: {_listed(results)} here, in parts of"
            f" {results['small']['part']:,}; at 21M the id table that finds the positives"
            f" adds at most {NQ_PASSAGES * ID_TABLE_BYTES / 1e9:.2f} GB of mapped pages"
            f" ({ID_TABLE_BYTES} bytes a passage; its first build holds about as much"
            " again for the hashes and their order). The 21M scan above ran in"
            f" {results['scan']['peak_rss_gb']:.2f} GB under `--memory-gb"
            f" {results['scan']['memory_gb']}`, with less room for its blocks than mine"
            " has under the default.",
        ]
    notes = source / "mine_notes.md"
    text = "\n".join(lines) + "\n"
    if notes.is_file():
        text += "\n" + notes.read_text()
    write_text_atomic(out / "mine.md", text)
    return out / "mine.md"
