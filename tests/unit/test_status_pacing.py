"""A gang's status is written at most once per interval, and a change is never left unwritten:
the pass at the end of the interval writes the state then."""

from __future__ import annotations

from itertools import pairwise

from hypothesis import given
from hypothesis import strategies as st

from quorum.operator.status import StatusPacing

KEY, OTHER = ("ns", "a"), ("ns", "b")


def simulate(changes: list[float], interval: float) -> list[float]:
    """Passes at every change and whenever a deferred write is due (as the loop runs them); the
    times the gang's status is written."""
    pacing = StatusPacing(interval)
    pending = sorted(changes)
    unwritten = False
    writes: list[float] = []
    now = 0.0
    while pending or unwritten:
        due = pacing.next_due
        now = min([t for t in (pending[0] if pending else None, due or None) if t is not None])
        while pending and pending[0] <= now:
            pending.pop(0)
            unwritten = True
        pacing.start_pass()
        if unwritten and pacing.may_write(KEY, now):
            writes.append(now)
            unwritten = False
    return writes


def test_the_first_write_is_immediate_and_the_next_waits_for_the_interval() -> None:
    pacing = StatusPacing(1.0)
    assert pacing.may_write(KEY, 100.0)
    assert not pacing.may_write(KEY, 100.4)
    assert pacing.next_due == 101.0
    assert pacing.may_write(OTHER, 100.4)  # gangs are paced each on its own
    pacing.start_pass()
    assert pacing.next_due == 0.0
    assert pacing.may_write(KEY, 101.0)


def test_a_forgotten_gang_is_written_at_once() -> None:
    pacing = StatusPacing(1.0)
    assert pacing.may_write(KEY, 5.0)
    pacing.forget(KEY)
    assert pacing.may_write(KEY, 5.1)


def test_a_burst_of_changes_in_one_interval_costs_two_writes() -> None:
    # Released, then 8 binds and 8 starts within the second after it.
    changes = [10.0, *(10.05 + i * 0.1 for i in range(9))]
    assert simulate(changes, 1.0) == [10.0, 11.0]


@given(
    st.lists(st.floats(min_value=0.0, max_value=30.0), min_size=1, max_size=40),
    st.floats(min_value=0.1, max_value=5.0),
)
def test_writes_are_an_interval_apart_and_the_last_change_is_written(
    changes: list[float], interval: float
) -> None:
    writes = simulate(changes, interval)
    assert all(b - a >= interval - 1e-9 for a, b in pairwise(writes))
    last = max(changes)
    assert writes[-1] >= last
    before = [w for w in writes if w < last]
    assert writes[-1] <= max(last, (before[-1] + interval) if before else last) + 1e-9
