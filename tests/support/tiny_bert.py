"""Build a tiny random-init BERT and its WordPiece tokenizer, for offline tests and the toy demo,
and a tiny random-init cross-encoder with the same tokenizer (a teacher for ``dpr-cache score``).

The tokenizer lower-cases and strips accents, like ``bert-base-uncased``. The folders load with
``AutoModel.from_pretrained`` (``AutoModelForSequenceClassification`` for the cross-encoder) and
``AutoTokenizer.from_pretrained`` and need no network.

The vocabulary is learned here rather than with ``tokenizers.trainers.WordPieceTrainer``: that
trainer breaks ties through Rust hash-map order, so its vocabulary changes from run to run.
The learner below is the same frequency-merge scheme with ties broken by the token strings.
"""

from __future__ import annotations

import heapq
import shutil
from collections import Counter, defaultdict
from collections.abc import Iterable, Iterator
from itertools import pairwise
from pathlib import Path

SPECIAL_TOKENS = ["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]"]
PREFIX = "##"
TOKENIZER_FILES = (
    "tokenizer.json",
    "tokenizer_config.json",
    "special_tokens_map.json",
    "vocab.txt",
)


def _bert_pipeline():
    """An empty ``tokenizers.Tokenizer`` with the BERT normalizer (lower-case, no accents)."""
    from tokenizers import Tokenizer, decoders, normalizers, pre_tokenizers
    from tokenizers.models import WordPiece

    tok = Tokenizer(WordPiece({"[UNK]": 0}, unk_token="[UNK]"))
    tok.normalizer = normalizers.BertNormalizer(
        clean_text=True, handle_chinese_chars=True, strip_accents=True, lowercase=True
    )
    tok.pre_tokenizer = pre_tokenizers.BertPreTokenizer()
    tok.decoder = decoders.WordPiece(prefix=PREFIX)
    return tok


def frequent_merges(
    pieces: list[list[str]], freq: list[int], join
) -> Iterator[tuple[tuple[str, str], str]]:
    """Merge the most frequent adjacent pair of symbols over ``pieces`` (each word's symbols,
    the word counted ``freq[i]`` times) again and again, ties broken by the pair's strings, until
    nothing is left to merge; yield each pair and the symbol it became (``join(left, right)``)
    once the merge is applied to every word. Deterministic: no hash order is involved."""
    pair_count: Counter[tuple[str, str]] = Counter()
    holders: defaultdict[tuple[str, str], set[int]] = defaultdict(set)
    for i, syms in enumerate(pieces):
        for pair in pairwise(syms):
            pair_count[pair] += freq[i]
            holders[pair].add(i)
    heap = [(-n, pair) for pair, n in pair_count.items()]
    heapq.heapify(heap)
    while heap:
        neg, pair = heapq.heappop(heap)
        if pair_count.get(pair, 0) != -neg or neg == 0:
            continue  # stale entry
        merged = join(*pair)
        touched: set[tuple[str, str]] = set()
        for i in sorted(holders.pop(pair)):
            syms = pieces[i]
            for old in pairwise(syms):
                pair_count[old] -= freq[i]
                touched.add(old)
            out: list[str] = []
            j = 0
            while j < len(syms):
                if j + 1 < len(syms) and (syms[j], syms[j + 1]) == pair:
                    out.append(merged)
                    j += 2
                else:
                    out.append(syms[j])
                    j += 1
            pieces[i] = out
            for new in pairwise(out):
                pair_count[new] += freq[i]
                holders[new].add(i)
                touched.add(new)
        for p in sorted(touched):
            if pair_count[p] > 0:
                heapq.heappush(heap, (-pair_count[p], p))
            else:
                pair_count.pop(p, None)
                holders.pop(p, None)
        yield pair, merged


def learn_wordpiece_vocab(word_counts: Counter[str], vocab_size: int) -> list[str]:
    """Learn WordPiece tokens by repeatedly merging the most frequent adjacent pair
    (:func:`frequent_merges`).

    Starts from every character, word-initial and ``##``-continued; stops at ``vocab_size``
    tokens (special tokens included) or when nothing is left to merge. Deterministic.
    """
    words = sorted(word_counts)
    freq = [word_counts[w] for w in words]
    pieces = [[w[0]] + [PREFIX + c for c in w[1:]] for w in words]
    chars = sorted({c for w in words for c in w})
    vocab = SPECIAL_TOKENS + chars + [PREFIX + c for c in chars]
    seen = set(vocab)
    if len(vocab) >= vocab_size:
        return vocab
    for _, merged in frequent_merges(pieces, freq, lambda left, right: left + right[len(PREFIX) :]):
        if merged not in seen:
            seen.add(merged)
            vocab.append(merged)
        if len(vocab) >= vocab_size:
            break
    return vocab


def train_wordpiece(texts: Iterable[str], vocab_size: int):
    """A BERT WordPiece ``tokenizers.Tokenizer`` with a vocabulary learned on ``texts``."""
    from tokenizers import processors
    from tokenizers.models import WordPiece

    tok = _bert_pipeline()
    counts: Counter[str] = Counter()
    for text in texts:
        normalized = tok.normalizer.normalize_str(text)
        counts.update(word for word, _ in tok.pre_tokenizer.pre_tokenize_str(normalized))
    tokens = learn_wordpiece_vocab(counts, vocab_size)
    tok.model = WordPiece(
        {t: i for i, t in enumerate(tokens)}, unk_token="[UNK]", continuing_subword_prefix=PREFIX
    )
    tok.add_special_tokens(SPECIAL_TOKENS)
    tok.post_processor = processors.TemplateProcessing(
        single="[CLS]:0 $A:0 [SEP]:0",
        pair="[CLS]:0 $A:0 [SEP]:0 $B:1 [SEP]:1",
        special_tokens=[("[CLS]", tokens.index("[CLS]")), ("[SEP]", tokens.index("[SEP]"))],
    )
    return tok


def build_tiny_bert(
    texts: Iterable[str],
    out_dir: Path,
    *,
    vocab_size: int = 2000,
    hidden: int = 64,
    layers: int = 2,
    heads: int = 2,
    intermediate: int = 128,
    max_positions: int = 256,
    seed: int = 0,
) -> Path:
    """Write a WordPiece tokenizer trained on ``texts`` and a random-init ``BertModel`` to out_dir.

    The vocabulary may end up smaller than ``vocab_size`` on a small text set; the model's
    embedding matrix matches it. The same texts, sizes and seed give byte-identical files.
    """
    import torch
    from transformers import BertConfig, BertModel, BertTokenizerFast

    out_dir = Path(out_dir)
    out_dir.mkdir(parents=True, exist_ok=True)

    backend = train_wordpiece(texts, vocab_size)
    tokenizer = BertTokenizerFast(
        tokenizer_object=backend,
        do_lower_case=True,
        strip_accents=True,
        tokenize_chinese_chars=True,
        unk_token="[UNK]",
        sep_token="[SEP]",
        pad_token="[PAD]",
        cls_token="[CLS]",
        mask_token="[MASK]",
        model_max_length=max_positions,
    )
    tokenizer.save_pretrained(str(out_dir))

    config = BertConfig(
        vocab_size=backend.get_vocab_size(),
        hidden_size=hidden,
        num_hidden_layers=layers,
        num_attention_heads=heads,
        intermediate_size=intermediate,
        max_position_embeddings=max_positions,
        type_vocab_size=2,
        pad_token_id=backend.token_to_id("[PAD]"),
    )
    rng = torch.random.get_rng_state()
    try:
        torch.manual_seed(seed)
        model = BertModel(config)
    finally:
        torch.random.set_rng_state(rng)
    model.save_pretrained(str(out_dir))
    return out_dir


def build_tiny_cross_encoder(
    bert_dir: Path,
    out_dir: Path,
    *,
    num_labels: int = 1,
    hidden: int = 8,
    layers: int = 2,
    heads: int = 2,
    intermediate: int = 16,
    init_std: float = 0.5,
    seed: int = 0,
) -> Path:
    """Write a random-init ``BertForSequenceClassification`` (``num_labels`` logits) and a copy of
    the tokenizer files of the tiny BERT in ``bert_dir`` to out_dir: a cross-encoder for offline
    tests.

    Its weights are drawn with std ``init_std`` (BERT's is 0.02), so that its scores spread over
    about a unit, as a trained cross-encoder's logits do, rather than all rounding to one value.
    The same folder, sizes and seed give byte-identical files.
    """
    import torch
    from transformers import AutoTokenizer, BertConfig, BertForSequenceClassification

    out_dir = Path(out_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    for name in TOKENIZER_FILES:
        if (Path(bert_dir) / name).is_file():
            shutil.copyfile(Path(bert_dir) / name, out_dir / name)
    tokenizer = AutoTokenizer.from_pretrained(out_dir)
    config = BertConfig(
        vocab_size=len(tokenizer),
        hidden_size=hidden,
        num_hidden_layers=layers,
        num_attention_heads=heads,
        intermediate_size=intermediate,
        max_position_embeddings=tokenizer.model_max_length,
        type_vocab_size=2,
        pad_token_id=tokenizer.pad_token_id,
        initializer_range=init_std,
        num_labels=num_labels,
    )
    rng = torch.random.get_rng_state()
    try:
        torch.manual_seed(seed)
        model = BertForSequenceClassification(config)
    finally:
        torch.random.set_rng_state(rng)
    model.save_pretrained(str(out_dir))
    return out_dir
