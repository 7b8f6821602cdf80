"""The entry points of the retrieval commands (``index``, ``eval``, ``encode``, ``search``,
``mine``): each takes the lock on its output and hands the config's sections (``index``,
``eval``; the parts below take them as they are) to the parts below. The only modules of
``retrieval/`` that read a whole ``Config``."""
