"""Quiet libraries: transformers' load reports and progress bars off, and the tokenizers'
warning about forked processes off (a default only: a variable the user set wins). Applied once
by the CLI, inherited by its child processes; transformers is quieted when it is first
imported, not imported for it (a command that refuses its input never loads it)."""

from __future__ import annotations

import importlib.util
import os
import sys

__all__ = ["QUIET_ENV", "quiet_libraries"]

QUIET_ENV = {"TOKENIZERS_PARALLELISM": "false", "TRANSFORMERS_VERBOSITY": "error"}


def quiet_libraries() -> None:
    """Apply :data:`QUIET_ENV` where unset; silence transformers' load reports and progress
    bars as soon as it is imported (now, if it is already)."""
    for key, value in QUIET_ENV.items():
        os.environ.setdefault(key, value)
    _when_imported("transformers", _quiet_transformers)


def _quiet_transformers() -> None:
    transformers = sys.modules["transformers"]
    transformers.logging.set_verbosity_error()  # e.g. "unused pooler weights" on every load
    transformers.logging.disable_progress_bar()


def _when_imported(name: str, action) -> None:
    """Run ``action`` once module ``name`` is imported: now when it is, else right after its
    import (a finder first on ``sys.meta_path`` that wraps the module's loader once)."""
    if name in sys.modules:
        action()
        return
    if any(getattr(f, "module", None) == name for f in sys.meta_path):
        return  # waiting already

    class _Then:
        module = name

        @staticmethod
        def find_spec(fullname, path=None, target=None):
            if fullname != name:
                return None
            sys.meta_path.remove(_Then)
            spec = importlib.util.find_spec(fullname)
            if spec is None or spec.loader is None:
                return spec
            run = spec.loader.exec_module

            def exec_module(module):
                run(module)
                action()

            spec.loader.exec_module = exec_module
            return spec

    sys.meta_path.insert(0, _Then)
