"""What this process keeps about each gang beyond what the watches show, in one entry per gang
(like Kueue's cache entry per workload): the operator's modules each read and write their own
fields of it, and forgetting a gang is one delete.

Nothing here is a decision: decisions are recorded on the Gang object, so that a new leader
continues them. This is what one leader's term knows — what it wrote and announced, what it
saw, what it is waiting for — and a new term starts with none of it.
"""

from __future__ import annotations

import asyncio
from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import Any

GangKey = tuple[str, str]
JSON = dict[str, Any]


@dataclass
class GangMemory:
    # status.py: what was written and told
    written: JSON | None = None  # the last status the apiserver took
    written_at: float | None = None  # monotonic: when it was written (status pacing)
    settling: float | None = None  # monotonic: since when a counters-only change waits
    reason: str | None = None  # the hold reason last announced by an Event
    transitions: dict[str, tuple[str, str]] = field(default_factory=dict)  # type -> (status, time)
    capacity_held: bool = False  # its CapacityHeld Event was posted
    group_behind: float | None = None  # monotonic: since when the group's status lags the Gang's
    warned_unmodeled: bool = False  # its UnmodeledConstraints check was made
    last_seen: float | None = None  # monotonic: a label-only gang without pods, since when
    unseen: JSON = field(default_factory=dict)  # decisions written that the watch has not shown
    unseen_version: str = "0"  # the resourceVersion the last of them was written at
    # The gang's decision (admission attempt) this process saw last, and since when (monotonic):
    # its timeout counts from there, never from a time another machine wrote.
    decision_seen: tuple[int, float] | None = None
    # recovery.py
    recovered: int | None = None  # the admission attempt this process recovered
    recovered_at: float | None = None  # monotonic: when (a composite's other gangs go with it)
    # A withdrawn recovery of this attempt, and since when this process knows it (monotonic):
    # the gang may be recovered again a timeout after that, never at once.
    withdrawal_seen: tuple[int, float] | None = None
    backoff_until: float = 0.0  # epoch seconds: a recovery's backoff as written
    polled: float | None = None  # monotonic: a suspended Job last looked at
    whole: tuple[int, dict[str, tuple[str, str]]] | None = None  # seen whole: attempt, bound pods
    warned_policy: bool = False  # told its member-loss annotation is wrong
    # delegation.py: since when (pass time) kube-scheduler has had the whole gang to place; its
    # forming grace counts from there, not from its first pod (placement kube-scheduler).
    placing_since: float | None = None
    # recovery.py and preemption.py: `status.recovery` is written by both, one write at a time,
    # each on top of the other's last (a preemption records a victim's Job there before it
    # suspends it; a recovery's write from an older copy must not drop it).
    recording: asyncio.Lock = field(default_factory=asyncio.Lock)
    # Jobs a preemption of this process recorded in `suspendedJobs` and may still suspend: not
    # "resumed by someone else" while it may (a new leader's term starts without: the old
    # leader's tasks are gone, and a Job recorded but never suspended is dropped).
    suspending: set[str] = field(default_factory=set)
    # release.py
    unfinished: dict[str, str] = field(
        default_factory=dict
    )  # pods of its release still to patch: uid -> node
    complete_at: float | None = None  # epoch seconds: its members were all there (a metric)
    # holds.py and loop.py
    first_seen: float | None = None  # epoch seconds: when a pass first saw it
    first_pod: JSON | None = None  # a pod of it, for Events before its Gang exists


class GangMemories:
    """One `GangMemory` per gang, made on first use."""

    def __init__(self) -> None:
        self.entries: dict[GangKey, GangMemory] = {}

    def __getitem__(self, key: GangKey) -> GangMemory:
        entry = self.entries.get(key)
        if entry is None:
            entry = self.entries[key] = GangMemory()
        return entry

    def get(self, key: GangKey) -> GangMemory | None:
        return self.entries.get(key)

    def __contains__(self, key: object) -> bool:
        return key in self.entries

    def items(self) -> list[tuple[GangKey, GangMemory]]:
        return list(self.entries.items())

    def keep(self, live: Iterable[GangKey]) -> None:
        """Forget every gang not in `live` (it has neither pods nor a Gang object)."""
        keep = set(live)
        for key in [k for k in self.entries if k not in keep]:
            del self.entries[key]
