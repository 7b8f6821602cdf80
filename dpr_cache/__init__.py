"""dpr-cache: Dense Passage Retrieval with huge simulated batches on small hardware.

Public API: :class:`BiEncoder`, :class:`GradCache`, :func:`contrastive_loss`, :func:`load_config`.
Heavy modules (transformers, pydantic) load on first use, so `import dpr_cache` stays cheap.
"""

from typing import Any

__version__ = "0.1.0"
__all__ = ["BiEncoder", "GradCache", "contrastive_loss", "load_config", "__version__"]

_LAZY = {
    "BiEncoder": "dpr_cache.model.biencoder",
    "GradCache": "dpr_cache.core.engine",
    "contrastive_loss": "dpr_cache.core.loss",
    "load_config": "dpr_cache.config",
}


def __getattr__(name: str) -> Any:
    if name in _LAZY:
        import importlib

        return getattr(importlib.import_module(_LAZY[name]), name)
    raise AttributeError(f"module 'dpr_cache' has no attribute {name!r}")
