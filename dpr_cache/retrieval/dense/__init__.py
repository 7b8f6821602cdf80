"""Dense retrieval: texts into vectors, vectors into shards and indexes, and their search in
bounded memory. Nothing here knows of BM25, fusion, mining or the config."""
