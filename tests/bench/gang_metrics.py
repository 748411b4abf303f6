"""What the peer benchmark reports about gangs, computed from observed times (pure functions).

Inputs are what a run observed, in seconds on one clock: per pod its gang, its GPUs, when it
was bound and when it finished, and (scheduler-plugins only) the intervals it waited at Permit,
assumed on a node that no other pod could use. Definitions, as issue 7 gives them:

- a pod *holds* its GPUs while it waits at Permit and from binding until it finishes;
- a gang is *partially placed* while at least one but fewer than minMember of its pods hold
  GPUs, counted only for episodes longer than `threshold` (10 s): a gang whose pods bind or
  finish a moment apart is not partial;
- *GPU-seconds held partially*: the GPUs its pods hold, integrated over those episodes;
- a *deadlock*: `window` (60 s) or more in which some gang is partially placed and no pod of any
  gang is bound;
- *GPU utilisation*: GPU-seconds of bound pods over total GPUs x the time to finish all gangs;
- the *longest gap between binds*, from the start to the last bind: how long the scheduler sat
  with pods pending and bound none (a stall that is no deadlock, as nothing is held meanwhile);
- *unfinished gangs*: gangs some pod of which had not finished by the end (the run's deadline,
  when not everything finished): the gangs that failed to run;
- gangs *partial at the end*: of those, the ones holding some but not all they need then.

What became of each gang by the end (`gang_outcomes`):

- *ran whole*: minMember of its pods held GPUs at once for longer than `threshold` (10 s) on end
  (pods that ran 20 s each but started more than 10 s apart ran in pieces, not whole);
- *ran only in part*: some pod was bound, but it never ran whole (its pods ran in pieces, or
  some never ran);
- *never started*: no pod of it bound;
- *not fully bound*: some pod of it never bound by the end; *pods pending*: pods never bound.
"""

from __future__ import annotations

import itertools
import re
from collections import defaultdict
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from datetime import UTC, datetime

Interval = tuple[float, float]


@dataclass(frozen=True)
class PodRecord:
    gang: str
    gpus: int
    bound: float | None = None
    finished: float | None = None
    waits: tuple[Interval, ...] = ()  # at Permit (scheduler-plugins), not bound meanwhile

    def holding(self, end: float) -> list[Interval]:
        """When this pod held GPUs, up to `end` for what had not ended by then."""
        spans = [w for w in self.waits if w[1] > w[0]]
        if self.bound is not None:
            spans.append((self.bound, self.finished if self.finished is not None else end))
        return [(a, min(b, end)) for a, b in spans if min(b, end) > a]

    def holds(self, when: float) -> bool:
        """Whether this pod holds GPUs at `when`: bound and not finished, or waiting at Permit."""
        if self.bound is not None and self.bound <= when and (self.finished is None or self.finished > when):
            return True
        return any(a <= when < b for a, b in self.waits)


@dataclass(frozen=True)
class Episode:
    gang: str
    start: float
    end: float
    gpu_seconds: float


@dataclass(frozen=True)
class GangReport:
    gangs_partially_placed: int
    gpu_seconds_held_partially: float
    deadlocks: int
    longest_stall_while_partial: float
    longest_gap_between_binds: float
    gpu_utilisation: float
    gangs_unfinished: int = 0
    gangs_partial_at_end: int = 0
    episodes: list[Episode] = field(default_factory=list)


def partial_episodes(
    pods: Iterable[PodRecord], min_member: dict[str, int], end: float, threshold: float = 10.0
) -> list[Episode]:
    """Every episode longer than `threshold` in which a gang held some but not all it needs."""
    steps: dict[str, list[tuple[float, int, int]]] = defaultdict(list)  # gang -> (t, +-pods, +-gpus)
    for pod in pods:
        for a, b in pod.holding(end):
            steps[pod.gang] += [(a, 1, pod.gpus), (b, -1, -pod.gpus)]
    episodes: list[Episode] = []
    for gang, changes in steps.items():
        changes.sort(key=lambda c: (c[0], c[1]))  # at a tie, releases before acquisitions
        held = gpus = 0
        started: float | None = None
        gpu_seconds = 0.0
        last = changes[0][0]
        for t, dp, dg in changes:
            if started is not None:
                gpu_seconds += gpus * (t - last)
            held, gpus, last = held + dp, gpus + dg, t
            partial = 0 < held < min_member[gang]
            if partial and started is None:
                started, gpu_seconds = t, 0.0
            elif not partial and started is not None:
                if t - started > threshold:
                    episodes.append(Episode(gang, started, t, gpu_seconds))
                started = None
        if started is not None and end - started > threshold:
            episodes.append(Episode(gang, started, end, gpu_seconds + gpus * (end - last)))
    return sorted(episodes, key=lambda e: (e.start, e.gang))


def union(intervals: Iterable[Interval]) -> list[Interval]:
    merged: list[Interval] = []
    for a, b in sorted(intervals):
        if merged and a <= merged[-1][1]:
            merged[-1] = (merged[-1][0], max(merged[-1][1], b))
        else:
            merged.append((a, b))
    return merged


def stalls(partial: Sequence[Interval], binds: Sequence[float]) -> list[float]:
    """Lengths of the stretches, within times when some gang is partial, with no bind."""
    times = sorted(binds)
    out: list[float] = []
    for a, b in union(partial):
        inside = [t for t in times if a < t < b]
        edges = [a, *inside, b]
        out += [y - x for x, y in itertools.pairwise(edges)]
    return out


def longest_gap(start: float, binds: Sequence[float]) -> float:
    """The longest time from `start`, or from one bind, to the next bind."""
    return max((b - a for a, b in itertools.pairwise([start, *sorted(binds)])), default=0.0)


def utilisation(pods: Iterable[PodRecord], total_gpus: int, start: float, end: float) -> float:
    if end <= start or total_gpus <= 0:
        return 0.0
    busy = sum(
        pod.gpus * (min(pod.finished if pod.finished is not None else end, end) - max(pod.bound, start))
        for pod in pods
        if pod.bound is not None and pod.bound < end
    )
    return busy / (total_gpus * (end - start))


def partial_at(pods: Iterable[PodRecord], min_member: dict[str, int], when: float) -> int:
    """Gangs that hold some but not all they need at `when` (by their pods' holding spans)."""
    holding: dict[str, int] = defaultdict(int)
    for pod in pods:
        holding[pod.gang] += pod.holds(when)
    return sum(1 for gang, held in holding.items() if 0 < held < min_member[gang])


def gang_report(
    pods: Sequence[PodRecord],
    min_member: dict[str, int],
    total_gpus: int,
    start: float,
    end: float,
    threshold: float = 10.0,
    window: float = 60.0,
) -> GangReport:
    episodes = partial_episodes(pods, min_member, end, threshold)
    binds = [p.bound for p in pods if p.bound is not None]
    gaps = stalls([(e.start, e.end) for e in episodes], binds)
    return GangReport(
        gangs_partially_placed=len({e.gang for e in episodes}),
        gpu_seconds_held_partially=round(sum(e.gpu_seconds for e in episodes), 1),
        deadlocks=sum(1 for g in gaps if g >= window),
        longest_stall_while_partial=round(max(gaps, default=0.0), 1),
        longest_gap_between_binds=round(longest_gap(start, binds), 1),
        gpu_utilisation=round(utilisation(pods, total_gpus, start, end), 3),
        gangs_unfinished=len({p.gang for p in pods if p.finished is None or p.finished > end}),
        gangs_partial_at_end=partial_at(pods, min_member, end),
        episodes=episodes,
    )


@dataclass(frozen=True)
class GangOutcomes:
    gangs_ran_whole: int
    gangs_ran_in_part: int
    gangs_never_started: int
    gangs_not_fully_bound: int
    pods_pending_at_end: int


def longest_whole(pods: Iterable[PodRecord], min_member: dict[str, int], end: float) -> dict[str, float]:
    """Per gang, the longest stretch up to `end` in which minMember of its pods held GPUs at
    once (0: never)."""
    steps: dict[str, list[tuple[float, int]]] = defaultdict(list)
    for pod in pods:
        steps.setdefault(pod.gang, [])
        for a, b in pod.holding(end):
            steps[pod.gang] += [(a, 1), (b, -1)]
    longest: dict[str, float] = {}
    for gang, changes in steps.items():
        changes.sort()  # at a tie, releases before acquisitions: a pod that ends as another starts
        held, since, best = 0, 0.0, 0.0
        for t, change in changes:
            if held >= min_member[gang] > held + change:
                best = max(best, t - since)
            elif held < min_member[gang] <= held + change:
                since = t
            held += change
        longest[gang] = best
    return longest


def gang_outcomes(
    pods: Sequence[PodRecord], min_member: dict[str, int], end: float, threshold: float = 10.0
) -> GangOutcomes:
    """What became of each gang by `end` (see the module's docstring)."""
    longest = longest_whole(pods, min_member, end)
    started = {p.gang for p in pods if p.bound is not None and p.bound <= end}
    unbound = [p for p in pods if p.bound is None or p.bound > end]
    whole = {g for g, seconds in longest.items() if seconds > threshold}
    return GangOutcomes(
        gangs_ran_whole=len(whole),
        gangs_ran_in_part=len(started - whole),
        gangs_never_started=len(set(longest) - started),
        gangs_not_fully_bound=len({p.gang for p in unbound}),
        pods_pending_at_end=len(unbound),
    )


# -- scheduler-plugins: when pods waited at Permit, from cw-coscheduler's log (klog text) --------

_KLOG = re.compile(r'^[IWEF](\d\d)(\d\d) (\d\d):(\d\d):(\d\d)\.(\d+)\s+\d+\s+\S+\] "([^"]*)"(.*)$')
_POD = re.compile(r'\bpod="([^"]+)"')
WAITING = "Pod is waiting to be scheduled to node"
REJECTED = ("Unreserve rejects", "PostFilter rejects the pod")


def klog_time(month: int, day: int, clock: tuple[int, int, int, int], year: int) -> float:
    h, m, s, us = clock
    return datetime(year, month, day, h, m, s, us, tzinfo=UTC).timestamp()


def permit_waits(
    log_lines: Iterable[str], bound: dict[str, float], timeout: float, year: int
) -> dict[str, list[Interval]]:
    """Per pod ("namespace/name"), the intervals it waited at Permit: from the plugin's "waiting"
    line to the first of its rejection, its next wait, its binding, or the Permit timeout."""
    events: dict[str, list[tuple[float, str]]] = defaultdict(list)
    for line in log_lines:
        match = _KLOG.match(line)
        if not match or not (match[7] == WAITING or match[7] in REJECTED):
            continue
        named = _POD.search(match[8])
        if named is None:
            continue
        clock = (int(match[3]), int(match[4]), int(match[5]), int(match[6][:6].ljust(6, "0")))
        when = klog_time(int(match[1]), int(match[2]), clock, year)
        events[named[1]].append((when, "wait" if match[7] == WAITING else "reject"))
    waits: dict[str, list[Interval]] = {}
    for pod, seen in events.items():
        seen.sort()
        spans = []
        for i, (start, kind) in enumerate(seen):
            if kind != "wait":
                continue
            ends = [start + timeout]
            if i + 1 < len(seen):
                ends.append(seen[i + 1][0])
            if pod in bound and bound[pod] >= start:
                ends.append(bound[pod])
            spans.append((start, min(ends)))
        waits[pod] = spans
    return waits
