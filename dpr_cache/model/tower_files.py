"""One saved tower folder that every tool reads the same way: a complete ``transformers`` folder
(config, weights with BERT's pooler, tokenizer files without stored truncation or padding) and a
complete sentence-transformers folder (``modules.json``, ``config_sentence_transformers.json``
with the tower's prompt, ``sentence_bert_config.json``, ``1_Pooling/config.json``, Normalize
when the vectors are normalized), so ``SentenceTransformer(tower)`` prompts, pools and
normalizes as dpr-cache does."""

from __future__ import annotations

import copy
import json
from pathlib import Path

from torch import nn

__all__ = ["write_tower", "clean_tokenizer", "sort_target_modules"]

_MODULES = "sentence_transformers.models"


def clean_tokenizer(tokenizer):
    """A copy without the truncation / padding a fast tokenizer keeps from its last call (saved,
    it breaks plain ``tokenizers`` use and changes the folder's bytes from run to run)."""
    tokenizer = copy.deepcopy(tokenizer)
    backend = getattr(tokenizer, "backend_tokenizer", None)
    if backend is not None:
        backend.no_truncation()
        backend.no_padding()
    return tokenizer


def _write_json(path: Path, obj) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(obj, indent=2) + "\n")


def write_tower(
    tower: nn.Module,
    out: Path,
    *,
    tokenizer,
    pooling: str,
    normalize: bool,
    max_length: int | None,
    prompt: tuple[str, str] = ("query", ""),
    more_prompts: dict[str, str] | None = None,
) -> Path:
    """Write ``tower`` with its tokenizer and the sentence-transformers modules into ``out``;
    ``prompt`` (name, text), when the text is not empty, is its default sentence-transformers
    prompt, so ``SentenceTransformer(out).encode`` prepends it as dpr-cache does;
    ``more_prompts`` (each training source's, by name) are there for ``prompt_name=``."""
    out = Path(out)
    tower.save_pretrained(out)  # with adapters: peft's adapter_config.json and weights alone
    sort_target_modules(out / "adapter_config.json")
    length = max_length or getattr(tokenizer, "model_max_length", 512)
    if tokenizer is not None:
        clean_tokenizer(tokenizer).save_pretrained(out)
    modules = [
        {"idx": 0, "name": "0", "path": "", "type": f"{_MODULES}.Transformer"},
        {"idx": 1, "name": "1", "path": "1_Pooling", "type": f"{_MODULES}.Pooling"},
    ]
    if normalize:
        modules.append(
            {"idx": 2, "name": "2", "path": "2_Normalize", "type": f"{_MODULES}.Normalize"}
        )
        (out / "2_Normalize").mkdir(exist_ok=True)
    _write_json(out / "modules.json", modules)
    _write_json(
        out / "sentence_bert_config.json", {"max_seq_length": int(length), "do_lower_case": False}
    )
    settings: dict = {"similarity_fn_name": "cosine" if normalize else "dot"}
    name, text = prompt
    if text:
        settings.update(prompts={name: text}, default_prompt_name=name)
    if more_prompts:
        settings["prompts"] = {**settings.get("prompts", {}), **more_prompts}
    _write_json(out / "config_sentence_transformers.json", settings)
    _write_json(
        out / "1_Pooling" / "config.json",
        {
            "word_embedding_dimension": int(tower.config.hidden_size),
            "pooling_mode_cls_token": pooling == "cls",
            "pooling_mode_mean_tokens": pooling == "mean",
            "pooling_mode_max_tokens": False,
            "pooling_mode_mean_sqrt_len_tokens": False,
            "pooling_mode_lasttoken": pooling == "last",
        },
    )
    return out


def sort_target_modules(path: Path) -> None:
    """peft writes ``target_modules`` from a set, in an order that changes from process to
    process; sorted, the same adapters give the same file."""
    if not path.is_file():
        return
    config = json.loads(path.read_text())
    if isinstance(config.get("target_modules"), list):
        config["target_modules"] = sorted(config["target_modules"])
        _write_json(path, config)
