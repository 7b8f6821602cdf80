"""A BM25 index over a passages TSV (title + text) with deterministic top-k ranking.

Tokenization is ``bm25s.tokenize``'s, fixed here so mining is reproducible: lower case, tokens are
runs of two or more word characters (scikit-learn's pattern; one-letter words are dropped),
Lucene's 33-word English stopword list (``bm25s.stopwords.STOPWORDS_EN``), no stemming. Scores
use Lucene's BM25 with k1=0.9 and b=0.4 (Anserini's defaults, the shared README's BM25); a query
token that occurs twice counts twice. Ties are broken by passage order in the file.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import bm25s
import numpy as np

from dpr_cache.data.passages import read_passages
from dpr_cache.errors import InputError

K1 = 0.9
B = 0.4
STOPWORDS = "en"  # bm25s.stopwords.STOPWORDS_EN: Lucene's English list


def bm25_tokens(texts: list[str]) -> list[list[str]]:
    """The BM25 tokens of each text (see the module docstring)."""
    if not texts:
        return []
    return bm25s.tokenize(texts, stopwords=STOPWORDS, return_ids=False, show_progress=False)


def top_rows(scores: np.ndarray, k: int) -> np.ndarray:
    """Indices of the ``k`` highest scores, best first; equal scores keep index order."""
    k = min(k, len(scores))
    if k <= 0:
        return np.zeros(0, dtype=np.int64)
    if k < len(scores):
        threshold = np.partition(scores, len(scores) - k)[len(scores) - k]
        candidates = np.flatnonzero(scores >= threshold)  # ascending index order
    else:
        candidates = np.arange(len(scores))
    order = np.argsort(-scores[candidates], kind="stable")
    return candidates[order][:k]


@dataclass
class Bm25Corpus:
    """The passages of a TSV (ids, titles, texts in file order) and their BM25 index."""

    ids: list[str]
    titles: list[str]
    texts: list[str]
    retriever: bm25s.BM25

    @classmethod
    def from_tsv(cls, path: Path) -> Bm25Corpus:
        """Read and index a DPR passages TSV; InputError if it holds no passage."""
        ids, titles, texts = [], [], []
        for pid, text, title in read_passages(path):
            ids.append(pid)
            titles.append(title)
            texts.append(text)
        if not ids:
            raise InputError(f"{path}: no passages")
        retriever = bm25s.BM25(k1=K1, b=B, method="lucene")
        tokens = bm25_tokens([f"{title} {text}" for title, text in zip(titles, texts, strict=True)])
        retriever.index(tokens, show_progress=False)
        return cls(ids, titles, texts, retriever)

    def __len__(self) -> int:
        return len(self.ids)

    def search(self, questions: list[str], k: int) -> list[tuple[np.ndarray, np.ndarray]]:
        """For each question, its top-``k`` passage rows and their scores, best first."""
        out = []
        for tokens in bm25_tokens(questions):
            ids = self.retriever.get_tokens_ids(tokens)  # unknown tokens are left out
            scores = self.retriever.get_scores_from_ids(ids)
            rows = top_rows(scores, k)
            out.append((rows, scores[rows]))
        return out
