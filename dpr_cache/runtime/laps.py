"""Wall seconds per named stage of a command (its ``timings.json``, a mining summary)."""

from __future__ import annotations

import time

__all__ = ["Laps"]


class Laps:
    """``lap(name)`` ends the stage running since the last lap (or since the start) and adds its
    seconds under ``name``: a stage met again, as in a loop over parts, adds up."""

    def __init__(self) -> None:
        self._seconds: dict[str, float] = {}
        self._clock = time.perf_counter()

    def lap(self, name: str) -> None:
        now = time.perf_counter()
        self._seconds[name] = self._seconds.get(name, 0.0) + now - self._clock
        self._clock = now

    def seconds(self) -> dict[str, float]:
        """Each stage's seconds, in the order first met, to the millisecond."""
        return {name: round(s, 3) for name, s in self._seconds.items()}
