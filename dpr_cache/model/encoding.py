"""How a text becomes a vector: the :class:`QueryEncoding` record, what a model folder records
of it, and the one rule that settles it from what the user asked and what a model folder or an
index records.

A dpr-cache model folder records its encoding in ``biencoder.json`` and an index copies it into
its ``meta.json`` (``"model"``), both under the config's own key names (``query_prefix``,
``pooling``, ``normalize``, ``max_query_length``; ``passage_prefix`` beside them), so files
written by earlier runs read the same. A sentence-transformers folder records its pooling, its
normalization and its prompts in its modules; DPR's checkpoints encode by [CLS], unnormalized
(:func:`folder_encoding`). :func:`settle_encoding` is the rule every command applies, training
included: a setting the user gave (a YAML key, a ``--set``, a flag) that contradicts a record
is an error naming both values; a setting not given takes the recorded value, else the
fallback.
"""

from __future__ import annotations

import dataclasses
import json
import string
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from dpr_cache.errors import InputError

__all__ = [
    "QueryEncoding",
    "RECORDED_KEYS",
    "MODEL_KEYS",
    "ENCODING_FILE",
    "encoding_record",
    "folder_encoding",
    "is_multi_vector_folder",
    "resolve_encoding",
    "settle_encoding",
    "shipped_expansion",
    "shipped_modules",
    "shipped_normalize",
    "shipped_settings",
    "shipped_skiplist",
    "shipped_pooling",
    "shipped_prefixes",
]

ENCODING_FILE = "biencoder.json"


@dataclass(frozen=True)
class QueryEncoding:
    """How a question is encoded: the prefix put before it, the pooling of the tower's last
    hidden state, whether the vector is scaled to unit length, the tokens kept and the
    vector's width (its first ``dim`` dims, re-normalized when normalized: ``index.dim``). The
    field names are the config's keys (``model.*``, ``index.dim``) and the recorded files'
    keys."""

    query_prefix: str
    pooling: str
    normalize: bool
    max_query_length: int | None  # None: not known (a model not saved by dpr-cache)
    dim: int | None = None  # None: not known (a record written before widths were recorded)

    def record(self) -> dict[str, Any]:
        """The record as a model folder and an index write it."""
        return dataclasses.asdict(self)


RECORDED_KEYS = (*(f.name for f in dataclasses.fields(QueryEncoding)), "passage_prefix")
"""What a model folder and an index record of how texts are encoded: the query encoding, and
the passages' prefix (pooling and normalization serve both towers)."""


_KEY_NAMES = {"dim": "index.dim (--dim)"}
"""The config key (and flag) of a recorded setting outside ``model.*``."""


MODEL_KEYS = (*RECORDED_KEYS, "max_passage_length", "vectors", "multi_dim")
"""What a model folder records of its encoding: :data:`RECORDED_KEYS`, the passages' length and
what it encodes (one vector a text or a vector a token, and their width: ``model.*`` settled
by training, beside ``index.dim``)."""


def encoding_record(saved: Mapping[str, Any] | None) -> dict[str, Any]:
    """The keys of :data:`MODEL_KEYS` that a saved mapping (a model folder's
    ``biencoder.json``, the ``"model"`` of an index's ``meta.json``) records: those present and
    not null."""
    return {key: saved[key] for key in MODEL_KEYS if (saved or {}).get(key) is not None}


def folder_encoding(model_dir: str | Path) -> dict[str, Any]:
    """What a model folder records of how it encodes, by the config's key names: a dpr-cache
    folder its ``biencoder.json``; a sentence-transformers folder its Pooling module's pooling,
    whether it ends in a Normalize module, and its query and document prompts; DPR's
    checkpoints (an HF question/context pair, a ``.cp`` file) [CLS] pooling, unnormalized;
    nothing for any other folder, whose settings are the user's or the defaults."""
    path = Path(model_dir)
    if (path / ENCODING_FILE).is_file():
        return encoding_record(json.loads((path / ENCODING_FILE).read_text(encoding="utf-8")))
    if _is_dpr_checkpoint(path):
        return {"pooling": "cls", "normalize": False}
    if not shipped_modules(path) and not shipped_settings(path):
        return {}
    found = {"pooling": shipped_pooling(path), "normalize": shipped_normalize(path)}
    if is_multi_vector_folder(path):
        found.update(vectors="multi", multi_dim=_projection_width(path), normalize=True)
        found.update(_shipped_lengths(path))
    return encoding_record({**found, **shipped_prefixes(path)})


_MULTI_VECTOR_TYPES = ("MultiVectorEncoder", "ColBERT")
"""``model_type`` of a sentence-transformers ``MultiVectorEncoder`` folder and of PyLate's."""


def shipped_settings(path: Path) -> dict:
    """A sentence-transformers folder's ``config_sentence_transformers.json`` (none for other
    folders)."""
    file = Path(path) / "config_sentence_transformers.json"
    return json.loads(file.read_text()) if file.is_file() else {}


def is_multi_vector_folder(path: Path) -> bool:
    """Whether ``path`` is a sentence-transformers ``MultiVectorEncoder`` folder or a PyLate
    one (its ``model_type``, or a MultiVectorMask module)."""
    if shipped_settings(path).get("model_type") in _MULTI_VECTOR_TYPES:
        return True
    return any(m.get("type", "").endswith("MultiVectorMask") for m in shipped_modules(path))


def shipped_expansion(path: Path) -> dict | None:
    """The query expansion a multi-vector folder records (``length``, ``attend``, ``token``):
    sentence-transformers' ``query_expansion`` of strategy ``fixed``, or PyLate's
    ``query_length`` (PyLate expands unless ``do_query_expansion`` is false); None for none;
    InputError for another strategy."""
    transformer = Path(path) / "sentence_bert_config.json"
    found = json.loads(transformer.read_text()) if transformer.is_file() else {}
    expansion = found.get("query_expansion")
    if expansion is not None:
        if expansion.get("strategy", "fixed") != "fixed":
            raise InputError(
                f"{transformer}: query expansion of strategy {expansion['strategy']!r} is not "
                "encoded by dpr-cache yet (fixed is)"
            )
        token = expansion.get("token")
        return {
            "length": int(expansion["length"]),
            "attend": bool(expansion.get("attend")),
            "token": token,
        }
    settings = shipped_settings(path)
    if settings.get("model_type") == "ColBERT" and settings.get("do_query_expansion", True):
        attend = bool(settings.get("attend_to_expansion_tokens"))
        return {"length": int(settings.get("query_length") or 32), "attend": attend, "token": None}
    return None


def shipped_skiplist(path: Path) -> list[str]:
    """The words whose tokens a multi-vector folder's passages do not score: its
    MultiVectorMask module's, or PyLate's ``skiplist_words`` (punctuation when a PyLate folder
    names none, as PyLate and sentence-transformers read it)."""
    for module in shipped_modules(path):
        if module.get("type", "").endswith("MultiVectorMask"):
            config = Path(path) / module.get("path", "") / "config.json"
            if config.is_file():
                return list(json.loads(config.read_text()).get("skiplist_words") or [])
    settings = shipped_settings(path)
    if settings.get("model_type") == "ColBERT" and "skiplist_words" not in settings:
        return list(string.punctuation)
    return list(settings.get("skiplist_words") or [])


def _shipped_lengths(path: Path) -> dict[str, int | None]:
    """The question and passage lengths a multi-vector folder records: the query expansion's
    (a question is at most that long), else its query length; its document length."""
    transformer = Path(path) / "sentence_bert_config.json"
    found = {
        **shipped_settings(path),
        **(json.loads(transformer.read_text()) if transformer.is_file() else {}),
    }
    expansion = shipped_expansion(path)
    query = expansion["length"] if expansion else found.get("query_length")
    return {"max_query_length": query, "max_passage_length": found.get("document_length")}


def _projection_width(path: Path) -> int | None:
    """The token vectors' width a multi-vector folder's Dense module projects to."""
    for module in shipped_modules(path):
        config = Path(path) / module.get("path", "") / "config.json"
        if module.get("type", "").endswith("Dense") and config.is_file():
            return json.loads(config.read_text()).get("out_features")
    return None


def _is_dpr_checkpoint(path: Path) -> bool:
    """Whether ``path`` holds one of DPR's checkpoints, by its shape (the towers' classes are
    checked where it loads: :func:`~dpr_cache.model.dpr_formats.dpr_kind`)."""
    if path.is_file():
        return path.suffix == ".cp"
    return all((path / tower / "config.json").is_file() for tower in _DPR_TOWERS)


_DPR_TOWERS = ("question_encoder", "ctx_encoder")


def shipped_modules(path: Path) -> list[dict]:
    """A sentence-transformers folder's ``modules.json`` entries (none for other folders)."""
    modules = Path(path) / "modules.json"
    return json.loads(modules.read_text()) if modules.is_file() else []


def shipped_normalize(path: Path) -> bool:
    """Whether a sentence-transformers folder ends in a Normalize module."""
    return any(m.get("type", "").endswith("Normalize") for m in shipped_modules(path))


def shipped_pooling(path: Path) -> str | None:
    """The pooling a sentence-transformers folder's Pooling module does (``"cls"``,
    ``"mean"`` or ``"last"``), or None when it has none (or one of another kind). Its config
    says it either way sentence-transformers writes it: ``pooling_mode_*`` flags, or one
    ``pooling_mode`` name."""
    for module in shipped_modules(path):
        config = Path(path) / module.get("path", "") / "config.json"
        if module.get("type", "").endswith("Pooling") and config.is_file():
            modes = json.loads(config.read_text())
            for ours, flag, name in _POOLING_MODES:
                if modes.get(flag) or modes.get("pooling_mode") == name:
                    return ours
    return None


# ours, sentence-transformers' flag, its name
_POOLING_MODES = (
    ("cls", "pooling_mode_cls_token", "cls"),
    ("mean", "pooling_mode_mean_tokens", "mean"),
    ("last", "pooling_mode_lasttoken", "lasttoken"),
)


def shipped_prefixes(path: Path) -> dict[str, str]:
    """The query and passage prompts a sentence-transformers folder ships
    (``config_sentence_transformers.json``: ``prompts`` named ``query`` and ``document`` or
    ``passage``; a PyLate folder's ``query_prefix`` and ``document_prefix``), as
    ``query_prefix`` / ``passage_prefix``; none for other folders."""
    settings = shipped_settings(path)
    prompts = settings.get("prompts") or {}
    found = {"query_prefix": prompts.get("query") or settings.get("query_prefix")}
    passage = prompts.get("document", prompts.get("passage"))
    found["passage_prefix"] = passage or settings.get("document_prefix")
    return {key: value for key, value in found.items() if value}


def resolve_encoding(
    asked: Mapping[str, Any],
    records: Sequence[tuple[str, Mapping[str, Any], str]],
    fallback: Mapping[str, Any],
    keys: Sequence[str] = RECORDED_KEYS,
) -> dict[str, Any]:
    """Each key of :data:`RECORDED_KEYS` settled by one rule: the user's value (``asked``: the
    keys they gave, by config key name; None is not given) when no record says otherwise, else
    the first record's value (``records``: what holds it, its keys, what to do on a
    contradiction; e.g. ``("the index was built with", meta, "rerun `dpr-cache index`")``),
    else ``fallback``'s (None: as the model folder ships it). A given value that contradicts a
    record is an InputError naming both. ``keys``: the settings settled (default
    :data:`RECORDED_KEYS`)."""
    settled: dict[str, Any] = {}
    for key in keys:
        given = asked.get(key)
        recorded = next(((what, rec[key], fix) for what, rec, fix in records if key in rec), None)
        if given is not None and recorded is not None and given != recorded[1]:
            what, value, fix = recorded
            name = _KEY_NAMES.get(key, f"model.{key}")
            raise InputError(f"{name}: {given!r}, but {what} {value!r}: set it back or {fix}")
        if given is not None:
            settled[key] = given
        else:
            settled[key] = recorded[1] if recorded is not None else fallback.get(key)
    return settled


def settle_encoding(
    model_dir: str | Path,
    asked: Mapping[str, Any],
    fallback: Mapping[str, Any],
    records: Sequence[tuple[str, Mapping[str, Any], str]] = (),
    keys: Sequence[str] = RECORDED_KEYS,
) -> dict[str, Any]:
    """:func:`resolve_encoding` of ``asked`` against ``records`` (an index's, when searching
    one) and then what the model folder records (:func:`folder_encoding`): the rule train,
    encode, index, search, eval, mine and score all apply."""
    mine = (f"the model at {model_dir} records", folder_encoding(model_dir), "pass another model")
    return resolve_encoding(asked, [*records, mine], fallback, keys)
