"""The planner's index of nodes by pod shape, kept between passes.

For each pod shape (pods of one shape fit the same nodes the same way): the nodes it may use at
all (predicates, computed once), and among them the nodes with room for one more such pod, in
best-fit order (fewest untolerated PreferNoSchedule taints, then the least room left after the
pod: accelerators, CPU, memory), plus running totals of that room (how many such pods fit in
all, on how many nodes, at most how many on one). When a node's free room changes only that node
moves (a bisect per shape), so a pass costs about the nodes it changes, not a scan of the pool,
and a gang of alike pods is known not to fit from the totals alone.
"""

from __future__ import annotations

import bisect
from collections import Counter
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from typing import Protocol

from quorum.core.fit import FitSettings, prefers_not, why_not
from quorum.core.model import Node, Pod

Shape = tuple[object, ...]
Key = tuple[int, int, int, int, str]


class NodesOfShape(Protocol):
    """What placement reads of a shape's nodes: all of the index's, or one domain's."""

    ordered: list[tuple[Key, Node]]
    eligible: dict[str, Node]
    room: dict[str, int]  # how many such pods fit, per node with room for one


def slots(pod: Pod, room: Mapping[str, int]) -> int:
    """How many such pods fit in the room."""
    counts = [room.get(k, 0) // v for k, v in pod.requests.items() if v > 0]
    return max(0, min(counts)) if counts else 1_000_000


@dataclass
class ShapeEntry:
    pod: Pod  # a pod of the shape, standing for all
    needs: tuple[tuple[str, int], ...]  # its positive requests
    accelerators: int  # its accelerators, summed
    eligible: dict[str, Node]  # may use at all, by name
    refusals: Counter[str]  # why the other nodes may not be used, counted
    ordered: list[tuple[Key, Node]] = field(default_factory=list)  # with room, best fit first
    keys: dict[str, Key] = field(default_factory=dict)
    room: dict[str, int] = field(default_factory=dict)  # slots per eligible node
    total: int = 0  # such pods that fit in all
    per_node: Counter[int] = field(default_factory=Counter)  # nodes by their slots (> 0)
    # Bumped when the totals or the eligible nodes change / when any eligible node's room does:
    # a held gang whose shapes' versions are as before is held for the same reason.
    stats_version: int = 0
    room_version: int = 0

    @property
    def with_room(self) -> int:
        return sum(self.per_node.values())

    @property
    def most_on_one(self) -> int:
        return max(self.per_node, default=0)


class NodeIndex:
    def __init__(self, fit: FitSettings, accelerators: tuple[str, ...]) -> None:
        self.fit = fit
        self.accelerators = accelerators
        self.nodes: dict[str, Node] = {}
        self.free: dict[str, dict[str, int]] = {}
        self.shapes: dict[Shape, ShapeEntry] = {}
        # PreferNoSchedule taints not tolerated, by (tolerations, taints): nodes share taints.
        self.prefer_cache: dict[tuple[object, object], int] = {}

    # -- nodes ------------------------------------------------------------------------------

    def set_node(self, node: Node, free: dict[str, int]) -> None:
        """Add a node or replace it (labels, taints, allocatable may have changed)."""
        old = self.nodes.get(node.name)
        self.nodes[node.name] = node
        self.free[node.name] = free
        if old is not None and old == node:
            self.set_free(node.name, free)
            return
        for entry in self.shapes.values():
            self._forget(entry, node.name)
            entry.eligible.pop(node.name, None)
            if old is not None:
                reason = why_not(entry.pod, old, self.fit)
                if reason is not None:
                    entry.refusals[reason] -= 1
                    if entry.refusals[reason] <= 0:
                        del entry.refusals[reason]
            self._admit(entry, node)

    def remove_node(self, name: str) -> None:
        old = self.nodes.pop(name, None)
        self.free.pop(name, None)
        if old is None:
            return
        for entry in self.shapes.values():
            self._forget(entry, name)
            entry.eligible.pop(name, None)
            entry.stats_version += 1
            reason = why_not(entry.pod, old, self.fit)
            if reason is not None:
                entry.refusals[reason] -= 1
                if entry.refusals[reason] <= 0:
                    del entry.refusals[reason]

    def set_free(self, name: str, free: dict[str, int]) -> None:
        """The node's free room changed: move it in (or out of) every shape's order."""
        self.free[name] = free
        node = self.nodes[name]
        for entry in self.shapes.values():
            if name in entry.eligible:
                self._forget(entry, name)
                self._place(entry, node)

    # -- shapes -----------------------------------------------------------------------------

    def shape(self, pod: Pod) -> ShapeEntry:
        shape = pod.shape
        entry = self.shapes.get(shape)
        if entry is None:
            needs = tuple((k, v) for k, v in pod.requests.items() if v > 0)
            accelerators = sum(pod.requests.get(a, 0) for a in self.accelerators)
            entry = ShapeEntry(pod, needs, accelerators, {}, Counter())
            # Built in one sweep (the incremental paths below keep it up to date afterwards).
            eligible, refusals, room, ordered, keys = (
                entry.eligible,
                entry.refusals,
                entry.room,
                [],
                entry.keys,
            )
            free, fit, measure = self.free, self.fit, self.measure
            for name, node in self.nodes.items():
                reason = why_not(pod, node, fit)
                if reason is not None:
                    refusals[reason] += 1
                    continue
                eligible[name] = node
                count, key = measure(entry, node, free[name])
                if count > 0:
                    room[name] = count
                if key is not None:
                    keys[name] = key
                    ordered.append((key, node))
            ordered.sort(key=lambda item: item[0])
            entry.ordered = ordered
            entry.per_node = Counter(room.values())
            entry.total = sum(room.values())
            self.shapes[shape] = entry
        return entry

    def keep_only(self, shapes: Iterable[Shape]) -> None:
        """Forget shapes no pending pod has any more (memory stays bounded by the queue)."""
        wanted = set(shapes)
        for shape in [s for s in self.shapes if s not in wanted]:
            del self.shapes[shape]

    # -- internals --------------------------------------------------------------------------

    def measure(self, entry: ShapeEntry, node: Node, room: Mapping[str, int]) -> tuple[int, Key | None]:
        """How many of the shape's pods fit in the node's room, and where the node stands in
        best-fit order for one of them (None if none fits). The planner's hottest function."""
        count = 1_000_000
        for k, v in entry.needs:
            have = room.get(k, 0) // v
            if have < count:
                count = have
                if count <= 0:
                    return 0, None
        pod, requests = entry.pod, entry.pod.requests
        taints = (pod.tolerations, node.taints)
        pref = self.prefer_cache.get(taints)
        if pref is None:
            pref = self.prefer_cache[taints] = prefers_not(pod, node)
        key = (
            pref,
            sum(room.get(a, 0) for a in self.accelerators) - entry.accelerators,
            room.get("cpu", 0) - requests.get("cpu", 0),
            room.get("memory", 0) - requests.get("memory", 0),
            node.name,
        )
        return count, key

    def _admit(self, entry: ShapeEntry, node: Node) -> None:
        entry.stats_version += 1  # eligibility (or the count of refusals) may change
        reason = why_not(entry.pod, node, self.fit)
        if reason is not None:
            entry.refusals[reason] += 1
            return
        entry.eligible[node.name] = node
        self._place(entry, node)

    def _place(self, entry: ShapeEntry, node: Node) -> None:
        count, key = self.measure(entry, node, self.free[node.name])
        self._count(entry, node.name, count)
        if key is not None:
            entry.keys[node.name] = key
            bisect.insort(entry.ordered, (key, node), key=lambda item: item[0])

    def _forget(self, entry: ShapeEntry, name: str) -> None:
        entry.room_version += 1
        old = entry.keys.pop(name, None)
        if old is not None:
            ordered = entry.ordered
            del ordered[bisect.bisect_left(ordered, old, key=lambda item: item[0])]
        self._count(entry, name, 0)

    @staticmethod
    def _count(entry: ShapeEntry, name: str, count: int) -> None:
        old = entry.room.pop(name, 0)
        if old != count:
            entry.stats_version += 1
        if old > 0:
            entry.total -= old
            entry.per_node[old] -= 1
            if not entry.per_node[old]:
                del entry.per_node[old]
        if count > 0:
            entry.room[name] = count
            entry.total += count
            entry.per_node[count] += 1
