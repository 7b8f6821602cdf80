"""LoRA adapters on a tower through peft: added to a frozen base, saved and loaded in peft's own
format, merged into the base for export.

A tower with adapters is a ``peft.PeftModel`` wrapping the Hugging Face model: its forward is
the base's (``last_hidden_state``), its trainable parameters are the adapters' alone, kept in
fp32 whatever the base's dtype (peft's ``autocast_adapter_dtype``). LoRA's dropout modules are
``nn.Dropout``: the global RNG draws their masks, so GradCache's replay of a chunk's RNG state
redraws them exactly, and :func:`~dpr_cache.model.fast_dropout.use_fast_dropout` swaps them as
it swaps the base's. A saved tower folder holds ``adapter_config.json`` and
``adapter_model.safetensors``, which ``peft.PeftModel.from_pretrained`` loads on the base that
``adapter_config.json`` names (``base_model_name_or_path``).
"""

from __future__ import annotations

import contextlib
import json
import warnings
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from torch import nn

from dpr_cache.errors import InputError

__all__ = [
    "ADAPTER_CONFIG",
    "add_lora",
    "has_adapters",
    "adapter_base",
    "load_adapters",
    "check_saved_lora",
    "set_lora_dropout",
    "linear_names",
    "merged",
]

ADAPTER_CONFIG = "adapter_config.json"


def has_adapters(tower: nn.Module) -> bool:
    """Whether ``tower`` carries peft adapters."""
    return hasattr(tower, "peft_config")


def linear_names(tower: nn.Module) -> list[str]:
    """The distinct names (last part) of the tower's linear layers, as ``target_modules``
    names them."""
    return sorted({name.rsplit(".", 1)[-1] for name, m in tower.named_modules() if _linear(m)})


def _linear(module: nn.Module) -> bool:
    # transformers' Conv1D (GPT-2) is a linear layer too
    return isinstance(module, nn.Linear) or type(module).__name__ == "Conv1D"


def _check_targets(tower: nn.Module, targets: list[str] | str) -> None:
    """InputError naming each of ``targets`` that matches no linear layer (peft matches a name
    to a module's full name or its trailing parts), with the tower's linear layers."""
    if targets == "all-linear":
        return
    names = [name for name, m in tower.named_modules() if _linear(m)]
    missing = [t for t in targets if not any(n == t or n.endswith("." + t) for n in names)]
    if missing:
        raise InputError(
            f"model.lora.target_modules: {', '.join(map(repr, missing))} names no linear layer "
            f"of the model; its linear layers: {', '.join(linear_names(tower)) or '(none)'} "
            "(or all-linear)"
        )


def add_lora(tower: nn.Module, lora: Any) -> nn.Module:
    """``tower`` with LoRA adapters (``lora``: ``r``, ``alpha``, ``dropout``,
    ``target_modules``, as ``model.lora`` gives them) on its linear layers: a ``PeftModel``
    whose base is frozen, the adapters trainable in fp32."""
    from peft import LoraConfig, get_peft_model

    _check_targets(tower, lora.target_modules)
    config = LoraConfig(
        r=lora.r,
        lora_alpha=lora.alpha,
        lora_dropout=lora.dropout,
        target_modules=lora.target_modules,
        bias="none",
    )
    with _quiet_peft():
        return get_peft_model(tower, config, autocast_adapter_dtype=True)


def adapter_base(folder: Path) -> str:
    """The base model an adapter folder was trained on (its ``base_model_name_or_path``)."""
    config = json.loads((Path(folder) / ADAPTER_CONFIG).read_text(encoding="utf-8"))
    return str(config.get("base_model_name_or_path") or "")


def load_adapters(base: nn.Module, folder: Path, trainable: bool = False) -> nn.Module:
    """``base`` with the adapters saved in ``folder`` (peft's format), trainable or frozen."""
    from peft import PeftModel

    with _quiet_peft():
        return PeftModel.from_pretrained(base, str(folder), is_trainable=trainable)


def check_saved_lora(folder: Path, base: nn.Module, lora: Any) -> None:
    """InputError when ``lora`` (``model.lora``) disagrees with the adapters saved in
    ``folder`` (on ``base``) on ``r``, ``alpha`` or ``target_modules``: the saved adapters'
    shapes and scale are theirs, so a different setting cannot go on training them. Target
    modules compare by their last names (peft saves ``all-linear`` as the full names it
    matched, which for ``all-linear`` are every linear layer of ``base``)."""
    saved = json.loads((Path(folder) / ADAPTER_CONFIG).read_text(encoding="utf-8"))
    pairs = [
        ("r", lora.r, saved.get("r")),
        ("alpha", float(lora.alpha), float(saved.get("lora_alpha", 0.0))),
        (
            "target_modules",
            _targets(lora.target_modules, base),
            _targets(saved.get("target_modules"), base),
        ),
    ]
    for field, asked, found in pairs:
        if asked != found:
            shown = ", ".join(asked) if isinstance(asked, list) else asked
            was = ", ".join(found) if isinstance(found, list) else found
            raise InputError(
                f"model.lora.{field}: {shown}, but the adapters saved in {folder} have {was}: "
                "set it as saved to train them on, or give their base model to train new ones"
            )


def _targets(targets: Any, base: nn.Module) -> list[str] | str:
    """``target_modules`` as the sorted last names of the layers it names (``all-linear``: every
    linear layer of ``base``), or a pattern string as it is."""
    if targets == "all-linear":
        return linear_names(base)
    if isinstance(targets, str):
        return targets
    return sorted({str(name).rsplit(".", 1)[-1] for name in targets or []})


def set_lora_dropout(tower: nn.Module, p: float) -> nn.Module:
    """``tower``'s LoRA dropout set to ``p`` on every adapter (``nn.Dropout``, or
    ``nn.Identity`` for 0, as peft builds them), and recorded in its adapter config so that
    saving writes it."""
    for module in tower.modules():
        dropouts = getattr(module, "lora_dropout", None)
        if isinstance(dropouts, nn.ModuleDict):
            for name in list(dropouts):
                dropouts[name] = nn.Dropout(p) if p > 0 else nn.Identity()
                dropouts[name].train(module.training)
    for config in tower.peft_config.values():
        config.lora_dropout = p
    return tower


def merged(tower: nn.Module) -> nn.Module:
    """The plain Hugging Face model with ``tower``'s adapters merged into its weights (a tower
    without adapters as it is)."""
    return tower.merge_and_unload() if has_adapters(tower) else tower


@contextlib.contextmanager
def _quiet_peft() -> Iterator[None]:
    """peft reads transformers' ``is_gradient_checkpointing``, whose deprecation warning would
    print on every load: silenced here alone."""
    with warnings.catch_warnings():
        warnings.filterwarnings(
            "ignore", message=".*is_gradient_checkpointing", category=FutureWarning
        )
        yield
