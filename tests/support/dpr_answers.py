"""DPR's ``has_answer``, written once for the tests from DPR's description (its code is not
copied): the independent reference the package's answer rule (``dpr_cache.data.answers``) is
checked against.

DPR's SimpleTokenizer: runs of letters, digits and marks, or any single other character that is
not a separator or a control; compared lower-cased after NFD. A "string" answer matches when its
tokens occur contiguously in the passage text's tokens (answers without tokens never match); a
"regex" answer is searched case-insensitively in the NFD text (a pattern that does not compile
never matches).
"""

from __future__ import annotations

import unicodedata

import regex

__all__ = ["dpr_words", "dpr_has_answer"]

_DPR_WORD = regex.compile(r"[\p{L}\p{N}\p{M}]+|[^\p{Z}\p{C}]")


def dpr_words(text: str) -> list[str]:
    """The text's tokens as DPR's SimpleTokenizer splits them, lower-cased, after NFD."""
    return [w.lower() for w in _DPR_WORD.findall(unicodedata.normalize("NFD", text))]


def dpr_has_answer(answers: list[str], text: str, match: str = "string") -> bool:
    """True when one of ``answers`` is in ``text`` by DPR's rule (``match``: string | regex)."""
    text = unicodedata.normalize("NFD", text)
    if match == "regex":
        for answer in answers:
            try:
                pattern = regex.compile(
                    unicodedata.normalize("NFD", answer), regex.IGNORECASE | regex.MULTILINE
                )
            except regex.error:
                continue
            if pattern.search(text):
                return True
        return False
    words = dpr_words(text)
    for answer in answers:
        needle = dpr_words(answer)
        if needle and any(words[i : i + len(needle)] == needle for i in range(len(words))):
            return True
    return False
