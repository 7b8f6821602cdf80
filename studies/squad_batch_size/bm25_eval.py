"""BM25 on the dev questions, written like a `dpr-cache eval` run so the same checks apply.

Uses the BM25 that mines the hard negatives (dpr_cache.retrieval.lexical: bm25s, Lucene,
k1=0.9, b=0.4, title + text) over ``data.passages``, answers matched by DPR's rule
(``eval.match``). Writes
``OUT/eval/{retrieval.json,metrics.json,config.yaml}`` and ``OUT/run.json``.

    .venv/bin/python -m studies.squad_batch_size.bm25_eval -c configs/squad_reproduce.yaml \
        --out runs/reproduce/bm25
"""

from __future__ import annotations

import argparse
import json
import time
from pathlib import Path

from dpr_cache.config import load_config, save_config
from dpr_cache.data.answers import has_answer
from dpr_cache.data.passages import load_passages, passage_columns
from dpr_cache.data.qas import read_qas
from dpr_cache.retrieval.lexical import Bm25Index
from dpr_cache.retrieval.metrics import answer_qrels, ranking_metrics
from dpr_cache.retrieval.results import (
    CONFIG_FILE,
    METRICS_FILE,
    RETRIEVAL_FILE,
    format_metrics_table,
    rounded,
)
from dpr_cache.runtime.atomic import write_json_atomic, write_text_atomic


def bm25_eval(config_path: Path, out: Path, overrides: list[str]) -> dict:
    """Search every dev question with BM25; write the eval files; return the metrics."""
    config = load_config(config_path, [*overrides, f"output_dir={out}"])
    start = time.perf_counter()
    passages = Path(config.data.passages)
    index = Bm25Index.open(passages, config.cache_path)
    dataset = load_passages(passages, config.cache_path)
    qas = read_qas(Path(config.data.dev_qa))
    k_max = max(config.eval.top_k)
    ranked = index.search([q for q, _ in qas], k_max)
    found_rows = sorted({int(r) for rows, _ in ranked for r in rows})
    found = passage_columns(dataset, found_rows)
    where = {row: i for i, row in enumerate(found_rows)}
    entries = []
    for (question, answers), (rows, scores) in zip(qas, ranked, strict=True):
        ctxs = []
        for r, s in zip(rows.tolist(), scores.tolist(), strict=True):
            text = found["text"][where[r]]
            ctxs.append(
                {
                    "id": found["id"][where[r]],
                    "title": found["title"][where[r]],
                    "text": text,
                    "score": float(s),
                    "has_answer": has_answer(answers, text, config.eval.match),
                }
            )
        entries.append({"question": question, "answers": answers, "ctxs": ctxs})
    eval_dir = out / "eval"
    write_text_atomic(eval_dir / RETRIEVAL_FILE, json.dumps(entries, ensure_ascii=False, indent=0))
    qids = [str(i) for i in range(len(entries))]
    pids = [[ctx["id"] for ctx in entry["ctxs"]] for entry in entries]
    flags = [[ctx["has_answer"] for ctx in entry["ctxs"]] for entry in entries]
    judged = answer_qrels(qids, pids, flags)
    found = ranking_metrics(dict(zip(qids, pids, strict=True)), judged, config.eval.top_k)
    metrics = {**rounded({k: v for k, v in found.items() if k.startswith("top")})}
    metrics["n_questions"] = len(entries)
    write_json_atomic(eval_dir / METRICS_FILE, metrics)
    save_config(config, eval_dir / CONFIG_FILE)
    run = {
        "model": "bm25",
        "setting": "bm25",
        "mode": "bm25",
        "batch_size": 0,
        "seed": 0,
        "eval_seconds": round(time.perf_counter() - start, 1),
    }
    write_json_atomic(out / "run.json", run)  # last: the script treats it as "done"
    return metrics


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("-c", "--config", type=Path, required=True)
    parser.add_argument("--out", type=Path, required=True)
    parser.add_argument("--set", dest="overrides", action="append", default=[])
    args = parser.parse_args()
    print(format_metrics_table(bm25_eval(args.config, args.out, args.overrides)))


if __name__ == "__main__":
    main()
