"""How a question becomes a vector: the :class:`QueryEncoding` record, and the one rule that
settles it from what the user asked and what a model folder or an index records.

A model folder records its encoding in ``biencoder.json`` and an index copies it into its
``meta.json`` (``"model"``), both under the config's own key names (``query_prefix``,
``pooling``, ``normalize``, ``max_query_length``; ``passage_prefix`` beside them), so files
written by earlier runs read the same. :func:`resolve_encoding` is the rule every command
applies: a setting the user gave (a YAML key, a ``--set``, a flag) that contradicts a record is
an error naming both values; a setting not given takes the recorded value, else the fallback.
"""

from __future__ import annotations

import dataclasses
import json
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from dpr_cache.errors import InputError

__all__ = [
    "QueryEncoding",
    "RECORDED_KEYS",
    "ENCODING_FILE",
    "encoding_record",
    "saved_encoding",
    "resolve_encoding",
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


def encoding_record(saved: Mapping[str, Any] | None) -> dict[str, Any]:
    """The keys of :data:`RECORDED_KEYS` that a saved mapping (a model folder's
    ``biencoder.json``, the ``"model"`` of an index's ``meta.json``) records: those present and
    not null."""
    return {key: saved[key] for key in RECORDED_KEYS if (saved or {}).get(key) is not None}


def saved_encoding(model_dir: str | Path) -> dict[str, Any]:
    """What a dpr-cache model folder records of its encoding (``biencoder.json``); nothing for
    any other folder or file, whose settings are what it ships."""
    path = Path(model_dir) / ENCODING_FILE
    if not path.is_file():
        return {}
    return encoding_record(json.loads(path.read_text(encoding="utf-8")))


def resolve_encoding(
    asked: Mapping[str, Any],
    records: Sequence[tuple[str, Mapping[str, Any], str]],
    fallback: Mapping[str, Any],
) -> dict[str, Any]:
    """Each key of :data:`RECORDED_KEYS` settled by one rule: the user's value (``asked``: the
    keys they gave, by config key name; None is not given) when no record says otherwise, else
    the first record's value (``records``: what holds it, its keys, what to do on a
    contradiction; e.g. ``("the index was built with", meta, "rerun `dpr-cache index`")``),
    else ``fallback``'s (None: as the model folder ships it). A given value that contradicts a
    record is an InputError naming both."""
    settled: dict[str, Any] = {}
    for key in RECORDED_KEYS:
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
