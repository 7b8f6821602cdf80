"""dpr-cache: Dense Passage Retrieval with huge simulated batches on small hardware.

Public API: :class:`BiEncoder`, :class:`GradCache`, :func:`contrastive_loss`, :func:`load_config`,
:func:`build_step` (the step object train, verify and bench run, from a config).
Heavy modules (transformers, pydantic) load on first use, so `import dpr_cache` stays cheap.
"""

from typing import Any

__version__ = "0.1.0"
__all__ = [
    "BiEncoder",
    "GradCache",
    "build_step",
    "contrastive_loss",
    "load_config",
    "__version__",
]

_LAZY = {
    "BiEncoder": "dpr_cache.model.biencoder",
    "GradCache": "dpr_cache.core.engine",
    "contrastive_loss": "dpr_cache.core.loss",
    "load_config": "dpr_cache.config",
    "build_step": "dpr_cache.train.step",
}


def __getattr__(name: str) -> Any:
    if name in _LAZY:
        import importlib

        return getattr(importlib.import_module(_LAZY[name]), name)
    raise AttributeError(f"module 'dpr_cache' has no attribute {name!r}")
