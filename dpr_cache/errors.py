"""The project's own error types. The CLI maps each to one line on stderr and an exit code:
:class:`InputError` exits 2, :class:`Diverged` 3, :class:`OutOfDeviceMemory` 1,
:class:`Interrupted` 130; anything else keeps its own message."""

from __future__ import annotations

from pathlib import Path

__all__ = ["InputError", "Interrupted", "Diverged", "OutOfDeviceMemory"]


class InputError(ValueError):
    """Bad input: the message is one line naming the file and, where relevant, line or key."""


class Interrupted(Exception):
    """Raised after Ctrl-C / SIGTERM once a checkpoint of the last finished step is saved; the
    message names it and the command that continues the run (``command``, when given)."""

    def __init__(self, checkpoint: Path, command: str | None = None):
        then = f"; continue with: {command}" if command else ""
        super().__init__(f"interrupted: checkpoint saved at {checkpoint}{then}")
        self.checkpoint, self.command = checkpoint, command


class Diverged(ArithmeticError):
    """Training met a loss or gradient that is not finite (fp32, bf16): the message names the
    step and its batch, and the last checkpoint, which is left as it was."""


class OutOfDeviceMemory(RuntimeError):
    """A command's work ran out of GPU memory: the message says what the GPU holds and the
    setting of that work to lower (:func:`dpr_cache.runtime.device.advises_on_out_of_memory`)."""
