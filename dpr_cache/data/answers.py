"""Answer matching as DPR does it: NFD text, simple tokens, contiguous match.

A token is a run of letters, digits and combining marks, or one other character that is neither a
separator nor a control/format character; tokens are compared lower-cased. Accents are *not*
stripped: NFD only decomposes them, so "Beyoncé" and "Beyonce" are different tokens.
"""

from __future__ import annotations

import functools
import unicodedata
from collections.abc import Sequence

import regex

MATCH_TYPES = ("string", "regex")

_TOKEN = regex.compile(
    r"[\p{L}\p{N}\p{M}]+|[^\p{Z}\p{C}]", flags=regex.IGNORECASE | regex.UNICODE | regex.MULTILINE
)
_WORDS_CACHED = 8192  # texts whose tokens are kept: a question's answers and its retrieved passages


def normalize(text: str) -> str:
    """Unicode NFD normalization (DPR's ``_normalize``)."""
    return unicodedata.normalize("NFD", text)


def tokenize(text: str) -> list[str]:
    """DPR SimpleTokenizer words of the NFD-normalized text, lower-cased."""
    return list(_words(text))


@functools.lru_cache(maxsize=_WORDS_CACHED)
def _words(text: str) -> tuple[str, ...]:
    """:func:`tokenize`'s words, kept for the texts seen last: the same passage is matched
    against many questions' answers, and the same answers against many passages."""
    return tuple(word.lower() for word in _TOKEN.findall(normalize(text)))


def _contains(haystack: tuple[str, ...], needle: tuple[str, ...]) -> bool:
    """Whether ``needle`` occurs contiguously in ``haystack``, tried only where its first word
    is."""
    n, last = len(needle), len(haystack) - len(needle)
    start = 0
    while start <= last:
        try:
            at = haystack.index(needle[0], start, last + 1)
        except ValueError:
            return False
        if haystack[at : at + n] == needle:
            return True
        start = at + 1
    return False


def _regex_search(pattern: str, text: str) -> bool:
    try:
        compiled = regex.compile(pattern, flags=regex.IGNORECASE | regex.UNICODE | regex.MULTILINE)
    except (regex.error, ValueError, TypeError, OverflowError):
        return False
    return compiled.search(text) is not None


def has_answer(answers: Sequence[str], text: str, match: str = "string") -> bool:
    """Whether the passage ``text`` (never its title) holds one of ``answers``.

    ``match="string"``: an answer's token sequence occurs contiguously in the text's tokens.
    Answers with no tokens (empty or blank) never match; DPR would let them match anything.
    ``match="regex"``: an answer is a case-insensitive pattern searched in the NFD text
    (CuratedTREC); a pattern that does not compile matches nothing.
    """
    if match == "string":
        words = _words(text)
        for answer in answers:
            answer_words = _words(answer)
            if answer_words and _contains(words, answer_words):
                return True
        return False
    if match == "regex":
        text = normalize(text)
        return any(_regex_search(normalize(answer), text) for answer in answers)
    raise ValueError(f"match must be one of {MATCH_TYPES}, got {match!r}")
