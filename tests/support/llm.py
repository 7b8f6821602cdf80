"""The committed tiny decoders as the tests use them: a BiEncoder on one with last-token pooling
(LoRA on or off, either padding side), made to look trained, and real toy texts tokenized by it
into a batch with ragged padding."""

from __future__ import annotations

import csv
import json
from types import SimpleNamespace

import torch

from dpr_cache.data.tokenize import encode_passages, encode_questions
from dpr_cache.model.biencoder import BiEncoder
from tests.support.fixtures import TOY

__all__ = [
    "DECODERS",
    "lora_settings",
    "decoder_model",
    "toy_batch",
    "toy_texts",
    "float64_norms",
]

DECODERS = {"llama": TOY / "tiny-llama", "qwen2": TOY / "tiny-qwen2"}


def lora_settings(dropout: float = 0.0, targets="all-linear", r: int = 4) -> SimpleNamespace:
    """``model.lora`` as the config section gives it (r, alpha, dropout, target_modules)."""
    return SimpleNamespace(r=r, alpha=2.0 * r, dropout=dropout, target_modules=targets)


def decoder_model(
    kind: str = "llama",
    *,
    lora: SimpleNamespace | None = None,
    shared: bool = False,
    checkpointing: bool = False,
    dropout: float | None = 0.0,
    side: str | None = None,
    seed: int = 0,
) -> BiEncoder:
    """A BiEncoder on the tiny decoder ``kind`` with last-token pooling, its adapters' B
    matrices (zero at init, which would leave A without a gradient) and, for separate towers,
    the passage tower's trainable weights moved off their start, as training leaves them;
    ``side`` the tokenizer's padding side (None: its own)."""
    torch.manual_seed(seed)
    model = BiEncoder.from_pretrained(
        DECODERS[kind],
        shared=shared,
        pooling="last",
        gradient_checkpointing=checkpointing,
        dropout=dropout,
        lora=lora,
    )
    if side is not None:
        model.tokenizer.padding_side = side
    with torch.no_grad():
        for name, param in model.named_parameters():
            if "lora_B" in name:
                param.normal_(0.0, 0.05)
        if not shared:
            for param in model.passage_encoder.parameters():
                if param.requires_grad:
                    param.add_(0.02 * torch.randn_like(param))
    return model


def toy_texts(n: int, offset: int = 0) -> tuple[list[str], list[tuple[str, str]]]:
    """``n`` train questions and ``n`` passages (title, text) of the toy corpus."""
    with (TOY / "train.jsonl").open(encoding="utf-8") as f:
        questions = [json.loads(line)["question"] for line in f][offset : offset + n]
    with (TOY / "passages.tsv").open(encoding="utf-8", newline="") as f:
        rows = list(csv.DictReader(f, delimiter="\t"))[offset : offset + n]
    return questions, [(row["title"], row["text"]) for row in rows]


def toy_batch(tokenizer, n_q: int, hard_negatives: int, *, prefix: str = ""):
    """Questions and their passage groups (positive and ``hard_negatives`` hard negatives) of
    the toy corpus, tokenized with ragged lengths (passages cut at various limits), padded on
    the tokenizer's side; the passage ids."""
    group = 1 + hard_negatives
    questions, _ = toy_texts(n_q)
    _, pairs = toy_texts(n_q * group, offset=n_q)
    q_inputs = encode_questions(tokenizer, questions, 24, prefix=prefix)
    titles = [t for t, _ in pairs]
    texts = [x[: 20 + 15 * (i % 5)] for i, (_, x) in enumerate(pairs)]  # ragged lengths
    p_inputs = encode_passages(tokenizer, titles, texts, 40)
    return q_inputs, p_inputs, torch.arange(n_q * group)


def float64_norms(monkeypatch) -> None:
    """Make the decoders' RMSNorm compute in float64 for float64 inputs (transformers' computes
    it in float32 whatever the input, which leaves float32 rounding in a float64 model: a
    finite difference then measures that rounding, not the gradient)."""
    from transformers.models.llama.modeling_llama import LlamaRMSNorm
    from transformers.models.qwen2.modeling_qwen2 import Qwen2RMSNorm

    for norm in (LlamaRMSNorm, Qwen2RMSNorm):
        monkeypatch.setattr(norm, "forward", _rms_norm(norm.forward))


def _rms_norm(original):
    def forward(self, hidden: torch.Tensor) -> torch.Tensor:
        if hidden.dtype != torch.float64:
            return original(self, hidden)
        variance = hidden.pow(2).mean(-1, keepdim=True)
        return self.weight * (hidden * torch.rsqrt(variance + self.variance_epsilon))

    return forward
