"""``dpr-cache mine`` at NQ's size (58,880 training questions over 21M passages), projected from
rates measured here, each command in a fresh process measured by ``wait4``:

    python -m benchmarks.mine --work runs/mine-bench --out docs/bench   # resumable

Steps: ``small``, the real command end to end with a random BERT-base-shaped model over a small
corpus, at two question counts (each stage's seconds; a peak RSS that should not grow with the
questions); ``scan``, one part's exact search over 21M synthetic vectors streamed from disk (the
one stage that grows with the corpus); ``report``, ``OUT/mine.md``: the projection, with the
21M read rate of ``OUT/scale.json`` (``benchmarks.scale``'s eval). All data is synthetic.
"""

from __future__ import annotations

import json
import math
import shutil
from pathlib import Path

from benchmarks import nq_like
from benchmarks.harness import (
    cpu_text,
    load_average,
    markdown_table,
    matmul_gflops,
    run_steps,
    write_random_bert,
)
from benchmarks.scale import (
    DIM,
    GB,
    MEMORY_GB,
    N_FULL,
    SHARD_ROWS,
    TINY,
    cli,
    exact_search,
    measured,
)
from dpr_cache.runtime.atomic import write_text_atomic
from dpr_cache.runtime.memory import HEADROOM_GB

SMALL = {  # the small run's settings, saved with its figures
    "passages": 300 if TINY else 5_000,
    "dim": DIM,
    "layers": 2 if TINY else 12,  # BERT-base's depth: the question encoder's cost
    "part": 64 if TINY else 2_048,  # mine's default --batch
    "depth": 100,
    "negatives": 30,
    "contexts": 10 if TINY else 100,  # NQ's training records hold 100 contexts
    "memory_gb": MEMORY_GB,
}
QUESTIONS = (64, 256) if TINY else (2_048, 8_192)
INDEX_LENGTH = 64  # the passages' encoding is not part of mining; kept short


def _small_index(work: Path, model: Path) -> dict:
    """The small corpus indexed by ``model`` (not part of mine's figures)."""
    config = work / "small.yaml"
    data = f"{{passages: {work / 'passages.tsv'}, cache_dir: {work / 'cache'}}}"
    model_settings = f"{{pooling: cls, max_query_length: 32, max_passage_length: {INDEX_LENGTH}}}"
    text = f"output_dir: {work / 'small'}\nmodel: {model_settings}\ndata: {data}\n"
    write_text_atomic(config, text + f"index: {{memory_gb: {MEMORY_GB}}}\n")
    return measured(
        cli("index", "-q", config=config, model=model), work / "logs" / "index-small.txt"
    )


def _mine_run(work: Path, model: Path, n: int) -> dict:
    """``dpr-cache mine`` of ``n`` questions: its figures and its own summary's."""
    train, mined = work / f"train-{n}.json", work / f"mined-{n}.jsonl"
    nq_like.write_mine_train(train, n, work / "passages.tsv", SMALL["contexts"])
    inputs = {"model": model, "index": work / "small" / "index", "train": train, "out": mined}
    rules = {k: SMALL[k] for k in ("depth", "negatives", "memory_gb")}
    command = cli("mine", "-q", **inputs, **rules, batch=SMALL["part"], cache_dir=work / "cache")
    figures = measured(command, work / "logs" / f"mine-{n}.txt")
    summary = json.loads(mined.with_suffix(".summary.json").read_text())
    figures |= {"questions": n, "train_gb": round(train.stat().st_size / GB, 3)}
    figures["stages"] = summary["seconds_by_stage"]
    figures |= {k: summary[k] for k in ("negatives", "candidates", "dropped")}
    train.unlink()
    mined.unlink()
    return figures


def step_small(work: Path) -> dict:
    """``dpr-cache mine`` end to end over a small corpus, at two question counts."""
    if not (work / "passages.tsv").is_file():
        nq_like.write_passages_tsv(work / "passages.tsv", SMALL["passages"])
    model = work / "bert-base-random"
    if not model.is_dir():
        write_random_bert(model, hidden=DIM, layers=SMALL["layers"])
    out = {**SMALL, "index": _small_index(work, model), "load_average": load_average()}
    return out | {"runs": {str(n): _mine_run(work, model, n) for n in QUESTIONS}}


def step_scan(work: Path) -> dict:
    """One part's exact search at full size: a part's queries, top ``depth``, 21M vectors."""
    part, depth = SMALL["part"], SMALL["depth"]
    paths = nq_like.write_vectors(work / "vectors", N_FULL, DIM, SHARD_ROWS)
    queries = nq_like.write_queries(work / "part-queries.npy", part, DIM)
    before = round(matmul_gflops(part, DIM, seconds=1.0 if TINY else 20.0), 1)
    load = load_average()
    figures = exact_search(work, "21M", "part-*.npy", queries, part, depth)
    disk = round(sum(p.stat().st_size for p in paths) / GB, 2)
    shutil.rmtree(work / "flat-21M")
    shutil.rmtree(work / "vectors")  # 32 GB
    settings = {"queries": part, "k": depth, "memory_gb": MEMORY_GB, "disk_gb": disk}
    return figures | settings | {"matmul_gflops": before, "load_average": load}


STEPS = {"small": step_small, "scan": step_scan}


def main(argv: list[str] | None = None) -> None:
    description = __doc__.splitlines()[0]
    run_steps(argv, description, STEPS, Path("runs/mine-bench"), "mine.json", render)


# The page.


NQ_QUESTIONS = 58_880  # biencoder-nq-train.json
NQ_PASSAGES = 21_015_324  # psgs_w100.tsv
ID_TABLE_BYTES = 16  # a passage's id hash and row, the table that finds the positives
EVAL_QUESTIONS = 3_610  # the scale page's eval: NQ test's questions, top 100 each
EVAL_READ = "read passages, match answers, write retrieval.json"


def _read_rate(seconds: float, n: int, depth: int, evals: dict | None) -> tuple[float, str]:
    """Seconds a candidate read, and how: the slower of here and the 21M eval's reading."""
    here = seconds / (n * depth)
    there = evals["stages"][EVAL_READ] / (EVAL_QUESTIONS * 100) if evals else 0
    how = f"{NQ_QUESTIONS:,} x {depth} at {1e6 * max(here, there):.1f} us a candidate"
    if there <= here:
        return here, f"{how} (here)"
    return there, (
        f"{how} (the scale page's eval at 21M, slower than here; its stage also matched"
        " answers and wrote its file)"
    )


def _projected(stage: str, seconds: float, run: dict, small: dict, scan: dict, evals) -> tuple:
    """(seconds, how) of one of mine's stages for NQ's questions."""
    n, part, depth = run["questions"], small["part"], small["depth"]
    if stage == "load the model, index and passages":
        return seconds, "as measured (once)"
    if stage == "search":
        parts = math.ceil(NQ_QUESTIONS / part)
        last = NQ_QUESTIONS - (parts - 1) * part
        how = f"one part at 21M; the last, {last:,} questions, counted whole"
        return parts * scan["seconds"], f"{parts} parts x {scan['seconds']:.1f} s ({how})"
    if stage == "read the candidates":
        each, how = _read_rate(seconds, n, depth, evals)
        return NQ_QUESTIONS * depth * each, how
    if stage == "apply the rules":  # the synthetic answers never match: ~30 looked at
        each, looked = seconds / run["candidates"], run["candidates"] / n
        how = f"{1e6 * each:.1f} us a candidate, all {depth} a question looked at (here"
        return NQ_QUESTIONS * depth * each, (
            f"{how} {looked:.1f}: no synthetic passage held another's answer)"
        )
    return seconds / n * NQ_QUESTIONS, f"{seconds / n * 1e3:.2f} ms a question"


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
    """The projection's total in hours: the page's bound on mining NQ on this machine."""
    return sum(seconds for _, seconds, _ in projection(results, scale)) / 3600


def _load(step: dict) -> str:
    """The load average a step recorded before it ran (or, failing that, after)."""
    for key, when in (("load_average", "at the start"), ("load_average_after", "at the end")):
        if step.get(key):
            loads = " / ".join(f"{x:.2f}" for x in step[key])
            return f"Load average {when}: {loads} (1, 5, 15 min)"
    return "Load average: not recorded"


def render(results: dict, out: Path, source: Path | None = None) -> Path:
    """Write ``out/mine.md`` from what has been measured, with ``source/scale.json`` (default
    ``out``) for the 21M read rate and ``source/mine_notes.md`` appended, where they are."""
    source = out if source is None else source
    scale_path, notes = source / "scale.json", source / "mine_notes.md"
    scale = json.loads(scale_path.read_text()) if scale_path.is_file() else None
    lines = _mine_head(results) + _mine_small(results.get("small"))
    lines += _mine_scan(results) + _mine_projection(results, scale)
    text = "\n".join(lines) + "\n"
    if notes.is_file():
        text += "\n" + notes.read_text()
    write_text_atomic(out / "mine.md", text)
    return out / "mine.md"


def _mine_head(results: dict) -> list[str]:
    machines = results.get("machines", {})
    return [
        "# `dpr-cache mine` at NQ's size, projected from measured rates",
        "",
        "Written by `python -m benchmarks.mine --work runs/mine-bench --out docs/bench`"
        " (resumable; each command a fresh process measured by `wait4`). All data is"
        " **synthetic**, in NQ's structure: no NQ file can be downloaded here.",
        "",
        *(f"Machine ({step}): {cpu_text(m)}." for step, m in machines.items()),
    ]


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
    return [
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
        *markdown_table(header, rows),
    ]


def _mine_scan(results: dict) -> list[str]:
    small, scan = results.get("small"), results.get("scan")
    if not scan:
        return []
    return [
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


def _mine_projection(results: dict, scale: dict | None) -> list[str]:
    rows = projection(results, scale)
    if not rows:
        return []
    total = sum(s for _, s, _ in rows)
    runs = results["small"]["runs"].values()
    peaks = " and ".join(f"{r['peak_rss_gb']:.2f}" for r in runs)
    counts = " and ".join(f"{r['questions']:,}" for r in runs)
    table = markdown_table(
        ["stage", "projected s", "from"], [[a, f"{s:,.0f}", b] for a, s, b in rows]
    )
    return [
        "",
        f"## Projected: {NQ_QUESTIONS:,} questions over {NQ_PASSAGES:,} passages",
        "",
        "The stages that grow with the questions are scaled from the larger run"
        " above, the search from one part measured at full size; where NQ would cost"
        " more than the synthetic data, the dearer case is taken, so the total is an"
        " upper bound.",
        "",
        *table,
        f"| **total** | **{total:,.0f}** ({total / 3600:.1f} h) | |",
        "",
        "Peak memory: `--memory-gb` bounds the whole process (the search plans its"
        " blocks in what the process does not already hold), so at NQ's size the peak"
        f" stays within the budget (unset, {HEADROOM_GB:g} GB over what the process holds"
        " at its first search). What mine itself holds does not"
        f" grow with the questions: {peaks} GB at {counts} questions here, in parts of"
        f" {results['small']['part']:,}; at 21M the id table that finds the positives"
        f" adds at most {NQ_PASSAGES * ID_TABLE_BYTES / 1e9:.2f} GB of mapped pages"
        f" ({ID_TABLE_BYTES} bytes a passage; its first build holds about as much"
        " again for the hashes and their order). The 21M scan above ran in"
        f" {results['scan']['peak_rss_gb']:.2f} GB under `--memory-gb"
        f" {results['scan']['memory_gb']}`, with less room for its blocks than mine"
        " has under the default.",
    ]


if __name__ == "__main__":
    main()
