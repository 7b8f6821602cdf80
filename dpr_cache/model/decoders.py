"""What a decoder LLM needs to be a tower: a tokenizer that pads and ends each text in EOS, the
dtype and attention its weights load with, and a context long enough for the texts.

**Pad token.** Decoder tokenizers often have none (Llama, Mistral). One without gets its EOS
as the pad token (as RepLLaMA, E5-Mistral and sentence-transformers do); the padded positions
are masked by ``attention_mask``, so the pad's id changes nothing, and the choice is saved with
the tokenizer (``tokenizer_config.json``).

**EOS appended.** Last-token pooling reads the hidden state of each text's final token, which
for a decoder has seen the whole text; RepLLaMA and E5-Mistral end every text with EOS, whose
state is trained to summarize it. :func:`append_eos` rewrites the fast tokenizer's template
(its ``post_processor``) to end single texts and pairs in EOS, keeping every special token the
model's own template adds (a Llama BOS, a separator between a pair's texts), and only where the
template does not end in EOS already. The template is part of ``tokenizer.json``, so the saved
tokenizer appends EOS wherever it is loaded (transformers, sentence-transformers, dpr-cache):
no separate flag records it, and truncation keeps the EOS (the template's tokens count toward
``max_length``).
"""

from __future__ import annotations

from typing import Any

import torch
from torch import nn

from dpr_cache.errors import InputError

__all__ = [
    "DTYPES",
    "torch_dtype",
    "dtype_name",
    "attention_of",
    "prepare_tokenizer",
    "append_eos",
    "ends_with_eos",
    "check_dtype_on",
    "check_positions",
]

DTYPES = {"fp32": torch.float32, "bf16": torch.bfloat16, "fp16": torch.float16}
"""``model.dtype`` -> the torch dtype the weights are loaded and kept in."""

_PROBE = ("a", "b")  # texts whose tokens show where a template puts its special tokens


def torch_dtype(name: str | None) -> torch.dtype | None:
    """``model.dtype`` (``fp32 | bf16 | fp16``) as a torch dtype; None stays None."""
    return None if name is None else DTYPES[name]


def dtype_name(dtype: torch.dtype) -> str:
    """A torch dtype as ``model.dtype`` names it (``fp32 | bf16 | fp16``; another dtype, e.g.
    float64, by torch's own name)."""
    names = {value: key for key, value in DTYPES.items()}
    return names.get(dtype, str(dtype).removeprefix("torch."))


def attention_of(name: str | None) -> str | None:
    """``model.attn_implementation`` as transformers takes it (``auto``, None: its own choice);
    InputError for ``flash_attention_2`` where the flash-attn package is not installed."""
    if name in (None, "auto"):
        return None
    if name == "flash_attention_2":
        from transformers.utils import is_flash_attn_2_available

        if not is_flash_attn_2_available():
            raise InputError(
                "model.attn_implementation: flash_attention_2 needs the flash-attn package and a "
                "CUDA GPU, not found here: install flash-attn, or use sdpa"
            )
    return name


def check_dtype_on(dtype: str | None, device: torch.device) -> None:
    """InputError for ``model.dtype: fp16`` on a CPU (half-precision weights train there
    neither fast nor stably)."""
    if dtype == "fp16" and device.type == "cpu":
        raise InputError(
            "model.dtype: fp16 weights need a GPU, and this run is on the CPU: use bf16 or fp32"
        )


def check_positions(tower: nn.Module, max_length: int, key: str) -> None:
    """InputError when ``tower``'s context (``max_position_embeddings``) is shorter than the
    ``max_length`` tokens the config key ``key`` allows a text."""
    config = getattr(tower, "config", None)
    positions = getattr(config, "max_position_embeddings", None)
    if isinstance(positions, int) and positions < max_length:
        raise InputError(
            f"{key}: {max_length} tokens, but the model reads at most {positions} "
            f"(max_position_embeddings of {getattr(config, 'model_type', 'the model')}): "
            f"lower {key} to {positions} or less"
        )


def _ids(tokenizer: Any, *texts: str, special: bool = True) -> list[int]:
    return list(tokenizer(*texts, add_special_tokens=special)["input_ids"])


def ends_with_eos(tokenizer: Any) -> bool:
    """Whether the tokenizer's template ends a single text and a pair in its EOS."""
    eos = tokenizer.eos_token_id
    return eos is not None and all(
        _ids(tokenizer, *texts)[-1:] == [eos] for texts in ((_PROBE[0],), _PROBE)
    )


def _around(encoded: list[int], contents: list[list[int]]) -> list[list[int]]:
    """The special tokens before, between and after ``contents`` (each text's own tokens) in
    ``encoded`` (the template's output): len(contents) + 1 lists."""
    pieces, at = [], 0
    for content in contents:
        start = next(
            i for i in range(at, len(encoded) + 1) if encoded[i : i + len(content)] == content
        )
        pieces.append(encoded[at:start])
        at = start + len(content)
    return [*pieces, encoded[at:]]


def append_eos(tokenizer: Any) -> Any:
    """``tokenizer`` (changed in place) with its template ending every single text and pair in
    EOS, the model's own special tokens kept; unchanged when it ends so already or has no EOS."""
    if tokenizer.eos_token_id is None or ends_with_eos(tokenizer):
        return tokenizer
    backend = getattr(tokenizer, "backend_tokenizer", None)
    if backend is None:
        raise InputError(
            f"model.pooling: last appends EOS through a fast tokenizer's template, and "
            f"{type(tokenizer).__name__} is not one: give the model a tokenizer.json"
        )
    from tokenizers import processors

    a, b = (_ids(tokenizer, text, special=False) for text in _PROBE)
    lead, tail = _around(_ids(tokenizer, _PROBE[0]), [a])
    lead_p, mid, tail_p = _around(_ids(tokenizer, *_PROBE), [a, b])
    eos = tokenizer.eos_token_id
    names = {i: tokenizer.convert_ids_to_tokens(i) for i in {*lead, *tail, *lead_p, *mid, eos}}

    def marks(ids: list[int], type_id: int) -> list[str]:
        return [f"{names[i]}:{type_id}" for i in ids]

    backend.post_processor = processors.TemplateProcessing(
        single=[*marks(lead, 0), "$A:0", *marks(tail + [eos], 0)],
        pair=[*marks(lead_p, 0), "$A:0", *marks(mid, 0), "$B:1", *marks(tail_p + [eos], 1)],
        special_tokens=sorted((name, i) for i, name in names.items()),
    )
    return tokenizer


def prepare_tokenizer(tokenizer: Any, pooling: str) -> Any:
    """The tokenizer (changed in place) as a tower reads it: given a pad token where it has none
    (its EOS), and for ``pooling: last`` ending every text in EOS (:func:`append_eos`).
    InputError for ``last`` with a tokenizer that has neither EOS nor pad."""
    if tokenizer is None:
        return None
    if tokenizer.pad_token is None and tokenizer.eos_token is not None:
        tokenizer.pad_token = tokenizer.eos_token
    if pooling == "last":
        if tokenizer.eos_token is None and tokenizer.pad_token is None:
            raise InputError(
                "model.pooling: last needs a tokenizer with an EOS or a pad token, and this one "
                "has neither: give the tokenizer an eos_token, or use pooling cls or mean"
            )
        append_eos(tokenizer)
    return tokenizer
