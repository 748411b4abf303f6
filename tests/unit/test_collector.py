"""quorum.operator.collector: each collection timed, survivors of a full one frozen, and the
frozen objects thawed and collected once they have doubled."""

from __future__ import annotations

import gc
from collections.abc import Iterator
from typing import Any

import pytest

from quorum.operator.collector import Collector
from quorum.operator.metrics import REGISTRY


def sample(name: str, **labels: str) -> float:
    return REGISTRY.get_sample_value(name, labels) or 0.0


@pytest.fixture
def collector() -> Iterator[Collector]:
    """A collector installed for the test only; the process's frozen objects thawed after."""
    collector = Collector(least_frozen=1)
    gc.callbacks.append(collector)
    try:
        yield collector
    finally:
        gc.callbacks.remove(collector)
        gc.unfreeze()


class Cycle:
    def __init__(self) -> None:
        self.me: Any = self


def test_a_full_collection_is_timed_and_its_survivors_frozen(collector: Collector) -> None:
    gc.unfreeze()
    before = sample("quorum_operator_gc_pause_seconds_count", generation="2")
    kept = [Cycle() for _ in range(100)]
    gc.collect()
    assert sample("quorum_operator_gc_pause_seconds_count", generation="2") == before  # not yet:
    collector.record()  # the callback takes no lock; the pauses go to the histogram here
    assert sample("quorum_operator_gc_pause_seconds_count", generation="2") == before + 1
    assert gc.get_freeze_count() >= len(kept)
    young = gc.collect(0)  # a young collection freezes nothing more
    collector.record()
    assert young >= 0 and sample("quorum_operator_gc_pause_seconds_count", generation="0") > 0


def test_install_is_once_per_process() -> None:
    first, second = Collector(), Collector()
    first.install()
    second.install()
    try:
        assert sum(isinstance(c, Collector) for c in gc.callbacks) == 1
    finally:
        gc.callbacks[:] = [c for c in gc.callbacks if not isinstance(c, Collector)]


def test_cycles_frozen_alive_are_collected_at_the_thaw(collector: Collector) -> None:
    collector.freeze()
    baseline = collector.frozen_after_thaw
    assert not collector.thaw_due()
    cycles = [Cycle() for _ in range(baseline + 1000)]
    gc.collect()  # survivors (the cycles, alive) frozen
    assert collector.thaw_due()
    frozen = gc.get_freeze_count()
    del cycles  # dead now, but frozen: no collection reaches them
    assert gc.collect() == 0
    collector.thaw()
    assert gc.get_freeze_count() < frozen - 1000
    assert collector.frozen_after_thaw == gc.get_freeze_count()
    assert not collector.thaw_due()
