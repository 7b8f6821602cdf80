"""Every retrieval result the project writes: DPR's results file (``retrieval.json``: one entry a
question, its ``ctxs`` best first, with ``has_answer``), the same results in pyserini's form
(``retrieval.pyserini.json``), TREC runs (``qid Q0 pid rank score tag``), and the metrics table
printed at the end of an evaluation."""

from __future__ import annotations

import json
from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import Any

import numpy as np
from tqdm.auto import tqdm

from dpr_cache.data.answers import has_answer
from dpr_cache.data.passages import passage_columns
from dpr_cache.errors import InputError
from dpr_cache.runtime.atomic import write_atomic

__all__ = [
    "RETRIEVAL_FILE",
    "METRICS_FILE",
    "CONFIG_FILE",
    "TIMINGS_FILE",
    "RUN_FILE",
    "PYSERINI_FILE",
    "FUSION_FILE",
    "rounded",
    "answer_flags",
    "format_metrics_table",
    "write_retrieval",
    "write_pyserini_retrieval",
    "write_trec_run",
    "read_trec_run",
]

RETRIEVAL_FILE = "retrieval.json"
METRICS_FILE = "metrics.json"
CONFIG_FILE = "config.yaml"
TIMINGS_FILE = "timings.json"
RUN_FILE = "run.trec"
PYSERINI_FILE = "retrieval.pyserini.json"
FUSION_FILE = "fusion.json"
_WRITE_BATCH = 64  # questions whose passages are read from the Arrow cache together


def rounded(metrics: dict[str, float]) -> dict[str, Any]:
    """Percentages to 2 decimals, the count as an int."""
    return {k: (int(v) if k == "n_questions" else round(v, 2)) for k, v in metrics.items()}


def answer_flags(path: str | Path) -> list[list[bool]]:
    """Each question's ``has_answer`` flags, best first, read back from a DPR results file."""
    entries = json.loads(Path(path).read_text(encoding="utf-8"))
    return [[bool(ctx["has_answer"]) for ctx in entry["ctxs"]] for entry in entries]


def format_metrics_table(metrics: dict[str, Any]) -> str:
    """A small text table: a line per k (hit rate, recall), MRR@10 and nDCG@10, the count."""
    ks = sorted(int(key[3:]) for key in metrics if key.startswith("top"))
    lines = ["    k | hit rate % | recall %", "------+------------+---------"]
    for k in ks:
        recall = metrics.get(f"recall@{k}")
        shown = f"{recall:>8.2f}" if recall is not None else "       -"
        lines.append(f"{k:>5} | {metrics[f'top{k}']:>10.2f} | {shown}")
    for key in ("mrr@10", "ndcg@10"):
        if key in metrics:
            lines.append(f"{key}: {metrics[key]:.2f}")
    lines.append(f"questions: {metrics.get('n_questions', 0)}")
    return "\n".join(lines)


def pooled_metrics(sets: dict[str, dict[str, Any]]) -> dict[str, Any]:
    """Several dev sets' metrics as one: each figure the mean over every judged question (each
    set's figure weighted by its judged questions; from figures rounded to 2 decimals, so
    within 0.01 of the mean over the pooled questions), ``n_questions`` their sum, and each
    set's own under ``sets``."""
    weights = {name: m["measured"]["judged_questions"] for name, m in sets.items()}
    total = sum(weights.values())
    names = [k for k in next(iter(sets.values())) if k not in ("n_questions", "measured")]
    pooled: dict[str, Any] = {
        k: round(sum(weights[s] * m[k] for s, m in sets.items()) / total, 2) if total else 0.0
        for k in names
    }
    pooled["n_questions"] = sum(m["n_questions"] for m in sets.values())
    pooled["sets"] = {
        name: {k: v for k, v in m.items() if k != "measured"} for name, m in sets.items()
    }
    pooled["measured"] = {
        "pooled": "each figure: the sets' figures weighted by their judged questions",
        "dev_qa": {name: m["measured"]["data"]["dev_qa"] for name, m in sets.items()},
    }
    return pooled


def format_sets_table(pooled: dict[str, Any]) -> str:
    """A row a dev set and one for all of them: its questions, hit rates and MRR@10."""
    ks = sorted(int(key[3:]) for key in pooled if key.startswith("top"))
    rows = [*pooled["sets"].items(), ("all", pooled)]
    width = max(len("dev set"), *(len(name) for name, _ in rows))
    head = f"{'dev set':<{width}} | questions | " + " | ".join(f"top{k:<3}" for k in ks)
    lines = [head + " | mrr@10", "-" * (len(head) + 9)]
    for name, m in rows:
        hits = " | ".join(f"{m[f'top{k}']:>6.2f}" for k in ks)
        lines.append(f"{name:<{width}} | {m['n_questions']:>9} | {hits} | {m['mrr@10']:>6.2f}")
    return "\n".join(lines)


def _entries(questions, scores, rows, dataset, match: str) -> Iterator[dict[str, Any]]:
    """DPR results entries for a batch of questions, their scores and passage rows."""
    valid = np.unique(rows[rows >= 0])
    found = passage_columns(dataset, valid.tolist())
    where = {int(r): i for i, r in enumerate(valid)}
    for (question, answers), q_scores, q_rows in zip(questions, scores, rows, strict=True):
        ctxs = []
        for score, row in zip(q_scores, q_rows, strict=True):
            if row < 0:
                continue
            i = where[int(row)]
            text = found["text"][i]
            ctxs.append(
                {
                    "id": found["id"][i],
                    "title": found["title"][i],
                    "text": text,
                    "score": float(score),
                    "has_answer": has_answer(answers, text, match),
                }
            )
        yield {"question": question, "answers": answers, "ctxs": ctxs}


def write_retrieval(
    path: Path, qas, scores: np.ndarray, rows: np.ndarray, dataset, match: str, progress: bool
) -> tuple[list[list[str]], list[list[bool]]]:
    """DPR's results file for the questions' hits; returns each question's passage ids and
    answer flags, best first."""
    flags: list[list[bool]] = []
    pids: list[list[str]] = []

    def write(tmp: Path) -> None:
        with (
            open(tmp, "w", encoding="utf-8") as f,
            tqdm(total=len(qas), unit="q", desc="answers", disable=not progress) as bar,
        ):
            f.write("[")
            for start in range(0, len(qas), _WRITE_BATCH):
                part = slice(start, start + _WRITE_BATCH)
                for entry in _entries(qas[part], scores[part], rows[part], dataset, match):
                    f.write(",\n" if flags else "\n")
                    f.write(json.dumps(entry, ensure_ascii=False))
                    flags.append([ctx["has_answer"] for ctx in entry["ctxs"]])
                    pids.append([ctx["id"] for ctx in entry["ctxs"]])
                bar.update(len(qas[part]))
            f.write("\n]\n")

    write_atomic(path, write)
    return pids, flags


def write_pyserini_retrieval(
    path: Path,
    qids: Sequence[str],
    qas: Sequence[tuple[str, list[str]]],
    pids: Sequence[Sequence[str]],
    scores: Sequence[Sequence[float]],
    flags: Sequence[Sequence[bool]],
) -> None:
    """pyserini's DPR results file (``python -m pyserini.eval.evaluate_dpr_retrieval
    --retrieval FILE --topk 20 100`` reads it): per question id its question, answers and
    ``contexts`` best first, each with ``docid``, ``score`` and DPR's ``has_answer``."""

    def write(tmp: Path) -> None:
        with open(tmp, "w", encoding="utf-8") as f:
            f.write("{")
            rows = zip(qids, qas, pids, scores, flags, strict=True)
            for i, (qid, (question, answers), q_pids, q_scores, q_flags) in enumerate(rows):
                contexts = [
                    {"docid": pid, "score": float(score), "has_answer": flag}
                    for pid, score, flag in zip(q_pids, q_scores, q_flags, strict=True)
                ]
                entry = {"question": question, "answers": answers, "contexts": contexts}
                f.write(",\n" if i else "\n")
                f.write(f"{json.dumps(qid)}: {json.dumps(entry, ensure_ascii=False)}")
            f.write("\n}\n")

    write_atomic(path, write)


def write_trec_run(path: Path, qids: list[str], pids, scores, tag: str) -> None:
    """A TREC run: ``qid Q0 pid rank score tag`` a line, ranks from 1, best first (trec_eval,
    ir-measures and ranx read it). ``pids`` and ``scores`` hold a row per query (best first);
    an empty passage id marks a missing hit and is left out. Scores keep float32's precision
    (``.9g``), so trec_eval's sort by score agrees with our ranks."""
    flat = [pid for row in pids for pid in row]
    for name, values in (("query id", qids), ("passage id", flat), ("tag", [tag])):
        bad = next((v for v in values if any(c.isspace() for c in str(v))), None)
        if bad is not None or (name != "passage id" and "" in values):
            raise InputError(f"{path}: {name} {bad!r} is empty or holds white space")

    def write(tmp: Path) -> None:
        with open(tmp, "w", encoding="utf-8") as f:
            for qid, q_pids, q_scores in zip(qids, pids, scores, strict=True):
                rank = 0
                for pid, score in zip(q_pids, q_scores, strict=True):
                    if pid == "":
                        continue
                    rank += 1
                    f.write(f"{qid} Q0 {pid} {rank} {float(score):.9g} {tag}\n")

    write_atomic(path, write)


def read_trec_run(path: Path) -> dict[str, list[tuple[str, float]]]:
    """A TREC run (``qid Q0 pid rank score tag`` a line): each question's passages and scores,
    best first (by score, ties by rank, as trec_eval orders them)."""
    ranked: dict[str, list[tuple[float, int, str]]] = {}
    try:
        with open(path, encoding="utf-8") as f:
            for n, line in enumerate(f, start=1):
                fields = line.split()
                if not fields:
                    continue
                if len(fields) != 6:
                    raise InputError(f"{path} line {n}: expected 'qid Q0 pid rank score tag'")
                try:
                    entry = (-float(fields[4]), int(fields[3]), fields[2])
                except ValueError:
                    raise InputError(f"{path} line {n}: rank and score must be numbers") from None
                ranked.setdefault(fields[0], []).append(entry)
    except (OSError, UnicodeDecodeError) as e:
        raise InputError(f"{path}: cannot read ({' '.join(str(e).split())})") from None
    return {q: [(pid, -neg) for neg, _, pid in sorted(rows)] for q, rows in ranked.items()}
