"""Retrieval: encode a corpus into embedding shards, FAISS indexes, search and evaluation."""
