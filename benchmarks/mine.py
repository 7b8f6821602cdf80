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

import argparse
import json
import shutil
from pathlib import Path

from benchmarks import nq_like
from benchmarks.machine import cpu_info, load_average, matmul_gflops
from benchmarks.scale_common import DIM, GB, MEMORY_GB, N_FULL, SHARD_ROWS, TINY, cli, measured
from dpr_cache.runtime.atomic import write_json_atomic, write_text_atomic

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
        nq_like.write_random_bert(model, hidden=DIM, layers=LAYERS)
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
        figures = measured(
            cli(
                "mine",
                "--model",
                str(model),
                "--index",
                str(work / "small" / "index"),
                "--train",
                str(train),
                "--out",
                str(mined),
                "--depth",
                str(DEPTH),
                "--negatives",
                str(NEGATIVES),
                "--batch",
                str(PART),
                "--memory-gb",
                str(MEMORY_GB),
                "--cache-dir",
                str(work / "cache"),
                "-q",
            ),
            work / "logs" / f"mine-{n}.txt",
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
        cli(
            "search",
            "--index",
            str(index),
            "--query-embeddings",
            str(queries),
            "--k",
            str(DEPTH),
            "--memory-gb",
            str(MEMORY_GB),
            "--out",
            str(work / "part-21M.trec"),
        ),
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
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--work", type=Path, default=Path("runs/mine-bench"))
    parser.add_argument("--out", type=Path, default=Path("docs/bench"))
    parser.add_argument("--steps", nargs="*", default=[*STEPS, "report"])
    parser.add_argument("--redo", nargs="*", default=[])
    args = parser.parse_args(argv)
    args.work.mkdir(parents=True, exist_ok=True)
    args.out.mkdir(parents=True, exist_ok=True)
    path = args.out / "mine.json"
    results = json.loads(path.read_text()) if path.is_file() else {"machines": {}}
    for step in args.steps:
        if step == "report":
            from benchmarks.mine_report import write_report

            print(write_report(results, args.out))
            continue
        if step in results and step not in args.redo:
            print(f"{step}: done, skipped", flush=True)
            continue
        print(f"{step}: running", flush=True)
        results[step] = STEPS[step](args.work)
        results["machines"][step] = cpu_info()  # steps may run in different sessions
        write_json_atomic(path, results)
        print(f"{step}: {json.dumps(results[step])}", flush=True)


if __name__ == "__main__":
    main()
