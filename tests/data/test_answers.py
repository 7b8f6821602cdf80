"""DPR answer matching: tokenization, string/regex has_answer, top-k hit rates."""

from __future__ import annotations

import json
import random
from pathlib import Path

import pytest

from dpr_cache.data.answers import _contains, has_answer, tokenize
from tests.support.dpr_answers import dpr_has_answer


def test_tokens_are_alphanumeric_runs_or_single_symbols() -> None:
    assert tokenize("Hello, World! It's 3.5km.") == [
        "hello",
        ",",
        "world",
        "!",
        "it",
        "'",
        "s",
        "3",
        ".",
        "5km",
        ".",
    ]


def test_combining_marks_stay_in_their_token() -> None:
    # NFD splits "é" into "e" + U+0301; the mark is category M, so it stays inside the word.
    assert tokenize("Beyoncé") == ["beyonce\u0301"]


def test_accents_are_kept_not_stripped() -> None:
    # DPR only decomposes accents (NFD) and never removes them: "Beyoncé" becomes the token
    # "beyonce" + U+0301, which differs from "beyonce", so the accent-less spelling does not match.
    assert not has_answer(["Beyonce"], "Beyoncé Knowles was born in Houston.")
    assert not has_answer(["Beyoncé"], "Beyonce Knowles was born in Houston.")
    # Composed (U+00E9) and decomposed (e + U+0301) spellings are the same after NFD.
    assert has_answer(["Beyonc\u00e9"], "Beyonce\u0301 Knowles was born in Houston.")
    assert has_answer(["Beyonce\u0301"], "Beyonc\u00e9 Knowles was born in Houston.")


def test_case_is_ignored() -> None:
    assert has_answer(["denver broncos"], "The DENVER Broncos won.")
    assert has_answer(["NEW YORK"], "He moved to new york in 1884.")


def test_punctuation_is_its_own_token() -> None:
    text = "He moved to the U.S. in 1884."
    assert has_answer(["U.S."], text)
    # "US" is one token, "U.S." is four: u . s .
    assert not has_answer(["US"], text)
    # Surrounding punctuation in the passage does not hide the answer.
    assert has_answer(["1884"], "(born 1884)")
    assert has_answer(["Levi's Stadium"], "played at Levi's Stadium in Santa Clara")


def test_answer_inside_a_longer_word_does_not_match() -> None:
    assert not has_answer(["four"], "He was the fourth of five children.")
    assert has_answer(["four"], "He had four siblings.")
    assert not has_answer(["cat"], "A concatenation of strings.")


def test_multi_token_answers_must_be_contiguous_and_in_order() -> None:
    text = "Super Bowl 50 was played at Levi's Stadium in Santa Clara, California."
    assert has_answer(["Santa Clara, California"], text)
    assert has_answer(["Santa Clara California"], text.replace(",", ""))
    assert not has_answer(["Santa Clara California"], text)  # the comma is a token
    assert not has_answer(["California Santa Clara"], text)
    assert not has_answer(["Stadium Santa"], text)


def test_any_of_several_answers_suffices() -> None:
    assert has_answer(["Denver", "Carolina Panthers"], "The Carolina Panthers lost.")
    assert not has_answer([], "anything")


def test_empty_answer_never_matches() -> None:
    assert not has_answer([""], "Some text.")
    assert not has_answer(["   "], "Some text.")


def test_title_is_not_searched() -> None:
    # has_answer only sees the passage text; a caller that passes the text alone (as DPR does)
    # must not find an answer that is only in the title.
    title, text = "Nikola Tesla", "He was born in 1856 in Smiljan."
    assert has_answer(["Tesla"], title)
    assert not has_answer(["Tesla"], text)


def test_regex_mode_is_case_insensitive_search_over_nfd_text() -> None:
    text = "The Eiffel Tower was completed in 1889 in Paris."
    assert has_answer([r"18[0-9]{2}"], text, match="regex")
    assert has_answer([r"eiffel\s+tower"], text, match="regex")
    # A regex search is not token-bound: it matches inside words.
    assert has_answer(["our"], "the fourth one", match="regex")
    assert not has_answer([r"19[0-9]{2}"], text, match="regex")
    # Composed pattern vs decomposed text: both are NFD-normalized first.
    assert has_answer(["Beyonc\u00e9"], "Beyonce\u0301 sang.", match="regex")


def test_bad_regex_does_not_match_or_crash() -> None:
    assert not has_answer(["(unclosed", "[a-"], "(unclosed [a-", match="regex")
    assert has_answer(["(unclosed", "Paris"], "in paris", match="regex")


def test_unknown_match_type_is_an_error() -> None:
    with pytest.raises(ValueError, match="match"):
        has_answer(["a"], "a", match="fuzzy")


def test_contiguous_search_against_every_window() -> None:
    rng = random.Random(0)
    for _ in range(3000):
        haystack = tuple(rng.choice("abc") for _ in range(rng.randint(0, 9)))
        needle = tuple(rng.choice("abc") for _ in range(rng.randint(1, 4)))
        windows = {haystack[i : i + len(needle)] for i in range(len(haystack) - len(needle) + 1)}
        assert _contains(haystack, needle) == (needle in windows), (haystack, needle)


def test_squad_answers_against_every_passage_as_dpr_matches(squad_build) -> None:
    # each question's answers against passages of its own article (many hits) and of others,
    # each text seen again and again as in a results file: the same flags as DPR's rule
    records = [json.loads(line) for line in (squad_build[0] / "dev.jsonl").open()][:400]
    texts = [ctx["text"] for r in records for ctx in r["positive_ctxs"]]
    flags, want = [], []
    for i, record in enumerate(records):
        for text in texts[max(0, i - 20) : i + 20]:
            flags.append(has_answer(record["answers"], text))
            want.append(dpr_has_answer(record["answers"], text))
    assert flags == want and 0.05 < sum(want) / len(want) < 0.95


def test_tokens_handed_out_are_the_callers_own() -> None:
    words = tokenize("the same text")
    words.append("changed")
    assert tokenize("the same text") == ["the", "same", "text"]


def _gold_misses(path: Path) -> list[str]:
    misses = []
    with path.open(encoding="utf-8") as f:
        for line in f:
            obj = json.loads(line)
            if not has_answer(obj["answers"], obj["positive_ctxs"][0]["text"]):
                misses.append(obj["id"])
    return misses


def test_every_squad_train_question_has_answer_in_its_gold_passage(squad_build) -> None:
    assert _gold_misses(squad_build[0] / "train.jsonl") == []


def test_exactly_one_squad_dev_question_misses_its_gold_passage(squad_build) -> None:
    # "How many siblings did Tesla have?": the answer "four" only occurs inside "fourth".
    assert _gold_misses(squad_build[0] / "dev.jsonl") == ["56dfa1d34a1a83140091ebd4"]
