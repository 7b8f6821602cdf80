"""Stage seconds: a stage ends at the next lap, and a stage met again adds up."""

from __future__ import annotations

import time

from dpr_cache.runtime.laps import Laps


def test_laps_split_the_wall_time_and_add_up_repeated_stages() -> None:
    laps = Laps()
    start = time.perf_counter()
    for _ in range(2):
        time.sleep(0.02)
        laps.lap("sleep")
        laps.lap("nothing")
    total = time.perf_counter() - start
    seconds = laps.seconds()
    assert list(seconds) == ["sleep", "nothing"]
    assert seconds["sleep"] >= 0.04 and seconds["nothing"] < 0.01
    assert sum(seconds.values()) <= total + 0.002
