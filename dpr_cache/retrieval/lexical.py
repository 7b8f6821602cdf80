"""BM25 over a passages TSV (title + text) with deterministic top-k ranking, built once and saved.

Tokenization is ``bm25s.tokenize``'s, fixed here so mining is reproducible: lower case, tokens are
runs of two or more word characters (scikit-learn's pattern; one-letter words are dropped),
Lucene's 33-word English stopword list (``bm25s.stopwords.STOPWORDS_EN``), no stemming. Scores
use Lucene's BM25 with k1=0.9 and b=0.4 (Anserini's defaults, the shared README's BM25); a query
token that occurs twice counts twice. Ties are broken by passage order in the file.

The index is built from the passages' Arrow cache (all token lists in memory while it is built:
for a corpus too large for that, bring a BM25 run from pyserini instead) and saved beside that
cache, keyed like it by the file's path, size and mtime; afterwards it is read memory-mapped.
Rows are the passages file's rows.
"""

from __future__ import annotations

import hashlib
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

import numpy as np

from dpr_cache.data.arrow_cache import cache_file
from dpr_cache.data.passages import iter_passage_batches, load_passages
from dpr_cache.errors import InputError
from dpr_cache.runtime.atomic import write_dir_atomic

if TYPE_CHECKING:
    import bm25s

__all__ = ["K1", "B", "Bm25Index", "bm25_tokens", "top_rows"]

K1 = 0.9
B = 0.4
STOPWORDS = "en"  # bm25s.stopwords.STOPWORDS_EN: Lucene's English list
_LAYOUT = "bm25s-lucene-k1=0.9-b=0.4-en-1"  # part of the saved index's key


def bm25_tokens(texts: list[str]) -> list[list[str]]:
    """The BM25 tokens of each text (see the module docstring)."""
    if not texts:
        return []
    import bm25s  # imported where BM25 runs: it brings numba, which a dense run never needs

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
class Bm25Index:
    """The BM25 index of a passages file; its rows are the file's passage rows."""

    retriever: bm25s.BM25
    rows: int

    @classmethod
    def open(cls, passages: Path, cache_dir: Path) -> Bm25Index:
        """The saved index of ``passages`` (built now if there is none yet)."""
        import bm25s

        dataset = load_passages(passages, cache_dir)
        if len(dataset) == 0:
            raise InputError(f"{passages}: no passages")
        folder = _index_dir(passages, cache_dir)
        if not (folder / "params.index.json").is_file():
            texts = [
                f"{title} {text}"
                for batch in iter_passage_batches(dataset)
                for title, text in zip(batch["title"], batch["text"], strict=True)
            ]
            retriever = bm25s.BM25(k1=K1, b=B, method="lucene")
            retriever.index(bm25_tokens(texts), show_progress=False)
            del texts
            write_dir_atomic(folder, lambda tmp: retriever.save(str(tmp), show_progress=False))
        retriever = bm25s.BM25.load(str(folder), mmap=True, show_progress=False)
        return cls(retriever, len(dataset))

    def scores(self, question: str) -> np.ndarray:
        """The BM25 score of every passage for ``question`` [rows] (unknown words left out)."""
        ids = self.retriever.get_tokens_ids(bm25_tokens([question])[0])
        return self.retriever.get_scores_from_ids(ids)

    def search(self, questions: list[str], k: int) -> list[tuple[np.ndarray, np.ndarray]]:
        """For each question, its top-``k`` passage rows and their scores, best first; a passage
        sharing no word with the question (score 0) is not retrieved, as Lucene returns none."""
        out = []
        for question in questions:
            scores = self.scores(question)
            rows = top_rows(scores, k)
            rows = rows[scores[rows] > 0]
            out.append((rows, scores[rows]))
        return out


def _index_dir(passages: Path, cache_dir: Path) -> Path:
    """Where the index of ``passages`` is saved: beside its Arrow cache, keyed alike."""
    arrow = cache_file(passages, cache_dir, "passages")
    key = hashlib.blake2b(f"{arrow.name}|{_LAYOUT}".encode(), digest_size=8).hexdigest()
    return Path(cache_dir) / f"bm25-{Path(passages).name}-{key}"
