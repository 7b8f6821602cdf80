"""The entry points of the retrieval commands (``index``, ``eval``, ``encode``, ``search``,
``mine``): each takes the lock on its output, turns its settings into specs and calls the
parts below. The only modules of ``retrieval/`` that read a ``Config``."""
