"""A check of the mining filter: the mined negatives that hold an answer under looser rules than
DPR's (which every one of them passed), counted, and a sample of them kept for reading.

DPR's rule: an answer's tokens (NFD, DPR's simple tokenizer, lower case) occur contiguously in
the passage text. Looser, each on its own:
- ``prefix``: the answer (3 characters or more) starts a word of the text, case aside, wherever
  that word ends (so "four" in "fourth", "Tesla" in "Tesla's");
- ``words``: every word of the answer occurs somewhere in the text, in any order.
A mined negative flagged by either may still be a true negative (the words occur, but the passage
does not answer the question); reading the sample tells how many are false negatives.

    python -m studies.squad_hard_negatives.filter_check --mined runs/.../train.mined.jsonl \
        --out runs/.../filter_check.json
"""

from __future__ import annotations

import argparse
import json
import random
import re
from pathlib import Path

from dpr_cache.data.answers import has_answer, tokenize
from dpr_cache.runtime.atomic import write_json_atomic

SAMPLE = 25


def looser(answers: list[str], text: str) -> list[str]:
    """The looser rules (above) under which ``text`` holds one of ``answers``."""
    words = set(tokenize(text))
    found = []
    prefix = [
        re.compile(r"\b" + re.escape(a.strip()), re.I) for a in answers if len(a.strip()) >= 3
    ]
    if any(pattern.search(text) for pattern in prefix):
        found.append("prefix")
    if any(tokenize(a) and set(tokenize(a)) <= words for a in answers):
        found.append("words")
    return found


def snippet(text: str, answers: list[str], width: int = 160) -> str:
    """The text around the first place an answer occurs (lower-cased search)."""
    at = min(
        (text.lower().find(a.lower()) for a in answers if a.lower() in text.lower()), default=0
    )
    start = max(0, at - width // 2)
    return ("..." if start else "") + text[start : start + width] + "..."


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--mined", type=Path, required=True)
    parser.add_argument("--out", type=Path, required=True)
    args = parser.parse_args()
    negatives = flagged_total = 0
    by_rule = {"prefix": 0, "words": 0}
    flagged = []
    for line in args.mined.open(encoding="utf-8"):
        record = json.loads(line)
        for ctx in record["hard_negative_ctxs"]:
            negatives += 1
            assert not has_answer(record["answers"], ctx["text"])  # DPR's rule held
            rules = looser(record["answers"], ctx["text"])
            for rule in rules:
                by_rule[rule] += 1
            if rules:
                flagged_total += 1
                flagged.append(
                    {
                        "question": record["question"],
                        "answers": record["answers"],
                        "passage_id": ctx["passage_id"],
                        "title": ctx["title"],
                        "rules": rules,
                        "snippet": snippet(ctx["text"], record["answers"]),
                    }
                )
    sample = random.Random(0).sample(flagged, min(SAMPLE, len(flagged)))
    result = {
        "mined_negatives": negatives,
        "flagged": flagged_total,
        "by_rule": by_rule,
        "sample": sample,
    }
    write_json_atomic(args.out, result)
    print(
        f"{flagged_total} of {negatives} mined negatives hold an answer under a looser rule "
        f"({by_rule}); a sample of {len(sample)} in {args.out}"
    )


if __name__ == "__main__":
    main()
