"""``dpr-cache mine`` at NQ's size (58,880 questions over 21M passages), projected from rates
measured here, each command in a fresh process measured by ``wait4``::

    python -m benchmarks.mine --work runs/mine-bench --out docs/bench   # resumable

Steps: ``small``, the command end to end over a small corpus at two question counts; ``scan``,
one part's exact search over 21M synthetic vectors; ``report``, ``OUT/mine.md``: the projection,
with ``OUT/scale.json``'s 21M read rate.
"""

from __future__ import annotations

import json
import math
import shutil
from pathlib import Path

from benchmarks import harness, nq_like
from benchmarks.harness import DIM, GB, MEMORY_GB, N_FULL, NQ_PASSAGES, SCALE_TINY, SHARD_ROWS
from dpr_cache.runtime.atomic import write_text_atomic
from dpr_cache.runtime.memory import HEADROOM_GB

SMALL = {  # the small run's settings, saved with its figures
    "passages": 300 if SCALE_TINY else 5_000,
    "dim": DIM,
    "layers": 2 if SCALE_TINY else 12,  # BERT-base's depth: the question encoder's cost
    "part": 64 if SCALE_TINY else 2_048,  # mine's default --batch
    "depth": 100,
    "negatives": 30,
    "contexts": 10 if SCALE_TINY else 100,  # NQ's training records hold 100 contexts
    "memory_gb": MEMORY_GB,
}
QUESTIONS = (64, 256) if SCALE_TINY else (2_048, 8_192)
INDEX_LENGTH = 64  # the passages' encoding is not part of mining; kept short
NQ_QUESTIONS = 58_880  # biencoder-nq-train.json
ID_TABLE_BYTES = 16  # a passage's id hash and row, the table that finds the positives
EVAL_QUESTIONS = 3_610  # the scale page's eval: NQ test's questions, top 100 each
EVAL_READ = "read passages, match answers, write retrieval.json"


def _mine_run(work: Path, model: Path, n: int) -> dict:
    """``dpr-cache mine`` of ``n`` questions: its figures and its own summary's."""
    train, mined = work / f"train-{n}.json", work / f"mined-{n}.jsonl"
    nq_like.write_mine_train(train, n, work / "passages.tsv", SMALL["contexts"])
    inputs = {"model": model, "index": work / "small" / "index", "train": train, "out": mined}
    rules = {k: SMALL[k] for k in ("depth", "negatives", "memory_gb")}
    rules |= {"batch": SMALL["part"], "cache_dir": work / "cache"}
    figures = harness.run_cli(work, f"mine-{n}", "mine", "-q", **inputs, **rules)
    summary = json.loads(mined.with_suffix(".summary.json").read_text())
    figures |= {"questions": n, "train_gb": round(train.stat().st_size / GB, 3)}
    figures["stages"] = summary["seconds_by_stage"]
    figures |= {k: summary[k] for k in ("negatives", "candidates", "dropped")}
    train.unlink()
    mined.unlink()
    return figures


SMALL_CONFIG = """output_dir: {work}/small
model: {{pooling: cls, max_query_length: 32, max_passage_length: {length}}}
data: {{passages: {work}/passages.tsv, cache_dir: {work}/cache}}
index: {{memory_gb: {memory_gb}}}
"""


def step_small(work: Path) -> dict:
    if not (work / "passages.tsv").is_file():
        nq_like.write_passages_tsv(work / "passages.tsv", SMALL["passages"])
    model, config = work / "bert-base-random", work / "small.yaml"
    if not model.is_dir():
        harness.write_random_bert(model, hidden=DIM, layers=SMALL["layers"])
    write_text_atomic(
        config, SMALL_CONFIG.format(work=work, length=INDEX_LENGTH, memory_gb=MEMORY_GB)
    )
    index = harness.run_cli(work, "index-small", "index", "-q", config=config, model=model)
    out = {**SMALL, "index": index, "load_average": harness.load_average()}
    return out | {"runs": {str(n): _mine_run(work, model, n) for n in QUESTIONS}}


def step_scan(work: Path) -> dict:
    part, depth = SMALL["part"], SMALL["depth"]
    paths = nq_like.write_vectors(work / "vectors", N_FULL, DIM, SHARD_ROWS)
    queries = nq_like.write_queries(work / "part-queries.npy", part, DIM)

    def before_search() -> dict:
        rate = harness.matmul_gflops(part, DIM, seconds=1.0 if SCALE_TINY else 20.0)
        return {"matmul_gflops": round(rate, 1), "load_average": harness.load_average()}

    figures = harness.exact_search(work, "21M", "part-*.npy", queries, part, depth, before_search)
    disk = round(sum(p.stat().st_size for p in paths) / GB, 2)
    shutil.rmtree(work / "flat-21M")
    shutil.rmtree(work / "vectors")  # 32 GB
    return figures | {"queries": part, "k": depth, "memory_gb": MEMORY_GB, "disk_gb": disk}


def main(argv: list[str] | None = None) -> None:
    steps, work = {"small": step_small, "scan": step_scan}, Path("runs/mine-bench")
    harness.run_steps(argv, __doc__.splitlines()[0], steps, work, "mine.json", render)


def _projected(stage: str, seconds: float, run: dict, small: dict, scan: dict, evals) -> tuple:
    n, part, depth = run["questions"], small["part"], small["depth"]
    if stage == "load the model, index and passages":
        return seconds, "as measured (once)"
    if stage == "search":
        parts = math.ceil(NQ_QUESTIONS / part)
        last = NQ_QUESTIONS - (parts - 1) * part
        how = f"one part at 21M; the last, {last:,} questions, counted whole"
        return parts * scan["seconds"], f"{parts} parts x {scan['seconds']:.1f} s ({how})"
    if stage == "read the candidates":  # the slower of here and the 21M eval's reading
        here = seconds / (n * depth)
        there = evals["stages"][EVAL_READ] / (EVAL_QUESTIONS * 100) if evals else 0
        how = f"{NQ_QUESTIONS:,} x {depth} at {1e6 * max(here, there):.1f} us a candidate"
        why = "slower than here; its stage also matched answers and wrote its file"
        how += " (here)" if there <= here else f" (the scale page's eval at 21M, {why})"
        return NQ_QUESTIONS * depth * max(here, there), how
    if stage == "apply the rules":  # the synthetic answers never match: ~30 looked at
        each, looked = seconds / run["candidates"], run["candidates"] / n
        how = f"{1e6 * each:.1f} us a candidate, all {depth} a question looked at (here"
        how += f" {looked:.1f}: no synthetic passage held another's answer)"
        return NQ_QUESTIONS * depth * each, how
    return seconds / n * NQ_QUESTIONS, f"{seconds / n * 1e3:.2f} ms a question"


def projection(results: dict, scale: dict | None) -> list[tuple[str, float, str]] | None:
    """(stage, seconds, how) for NQ's questions over 21M passages: the larger run's seconds a
    question, one part's search at 21M times the parts, the slower of the two read rates (here,
    ``scale``'s eval at 21M); where NQ costs more than the synthetic data, the dearer case."""
    if "small" not in results or "scan" not in results:
        return None
    small, scan = results["small"], results["scan"]
    run = max(small["runs"].values(), key=lambda r: r["questions"])
    evals = scale.get("eval") if scale else None
    out = []
    for stage, seconds in run["stages"].items():
        out.append((stage, *_projected(stage, seconds, run, small, scan, evals)))
        if stage == "find the positives" and evals:  # built once per passages file
            how = "the scale page's eval at 21M: the same table built, "
            how += f"{EVAL_QUESTIONS * 100:,} ids looked up"
            table = evals["stages"]["map hits to passages"]
            out.append(("find the positives: the id table, once", table, how))
    return out


def projected_hours(results: dict, scale: dict | None) -> float:
    """The projection's total in hours: the page's bound on mining NQ."""
    return sum(seconds for _, seconds, _ in projection(results, scale)) / 3600


def _load(step: dict) -> str:
    """The load average a step recorded before it ran (earlier runs: after)."""
    when = "at the start" if step.get("load_average") else "at the end"
    loads = " / ".join(f"{x:.2f}" for x in step.get("load_average") or step["load_average_after"])
    return f"Load average {when}: {loads} (1, 5, 15 min)"


def render(results: dict, out: Path, source: Path | None = None) -> Path:
    """``out/mine.md``, with ``source/scale.json`` (default ``out``) for the 21M read rate."""
    scale_path = (out if source is None else source) / "scale.json"
    scale = json.loads(scale_path.read_text()) if scale_path.is_file() else None
    machines = results.get("machines", {}).items()
    return harness.write_page(
        out / "mine.md",
        "`dpr-cache mine` at NQ's size, projected from measured rates",
        "Written by `python -m benchmarks.mine --work runs/mine-bench --out docs/bench` (resumable;"
        " each command a fresh process measured by `wait4`). All data is **synthetic**, in NQ's"
        " structure: no NQ file can be downloaded here.",
        [
            *(f"Machine ({step}): {harness.cpu_text(m)}." for step, m in machines),
            *_mine_small(results.get("small")),
            *_mine_scan(results),
            *_mine_projection(results, scale),
        ],
    )


def _mine_small(small: dict | None) -> list[str]:
    if not small:
        return []
    runs = list(small["runs"].values())
    stages = list(runs[-1]["stages"])
    header = ["questions", "training file GB", "wall s", "peak RSS GB", *stages]
    rows = [
        [f"{r['questions']:,}", r["train_gb"], r["seconds"], r["peak_rss_gb"]]
        + [r["stages"].get(s, "-") for s in stages]
        for r in runs
    ]
    return harness.blocks(
        "## Measured: the whole command over a small corpus",
        f"A random BERT ({small['layers']} layers, {small['dim']}-d, CLS pooling) indexed"
        f" {small['passages']:,} passages (`dpr-cache index`, not in the figures); `dpr-cache mine"
        f" --depth {small['depth']} --negatives {small['negatives']} --batch {small['part']}"
        f" --memory-gb {small['memory_gb']}` over training files in NQ's structure"
        f" ({small['contexts']} contexts a question). {_load(small)}.",
        harness.markdown_table(header, rows),
    )


def _mine_scan(results: dict) -> list[str]:
    small, scan = results.get("small"), results.get("scan")
    if not scan:
        return []
    return harness.blocks(
        "## Measured: one part's search at 21M",
        f"Exact top-{scan['k']} of {scan['queries']:,} queries over {scan['rows']:,} synthetic"
        f" {small['dim'] if small else 768}-d float16 vectors ({scan['disk_gb']} GB, streamed"
        f" from disk), `--memory-gb {scan['memory_gb']}`: {scan['seconds']} s, peak RSS"
        f" {scan['peak_rss_gb']} GB, {scan['gflops']} GFLOP/s (plain float32 matmul here:"
        f" {scan['matmul_gflops']}). {_load(scan)}.",
    )


def _mine_projection(results: dict, scale: dict | None) -> list[str]:
    rows = projection(results, scale)
    if not rows:
        return []
    total = sum(s for _, s, _ in rows)
    runs, scan = results["small"]["runs"].values(), results["scan"]
    peaks = " and ".join(f"{r['peak_rss_gb']:.2f}" for r in runs)
    counts = " and ".join(f"{r['questions']:,}" for r in runs)
    table = [[a, f"{s:,.0f}", b] for a, s, b in rows]
    total_row = f"| **total** | **{total:,.0f}** ({total / 3600:.1f} h) | |"
    return harness.blocks(
        f"## Projected: {NQ_QUESTIONS:,} questions over {NQ_PASSAGES:,} passages",
        "Per-question stages scaled from the larger run, the search from one part at 21M; where NQ"
        " would cost more than the synthetic data, the dearer case: the total is an upper bound.",
        [*harness.markdown_table(["stage", "projected s", "from"], table), total_row],
        f"Peak memory: `--memory-gb` bounds the whole process (unset, {HEADROOM_GB:g} GB over what"
        f" it holds at its first search). It does not grow with the questions: {peaks} GB at"
        f" {counts} questions here, in parts of {results['small']['part']:,}; at 21M the id table"
        f" adds at most {NQ_PASSAGES * ID_TABLE_BYTES / 1e9:.2f} GB of mapped pages"
        f" ({ID_TABLE_BYTES} bytes a passage; as much again while built). The 21M scan above ran"
        f" in {scan['peak_rss_gb']:.2f} GB under `--memory-gb {scan['memory_gb']}`.",
    )


if __name__ == "__main__":
    main()
