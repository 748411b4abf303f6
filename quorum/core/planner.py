"""The gang planner: which gangs can be released now, and onto which node each pod goes.

A pure function of a snapshot: nodes, what is used on each (bound pods plus reservations of
pods released but not yet bound), and the queue of gangs. Gangs are taken in order (priority,
then age); a gang is released only if at least minMember of its pods (counting members released
before) are placed node by node, and the capacity it takes is subtracted before the next gang
is planned. A gang that does not fit does not block the gangs behind it (backfill).

Placement is best fit: each pod goes to the eligible node with the least room left after it
(accelerators first, then CPU and memory), preferring nodes whose PreferNoSchedule taints it
tolerates, so that whole nodes stay free for large gangs. For pods that are all alike, this
greedy placement is optimal (a node's room for one shape does not depend on other nodes); for
mixed pods it may miss a packing, so a bounded search tries before the gang is held.

Fairness. Backfill alone would let a stream of small gangs starve a large one: whenever a node
frees, a small gang behind it takes the node. So once a held gang has waited
`starvation_seconds`, the first such gang in queue order gets capacity *held* for it: the
eligible nodes closest to free (most room for its pods now, then most room when empty) until
they would take the whole gang. On those nodes, the gangs behind it see the room minus what the
starving gang will need there, so backfill only uses what it cannot (CPU beside its GPUs, say);
as the nodes drain, it fits and is released. A gang that could not fit even in an empty
cluster holds nothing. One starving gang at a time keeps the rest of the cluster working.
"""

from __future__ import annotations

import bisect
from collections import Counter
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field

from quorum.core.fit import FitSettings, prefers_not, why_not
from quorum.core.model import Gang, Node, Pod, Resources, fits, subtract

GiB = 1024**3 * 1000  # milli-bytes


@dataclass(frozen=True, slots=True)
class PlannerSettings:
    fit: FitSettings = field(default_factory=FitSettings)
    accelerators: tuple[str, ...] = ("nvidia.com/gpu", "sunk.coreweave.com/accelerator")
    search_budget: int = 20_000  # placements tried by the search for mixed gangs, per gang
    starvation_seconds: float = 60.0  # a gang held this long gets capacity held for it


@dataclass(frozen=True, slots=True)
class Release:
    gang: Gang
    placement: tuple[tuple[Pod, Node], ...]


@dataclass(frozen=True, slots=True)
class Hold:
    gang: Gang
    reason: str  # WaitingForMembers | Unschedulable
    message: str
    held_nodes: tuple[str, ...] = ()  # capacity held for this starving gang
    held_message: str = ""


@dataclass(frozen=True, slots=True)
class Plan:
    releases: tuple[Release, ...]
    holds: tuple[Hold, ...]


def queue_order(gang: Gang) -> tuple[int, float, str, str]:
    return (-gang.priority, gang.created, gang.namespace, gang.name)


def plan_gangs(
    nodes: Sequence[Node],
    used: Mapping[str, Resources],
    queue: Sequence[Gang],
    settings: PlannerSettings | None = None,
    now: float = 0.0,
) -> Plan:
    settings = settings or PlannerSettings()
    holding = False  # capacity is held for one starving gang at a time
    free = {n.name: subtract(n.allocatable, used.get(n.name, {})) for n in nodes}
    releases: list[Release] = []
    holds: list[Hold] = []
    cache = _Index(nodes, free, settings)
    for gang in sorted(queue, key=queue_order):
        needed = max(0, gang.min_member - gang.released)
        if gang.released + len(gang.pods) < gang.min_member:
            holds.append(
                Hold(
                    gang,
                    "WaitingForMembers",
                    f"{gang.members} of {gang.min_member} members exist (minMember {gang.min_member})",
                )
            )
            continue
        if not gang.pods:
            continue
        placement, message = _place(gang, needed, cache, free, settings)
        if placement is None:
            hold = Hold(gang, "Unschedulable", message)
            starving = gang.held_since is not None and now - gang.held_since >= settings.starvation_seconds
            if starving and not holding:
                hold = _hold_capacity(hold, needed, cache, free, settings, now)
                holding = bool(hold.held_nodes)
            holds.append(hold)
            continue
        if not placement:
            continue  # admitted already; the pods beyond minMember wait for room
        for pod, node in placement:
            free[node.name] = subtract(free[node.name], pod.requests)
        for node in {n.name: n for _, n in placement}.values():
            cache.touch(node)
        releases.append(Release(gang, tuple(placement)))
    return Plan(tuple(releases), tuple(holds))


Key = tuple[int, int, int, int, str]


@dataclass
class _Index:
    """For each pod shape of a planning pass: the nodes it may use (computed once and shared by
    every gang whose pods have that shape) and, among them, the nodes with room for one more
    such pod, kept sorted best fit first (fewest untolerated PreferNoSchedule taints, then the
    least room left after the pod: accelerators, CPU, memory). After a gang is committed only
    the nodes it used are re-sorted, so a pass costs about one sort per shape, not a scan of
    every node per gang."""

    nodes: Sequence[Node]
    free: Mapping[str, Mapping[str, int]]
    settings: PlannerSettings
    eligible: dict[tuple[object, ...], list[Node]] = field(default_factory=dict)
    refusals: dict[tuple[object, ...], Counter[str]] = field(default_factory=dict)
    ordered: dict[tuple[object, ...], list[tuple[Key, Node]]] = field(default_factory=dict)
    keys: dict[tuple[object, ...], dict[str, Key]] = field(default_factory=dict)
    pods: dict[tuple[object, ...], Pod] = field(default_factory=dict)
    names: dict[tuple[object, ...], set[str]] = field(default_factory=dict)  # eligible, by name

    def of(self, pod: Pod) -> list[Node]:
        shape = pod.shape
        if shape not in self.eligible:
            ok, why = [], Counter[str]()
            for node in self.nodes:
                reason = why_not(pod, node, self.settings.fit)
                if reason is None:
                    ok.append(node)
                else:
                    why[reason] += 1
            self.eligible[shape], self.refusals[shape], self.pods[shape] = ok, why, pod
            self.names[shape] = {n.name for n in ok}
            keys = {n.name: k for n in ok if (k := self.key(pod, n, self.free[n.name])) is not None}
            self.keys[shape] = keys
            self.ordered[shape] = sorted(
                ((k, n) for n in ok if (k := keys.get(n.name)) is not None), key=lambda item: item[0]
            )
        return self.eligible[shape]

    def key(self, pod: Pod, node: Node, room: Mapping[str, int]) -> Key | None:
        """Where the node stands in best-fit order for the pod; None if the pod does not fit."""
        requests = pod.requests
        if not all(room.get(k, 0) >= v for k, v in requests.items() if v > 0):
            return None
        accelerators = self.settings.accelerators
        return (
            prefers_not(pod, node),
            sum(room.get(a, 0) - requests.get(a, 0) for a in accelerators),
            room.get("cpu", 0) - requests.get("cpu", 0),
            room.get("memory", 0) - requests.get("memory", 0),
            node.name,
        )

    def touch(self, node: Node) -> None:
        """The node's committed room shrank: move it in (or out of) every shape's order."""
        for shape, keys in self.keys.items():
            old = keys.pop(node.name, None)
            ordered = self.ordered[shape]
            if old is not None:
                del ordered[bisect.bisect_left(ordered, old, key=lambda item: item[0])]
            if node.name not in self.names[shape]:
                continue
            new = self.key(self.pods[shape], node, self.free[node.name])
            if new is not None:
                keys[node.name] = new
                bisect.insort(ordered, (new, node), key=lambda item: item[0])


def _place(
    gang: Gang, needed: int, cache: _Index, free: dict[str, dict[str, int]], settings: PlannerSettings
) -> tuple[list[tuple[Pod, Node]] | None, str]:
    nodes = cache.nodes
    for pod in gang.pods:
        cache.of(pod)
    eligible, refusals = cache.eligible, cache.refusals
    if gang.min_resources:
        usable = {n.name: n for pod in gang.pods for n in eligible[pod.shape]}
        available: dict[str, int] = {}
        for name in usable:
            for k, v in free[name].items():
                available[k] = available.get(k, 0) + max(0, v)
        short = {k: v for k, v in gang.min_resources.items() if available.get(k, 0) < v}
        if short:
            return None, "minResources not free: " + "; ".join(
                f"needs {_amount(k, v)} {k}, eligible nodes have {_amount(k, available.get(k, 0))}"
                for k, v in sorted(short.items())
            )
    pods = sorted(gang.pods, key=lambda p: _size(p, settings), reverse=True)
    placement = _greedy(pods, cache, free)
    if len(placement) >= needed:
        return placement, ""
    if len({p.shape for p in pods}) > 1:
        found = _search(pods, needed, eligible, free, settings)
        if found is not None:
            return found, ""
    return None, _explain(gang, needed, pods, placement, eligible, refusals, free, len(nodes))


def _hold_capacity(
    hold: Hold,
    needed: int,
    cache: _Index,
    free: dict[str, dict[str, int]],
    settings: PlannerSettings,
    now: float,
) -> Hold:
    """Hold the nodes closest to free for a starving gang (see the module's doc): most room for
    its pods now (in fractions of a pod), then most room when empty. The gang's biggest pod
    stands for all of them when its pods differ."""
    gang = hold.gang
    pod = max(gang.pods, key=lambda p: _size(p, settings))
    candidates = []
    for node in cache.eligible[pod.shape]:
        empty = _slots(pod, node.allocatable)
        if empty > 0:
            candidates.append((-_share(pod, free[node.name]), -empty, node.name, node, empty))
    if sum(c[4] for c in candidates) < needed:
        return hold  # could not fit even in an empty cluster: holding would only waste
    candidates.sort(key=lambda c: c[:3])
    held: list[str] = []
    left, free_now = needed, 0
    for _, _, name, node, empty in candidates:
        if left <= 0:
            break
        take = min(empty, left)
        left -= take
        free_now += min(take, _slots(pod, free[name]))
        held.append(name)
        free[name] = subtract(free[name], {k: v * take for k, v in pod.requests.items()})
        cache.touch(node)
    waited = now - (gang.held_since or now)
    message = (
        f"holding {len(held)} nodes for this gang after {waited:.0f}s held (starvation guard): room "
        f"for {free_now} of its {needed} pods is free there now, the rest as running pods finish; "
        f"gangs behind it use only what it cannot: {', '.join(held[:10])}{' …' if len(held) > 10 else ''}"
    )
    return Hold(gang, hold.reason, hold.message, tuple(held), message)


def _size(pod: Pod, settings: PlannerSettings) -> tuple[int, ...]:
    r = pod.requests
    return (sum(r.get(a, 0) for a in settings.accelerators), r.get("cpu", 0), r.get("memory", 0))


def _score(pod: Pod, node: Node, room: Mapping[str, int], settings: PlannerSettings) -> tuple[object, ...]:
    after = subtract(room, pod.requests)
    return (
        prefers_not(pod, node),
        sum(after.get(a, 0) for a in settings.accelerators),
        after.get("cpu", 0),
        after.get("memory", 0),
        node.name,
    )


def _greedy(
    pods: Sequence[Pod],
    cache: _Index,
    free: Mapping[str, dict[str, int]],
) -> list[tuple[Pod, Node]]:
    """Best fit, a shape at a time: walk the shape's nodes in best-fit order and fill each in
    turn. For pods that are alike this is exactly placing each pod on the tightest node that
    takes it (a node only gets tighter as it fills)."""
    room: dict[str, dict[str, int]] = {}  # what this gang would take, over the committed `free`
    placement: list[tuple[Pod, Node]] = []
    by_shape: dict[tuple[object, ...], list[Pod]] = {}
    for pod in pods:  # pods come biggest first; shapes keep that order
        by_shape.setdefault(pod.shape, []).append(pod)
    for shape, waiting in by_shape.items():
        for _, node in cache.ordered[shape]:
            current = room.get(node.name) or free[node.name]
            while waiting and fits(waiting[0].requests, current):
                pod = waiting.pop(0)
                current = subtract(current, pod.requests)
                placement.append((pod, node))
            room[node.name] = current
            if not waiting:
                break
    return placement


def _search(
    pods: Sequence[Pod],
    needed: int,
    eligible: Mapping[tuple[object, ...], list[Node]],
    free: Mapping[str, dict[str, int]],
    settings: PlannerSettings,
) -> list[tuple[Pod, Node]] | None:
    """Depth-first search for `needed` pods placed together; bounded by the budget."""
    room = {name: dict(r) for name, r in free.items()}
    chosen: list[tuple[Pod, Node]] = []
    budget = [settings.search_budget]

    def visit(i: int) -> bool:
        if len(chosen) >= needed:
            return True
        if i >= len(pods) or len(chosen) + (len(pods) - i) < needed or budget[0] <= 0:
            return False
        pod = pods[i]
        tried: set[tuple[tuple[str, int], ...]] = set()
        for node in sorted(eligible[pod.shape], key=lambda n: _score(pod, n, room[n.name], settings)):
            state = tuple(sorted(room[node.name].items()))
            if state in tried or not fits(pod.requests, room[node.name]):
                continue  # an identical node was already tried for this pod
            tried.add(state)
            budget[0] -= 1
            room[node.name] = subtract(room[node.name], pod.requests)
            chosen.append((pod, node))
            if visit(i + 1):
                return True
            chosen.pop()
            room[node.name] = {k: v + pod.requests.get(k, 0) for k, v in room[node.name].items()}
        return visit(i + 1)  # leave this pod out (gangs with more pods than needed)

    return list(chosen) if visit(0) else None


def _share(pod: Pod, room: Mapping[str, int]) -> float:
    """How many such pods the room takes, as a fraction: 0.5 is half of one pod's needs free."""
    shares = [max(0, room.get(k, 0)) / v for k, v in pod.requests.items() if v > 0]
    return min(shares) if shares else 1e9


def _slots(pod: Pod, room: Mapping[str, int]) -> int:
    counts = [room.get(k, 0) // v for k, v in pod.requests.items() if v > 0]
    return max(0, min(counts)) if counts else 1_000_000


def _explain(
    gang: Gang,
    needed: int,
    pods: Sequence[Pod],
    placement: Sequence[tuple[Pod, Node]],
    eligible: Mapping[tuple[object, ...], list[Node]],
    refusals: Mapping[tuple[object, ...], Counter[str]],
    free: Mapping[str, dict[str, int]],
    node_count: int,
) -> str:
    """Why the gang does not fit, in numbers a person can act on."""
    placed = {p.uid for p, _ in placement}
    pod = next(p for p in pods if p.uid not in placed)
    same = sum(1 for p in pods if p.shape == pod.shape)
    nodes = eligible[pod.shape]
    room_per_node = [_slots(pod, free[n.name]) for n in nodes]
    with_room = sum(1 for s in room_per_node if s > 0)
    slots = sum(room_per_node)
    parts = [f"needs {needed} pods placed together; {same} pods × {describe(pod.requests)}"]
    excluded = refusals[pod.shape]
    note = f"{len(nodes)} of {node_count} nodes eligible"
    if excluded:
        by_count = sorted(excluded.items(), key=lambda item: (-item[1], item[0]))
        note += " (" + ", ".join(f"{n} {r}" for r, n in by_count) + ")"
    parts.append(note)
    per_node = max(room_per_node, default=0)
    verb = "has" if with_room == 1 else "have"
    parts.append(f"{with_room} {verb} room for one" + (f" (up to {per_node} each)" if per_node > 1 else ""))
    if slots < same:
        parts.append(f"{slots} such pods fit in all: short by {same - slots}")
    else:
        parts.append(f"only {len(placement)} of the gang's pods fit together")
    return "; ".join(parts)


def _amount(resource: str, milli_units: int) -> str:
    if resource == "memory" or resource.endswith("storage"):
        return f"{milli_units / GiB:g}Gi"
    value = milli_units / 1000
    return f"{value:g}" if value >= 1 or value == 0 else f"{milli_units}m"


def describe(requests: Resources) -> str:
    """ "8 nvidia.com/gpu, 16 cpu, 64Gi memory" (the pod count is left out)."""
    order = sorted((k for k in requests if k != "pods"), key=lambda k: (k in ("cpu", "memory"), k))
    return ", ".join(f"{_amount(k, requests[k])} {k}" for k in order if requests[k] > 0) or "no resources"
