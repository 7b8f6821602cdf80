"""Retrieval: encode a corpus into embedding shards, exact and FAISS indexes, search, BM25, hard
negatives mined, evaluation, every metric and every results file."""
