"""``dpr-cache mine`` at NQ's size (58,880 training questions over 21M passages), projected from
rates measured here, each command in a fresh process measured by ``wait4``:

    python -m benchmarks.mine --work runs/mine-bench --out docs/bench   # resumable

- ``small``: the real command, end to end, with a random model of BERT-base's shape (12 layers,
  768-d), over 5,000 passages it indexed, for 2,048 and 8,192 questions in NQ's structure (a
  positive among the passages, 100 contexts a question), in parts of 2,048: each stage's seconds
  (the command's own summary) and the peak RSS, which should not grow with the questions.
- ``scan``: the one stage that grows with the corpus, measured at full size: one part's exact
  search (2,048 queries, top 100) over 21,015,324 synthetic 768-d float16 vectors streamed from
  disk, ``--memory-gb 2``.
- ``report``: ``OUT/mine.md``, the projection: the per-question stages times 58,880, the search
  times the 29 parts, reading the candidates at the slower of the rate here and the 21M rate of
  ``OUT/scale.json`` (``benchmarks.scale``'s eval).

All data is synthetic: no NQ file can be downloaded here.
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
    option_args,
    run_steps,
    write_random_bert,
)
from benchmarks.scale_common import (
    DIM,
    GB,
    MEMORY_GB,
    N_FULL,
    SHARD_ROWS,
    TINY,
    cli,
    measured,
    search_cli,
)
from dpr_cache.runtime.atomic import write_text_atomic
from dpr_cache.runtime.memory import HEADROOM_GB

PASSAGES = 300 if TINY else 5_000
LAYERS = 2 if TINY else 12  # BERT-base's depth: the question encoder's cost
QUESTIONS = (64, 256) if TINY else (2_048, 8_192)
PART = 64 if TINY else 2_048  # mine's default --batch
CONTEXTS = 10 if TINY else 100  # NQ's training records hold 100 contexts
DEPTH, NEGATIVES = 100, 30
INDEX_LENGTH = 64  # the passages' encoding is not part of mining; kept short


def _small_config(work: Path) -> Path:
    config = work / "small.yaml"
    write_text_atomic(
        config,
        "\n".join(
            [
                f"output_dir: {work / 'small'}",
                "model: {pooling: cls, max_query_length: 32, "
                f"max_passage_length: {INDEX_LENGTH}}}",
                f"data: {{passages: {work / 'passages.tsv'}, cache_dir: {work / 'cache'}}}",
                f"index: {{memory_gb: {MEMORY_GB}}}",
            ]
        )
        + "\n",
    )
    return config


def step_small(work: Path) -> dict:
    """``dpr-cache mine`` end to end over a small corpus, at two question counts."""
    tsv = work / "passages.tsv"
    if not tsv.is_file():
        nq_like.write_passages_tsv(tsv, PASSAGES)
    model = work / "bert-base-random"
    if not model.is_dir():
        write_random_bert(model, hidden=DIM, layers=LAYERS)
    index = measured(
        cli("index", "-c", str(_small_config(work)), "--model", str(model), "-q"),
        work / "logs" / "index-small.txt",
    )
    out = {
        "passages": PASSAGES,
        "dim": DIM,
        "layers": LAYERS,
        "part": PART,
        "depth": DEPTH,
        "negatives": NEGATIVES,
        "contexts": CONTEXTS,
        "memory_gb": MEMORY_GB,
        "index": index,
        "load_average": load_average(),
        "runs": {},
    }
    for n in QUESTIONS:
        train, mined = work / f"train-{n}.json", work / f"mined-{n}.jsonl"
        nq_like.write_mine_train(train, n, tsv, CONTEXTS)
        options = {"--model": model, "--index": work / "small" / "index", "--train": train}
        options |= {"--out": mined, "--depth": DEPTH, "--negatives": NEGATIVES, "--batch": PART}
        options |= {"--memory-gb": MEMORY_GB, "--cache-dir": work / "cache"}
        figures = measured(
            cli("mine", *option_args(options), "-q"), work / "logs" / f"mine-{n}.txt"
        )
        summary = json.loads(mined.with_suffix(".summary.json").read_text())
        figures.update(
            questions=n,
            train_gb=round(train.stat().st_size / GB, 3),
            stages=summary["seconds_by_stage"],
            negatives=summary["negatives"],
            candidates=summary["candidates"],
            dropped=summary["dropped"],
        )
        out["runs"][str(n)] = figures
        train.unlink()
        mined.unlink()
    return out


def step_scan(work: Path) -> dict:
    """One part's exact search at full size: PART queries, top DEPTH, 21M streamed vectors."""
    vectors, index = work / "vectors", work / "flat-21M"
    if not (vectors / "done").is_file():
        paths = nq_like.write_vectors(vectors, N_FULL, DIM, SHARD_ROWS)
        (vectors / "done").write_text(str(len(paths)))
    queries = nq_like.write_queries(work / "part-queries.npy", PART, DIM)
    measured(
        cli("index", "--embeddings", str(vectors / "part-*.npy"), "--out", str(index)),
        work / "logs" / "index-21M.txt",
    )
    rows = json.loads((index / "meta.json").read_text())["rows"]
    disk = sum(p.stat().st_size for p in vectors.glob("part-*.npy"))
    before = matmul_gflops(PART, DIM, seconds=1.0 if TINY else 20.0)
    load = load_average()
    figures = measured(
        search_cli(index, queries, DEPTH, work / "part-21M.trec", MEMORY_GB),
        work / "logs" / "search-21M.txt",
    )
    figures.update(
        rows=rows,
        queries=PART,
        k=DEPTH,
        memory_gb=MEMORY_GB,
        disk_gb=round(disk / GB, 2),
        gflops=round(2 * PART * rows * DIM / figures["seconds"] / 1e9, 1),
        matmul_gflops=round(before, 1),
        load_average=load,
    )
    shutil.rmtree(index)
    shutil.rmtree(vectors)  # 32 GB
    return figures


STEPS = {"small": step_small, "scan": step_scan}


def main(argv: list[str] | None = None) -> None:
    description = __doc__.splitlines()[0]
    run_steps(argv, description, STEPS, Path("runs/mine-bench"), "mine.json", render)


# The page.


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


def projected_hours(results: dict, scale: dict | None) -> float:
    """The projection's total in hours: the page's bound on mining NQ on this machine."""
    return sum(seconds for _, seconds, _ in projection(results, scale)) / 3600


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


def render(results: dict, out: Path, source: Path | None = None) -> Path:
    """Write ``out/mine.md`` from what has been measured, with ``source/scale.json`` (default
    ``out``) for the 21M read rate and ``source/mine_notes.md`` appended, where they are."""
    source = out if source is None else source
    scale_path = source / "scale.json"
    scale = json.loads(scale_path.read_text()) if scale_path.is_file() else None
    lines = _mine_head(results) + _mine_small(results) + _mine_scan(results)
    lines += _mine_projection(results, scale)
    notes = source / "mine_notes.md"
    text = "\n".join(lines) + "\n"
    if notes.is_file():
        text += "\n" + notes.read_text()
    write_text_atomic(out / "mine.md", text)
    return out / "mine.md"


def _mine_head(results: dict) -> list[str]:
    machines = results.get("machines", {})
    lines = [
        "# `dpr-cache mine` at NQ's size, projected from measured rates",
        "",
        "Written by `python -m benchmarks.mine --work runs/mine-bench --out docs/bench`"
        " (resumable; each command a fresh process measured by `wait4`). All data is"
        " **synthetic**, in NQ's structure: no NQ file can be downloaded here.",
        "",
    ]
    return lines + [f"Machine ({step}): {cpu_text(m)}." for step, m in machines.items()]


def _mine_small(results: dict) -> list[str]:
    small = results.get("small")
    if not small:
        return []
    lines = [
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
    return lines


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
    lines = [
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
    return lines


if __name__ == "__main__":
    main()
