"""One scheduling pass of quorum-operator, replayed on objects read once: what its next pass
would decide for one gang, and why (`quorum explain`'s planned view; it works while the operator
is down, from what the caller may read).

Each step is the operator's own: the store and its gangs (`gangs.py`), the reservations of
released pods not yet bound, from the decisions recorded on the Gangs (`ledger.py`), which gangs
the planner sees and why the others wait (`holds.py`), since when each has been held, from its
recorded conditions (`status.py`), the snapshot and the whole queue planned (`snapshot.py`,
`quorum.core.planner`), preemption's choice (`preemption.py`), and the status the pass would
compose (`quorum.core.conditions`). What the operator keeps only in memory (a gang's failures and
their backoff, when preemption last found nothing) starts empty, as for a new leader. Nothing
here makes an API call.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import replace
from typing import Any, cast

from quorum.core.conditions import NO_ROOM, compose, iso, keep_transition_times
from quorum.core.diagnosis import Diagnosis, from_status, node_verdicts, plural
from quorum.core.explain import bigger_than_any_node, describe
from quorum.core.fit import why_not
from quorum.core.model import Gang, Node
from quorum.core.planner import (
    Hold,
    PassState,
    Planner,
    PlannerSettings,
    Release,
    biggest_pod,
    resource_shortfall,
)
from quorum.core.preemption import NoPreemption, Preemption, RunningPod
from quorum.k8s.api import KubeApi
from quorum.k8s.command_reads import ClusterObjects
from quorum.k8s.devices import DeviceObjects
from quorum.k8s.usage import BoundPods
from quorum.k8s.writes import RESERVED_TAINT
from quorum.operator.delegation import Delegation
from quorum.operator.gangs import (
    GangPods,
    GangView,
    Store,
    assemble,
    composites,
    store_composites,
    store_gangs,
    store_groups,
    store_nodes,
    store_pdbs,
)
from quorum.operator.holds import Holds
from quorum.operator.ledger import Ledger
from quorum.operator.memory import GangMemories
from quorum.operator.preemption import Preempter
from quorum.operator.recovery import Recoverer
from quorum.operator.settings import LoopSettings
from quorum.operator.snapshot import NodeModels, PodModels, Snapshot, plan, victims_devices
from quorum.operator.status import GangRecords
from quorum.operator.work import GangWork

GangKey = tuple[str, str]
JSON = dict[str, Any]


class NoCalls:
    """The operator's parts take a `KubeApi`; a replay must never call it."""

    def __getattr__(self, name: str) -> Any:
        raise RuntimeError(f"a replayed pass made an API call ({name})")


class Observing(Planner):
    """The planner, keeping the room free on every node when it came to one gang's turn (before
    any capacity was held for it): what that gang could use, node by node."""

    def __init__(self, settings: PlannerSettings, key: GangKey) -> None:
        super().__init__(settings)
        self.key = key
        self.seen: dict[str, dict[str, int]] | None = None

    def plan_gang(
        self,
        gang: Gang,
        now: float,
        state: PassState,
        held: dict[tuple[str, str], tuple[Gang, tuple[int, ...], Hold]],
    ) -> Release | Hold | None:
        if gang.key == self.key and self.seen is None:
            self.seen = dict(self.index.free)  # each node's room is replaced, never changed in place
        return super().plan_gang(gang, now, state, held)


def ahead(holds: tuple[Hold, ...], key: GangKey) -> tuple[Hold, ...]:
    """The holds the plan made before the gang's (what it was planned after)."""
    keys = [h.gang.key for h in holds]
    return holds[: keys.index(key)] if key in keys else holds


def store_of(objects: ClusterObjects) -> tuple[Store, BoundPods]:
    """The operator's store and bound-pod index, filled as its watches fill them."""
    store = Store(pod_group_version=objects.pod_group_version, composite_version=objects.composite_version)
    bound = BoundPods()
    GangPods(store).replace_all(objects.pods)
    bound.replace_all(objects.pods)
    store_nodes(store).replace_all(objects.nodes)
    store_gangs(store).replace_all(objects.gangs)
    store_pdbs(store).replace_all(objects.pdbs)
    store_composites(store).replace_all(objects.composites)
    for group, items in objects.groups.items():
        store_groups(store, group).replace_all(items)
    return store, bound


def replay(objects: ClusterObjects, key: GangKey, settings: LoopSettings, now: float) -> Diagnosis | None:
    """What the operator's next pass would decide for the gang `key`, as a diagnosis; None if
    the gang has no pods (nothing to plan)."""
    store, bound = store_of(objects)
    api = cast(KubeApi, NoCalls())
    records = GangRecords(api, store, settings.status_interval_seconds, GangMemories())
    records.resume()
    ledger = Ledger()
    ledger.resume(store.gangs, store.pods, bound.pods, store.gang_of)
    work = GangWork(
        settings.gang_concurrency, settings.gang_timeout_seconds, settings.failure_backoff, lambda: None
    )
    recoverer = Recoverer(
        api, records, settings.backoff, ledger, settings.member_loss_policy, settings.placement
    )
    holds_of = Holds(api, records, work, recoverer, settings.forming_grace_seconds)
    preempter = Preempter(api, records, bound, settings.preemption, settings.planner)
    views = {v.key: v for v in assemble(store, ledger.uids)}
    view = views.get(key)
    if view is None:
        return None
    holds, plannable = holds_of.sort_out(views, now)
    holds.update(Delegation(api, records, work, settings.placement).holds(views, holds))
    nodes = NodeModels().refresh(store.nodes)
    devices = DeviceObjects()
    devices.slices.replace_all(objects.resource_slices)
    devices.classes.replace_all(objects.device_classes)
    devices.claims.replace_all(objects.resource_claims)
    snapshot = Snapshot(
        nodes=nodes,
        used=ledger.usage(bound.used),
        gangs=plannable,
        held_since={k: records.held_since(k) for k in plannable},
        tokens=preempter.tokens(),
        changed=None,
        now=now,
        composites=composites(store, views.values()),
        devices=devices.world(nodes, ledger.devices()),
    )
    planner = Observing(settings.planner, key)
    planned = plan(snapshot, planner, PodModels())
    nodes = dict(planned.nodes or nodes)  # with their DRA devices counted in
    hold = holds.get(key) or next((h for h in planned.plan.holds if h.gang.key == key), None)
    release = next((r for r in planned.plan.releases if r.gang.key == key), None)
    if view.failure or key in planned.failed:
        hold = Hold(
            Gang(*key, view.min_member or 1, ()), "PlanningFailed", view.failure or planned.failed[key]
        )
    if hold is not None and (blocked := view.blocked()) and blocked not in hold.message:
        hold = replace(hold, message=f"{hold.message}; {blocked}")  # as the operator's Holds.explain

    preemption = ""
    if hold is not None and hold.reason == "Unschedulable":
        counted = victims_devices(planned.counts, devices)
        preemption, why = preemption_of(view, hold, views, nodes, planner, preempter, ledger, now, counted)
        if why:
            held = {key: hold}
            Holds.add_why_not(held, {key: why})
            hold = held[key]
    status = compose(
        records.state(view, hold, hold.message if hold and hold.reason == "PlanningFailed" else None)
    )
    gang = store.gangs.get(key) or {"metadata": {"namespace": key[0], "name": key[1]}}
    previous = (gang.get("status") or {}).get("conditions")
    timed = keep_transition_times(
        status.conditions, previous if isinstance(previous, list) else None, iso(now)
    )
    composed = {
        "metadata": gang.get("metadata") or {},
        "spec": {**(gang.get("spec") or {}), "minMember": view.min_member, "topologyKey": view.topology_key},
        "status": {**status.body, "conditions": timed},
    }
    diagnosis = from_status(composed, now, f"planned now from {plural(len(nodes), 'node')} you can read")
    if preemption:
        diagnosis = replace(diagnosis, preemption=preemption)
    if hold is not None and hold.held_nodes and diagnosis.capacity_held:  # named for who may read nodes
        named = f"{diagnosis.capacity_held}: {_few(sorted(hold.held_nodes))}"
        diagnosis = replace(diagnosis, capacity_held=named)
    if release is not None:
        return replace(diagnosis, message=released_now(release), reason=diagnosis.reason or "Released")
    if hold is None or hold.reason not in NO_ROOM or not hold.gang.pods:
        return diagnosis
    pod = biggest_pod(hold.gang, settings.planner)
    free = planner.seen if planner.seen is not None else planner.index.free
    eligible = eligible_nodes(hold.gang, nodes, settings)
    return replace(
        diagnosis,
        shortfall=tuple(resource_shortfall(hold.gang, eligible, free, settings.planner)),
        too_big=bigger_than_any_node(pod, (nodes[n] for n in eligible)),
        pod=describe(pod.requests),
        nodes=tuple(node_verdicts(pod, nodes.values(), free, settings.planner.fit, hold.gang.topology_key)),
        topology_key=hold.gang.topology_key,
        held_against=tuple(
            held_against(key, hold.gang, ahead(planned.plan.holds, key), nodes, eligible, preempter, settings)
        ),
    )


def eligible_nodes(gang: Gang, nodes: dict[str, Node], settings: LoopSettings) -> set[str]:
    """The nodes some pod of the gang may use at all (capacity aside)."""
    fit = settings.planner.fit
    return {name for name, node in nodes.items() if any(why_not(p, node, fit) is None for p in gang.shapes)}


def preemption_of(
    view: GangView,
    hold: Hold,
    views: dict[GangKey, GangView],
    nodes: dict[str, Node],
    planner: Planner,
    preempter: Preempter,
    ledger: Ledger,
    now: float,
    counted: Callable[[RunningPod], RunningPod] = lambda pod: pod,
) -> tuple[str, str]:
    """What preemption would do for a gang held for lack of room, if it were its turn: (what to
    tell, the operator's own words it appends to the hold's message, or "")."""
    key = view.key
    in_flight = preempter.in_flight()
    if key in in_flight:
        return f"in flight: {in_flight[key].message}", ""
    if in_flight:
        other = sorted(in_flight)[0]
        return (
            f"waits: gang {other[0]}/{other[1]}'s preemption is in flight (one at a time in the cluster)",
            "",
        )
    busy = {r.gang for r in ledger.entries.values()}
    candidate = preempter.candidate([(view, hold.gang)], nodes, planner.room_for, views, busy, now, counted)
    if candidate is None:
        why = preempter.why_not.get(key)  # "no preemption: its PodGroup has preemptionPolicy: Never"
        if why is None:
            return "none: preemption is off (QUORUM_OPERATOR_PREEMPTION=false)", ""
        return "none" + why.removeprefix("no preemption"), why
    outcome = preempter.decide(candidate)
    if isinstance(outcome, Preemption):
        return f"would take room now ({outcome.checks} checks): {outcome.summary()}", ""
    assert isinstance(outcome, NoPreemption)
    why = f"no preemption ({outcome.reason}): {outcome.message}"  # as Preempter.found_nothing
    return f"none ({outcome.reason}): {outcome.message}", why


def held_against(
    key: GangKey,
    gang: Gang,
    holds: tuple[Hold, ...],
    nodes: dict[str, Node],
    eligible: set[str],
    preempter: Preempter,
    settings: LoopSettings,
) -> list[str]:
    """Other gangs holding room on nodes this gang may use: capacity the starvation guard holds
    for them, and nodes a preemption reserved for them (by taint)."""
    out = []
    for other in holds:
        mine = sorted(set(other.held_nodes) & eligible)
        if other.gang.key != key and mine:
            who = f"{other.gang.namespace}/{other.gang.name}"
            out.append(
                f"gang {who} has {plural(len(mine), 'node')} it may use held (starvation guard): {_few(mine)}"
            )
    fit = settings.planner.fit
    for (namespace, name), token in sorted(preempter.tokens().items()):
        if (namespace, name) == key:
            continue
        reserved = sorted(
            n
            for n, node in nodes.items()
            if any(t.key == RESERVED_TAINT and t.value == token for t in node.taints)
            and any(why_not(p, _untainted(node), fit) is None for p in gang.shapes)
        )
        if reserved:
            out.append(
                f"gang {namespace}/{name}'s preemption reserves {plural(len(reserved), 'node')} it may use: "
                f"{_few(reserved)}"
            )
    return out


def _untainted(node: Node) -> Node:
    return replace(node, taints=tuple(t for t in node.taints if t.key != RESERVED_TAINT))


def _few(names: list[str], most: int = 6) -> str:
    return ", ".join(names[:most]) + (f" and {len(names) - most} more" if len(names) > most else "")


def released_now(release: Release) -> str:
    nodes = sorted({node.name for _, node in release.placement})
    return (
        f"it fits now: the plan places {plural(len(release.placement), 'pod')} on "
        f"{plural(len(nodes), 'node')} ({_few(nodes)}); quorum-operator releases it at its next pass "
        "(is it running?)"
    )
