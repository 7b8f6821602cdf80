"""Run without a model hub and without transformers' load chatter (the CLI and its children)."""

from __future__ import annotations

import os

__all__ = ["offline_and_quiet"]


def offline_and_quiet() -> None:
    """Nothing is fetched from a hub unless the user set otherwise; no load reports or bars."""
    for key in ("HF_HUB_OFFLINE", "TRANSFORMERS_OFFLINE", "HF_DATASETS_OFFLINE"):
        os.environ.setdefault(key, "1")
    os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
    import transformers

    transformers.logging.set_verbosity_error()  # e.g. "unused pooler weights" on every load
    transformers.logging.disable_progress_bar()
