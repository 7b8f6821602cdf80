"""The offline environment: nothing is fetched from a model or data hub unless the user says so,
and transformers stays quiet. Set once here for the CLI, its child processes and the tests."""

from __future__ import annotations

import os
from collections.abc import Mapping

__all__ = ["OFFLINE_ENV", "offline_env", "offline_and_quiet"]

OFFLINE_ENV = {
    "HF_HUB_OFFLINE": "1",
    "TRANSFORMERS_OFFLINE": "1",
    "HF_DATASETS_OFFLINE": "1",
    "TOKENIZERS_PARALLELISM": "false",
}
"""Defaults only: a variable the user set (e.g. ``HF_HUB_OFFLINE=0``) wins."""


def offline_env(base: Mapping[str, str] | None = None) -> dict[str, str]:
    """``base`` (default ``os.environ``) with the offline defaults filled in where unset."""
    env = dict(os.environ if base is None else base)
    for key, value in OFFLINE_ENV.items():
        env.setdefault(key, value)
    return env


def offline_and_quiet() -> None:
    """Apply the offline defaults to this process and silence transformers' load reports."""
    for key, value in OFFLINE_ENV.items():
        os.environ.setdefault(key, value)
    import transformers

    transformers.logging.set_verbosity_error()  # e.g. "unused pooler weights" on every load
    transformers.logging.disable_progress_bar()
