"""Build data/toy/ from the SQuAD v1.1 dev split in DPR's formats: corpus, train file, dev qas,
tiny BERT, tiny cross-encoder, tiny decoders.

The source is what ``dpr-cache data squad`` writes to data/squad/ from the shipped
``dev-v1.1.json.gz``. Run from the repo root with the package installed:
    dpr-cache data squad && python scripts/build_toy.py [--src DIR] [--out DIR]
Re-running gives the same files; the folder is replaced whole, never left half-written.
"""

from __future__ import annotations

import argparse
import csv
import hashlib
import json
import math
import sys
from collections import defaultdict
from functools import cache
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))  # the tiny BERT builder lives with the tests that check it

from dpr_cache.data.answers import has_answer, tokenize  # noqa: E402
from dpr_cache.data.qas import qas_line  # noqa: E402
from dpr_cache.runtime.atomic import write_dir_atomic  # noqa: E402
from tests.support.tiny_bert import build_tiny_bert, build_tiny_cross_encoder  # noqa: E402
from tests.support.tiny_decoder import KINDS as DECODER_KINDS  # noqa: E402
from tests.support.tiny_decoder import build_tiny_decoder  # noqa: E402

DEFAULT_SRC = ROOT / "data" / "squad"
DEFAULT_OUT = ROOT / "data" / "toy"

# Whole articles of the source's *train* split with short paragraphs and distinct topics.
ARTICLES = (
    "Super Bowl 50",
    "Normans",
    "Computational complexity theory",
    "Teacher",
    "Victoria (Australia)",
    "Sky (United Kingdom)",
    "Amazon rainforest",
)
TRAIN_QUESTIONS = 300  # keeps data/toy under 2 MB (~2.2 kB a line); spread evenly over passages
HARD_NEGATIVES = 2
STOPWORDS = frozenset(
    "a an and are as at be by did do does for from had has have how in is it its of on or that "
    "the this to was were what when where which who whom whose why with".split()
)


def order_key(question_id: str) -> str:
    """A fixed pseudo-random order for questions (the SQuAD ids are hex strings)."""
    return hashlib.sha1(question_id.encode()).hexdigest()


def read_passages(path: Path) -> list[tuple[str, str, str]]:
    """Rows (id, text, title) of a DPR passages TSV."""
    with path.open(encoding="utf-8", newline="") as f:
        rows = csv.reader(f, delimiter="\t")
        if next(rows) != ["id", "text", "title"]:
            raise ValueError(f"{path}: expected header id, text, title")
        return [(pid, text, title) for pid, text, title in rows]


def read_questions(paths: list[Path], passage_ids: set[str]) -> dict[str, list[dict]]:
    """Questions whose gold passage is in ``passage_ids`` and holds an answer, by passage id."""
    by_passage: dict[str, list[dict]] = defaultdict(list)
    for path in paths:
        with path.open(encoding="utf-8") as f:
            for line in f:
                obj = json.loads(line)
                gold = obj["positive_ctxs"][0]
                if gold["passage_id"] in passage_ids and has_answer(obj["answers"], gold["text"]):
                    by_passage[gold["passage_id"]].append(obj)
    for questions in by_passage.values():
        questions.sort(key=lambda q: order_key(q["id"]))
    return by_passage


def split_questions(by_passage: dict[str, list[dict]]) -> tuple[list[dict], list[dict]]:
    """Hold out one question of every passage that has two or more for dev; spread the train
    budget evenly over passages, skipping questions whose text is also a dev question."""
    dev, pools = [], []
    for pid in sorted(by_passage, key=int):
        questions = by_passage[pid]
        n_dev = 1 if len(questions) > 1 else 0
        dev.extend(questions[:n_dev])
        pools.append(questions[n_dev:])
    dev_texts = {q["question"].strip().lower() for q in dev}
    pools = [[q for q in p if q["question"].strip().lower() not in dev_texts] for p in pools]
    train: list[dict] = []
    depth = 0
    while len(train) < TRAIN_QUESTIONS and any(len(p) > depth for p in pools):
        layer = sorted(
            (p[depth] for p in pools if len(p) > depth), key=lambda q: order_key(q["id"])
        )
        train.extend(layer[: TRAIN_QUESTIONS - len(train)])
        depth += 1
    return train, dev


@cache
def content_words(text: str) -> frozenset[str]:
    return frozenset(t for t in tokenize(text) if t.isalnum() and t not in STOPWORDS)


def hard_negatives(question: dict, article: list[tuple[str, str, str]]) -> list[dict]:
    """Passages of the same article without any answer, ranked by shared question words.

    The count of shared non-stopwords is divided by the square root of the passage's number of
    distinct non-stopwords, so long paragraphs do not win by length alone.
    """
    gold = question["positive_ctxs"][0]["passage_id"]
    words = content_words(question["question"])
    scored = []
    for pid, text, title in article:
        if pid == gold or has_answer(question["answers"], text):
            continue
        passage_words = content_words(text)
        score = len(words & passage_words) / math.sqrt(max(1, len(passage_words)))
        scored.append((-score, int(pid), pid, text, title))
    scored.sort()
    return [
        {"passage_id": pid, "title": title, "text": text}
        for _, _, pid, text, title in scored[:HARD_NEGATIVES]
    ]


def write_passages(path: Path, rows: list[tuple[str, str, str]]) -> None:
    with path.open("w", encoding="utf-8", newline="") as f:
        writer = csv.writer(f, delimiter="\t", lineterminator="\n")
        writer.writerow(["id", "text", "title"])
        writer.writerows(rows)


def write_train(path: Path, train: list[dict], articles: dict[str, list]) -> int:
    """Write DPR training objects; returns how many got the full number of hard negatives."""
    full = 0
    with path.open("w", encoding="utf-8") as f:
        for q in train:
            gold = q["positive_ctxs"][0]
            negatives = hard_negatives(q, articles[gold["title"]])
            full += len(negatives) == HARD_NEGATIVES
            obj = {
                "id": q["id"],
                "question": q["question"],
                "answers": q["answers"],
                "positive_ctxs": [
                    {"passage_id": gold["passage_id"], "title": gold["title"], "text": gold["text"]}
                ],
                "hard_negative_ctxs": negatives,
                "negative_ctxs": [],
            }
            f.write(json.dumps(obj, ensure_ascii=False) + "\n")
    return full


def write_dev_qa(path: Path, dev: list[dict]) -> None:
    with path.open("w", encoding="utf-8") as f:
        for q in dev:
            f.write(qas_line(q["question"], q["answers"]))


README = """\
# Toy corpus (SQuAD v1.1 excerpt), tiny BERT and tiny cross-encoder

A small retrieval set for the demo (`make demo`, `configs/toy.yaml`) and the tests. It is **not**
a benchmark: it exists so that a tiny model trained for under a minute can show that it learns.

## Source and license

Derived from the SQuAD v1.1 development set: Rajpurkar, Zhang, Lopyrev and Liang, "SQuAD:
100,000+ Questions for Machine Comprehension of Text", EMNLP 2016
(https://rajpurkar.github.io/SQuAD-explorer/). SQuAD is licensed under CC BY-SA 4.0; these derived
files are shared under the same license (CC BY-SA 4.0). The text is unchanged.

## How it was built

`python scripts/build_toy.py` (deterministic) reads the SQuAD dev set in DPR's formats, as
`dpr-cache data squad` writes it to `data/squad/` from the shipped `dev-v1.1.json.gz`, and writes
this folder:

- **Corpus**: every paragraph of {n_articles} whole articles, one passage per paragraph, with the
  original passage ids. All {n_articles} are from that set's train split:
{articles}
- **Dev questions**: one question of every paragraph that has two or more ({n_dev} of the
  {n_questions} questions of these articles), the first in a fixed pseudo-random order (SHA-1 of
  the SQuAD question id).
- **Train questions**: the remaining questions, spread evenly over the paragraphs (one per paragraph
  first, then a second, ...) up to a budget of {budget} to keep the folder small. No train
  question has the text of a dev question, but both share the corpus, and a dev question's gold
  paragraph usually has a train question too. That makes the task easy on purpose.
- **Hard negatives**: {hard} per train question: other paragraphs of the same article that hold
  none of the answers (DPR's `has_answer`), ranked by the number of non-stopword question words
  they contain divided by the square root of their number of distinct non-stopwords.
- **tiny-bert/**: a random-init BERT (hidden 64, 2 layers, 2 heads, 256 positions, seed 0) with a
  lower-casing, accent-stripping WordPiece vocabulary (at most 2,000 tokens) learned on the corpus
  passages, titles and train questions (`tests.support.tiny_bert.build_tiny_bert`).
- **tiny-cross-encoder/**: a random-init `BertForSequenceClassification` with one logit (hidden 8,
  2 layers, 2 heads, 256 positions, weights drawn with std 0.5 so that its scores spread over about
  a unit, seed 0) and a copy of tiny-bert's tokenizer: a teacher for `dpr-cache score` in the
  tests (`tests.support.tiny_bert.build_tiny_cross_encoder`). Its scores mean nothing.
- **tiny-llama/**, **tiny-qwen2/**: random-init decoder LLMs shaped as Llama and Qwen2 (hidden
  32, 2 layers, 4 query and 2 key-value heads, 256 positions, seed 0, saved as `*ForCausalLM`)
  with byte-level BPE vocabularies (512 tokens) learned on the same texts; Llama's tokenizer puts
  BOS first, has no pad token and pads on the left, Qwen2's pads with its EOS on the right: the
  towers of `configs/toy_llm.yaml` and the decoder tests (`tests.support.tiny_decoder`,
  `scripts/build_tiny_decoders.py` rebuilds them alone).

## Files

| file | rows | content |
|------|-----:|---------|
| `passages.tsv` | {n_passages} | DPR wiki TSV, header `id`, `text`, `title`, csv quoting |
| `train.jsonl` | {n_train} | DPR training objects (one a line), extra key `id` |
| `dev.qa.tsv` | {n_dev} | DPR qas: `question<TAB>["answer", ...]`, no header |
| `tiny-bert/` | - | Hugging Face folder: `AutoModel` / `AutoTokenizer` load it offline |
| `tiny-cross-encoder/` | - | Hugging Face folder for `AutoModelForSequenceClassification` |
| `tiny-llama/`, `tiny-qwen2/` | - | Hugging Face causal LM folders: `AutoModel` loads the base |

{n_full} of {n_train} train questions have {hard} hard negatives.
"""


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--src", type=Path, default=DEFAULT_SRC)
    parser.add_argument("--out", type=Path, default=DEFAULT_OUT)
    args = parser.parse_args(argv)

    corpus = [row for row in read_passages(args.src / "passages.tsv") if row[2] in ARTICLES]
    articles: dict[str, list] = defaultdict(list)
    for row in corpus:
        articles[row[2]].append(row)
    missing = set(ARTICLES) - set(articles)
    if missing:
        raise SystemExit(f"error: articles not found in {args.src}: {sorted(missing)}")

    by_passage = read_questions(
        [args.src / "train.jsonl", args.src / "dev.jsonl"], {row[0] for row in corpus}
    )
    train, dev = split_questions(by_passage)

    counts = {}

    def build(out: Path) -> None:
        out.mkdir(parents=True)
        write_passages(out / "passages.tsv", corpus)
        counts["full"] = write_train(out / "train.jsonl", train, articles)
        write_dev_qa(out / "dev.qa.tsv", dev)
        texts = [text for _, text, _ in corpus] + list(ARTICLES) + [q["question"] for q in train]
        build_tiny_bert(texts, out / "tiny-bert")
        build_tiny_cross_encoder(out / "tiny-bert", out / "tiny-cross-encoder")
        for kind in DECODER_KINDS:
            build_tiny_decoder(texts, out / f"tiny-{kind}", kind=kind)
        (out / "README.md").write_text(
            README.format(
                n_articles=len(ARTICLES),
                articles="\n".join(f"  - {a}" for a in ARTICLES),
                n_questions=sum(len(qs) for qs in by_passage.values()),
                budget=TRAIN_QUESTIONS,
                hard=HARD_NEGATIVES,
                n_passages=len(corpus),
                n_train=len(train),
                n_dev=len(dev),
                n_full=counts["full"],
            ),
            encoding="utf-8",
        )

    write_dir_atomic(args.out, build)
    n_full = counts["full"]
    print(
        f"{len(corpus)} passages, {len(train)} train ({n_full} with {HARD_NEGATIVES} hard "
        f"negatives), {len(dev)} dev -> {args.out}"
    )


if __name__ == "__main__":
    main()
