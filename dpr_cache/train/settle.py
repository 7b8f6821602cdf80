"""A training config's ``model.*`` settled against what its model folder records, by the rule
every command applies (:func:`~dpr_cache.model.encoding.settle_encoding`): a key the config
gives that contradicts the folder is a one-line error naming both values; a key it leaves out
takes the folder's record (a dpr-cache folder's pooling, normalization, prefixes and lengths; a
sentence-transformers folder's pooling, normalization and prompts), else its default."""

from __future__ import annotations

from dpr_cache.config import Config, check_valid
from dpr_cache.errors import InputError
from dpr_cache.model.encoding import MODEL_KEYS, settle_encoding
from dpr_cache.model.hub import ModelNotFound, resolve_model_path

__all__ = ["TRAINED_KEYS", "settle_model"]

TRAINED_KEYS = tuple(key for key in MODEL_KEYS if key != "dim")
"""The ``model.*`` keys a model folder records of its encoding (``index.dim`` is retrieval's)."""


def settle_model(config: Config) -> Config:
    """``config`` with ``model.*``'s encoding keys settled against the model folder; the same
    config when the folder records nothing or cannot be found (loading it then says why)."""
    m = config.model
    try:
        path = resolve_model_path(m.name_or_path)
    except (ModelNotFound, InputError):
        return config
    if not path.exists():
        return config
    given = {key: getattr(m, key) for key in TRAINED_KEYS if key in m.model_fields_set}
    settled = settle_encoding(path, given, {}, keys=TRAINED_KEYS)
    update = {k: v for k, v in settled.items() if v is not None and k not in given}
    if not update:
        return config
    settled = config.model_copy(update={"model": m.model_copy(update=update)})
    check_valid(settled, f"model.* as the model at {path} records it")
    return settled
