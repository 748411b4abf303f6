"""The operator's use of Python's cyclic garbage collector.

A full collection (generation 2) stops the whole process, event loop and planner thread alike,
for a time that grows with everything the operator holds: every gang pod and every node of the
cluster. At 5,000 nodes and 24,000 gang pods that was about a second, every few seconds
(docs/benchmarks.md, "At scale"): a second of event-loop lag in whatever stage it hit, and
Lease renewals late enough to lose the Lease.

What the operator holds is almost all plain JSON from its watches, which never forms cycles and
is freed by reference counting when a newer version replaces it. So after each full collection
whatever survived is frozen (`gc.freeze()`): the next full collection walks only what came
since, not the whole store. The cost is that a cycle frozen while alive (an asyncio task, an
exception's traceback) is not collected when it dies; so once the frozen objects have doubled
since the last thaw, they are thawed and collected once, a single long pause instead of one
every few seconds. Every collection's pause is in quorum_operator_gc_pause_seconds.
"""

from __future__ import annotations

import asyncio
import gc
import logging
import time
from collections import deque
from dataclasses import dataclass, field

from quorum.operator.metrics import GC_PAUSE

log = logging.getLogger("quorum.operator.collector")


@dataclass
class Collector:
    """`install()` once per process (a `gc.callbacks` entry), and run `run()` as a
    task. One per process, as the garbage collector is: `COLLECTOR`."""

    check_seconds: float = 30.0
    least_frozen: int = 200_000  # frozen objects below this are never worth a thaw
    started: float = 0.0
    frozen_after_thaw: int = 0
    # (generation, seconds) of collections not yet in the histogram. The callback must take no
    # lock: a collection can start in any allocation, also in a thread holding the histogram's.
    pauses: deque[tuple[int, float]] = field(default_factory=lambda: deque(maxlen=10_000))

    def __call__(self, phase: str, info: dict[str, int]) -> None:
        if phase == "start":
            self.started = time.perf_counter()
            return
        generation = info.get("generation", -1)
        if self.started:
            self.pauses.append((generation, time.perf_counter() - self.started))
            self.started = 0.0
        if generation == 2:
            gc.freeze()  # what survived a full collection is alive: out of the next one's walk

    def record(self) -> None:
        """Move the pauses timed so far into quorum_operator_gc_pause_seconds."""
        while self.pauses:
            generation, seconds = self.pauses.popleft()
            GC_PAUSE.labels(str(generation)).observe(seconds)

    def install(self) -> None:
        if not any(isinstance(c, Collector) for c in gc.callbacks):
            gc.callbacks.append(self)

    def freeze(self) -> None:
        """Freeze everything now (what exists once the first listings are in lives as long as
        the process), counted as the level the next thaw is measured from."""
        gc.freeze()
        self.frozen_after_thaw = gc.get_freeze_count()

    def thaw_due(self) -> bool:
        return gc.get_freeze_count() > max(self.least_frozen, 2 * self.frozen_after_thaw)

    def thaw(self) -> None:
        """Collect everything once (the frozen objects too), then freeze what survived."""
        started = time.perf_counter()
        frozen = gc.get_freeze_count()
        gc.unfreeze()
        gc.collect()  # its callback freezes the survivors
        self.frozen_after_thaw = gc.get_freeze_count()
        log.info(
            "garbage collector: %d frozen objects thawed and collected in %.2fs; %d survived",
            frozen,
            time.perf_counter() - started,
            self.frozen_after_thaw,
        )

    async def run(self, record_seconds: float = 1.0) -> None:
        """Forever: record the pauses every `record_seconds`, and thaw when due (checked every
        `check_seconds`)."""
        checked = time.monotonic()
        while True:
            await asyncio.sleep(record_seconds)
            self.record()
            if time.monotonic() - checked >= self.check_seconds:
                checked = time.monotonic()
                if self.thaw_due():
                    self.thaw()


COLLECTOR = Collector()
