"""How closely other tools reproduce a saved model's vectors, on real questions and passages.

    python scripts/ecosystem_figures.py MODEL_DIR [--qas FILE] [--passages TSV] [--n 200]

Prints, for the query and passage towers, the largest ``1 - cosine`` and norm difference between
dpr-cache's vectors and sentence-transformers' (``SentenceTransformer(tower).encode``), and, for a
CLS model, the largest absolute difference to HF's ``DPRQuestionEncoder`` / ``DPRContextEncoder``
``pooler_output`` after ``dpr-cache export --format dpr-hf``. The tests assert the same bounds on a
tiny model; this reports the figures on a trained one.
"""

from __future__ import annotations

import argparse
import itertools
import json
import tempfile
from pathlib import Path

import numpy as np
import torch

from dpr_cache.data.passages import read_passages
from dpr_cache.data.qas import read_qas
from dpr_cache.model.dpr_formats import export_dpr_hf
from dpr_cache.model.loading import load_biencoder
from dpr_cache.retrieval.dense.encode import encode_passage_texts, encode_question_texts

CPU = torch.device("cpu")


def _passages(path: Path, n: int) -> tuple[list[str], list[str]]:
    rows = list(itertools.islice(read_passages(path), n))  # (id, text, title)
    return [title for _, _, title in rows], [text for _, text, _ in rows]


def _gap(ours: np.ndarray, theirs: np.ndarray) -> dict[str, float]:
    cos = (ours * theirs).sum(1) / np.linalg.norm(ours, axis=1) / np.linalg.norm(theirs, axis=1)
    norms = np.abs(np.linalg.norm(ours, axis=1) - np.linalg.norm(theirs, axis=1))
    return {
        "max_1_minus_cos": float((1 - cos).max()),
        "max_norm_diff": float(norms.max()),
        "max_abs_diff": float(np.abs(ours - theirs).max()),
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("model", type=Path)
    parser.add_argument("--qas", type=Path, default=Path("data/toy/dev.qa.tsv"))
    parser.add_argument("--passages", type=Path, default=Path("data/toy/passages.tsv"))
    parser.add_argument("--n", type=int, default=200)
    args = parser.parse_args()
    from sentence_transformers import SentenceTransformer

    model = load_biencoder(args.model).eval()
    questions = [q for q, _ in read_qas(args.qas)][: args.n]
    titles, texts = _passages(args.passages, args.n)
    ours_q = encode_question_texts(model, questions, max_length=model.max_query_length, device=CPU)
    ours_p = encode_passage_texts(
        model, titles, texts, max_length=model.max_passage_length, batch_size=32, device=CPU
    )
    q_st = SentenceTransformer(str(args.model / "query_encoder"), device="cpu")
    p_st = SentenceTransformer(str(args.model / "passage_encoder"), device="cpu")
    pairs = [[t, x] for t, x in zip(titles, texts, strict=True)]
    report = {
        "model": str(args.model),
        "pooling": model.pooling,
        "normalize": model.normalize,
        "questions": len(questions),
        "passages": len(texts),
        "sentence_transformers": {
            "questions": _gap(ours_q, q_st.encode(questions)),
            "passages": _gap(ours_p, p_st.encode(pairs)),
        },
    }
    if model.pooling == "cls":
        from transformers import AutoTokenizer, DPRContextEncoder, DPRQuestionEncoder

        with tempfile.TemporaryDirectory() as tmp:
            export_dpr_hf(model, Path(tmp))
            q = DPRQuestionEncoder.from_pretrained(Path(tmp) / "question_encoder").eval()
            c = DPRContextEncoder.from_pretrained(Path(tmp) / "ctx_encoder").eval()
            tok = AutoTokenizer.from_pretrained(Path(tmp) / "ctx_encoder")
            with torch.no_grad():
                q_in = tok(
                    questions,
                    truncation=True,
                    max_length=model.max_query_length,
                    padding=True,
                    return_tensors="pt",
                )
                p_in = tok(
                    titles,
                    texts,
                    truncation="only_second",
                    max_length=model.max_passage_length,
                    padding=True,
                    return_tensors="pt",
                )
                report["hf_dpr"] = {
                    "questions": _gap(ours_q, q(**q_in).pooler_output.numpy()),
                    "passages": _gap(ours_p, c(**p_in).pooler_output.numpy()),
                }
    print(json.dumps(report, indent=2))


if __name__ == "__main__":
    main()
