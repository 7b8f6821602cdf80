"""Retrieval, a folder per job:

- ``dense/``: passages and questions into vectors (``encode``, ``shards``, ``store``) and their
  search in bounded memory (``search``, ``faiss_index``, ``index``); imports nothing else here.
- ``lexical.py``: BM25. ``fusion.py``: BM25 and dense rankings fused (per ``eval.fusion*``).
  ``hybrid.py``: the fused search over an index and BM25.
- ``mining/``: hard negatives: the rules (``rules``), the one candidate loop (``miner``) and the
  resumable parts of a run (``parts``).
- ``metrics.py`` and ``results.py``: judging a ranking, and the files it is written to.
- ``drivers/``: what each command does (``index``, ``eval``, ``encode``, ``search``, ``mine``,
  ``score``), under ``cli/``'s parsing;
  the only modules that read a whole ``Config``; the parts below take its sections.
"""
