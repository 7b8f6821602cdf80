"""The ``dpr-cache`` command line (Typer): parsing only. Each command checks its flags and calls
one plain function that drives the work (``train/``, ``retrieval/drivers/``, ``model/``).

``app.py`` holds the app and the error mapping; the command modules register on import, in the
order ``--help`` lists them.
"""

import importlib

from dpr_cache.cli.app import app, main

for _module in ("run", "vectors", "mine", "score", "data", "export"):
    importlib.import_module(f"dpr_cache.cli.{_module}")

__all__ = ["app", "main"]
