"""What ``index`` and ``eval`` say of train's own keys: each encodes on its section's
``device`` and ``precision``, never on ``train.device`` / ``train.precision``."""

from __future__ import annotations

import sys
from collections.abc import Sequence

from dpr_cache.config import Config, default_of
from dpr_cache.errors import InputError

__all__ = ["refuse_train_keys", "refuse_train_overrides"]

ENCODER_KEYS = ("device", "precision")


def refuse_train_overrides(overridden: Sequence[str], command: str) -> None:
    """``--set train.device`` / ``train.precision`` given to ``command``: InputError naming the
    key to set instead."""
    for key in overridden:
        if key in (f"train.{name}" for name in ENCODER_KEYS):
            name = key.split(".")[1]
            raise InputError(f"{key}: {command} encodes on {command}.{name}; set that instead")


def refuse_train_keys(overridden: Sequence[str], command: str, config: Config) -> None:
    """``--set train.device`` / ``train.precision`` given to ``command`` (``index`` or
    ``eval``) is an InputError naming the key to set instead; a config whose train section sets
    them while the command's section is left at its default gets a note saying which one the
    command uses."""
    refuse_train_overrides(overridden, command)
    section = getattr(config, command)
    for name in ENCODER_KEYS:
        trained, used = getattr(config.train, name), getattr(section, name)
        if trained != default_of(f"train.{name}") and used == default_of(f"{command}.{name}"):
            print(
                f"note: {command} encodes with {command}.{name}: {used} (train.{name}: "
                f"{trained} is train's own)",
                file=sys.stderr,
            )
