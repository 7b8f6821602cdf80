"""Build tiny random-init decoder LLMs (Llama- and Qwen2-shaped) with a byte-level BPE tokenizer
learned on given texts, for offline tests and the toy LLM config: nothing is downloaded.

Each folder is laid out as a causal LM on the hub is (``config.json`` of ``*ForCausalLM``,
``model.safetensors``, ``tokenizer.json``, ``tokenizer_config.json``), so ``AutoModel`` loads
its base model and ``AutoTokenizer`` its tokenizer. Their tokenizers differ as the families'
do: ``llama`` puts BOS before each text (``<s>``), has no pad token and pads on the left;
``qwen2`` adds no special token, pads with its EOS (``<|endoftext|>``) on the right. Neither
appends EOS: last-token pooling has dpr-cache append it.

The merges are learned here rather than with ``tokenizers.trainers.BpeTrainer``, which breaks
ties through Rust hash-map order (its vocabulary changes from run to run): the most frequent
adjacent pair is merged first, ties broken by the pair's strings. The same texts, sizes and seed
give byte-identical folders.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Iterable
from pathlib import Path

from tests.support.tiny_bert import frequent_merges

__all__ = ["KINDS", "learn_bpe_merges", "train_byte_bpe", "build_tiny_decoder"]

# kind -> (special tokens, BOS, EOS, pad, padding side)
KINDS = {
    "llama": (["<unk>", "<s>", "</s>"], "<s>", "</s>", None, "left"),
    "qwen2": (["<|endoftext|>"], None, "<|endoftext|>", "<|endoftext|>", "right"),
}


def learn_bpe_merges(word_counts: Counter[str], n_merges: int) -> list[tuple[str, str]]:
    """Up to ``n_merges`` BPE merges over ``word_counts`` (words as their byte-level
    characters): the most frequent adjacent pair first, ties broken by the pair
    (:func:`~tests.support.tiny_bert.frequent_merges`, the WordPiece learner's). Deterministic."""
    words = sorted(word_counts)
    pieces = [list(w) for w in words]
    merges: list[tuple[str, str]] = []
    if n_merges <= 0:
        return merges
    freq = [word_counts[w] for w in words]
    for pair, _ in frequent_merges(pieces, freq, lambda left, right: left + right):
        merges.append(pair)
        if len(merges) >= n_merges:
            break
    return merges


def train_byte_bpe(texts: Iterable[str], vocab_size: int, specials: list[str]):
    """A byte-level BPE ``tokenizers.Tokenizer`` (GPT-2's pre-tokenizer, as Llama-3 and Qwen2
    use) with ``specials`` first, the 256 byte symbols, then merges learned on ``texts`` up to
    ``vocab_size`` tokens; no template (no special token added)."""
    from tokenizers import Tokenizer, decoders, pre_tokenizers, processors
    from tokenizers.models import BPE

    pre = pre_tokenizers.ByteLevel(add_prefix_space=False)
    counts: Counter[str] = Counter()
    for text in texts:
        counts.update(word for word, _ in pre.pre_tokenize_str(text))
    alphabet = sorted(pre_tokenizers.ByteLevel.alphabet())
    merges = learn_bpe_merges(counts, vocab_size - len(specials) - len(alphabet))
    tokens = specials + alphabet + [a + b for a, b in merges]
    vocab = {token: i for i, token in enumerate(dict.fromkeys(tokens))}
    tok = Tokenizer(BPE(vocab, merges, unk_token=None, fuse_unk=False))
    tok.pre_tokenizer = pre
    tok.decoder = decoders.ByteLevel()
    tok.post_processor = processors.ByteLevel(trim_offsets=False)
    tok.add_special_tokens(specials)
    return tok


def _model(kind: str, tokenizer, hidden: int, layers: int, max_positions: int):
    """A random-init causal LM of ``kind`` sized for ``tokenizer``."""
    from transformers import LlamaConfig, LlamaForCausalLM, Qwen2Config, Qwen2ForCausalLM

    config_class, model_class = {
        "llama": (LlamaConfig, LlamaForCausalLM),
        "qwen2": (Qwen2Config, Qwen2ForCausalLM),
    }[kind]
    config = config_class(
        vocab_size=len(tokenizer),
        hidden_size=hidden,
        intermediate_size=2 * hidden,
        num_hidden_layers=layers,
        num_attention_heads=4,
        num_key_value_heads=2,  # grouped-query attention, as Llama-3, Mistral and Qwen2 do
        max_position_embeddings=max_positions,
        tie_word_embeddings=True,
        bos_token_id=tokenizer.bos_token_id,
        eos_token_id=tokenizer.eos_token_id,
        pad_token_id=tokenizer.pad_token_id,
    )
    return model_class(config)


def build_tiny_decoder(
    texts: Iterable[str],
    out_dir: Path,
    *,
    kind: str = "llama",
    vocab_size: int = 512,
    hidden: int = 32,
    layers: int = 2,
    max_positions: int = 256,
    seed: int = 0,
) -> Path:
    """Write a byte-level BPE tokenizer learned on ``texts`` and a random-init decoder of
    ``kind`` (``llama`` or ``qwen2``, see :data:`KINDS`) to ``out_dir``."""
    import torch
    from transformers import PreTrainedTokenizerFast

    specials, bos, eos, pad, side = KINDS[kind]
    backend = train_byte_bpe(texts, vocab_size, specials)
    if bos is not None:  # Llama's template: BOS before each text of a pair
        from tokenizers import processors

        bos_id = backend.token_to_id(bos)
        backend.post_processor = processors.TemplateProcessing(
            single=f"{bos}:0 $A:0",
            pair=f"{bos}:0 $A:0 {bos}:1 $B:1",
            special_tokens=[(bos, bos_id)],
        )
    tokenizer = PreTrainedTokenizerFast(
        tokenizer_object=backend,
        bos_token=bos,
        eos_token=eos,
        pad_token=pad,
        unk_token="<unk>" if "<unk>" in specials else None,
        padding_side=side,
        model_input_names=["input_ids", "attention_mask"],
        model_max_length=max_positions,
        clean_up_tokenization_spaces=False,
    )
    out_dir = Path(out_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    tokenizer.save_pretrained(str(out_dir))
    rng = torch.random.get_rng_state()
    try:
        torch.manual_seed(seed)
        model = _model(kind, tokenizer, hidden, layers, max_positions)
    finally:
        torch.random.set_rng_state(rng)
    model.save_pretrained(str(out_dir))
    return out_dir
