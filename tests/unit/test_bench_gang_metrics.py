"""The peer benchmark's gang figures (partial placement, GPU-seconds, deadlocks, utilisation,
Permit waits read from scheduler-plugins' log) on plain data."""

from __future__ import annotations

import itertools
from datetime import UTC, datetime

from hypothesis import given
from hypothesis import strategies as st

from tests.bench.gang_metrics import PodRecord, gang_report, partial_episodes, permit_waits, stalls


def test_a_gang_bound_whole_is_never_partial() -> None:
    pods = [PodRecord("a", 1, bound=5.0 + i * 0.1, finished=30.0) for i in range(4)]
    assert partial_episodes(pods, {"a": 4}, end=100.0) == []


def test_half_a_gang_held_for_30_s_is_one_episode_of_gpu_seconds() -> None:
    pods = [
        PodRecord("a", 2, bound=10.0, finished=100.0),
        PodRecord("a", 2, bound=10.0, finished=100.0),
        PodRecord("a", 2, bound=40.0, finished=100.0),
        PodRecord("a", 2, bound=40.0, finished=100.0),
    ]
    (episode,) = partial_episodes(pods, {"a": 4}, end=200.0)
    assert (episode.gang, episode.start, episode.end) == ("a", 10.0, 40.0)
    assert episode.gpu_seconds == 4 * 30


def test_short_partial_moments_do_not_count() -> None:
    pods = [PodRecord("a", 1, bound=10.0, finished=50.0), PodRecord("a", 1, bound=19.0, finished=50.0)]
    assert partial_episodes(pods, {"a": 2}, end=60.0) == []


def test_permit_waits_hold_the_node_and_count() -> None:
    pods = [PodRecord("a", 8, waits=((0.0, 60.0),)), PodRecord("b", 8, bound=1.0, finished=20.0)]
    report = gang_report(pods, {"a": 2, "b": 1}, total_gpus=16, start=0.0, end=100.0)
    assert report.gangs_partially_placed == 1
    assert report.gpu_seconds_held_partially == 8 * 60
    assert report.deadlocks == 0  # 1.0 -> 60.0 is 59 s without a bind


def test_sixty_seconds_partial_without_a_bind_is_a_deadlock() -> None:
    pods = [PodRecord("a", 1, bound=0.0), PodRecord("b", 1, bound=0.0)]
    report = gang_report(pods, {"a": 2, "b": 2}, total_gpus=2, start=0.0, end=130.0)
    assert report.deadlocks == 1
    assert report.longest_stall_while_partial == 130.0
    assert report.gpu_utilisation == 1.0


def test_a_bind_breaks_a_stall() -> None:
    assert stalls([(0.0, 100.0)], [50.0]) == [50.0, 50.0]
    assert stalls([(0.0, 10.0), (5.0, 20.0)], []) == [20.0]


def test_longest_gap_between_binds_counts_from_the_start() -> None:
    pods = [PodRecord("a", 1, bound=t) for t in (30.0, 31.0, 331.0)]
    assert gang_report(pods, {"a": 1}, total_gpus=3, start=10.0, end=400.0).longest_gap_between_binds == 300
    assert gang_report([], {}, total_gpus=3, start=10.0, end=400.0).longest_gap_between_binds == 0


def test_utilisation_counts_bound_gpu_seconds_only() -> None:
    pods = [PodRecord("a", 4, bound=0.0, finished=50.0), PodRecord("a", 4, waits=((0.0, 100.0),))]
    assert gang_report(pods, {"a": 2}, total_gpus=8, start=0.0, end=100.0).gpu_utilisation == 0.25


def klog(when: datetime, message: str, pod: str) -> str:
    stamp = when.strftime("%m%d %H:%M:%S.%f")
    return (
        f'I{stamp}   4242 coscheduling.go:246] "{message}" ExtensionPoint="Permit" pod="{pod}" nodeName="n1"'
    )


def test_permit_waits_end_at_reject_bind_next_wait_or_timeout() -> None:
    t0 = datetime(2026, 11, 23, 2, 0, 0, tzinfo=UTC)
    at = t0.timestamp()
    lines = [
        klog(t0, "Pod is waiting to be scheduled to node", "ns/a"),
        'I1123 02:00:01.000000   4242 schedule_one.go:1] "Attempting to schedule pod" pod="ns/a"',
        klog(t0.replace(second=5), "Unreserve rejects", "ns/a"),
        klog(t0.replace(second=7), "Pod is waiting to be scheduled to node", "ns/a"),
        klog(t0.replace(second=9), "Pod is waiting to be scheduled to node", "ns/b"),
        klog(t0.replace(second=10), "Pod is waiting to be scheduled to node", "ns/c"),
        "garbage",
    ]
    waits = permit_waits(lines, bound={"ns/b": at + 12}, timeout=60, year=2026)
    assert waits["ns/a"] == [(at, at + 5), (at + 7, at + 67)]
    assert waits["ns/b"] == [(at + 9, at + 12)]
    assert waits["ns/c"] == [(at + 10, at + 70)]


spans = st.tuples(st.floats(0, 100), st.floats(0, 50)).map(lambda s: (s[0], s[0] + s[1]))
pod_records = st.builds(
    lambda gang, gpus, bound, wait: PodRecord(
        gang, gpus, bound=bound[0] if bound else None, finished=bound[1] if bound else None, waits=wait
    ),
    st.sampled_from(["a", "b", "c"]),
    st.integers(1, 8),
    st.one_of(st.none(), spans),
    st.lists(spans, max_size=2).map(tuple),
)


@given(st.lists(pod_records, max_size=12), st.integers(1, 5))
def test_partial_gpu_seconds_never_exceed_what_pods_held(pods: list[PodRecord], minimum: int) -> None:
    end = 200.0
    episodes = partial_episodes(pods, dict.fromkeys("abc", minimum), end)
    for gang in "abc":
        held = sum(p.gpus * (b - a) for p in pods if p.gang == gang for a, b in p.holding(end))
        mine = [e for e in episodes if e.gang == gang]
        assert sum(e.gpu_seconds for e in mine) <= held + 1e-6
        assert all(e.end - e.start > 10 for e in mine)
        assert all(x.end <= y.start for x, y in itertools.pairwise(mine))
    if minimum == 1:
        assert episodes == []  # with minMember 1 a gang is never partly placed
