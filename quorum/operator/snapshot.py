"""What a pass plans on, taken at one moment on the event loop: one `Snapshot` (nodes, usage
with the ledger's reservations, the gangs free to plan, since when each has been held, the
reservations of preemptors, the nodes that changed). The worker thread turns it into the
planner's models and the plan (`plan`); nothing in it changes while the plan is made.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field, replace

from quorum.core.conditions import NO_ROOM
from quorum.core.devices import (
    Ask,
    Assignment,
    DeviceCounts,
    DeviceKey,
    DeviceMatcher,
    DeviceWorld,
    count_devices,
)
from quorum.core.model import Composite, Gang, Node, Pod, Resources, add
from quorum.core.planner import Hold, Plan, Planner, Release
from quorum.core.preemption import RunningPod
from quorum.k8s.convert import node_from_api, pod_from_api
from quorum.k8s.devices import DeviceObjects
from quorum.operator.gangs import JSON, GangView
from quorum.operator.release import tolerating

log = logging.getLogger("quorum.operator")
GangKey = tuple[str, str]


@dataclass(frozen=True)
class Snapshot:
    nodes: Mapping[str, Node]
    used: Mapping[str, Resources]  # bound pods plus the ledger's reservations, per node
    gangs: Mapping[GangKey, GangView]  # the gangs free to plan, in the store's order
    held_since: Mapping[GangKey, float | None]  # since when each has been held for lack of room
    tokens: Mapping[GangKey, str]  # the reservation of each gang that preempts
    changed: set[str] | None  # nodes whose usage or object changed since the last pass (None: all)
    now: float
    composites: Mapping[GangKey, Composite] = field(default_factory=dict)  # 1.37 CompositePodGroups
    devices: DeviceWorld = field(default_factory=DeviceWorld)  # DRA: devices, classes, claims


class NodeModels:
    """The planner's Node of every node, converted again only when its object changed, and the
    names of the nodes that changed since the last pass."""

    def __init__(self) -> None:
        self.models: dict[str, tuple[str, Node]] = {}  # name -> (resourceVersion, Node)
        self.changed: set[str] = set()

    def refresh(self, objects: Mapping[str, JSON]) -> dict[str, Node]:
        models = {}
        for name, obj in objects.items():
            version = obj["metadata"].get("resourceVersion", "")
            cached = self.models.get(name)
            if cached is None or cached[0] != version:
                try:
                    cached = (version, node_from_api(obj))
                except Exception:  # a node we cannot read is a node we do not plan on
                    log.warning("node %s not understood; left out of plans", name, exc_info=True)
                    continue
                self.changed.add(name)
            models[name] = cached
        self.changed.update(n for n in self.models if n not in models)
        self.models = models
        return {name: model for name, (_, model) in models.items()}

    def take_changed(self) -> set[str]:
        changed, self.changed = self.changed, set()
        return changed


class PodModels:
    """The planner's Pod of every gated pod, converted again only when the pod changed: a
    held gang of a thousand pods is not converted anew every pass (nor its garbage collected:
    that was most of the loop's pauses). Used only by the worker thread."""

    def __init__(self) -> None:
        self.models: dict[str, tuple[str, Pod]] = {}  # uid -> (resourceVersion, Pod)
        self.seen: set[str] = set()

    def __call__(self, pod: JSON) -> Pod:
        meta = pod["metadata"]
        uid, version = meta["uid"], meta.get("resourceVersion", "")
        self.seen.add(uid)
        cached = self.models.get(uid)
        if cached is None or cached[0] != version:
            cached = (version, pod_from_api(pod))
            self.models[uid] = cached
        return cached[1]

    def keep_seen(self) -> None:
        """Forget the pods no plan asked for since the last call."""
        self.models = {uid: m for uid, m in self.models.items() if uid in self.seen}
        self.seen = set()


class DeviceNodes:
    """DRA for the planner across passes (worker thread only): the selector results, and each
    node with its devices counted in, the same object while its counts are the same (the
    planner's index refreshes a node that changed; `changed` tells it which)."""

    def __init__(self, matcher: DeviceMatcher | None = None) -> None:
        self.matcher = matcher or DeviceMatcher()
        # name -> (node, node with its devices, the devices taken there)
        self.models: dict[str, tuple[Node, Node, Mapping[str, int]]] = {}

    def keep_same(
        self,
        nodes: Mapping[str, Node],
        counted: Mapping[str, Node],
        taken: Mapping[str, Mapping[str, int]],
        changed: set[str] | None,
    ) -> tuple[dict[str, Node], set[str] | None]:
        out: dict[str, Node] = {}
        models: dict[str, tuple[Node, Node, Mapping[str, int]]] = {}
        for name, node in counted.items():
            base, held = nodes[name], taken.get(name, {})
            before = self.models.get(name)
            if (
                before is not None
                and before[0] is base
                and before[1].allocatable == node.allocatable
                and before[2] == held
            ):
                node = before[1]
            elif (node is not base or before is not None) and changed is not None:
                changed = changed | {name}
            if node is not base:
                models[name] = (base, node, held)
            out[name] = node
        self.models = models
        return out, changed


@dataclass(frozen=True)
class Planned:
    """What the worker thread hands back: the plan, the gangs whose conversion failed, and the
    devices each released pod's claims get (DRA)."""

    plan: Plan
    failed: dict[GangKey, str]
    devices: dict[GangKey, Assignment] = field(default_factory=dict)
    nodes: Mapping[str, Node] | None = None  # with their devices counted in (None: no DRA asked)
    counts: DeviceCounts | None = None  # how devices were counted (preemption counts victims' too)


def plan(
    snapshot: Snapshot, planner: Planner, pod_models: PodModels, device_nodes: DeviceNodes | None = None
) -> Planned:
    """In the worker thread: the gangs as the planner's models, then the plan. A gang whose
    pods cannot be read is left out, with the error (the others are planned). The planner is
    passed in, not read from the loop: a new term replaces it while an old plan may still run."""
    queue: list[Gang] = []
    failed: dict[GangKey, str] = {}
    for key, view in snapshot.gangs.items():
        try:
            gang = view.to_core(held_since=snapshot.held_since.get(key), convert=pod_models)
            if (token := snapshot.tokens.get(key)) is not None:  # its nodes are reserved for it
                gang = tolerating(gang, token)
            queue.append(gang)
        except Exception as err:
            failed[key] = f"reading its pods failed: {type(err).__name__}: {err}"
    pod_models.keep_seen()
    return plan_queue(snapshot, queue, planner, device_nodes or DeviceNodes(), failed)


REPLANS_FOR_DEVICES = 2  # a pass plans again at most this often without releases short of devices


def plan_queue(
    snapshot: Snapshot,
    queue: list[Gang],
    planner: Planner,
    device_nodes: DeviceNodes,
    failed: dict[GangKey, str] | None = None,
) -> Planned:
    """The queue planned, with DRA devices counted in and chosen for each release."""
    failed = failed or {}
    counted = count_devices(snapshot.nodes, queue, snapshot.devices, device_nodes.matcher)
    nodes, changed = device_nodes.keep_same(snapshot.nodes, counted.nodes, counted.taken, snapshot.changed)
    used = snapshot.used
    if counted.taken:  # the devices allocated, as used
        used = {**used, **{n: add(used.get(n, {}), t) for n, t in counted.taken.items()}}
    held = [Hold(gang, *counted.held[gang.key]) for gang in queue if gang.key in counted.held]
    plan = planner.plan(nodes, used, counted.queue, snapshot.now, changed, snapshot.composites)
    if counted.counts is None:
        planner.admitted(plan.releases)
        return Planned(Plan(plan.releases, (*plan.holds, *held), plan.visits), failed)
    releases, devices, short = choose_devices(plan.releases, counted.counts, counted.asks)
    # Releases short of devices a pool serving several nodes was counted with on each node:
    # held, and the rest planned again without them (their room is not theirs), a bounded
    # number of times; what is still short then is held too.
    for _ in range(REPLANS_FOR_DEVICES):
        if not short:
            break
        held.extend(Hold(release.gang, *_short_of_devices(snapshot.devices)) for release in short)
        out = {h.gang.key for h in held}
        rest = [gang for gang in counted.queue if gang.key not in out]
        plan = planner.plan(nodes, used, rest, snapshot.now, set(), snapshot.composites, replan=True)
        releases, devices, short = choose_devices(plan.releases, counted.counts, counted.asks)
    held.extend(Hold(release.gang, *_short_of_devices(snapshot.devices)) for release in short)
    holds = tuple(
        _with_selector_errors(
            _with_next_alternative(h, device_nodes.matcher), counted.asks, device_nodes.matcher
        )
        for h in (*plan.holds, *held)
    )
    device_nodes.matcher.forget_alternatives({h.gang.key for h in holds})  # released or gone: done
    planner.admitted(releases)  # the pass's final releases
    return Planned(Plan(tuple(releases), holds, plan.visits), failed, devices, nodes, counted.counts)


def choose_devices(
    releases: Sequence[Release], counts: DeviceCounts, asks: Mapping[str, Sequence[Ask]]
) -> tuple[list[Release], dict[GangKey, Assignment], list[Release]]:
    """The devices of every pod the pass releases: the releases whose pods all get theirs (and
    which), and those that do not. Chosen node by node, each node's pods of every release
    together, as the counts were (chosen gang by gang, one gang's could take what another's
    needs). Where that leaves some pods without devices (a device of a pool serving several
    nodes was counted on each), release by release in plan order instead: each release gets
    its devices or none, and what one cannot have stays free for the next."""
    placed = [placed for release in releases for placed in release.placement]
    chosen, failed_nodes = counts.assign_placement(placed, asks)
    if not failed_nodes:
        return list(releases), {r.gang.key: _of_release(r, chosen) for r in releases}, []
    kept: list[Release] = []
    devices: dict[GangKey, Assignment] = {}
    short: list[Release] = []
    taken: set[DeviceKey] = set()
    for release in releases:
        got, failed = counts.assign_placement(release.placement, asks, taken)
        if failed:
            short.append(release)
            continue
        kept.append(release)
        devices[release.gang.key] = _of_release(release, got)
        taken.update(k for per in got.values() for keys in per.values() for k in keys)
    return kept, devices, short


def _of_release(release: Release, chosen: Assignment) -> Assignment:
    return {pod.uid: chosen[pod.uid] for pod, _ in release.placement if pod.uid in chosen}


def _short_of_devices(world: DeviceWorld) -> tuple[str, str]:
    """Why a release whose pods did not all get devices is held (reason, message)."""
    if world.shared_pools:  # counted on every node they serve, chosen once: not enough for all
        pools = ", ".join(sorted(world.shared_pools)[:3]) + ("..." if len(world.shared_pools) > 3 else "")
        return (
            "Unschedulable",
            f"its pods' devices could not all be chosen on the planned nodes: devices of pools "
            f"that serve several nodes ({pools}) count on each node they serve, and chosen once "
            "each they are not enough for it this pass",
        )
    # The counts said it fits: never expected; held, not half-placed.
    return "PlanningFailed", "its pods' devices could not be chosen on the planned nodes"


def _with_selector_errors(hold: Hold, asks: Mapping[str, Sequence[Ask]], matcher: DeviceMatcher) -> Hold:
    """A gang held while a selector it asks failed on some devices says so: those devices are
    not counted for it (kube-scheduler's allocator fails on them too)."""
    if not matcher.errors:
        return hold
    kinds = {a.kind for pod in hold.gang.pods for a in asks.get(pod.uid, ())}
    failed = sorted({matcher.errors[k] for k in kinds if k in matcher.errors})
    if not failed:
        return hold
    told = f"a device selector failed on {failed[0]}" + (
        f" (and {len(failed) - 1} more)" if failed[1:] else ""
    )
    return replace(hold, message=f"{hold.message}; {told[:300]}: quorum counts no such device for it")


def _with_next_alternative(hold: Hold, matcher: DeviceMatcher) -> Hold:
    """A gang held for lack of room whose claims offer `firstAvailable` alternatives tries the
    next one at the next pass, and says so."""
    if hold.reason not in NO_ROOM or not (told := matcher.next_alternative(hold.gang.key)):
        return hold
    return replace(hold, message=f"{hold.message}; {told}")


def victims_devices(
    counts: DeviceCounts | None, devices: DeviceObjects
) -> Callable[[RunningPod], RunningPod]:
    """A running pod as preemption counts it: with the devices its claims hold, as this pass
    counted devices, among what it would free."""
    if counts is None:
        return lambda pod: pod
    held: dict[str, tuple[DeviceKey, ...]] | None = None  # read once, if preemption asks at all

    def with_devices(pod: RunningPod) -> RunningPod:
        nonlocal held
        if held is None:
            held = devices.held_by_pods()
        keys = held.get(pod.uid)
        if not keys:
            return pod
        return replace(pod, requests={**pod.requests, **counts.freed(pod.node, keys)})

    return with_devices
