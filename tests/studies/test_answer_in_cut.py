"""The study's count of answers that survive the training cut of the positive passage."""

from __future__ import annotations

import json

from dpr_cache.data.answers import has_answer
from dpr_cache.model.towers import load_tokenizer
from dpr_cache.runtime.atomic import read_lines
from studies.squad_batch_size.answer_in_cut import answer_kept
from tests.support.fixtures import TOY


def test_uncut_passages_keep_every_answer_their_text_holds_and_short_cuts_lose_some():
    rows = [json.loads(line) for line in read_lines(TOY / "train.jsonl")][:60]
    tokenizer = load_tokenizer(TOY / "tiny-bert")
    in_text = sum(has_answer(r["answers"], r["positive_ctxs"][0]["text"]) for r in rows)
    assert in_text > 0
    assert answer_kept(rows, tokenizer, 512) == in_text  # no cut: the text's own answers
    assert answer_kept(rows, tokenizer, 16) < in_text  # a short cut drops answers
