"""The operator's clock: wall time (epoch seconds, what a Gang's recorded times are in) and a
monotonic time (backoffs, pacing). One seam, so that a model test can move time forward without
waiting for it; the system clock otherwise. Measurements of how long a pass took use
`time.monotonic` directly: they are about this process, not about the gangs."""

from __future__ import annotations

import time as _time
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Protocol, TypeVar


class Clock(Protocol):
    def time(self) -> float: ...

    def monotonic(self) -> float: ...


class SystemClock:
    def time(self) -> float:
        return _time.time()

    def monotonic(self) -> float:
        return _time.monotonic()


class ManualClock:
    """A clock that moves only when told to (tests)."""

    def __init__(self, start: float | None = None) -> None:
        self.wall = _time.time() if start is None else start
        self.mono = 1000.0

    def time(self) -> float:
        return self.wall

    def monotonic(self) -> float:
        return self.mono

    def advance(self, seconds: float) -> None:
        self.wall += seconds
        self.mono += seconds


_clock: Clock = SystemClock()


def time() -> float:
    return _clock.time()


def monotonic() -> float:
    return _clock.monotonic()


C = TypeVar("C", bound=Clock)


@contextmanager
def using(clock: C) -> Iterator[C]:
    """Run the operator on `clock` (tests)."""
    global _clock
    before, _clock = _clock, clock
    try:
        yield clock
    finally:
        _clock = before
