"""The engine's clock: wall time in a run, a virtual clock in a trace replay.

Everything that times the engine's work (latency, model time, a variant's wall clock,
the step statistics the backends report) reads `now()`. A run reads `time.perf_counter`.
`tts replay` swaps in a `VirtualClock` (`simulated`) that stands still while Python runs
and moves only when the replay backends advance it by a step cost model's seconds, so
every figure such a run reports is simulated time.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager

_now: Callable[[], float] = time.perf_counter


def now() -> float:
    """Seconds on the current clock (wall time unless a replay is simulating)."""
    return _now()


class VirtualClock:
    """A clock that moves only when told to."""

    def __init__(self) -> None:
        self.t = 0.0

    def __call__(self) -> float:
        return self.t

    def advance(self, seconds: float) -> None:
        if seconds < 0:
            raise ValueError(f"a clock cannot go back ({seconds} s)")
        self.t += seconds


def simulating() -> VirtualClock | None:
    """The virtual clock in use, or None when the clock is the wall clock."""
    return _now if isinstance(_now, VirtualClock) else None


@contextmanager
def simulated(clock: VirtualClock) -> Iterator[VirtualClock]:
    """Run the block on `clock` instead of wall time."""
    global _now
    previous, _now = _now, clock
    try:
        yield clock
    finally:
        _now = previous
