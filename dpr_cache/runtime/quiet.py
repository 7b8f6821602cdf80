"""Quiet libraries: transformers' load reports and progress bars off, and the tokenizers'
warning about forked processes off (a default only: a variable the user set wins). Applied once
by the CLI, inherited by its child processes."""

from __future__ import annotations

import os

__all__ = ["QUIET_ENV", "quiet_libraries"]

QUIET_ENV = {"TOKENIZERS_PARALLELISM": "false"}


def quiet_libraries() -> None:
    """Apply :data:`QUIET_ENV` where unset and silence transformers' load reports."""
    for key, value in QUIET_ENV.items():
        os.environ.setdefault(key, value)
    import transformers

    transformers.logging.set_verbosity_error()  # e.g. "unused pooler weights" on every load
    transformers.logging.disable_progress_bar()
