"""Stable passage ids: a string id for passages without one, and a 63-bit integer per id."""

from __future__ import annotations

import hashlib

_MASK63 = (1 << 63) - 1


def derived_passage_id(title: str, text: str) -> str:
    """A stable string id for a passage that has none, from its title and text."""
    digest = hashlib.blake2b(f"{title}\x1f{text}".encode(), digest_size=8).hexdigest()
    return f"h:{digest}"


def passage_hash(passage_id: str) -> int:
    """A non-negative 63-bit integer for a passage id string (blake2b; equal ids, equal ints)."""
    digest = hashlib.blake2b(passage_id.encode(), digest_size=8).digest()
    return int.from_bytes(digest, "big") & _MASK63


def text_hash(title: str, text: str) -> int:
    """A non-negative 63-bit integer for a passage's title and text (equal texts, equal ints)."""
    digest = hashlib.blake2b(f"{title}\x1f{text}".encode(), digest_size=8).digest()
    return int.from_bytes(digest, "big") & _MASK63
