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

Incremental. A `Planner` keeps its node index (`quorum.core.index`) between passes; a pass
told which nodes changed (usage or the node itself) brings only those up to date, plus the
nodes the previous pass committed to, and then plans the queue. A gang of alike pods that does
not fit is known from the index's running totals, without a scan, so held gangs cost little.
`plan_gangs` is one pass of a fresh planner.

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

from collections.abc import Collection, Mapping, Sequence
from dataclasses import dataclass, field

from quorum.core.explain import amount, explain
from quorum.core.fit import FitSettings, prefers_not
from quorum.core.index import NodeIndex, NodesOfShape, Shape, ShapeEntry, slots
from quorum.core.model import Gang, Node, Pod, Resources, fits, subtract
from quorum.core.topology import domains_of, explain_domains, least_waste_first


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
    """One planning pass from scratch."""
    return Planner(settings).plan({n.name: n for n in nodes}, used, queue, now)


class Planner:
    def __init__(self, settings: PlannerSettings | None = None) -> None:
        self.settings = settings or PlannerSettings()
        self.index = NodeIndex(self.settings.fit, self.settings.accelerators)
        self.committed: set[str] = set()  # nodes whose room the last pass took (to restore)
        self.synced = False
        # Gangs held for lack of room last pass, with the versions of their shapes then.
        self.held: dict[tuple[str, str], tuple[Gang, tuple[int, ...], Hold]] = {}

    def plan(
        self,
        nodes: Mapping[str, Node],
        used: Mapping[str, Resources],
        queue: Sequence[Gang],
        now: float = 0.0,
        changed: Collection[str] | None = None,
    ) -> Plan:
        """Plan the queue. `changed`: the names of the nodes whose usage or object changed since
        the previous pass (None: compare everything)."""
        self.sync(nodes, used, changed)
        index, settings = self.index, self.settings
        holding = False  # capacity is held for one starving gang at a time
        releases: list[Release] = []
        holds: list[Hold] = []
        held: dict[tuple[str, str], tuple[Gang, tuple[int, ...], Hold]] = {}
        explained: dict[tuple[object, ...], str] = {}  # gangs alike held alike share a message
        touched: set[Shape] = set()
        for gang in sorted(queue, key=queue_order):
            needed = max(0, gang.min_member - gang.released)
            if gang.released + len(gang.pods) < gang.min_member:
                message = f"{gang.members} of {gang.min_member} members exist (minMember {gang.min_member})"
                holds.append(Hold(gang, "WaitingForMembers", message))
                continue
            if not gang.pods:
                continue
            starving = gang.held_since is not None and now - gang.held_since >= settings.starvation_seconds
            entries = {pod.shape: index.shape(pod) for pod in gang.shapes}
            touched.update(entries)
            versions = _versions(entries)
            before = self.held.get(gang.key)
            if before is not None and not starving and before[1] == versions and before[0] == gang:
                holds.append(before[2])  # nothing it could use changed: held for the same reason
                held[gang.key] = before
                continue
            placement, message = _place(gang, needed, index, settings, entries, explained)
            if placement is None:
                hold = Hold(gang, "Unschedulable", message)
                if starving and not holding:
                    hold = self.hold_capacity(hold, needed, now)
                    holding = bool(hold.held_nodes)
                holds.append(hold)
                held[gang.key] = (gang, versions, hold)
                continue
            if not placement:
                continue  # admitted already; the pods beyond minMember wait for room
            taken: dict[str, dict[str, int]] = {}
            for pod, node in placement:
                taken[node.name] = subtract(taken.get(node.name) or index.free[node.name], pod.requests)
            for name, room in taken.items():
                index.set_free(name, room)
            self.committed.update(taken)
            releases.append(Release(gang, tuple(placement)))
        index.keep_only(touched)  # shapes no gang asked for this pass are forgotten
        self.held = held
        return Plan(tuple(releases), tuple(holds))

    def sync(
        self, nodes: Mapping[str, Node], used: Mapping[str, Resources], changed: Collection[str] | None
    ) -> None:
        """Bring the index to the pass's starting point: every node's room is its allocatable
        minus what is used on it."""
        index = self.index
        if changed is None or not self.synced:
            for name in [n for n in index.nodes if n not in nodes]:
                index.remove_node(name)
            names: Collection[str] = nodes.keys()
        else:
            names = set(changed) | self.committed
        self.committed = set()
        for name in names:
            node = nodes.get(name)
            if node is None:
                index.remove_node(name)
                continue
            room = subtract(node.allocatable, used.get(name, {}))
            if index.nodes.get(name) is not node:
                index.set_node(node, room)
            elif index.free[name] != room:
                index.set_free(name, room)
        self.synced = True

    def hold_capacity(self, hold: Hold, needed: int, now: float) -> Hold:
        """Hold the nodes closest to free for a starving gang (see the module's doc): most room
        for its pods now (in fractions of a pod), then most room when empty. The gang's biggest
        pod stands for all of them when its pods differ."""
        gang, index = hold.gang, self.index
        pod = max(gang.pods, key=lambda p: _size(p, self.settings))
        by_domain: dict[str | None, list[tuple[float, int, str, int]]] = {}
        for node in index.shape(pod).eligible.values():
            empty = slots(pod, node.allocatable)
            domain = node.labels.get(gang.topology_key) if gang.topology_key else None
            if empty > 0 and (domain is not None or not gang.topology_key):
                candidate = (-_share(pod, index.free[node.name]), -empty, node.name, empty)
                by_domain.setdefault(domain, []).append(candidate)
        # With a topology constraint, the domain that could take the gang and is closest to free.
        possible = [(domain, c) for domain, c in by_domain.items() if sum(x[3] for x in c) >= needed]
        if not possible:
            return hold  # could not fit even in an empty cluster: holding would only waste
        _, candidates = min(possible, key=lambda dc: (sum(x[0] for x in dc[1]), str(dc[0])))
        candidates.sort()
        held: list[str] = []
        left, free_now = needed, 0
        for _, _, name, empty in candidates:
            if left <= 0:
                break
            take = min(empty, left)
            left -= take
            free_now += min(take, slots(pod, index.free[name]))
            held.append(name)
            index.set_free(name, subtract(index.free[name], {k: v * take for k, v in pod.requests.items()}))
        self.committed.update(held)
        waited = now - (gang.held_since or now)
        message = (
            f"holding {len(held)} nodes for this gang after {waited:.0f}s held (starvation guard): room "
            f"for {free_now} of its {needed} pods is free there now, the rest as running pods finish; "
            f"gangs behind it use only what it cannot: {', '.join(held[:10])}{' …' if len(held) > 10 else ''}"
        )
        return Hold(gang, hold.reason, hold.message, tuple(held), message)


def _place(
    gang: Gang,
    needed: int,
    index: NodeIndex,
    settings: PlannerSettings,
    entries: Mapping[Shape, ShapeEntry],
    explained: dict[tuple[object, ...], str],
) -> tuple[list[tuple[Pod, Node]] | None, str]:
    free = index.free
    if gang.min_resources:
        usable = {name for entry in entries.values() for name in entry.eligible}
        available: dict[str, int] = {}
        for name in usable:
            for k, v in free[name].items():
                available[k] = available.get(k, 0) + max(0, v)
        short = {k: v for k, v in gang.min_resources.items() if available.get(k, 0) < v}
        if short:
            return None, "minResources not free: " + "; ".join(
                f"needs {amount(k, v)} {k}, eligible nodes have {amount(k, available.get(k, 0))}"
                for k, v in sorted(short.items())
            )
    if gang.topology_key:
        return _place_in_one_domain(gang, needed, gang.topology_key, entries, free, settings)
    if len(entries) == 1:
        (entry,) = entries.values()
        if entry.total < needed:  # known from the totals: no scan, and the reason is shared
            why = (entry.pod.shape, entry.stats_version, needed, len(gang.pods), len(index.nodes))
            if why not in explained:
                explained[why] = explain(gang, needed, gang.pods, [], entries, len(index.nodes))
            return None, explained[why]
    pods = sorted(gang.pods, key=lambda p: _size(p, settings), reverse=True)
    placement = _greedy(pods, entries, free)
    if len(placement) >= needed:
        return placement, ""
    if len(entries) > 1:
        found = _search(pods, needed, entries, free, settings)
        if found is not None:
            return found, ""
    return None, explain(gang, needed, pods, placement, entries, len(index.nodes))


def _place_in_one_domain(
    gang: Gang,
    needed: int,
    key: str,
    entries: Mapping[Shape, ShapeEntry],
    free: Mapping[str, dict[str, int]],
    settings: PlannerSettings,
) -> tuple[list[tuple[Pod, Node]] | None, str]:
    """All of the gang in one domain of `key`: the fitting domain with the least free capacity."""
    pods = sorted(gang.pods, key=lambda p: _size(p, settings), reverse=True)
    biggest = pods[0].shape
    domains, unlabeled = domains_of(entries, key)
    for domain in least_waste_first(domains, biggest):
        if len(entries) == 1 and domain.capacity(biggest) < needed:
            continue  # known from the totals
        placement = _greedy(pods, domain.shapes, free)
        if len(placement) >= needed:
            return placement, ""
        if len(entries) > 1 and len(domain.shapes) == len(entries):
            found = _search(pods, needed, domain.shapes, free, settings)
            if found is not None:
                return found, ""
    return None, explain_domains(key, needed, domains, biggest, unlabeled)


def _versions(entries: Mapping[Shape, ShapeEntry]) -> tuple[int, ...]:
    """What a held gang's outcome depends on: for alike pods, the shape's room per node (with a
    topology constraint too: a domain's totals are its nodes'); for mixed pods, the room of
    every eligible node of each shape."""
    if len(entries) == 1:
        (entry,) = entries.values()
        return (entry.stats_version,)
    return tuple(v for e in entries.values() for v in (e.stats_version, e.room_version))


def _size(pod: Pod, settings: PlannerSettings) -> tuple[int, ...]:
    r = pod.requests
    return (sum(r.get(a, 0) for a in settings.accelerators), r.get("cpu", 0), r.get("memory", 0))


def _share(pod: Pod, room: Mapping[str, int]) -> float:
    """How many such pods the room takes, as a fraction: 0.5 is half of one pod's needs free."""
    shares = [max(0, room.get(k, 0)) / v for k, v in pod.requests.items() if v > 0]
    return min(shares) if shares else 1e9


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
    pods: Sequence[Pod], entries: Mapping[Shape, NodesOfShape], free: Mapping[str, dict[str, int]]
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
        for _, node in entries[shape].ordered:
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
    entries: Mapping[Shape, NodesOfShape],
    free: Mapping[str, dict[str, int]],
    settings: PlannerSettings,
) -> list[tuple[Pod, Node]] | None:
    """Depth-first search for `needed` pods placed together; bounded by the budget."""
    names = {name for entry in entries.values() for name in entry.eligible}
    room = {name: dict(free[name]) for name in names}
    chosen: list[tuple[Pod, Node]] = []
    budget = [settings.search_budget]

    def visit(i: int) -> bool:
        if len(chosen) >= needed:
            return True
        if i >= len(pods) or len(chosen) + (len(pods) - i) < needed or budget[0] <= 0:
            return False
        pod = pods[i]
        tried: set[tuple[tuple[str, int], ...]] = set()
        eligible = entries[pod.shape].eligible.values()
        for node in sorted(eligible, key=lambda n: _score(pod, n, room[n.name], settings)):
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
