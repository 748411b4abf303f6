"""From what the operator's watches hold (plain API objects) to gangs: which pods form which
gang, its group object, its minMember, its counters and its status. Pure functions of a
`Store`, tested with plain data."""

from __future__ import annotations

import asyncio
from collections import defaultdict
from collections.abc import Callable, Collection
from dataclasses import dataclass, field
from functools import cached_property
from typing import Any

from quorum.core.conditions import timestamp
from quorum.core.gangs import GANG_LABEL as GANG_LABEL  # re-exported, as are GATE and is_gated
from quorum.core.gangs import GATE as GATE
from quorum.core.gangs import GROUP_APIS as GROUP_APIS  # re-exported: the operator's modules use it
from quorum.core.gangs import (
    KUEUE_ADMISSION_GATE,
    MAX_MIN_AVAILABLE,
    QUORUM_SCHEDULER_NAMES,
    SIZED_BY_PODS,
    SOURCE_KINDS,
    GangMarker,
    GangSource,
    Placer,
    delegated_pod_group,
    gang_marker,
    gang_markers,
    gang_name,
    legacy_gang_name,
    may_be_legacy,
    parse_min_available,
    queued_since,
    size_on_pod,
)
from quorum.core.gangs import is_gated as is_gated
from quorum.core.model import Composite, Gang, Pod, resources
from quorum.core.preemption import HIGHEST_USER_PRIORITY
from quorum.core.quantity import QuantityError
from quorum.core.workloads import (
    MAX_COMPOSITE_DEPTH,
    POD_GROUP_VERSIONS,
    WAS_GROUP,
    CompositeFacts,
    InvalidWorkloadObject,
    composite_facts,
    disruption_mode,
    parent_name,
    preemption_policy,
    scheduler_refusal,
    topology_of,
)
from quorum.k8s.convert import newer_or_same, pod_from_api
from quorum.k8s.writes import pinned_node

TOPOLOGY_ANNOTATION = "quorum.dev/topology-key"
JSON = dict[str, Any]


@dataclass(frozen=True, slots=True)
class Unclaimed:
    """A pod of a group that asks for a scheduler quorum does not take: what its Event needs."""

    namespace: str
    name: str
    uid: str
    scheduler: str
    marker: GangMarker

    @classmethod
    def of(cls, pod: JSON, marker: GangMarker) -> Unclaimed:
        meta = pod["metadata"]
        scheduler = str((pod.get("spec") or {}).get("schedulerName"))[:253]
        group = GangMarker(marker.source, marker.group[:253])  # an annotation may be long
        return cls(meta.get("namespace", ""), meta["name"], meta["uid"], scheduler, group)

    @property
    def pod(self) -> JSON:
        """The pod as an Event's object."""
        return {
            "apiVersion": "v1",
            "kind": "Pod",
            "metadata": {"name": self.name, "namespace": self.namespace, "uid": self.uid},
        }


@dataclass
class Store:
    """The latest version of every object quorum watches, by key: its watches write it (the
    tables below), and this process's own writes of objects are assumed in it (`assume_*`)
    until the watch shows them; nothing else writes it. Decisions this process recorded and the
    watch has not shown are not here but in `GangRecords` (quorum.operator.status)."""

    pods: dict[str, JSON] = field(default_factory=dict)  # uid -> gang pod
    nodes: dict[str, JSON] = field(default_factory=dict)  # name -> node
    groups: dict[tuple[str, str, str], JSON] = field(default_factory=dict)  # (api group, ns, name)
    gangs: dict[tuple[str, str], JSON] = field(default_factory=dict)  # (ns, name) -> Gang object
    pdbs: dict[tuple[str, str], JSON] = field(default_factory=dict)  # (ns, name) -> PodDisruptionBudget
    composites: dict[tuple[str, str], JSON] = field(default_factory=dict)  # (ns, name) -> CompositePodGroup
    # The namespace label whose value names a gang's tenant (a team of many namespaces is one
    # tenant, docs/lifecycle.md), and the namespaces by name, watched only where it is set.
    tenant_label: str = ""
    namespaces: dict[str, JSON] = field(default_factory=dict)
    # The version of scheduling.k8s.io PodGroup the cluster serves (1.37: v1beta1; 1.36:
    # v1alpha2), None where it serves none; and of CompositePodGroup (1.37: v1alpha3). Kept
    # current by discovery (`quorum.operator.workloads`).
    pod_group_version: str | None = POD_GROUP_VERSIONS[0]
    composite_version: str | None = None
    # API groups of the CRD-defined PodGroups whose CRD is quorum's (crds/; Volcano's where quorum
    # installed it): quorum writes their phase and counters. Another's (scheduler-plugins' own
    # CRD, its controller writing the status) gets no status from quorum: the Gang tells the story.
    owned_group_apis: frozenset[str] = frozenset(g for g, _ in GROUP_APIS.values() if g != WAS_GROUP)
    # The schedulerNames of the pods quorum takes (settings: the default scheduler's, none, and the
    # coscheduler names); a pod asking for another is not quorum's, whatever its markers.
    schedulers: tuple[str, ...] = QUORUM_SCHEDULER_NAMES
    # Pods with a group marker that ask for a scheduler quorum does not take, not bound yet, by
    # uid: told once, on the pod and its group, that quorum leaves them to that scheduler. Only
    # what the Event needs is kept, not the pod.
    unclaimed: dict[str, Unclaimed] = field(default_factory=dict)
    # Watched kind -> set once its first listing is in: the loop plans only when all are.
    synced: dict[str, asyncio.Event] = field(default_factory=dict)
    # Watched kind -> the latest resourceVersion its watch delivered (pods, gangs): an object
    # listed at an older version and not in the store is known deleted (`loop.CatchUp`).
    progress: dict[str, str] = field(default_factory=dict)

    # Gangs made under their group's legacy name (quorum.core.gangs.legacy_gang_name), by
    # (namespace, the name the webhook gives the group's new pods now) -> the legacy name: the
    # group's pods of either label are one gang, under the name its Gang object has.
    aliases: dict[tuple[str, str], str] = field(default_factory=dict)

    def gang_of(self, pod: JSON) -> str | None:
        """The name of the gang the pod belongs to: its quorum.dev/gang label, or the legacy
        name its group's Gang object still has."""
        meta = pod["metadata"]
        name: str | None = (meta.get("labels") or {}).get(GANG_LABEL)
        if not name or not self.aliases:
            return name or None
        return self.aliases.get((meta.get("namespace", ""), name), name)

    def assume_gang(self, key: tuple[str, str], gang: JSON | None) -> None:
        """A Gang this process made, changed (`gang`, as the apiserver answered) or deleted
        (None): what the next pass reads until the watch delivers it (or something newer)."""
        if gang is None:
            if (gone := self.gangs.pop(key, None)) is not None:
                self.saw_gang(gone, present=False)
        else:
            self.gangs[key] = gang
            self.saw_gang(gang, present=True)

    def assume_group(self, key: tuple[str, str, str], group: JSON) -> None:
        """A group object this process made or changed, as the apiserver answered (a Kubernetes
        PodGroup it makes for a gang kube-scheduler places): read until the watch delivers it."""
        self.groups[key] = group

    def assume_deleting(self, uid: str, at: str) -> None:
        """A pod this process deleted (or whose Job it suspended): shown terminating until the
        watch does, so that the next pass neither counts it as a member nor releases a
        replacement beside it."""
        pod = self.pods.get(uid)
        if pod is not None:
            pod["metadata"]["deletionTimestamp"] = at

    def labels_of(self, key: tuple[str, str]) -> tuple[str, ...]:
        """The quorum.dev/gang labels the gang's pods carry: its name, and the name its group's
        new pods get where that is a legacy name."""
        if not self.aliases:
            return (key[1],)
        return (key[1], *sorted(now for (ns, now), legacy in self.aliases.items() if (ns, legacy) == key))

    def saw_gang(self, gang: JSON, present: bool) -> None:
        """Keep `aliases` current with one Gang object as its watch delivered it."""
        meta = gang["metadata"]
        if not may_be_legacy(meta["name"]):
            return  # nearly every Gang: no legacy name ends otherwise
        namespace = meta.get("namespace", "")
        for key in [k for k, legacy in self.aliases.items() if (k[0], legacy) == (namespace, meta["name"])]:
            del self.aliases[key]  # as it stood before: its source may have changed (an adoption)
        marker = gang_source(gang)
        if marker is None or legacy_gang_name(marker.source, marker.group) != meta["name"]:
            return
        if present:
            self.aliases[(namespace, gang_name(marker.source, marker.group))] = meta["name"]

    def advance(self, kind: str, obj: JSON) -> None:
        version = str((obj.get("metadata") or {}).get("resourceVersion") or "")
        if newer_or_same(version, self.progress.get(kind, "")) is not False:
            self.progress[kind] = version

    @property
    def workload_api(self) -> bool:
        """Whether the cluster serves a Kubernetes Workload Aware Scheduling PodGroup."""
        return self.pod_group_version is not None

    def sync_event(self, kind: str) -> asyncio.Event:
        return self.synced.setdefault(kind, asyncio.Event())

    def not_synced(self) -> list[str]:
        return sorted(kind for kind, event in self.synced.items() if not event.is_set())


@dataclass
class GangPods:
    """The Store's gang pods (those with the quorum.dev/gang label), as an index of the
    operator's pod watch (`quorum/k8s/watch.py`), which sees every pod."""

    store: Store

    def upsert(self, pod: JSON) -> None:
        uid = pod["metadata"]["uid"]
        if GANG_LABEL in (pod["metadata"].get("labels") or {}):
            self.store.pods[uid] = pod
        else:
            self.store.pods.pop(uid, None)
            if (marker := unclaimed_marker(pod, self.store.schedulers)) is not None:
                self.store.unclaimed[uid] = Unclaimed.of(pod, marker)
            else:
                self.store.unclaimed.pop(uid, None)
        self.store.advance("pods", pod)

    def delete(self, pod: JSON) -> None:
        self.store.pods.pop(pod["metadata"]["uid"], None)
        self.store.unclaimed.pop(pod["metadata"]["uid"], None)
        self.store.advance("pods", pod)

    def replace_all(self, pods: list[JSON]) -> None:
        self.store.pods.clear()
        self.store.unclaimed.clear()
        for pod in pods:
            self.upsert(pod)


@dataclass
class StoreTable:
    """One table of the Store as the index of a watch (`quorum/k8s/watch.py`): objects by
    `key`. A relisting replaces the entries this watch owns: those whose key starts with
    `owned` (a table several watches fill), or all of them."""

    table: dict[Any, JSON]
    key: Callable[[JSON], Any]
    owned: tuple[str, ...] = ()
    # (apiVersion, kind) of the objects: a listing of a built-in kind (Kubernetes' PodGroup) gives
    # its items without them, and the Gang record names its source by them.
    typed: Callable[[], tuple[str, str]] | None = None
    seen: Callable[[JSON], None] | None = None  # told of every object delivered (the Gangs' progress)

    def upsert(self, obj: JSON) -> None:
        if self.typed is not None and not obj.get("apiVersion"):
            obj["apiVersion"], obj["kind"] = self.typed()
        self.table[self.key(obj)] = obj
        if self.seen is not None:
            self.seen(obj)

    def delete(self, obj: JSON) -> None:
        self.table.pop(self.key(obj), None)
        if self.seen is not None:
            self.seen(obj)

    def replace_all(self, objs: list[JSON]) -> None:
        if self.owned:
            for key in [k for k in self.table if k[: len(self.owned)] == self.owned]:
                del self.table[key]
        else:
            self.table.clear()
        for obj in objs:
            self.upsert(obj)


def namespaced(obj: JSON) -> tuple[str, str]:
    return (obj["metadata"].get("namespace", ""), obj["metadata"]["name"])


def store_namespaces(store: Store) -> StoreTable:
    """The Store's namespaces, by name (their tenant label)."""
    return StoreTable(store.namespaces, lambda namespace: namespace["metadata"]["name"])


def tenant_of(store: Store, namespace: str) -> str:
    """The tenant of a namespace's gangs: `<label>=<value>` of the tenant label where the
    namespace has it, else "" (the namespace is the tenant)."""
    if not store.tenant_label:
        return ""
    labels = (store.namespaces.get(namespace) or {}).get("metadata", {}).get("labels") or {}
    value = labels.get(store.tenant_label)
    return f"{store.tenant_label}={value}" if isinstance(value, str) and value else ""


def store_nodes(store: Store) -> StoreTable:
    """The Store's nodes, by name."""
    return StoreTable(store.nodes, lambda node: node["metadata"]["name"])


@dataclass
class GangTable(StoreTable):
    """The Store's Gang objects, which also keep its legacy gang names (`Store.aliases`)."""

    store: Store | None = None

    def upsert(self, obj: JSON) -> None:
        super().upsert(obj)
        if self.store is not None:
            self.store.saw_gang(obj, present=True)

    def delete(self, obj: JSON) -> None:
        super().delete(obj)
        if self.store is not None:
            self.store.saw_gang(obj, present=False)

    def replace_all(self, objs: list[JSON]) -> None:
        if self.store is not None:
            self.store.aliases.clear()
        super().replace_all(objs)


def store_gangs(store: Store) -> StoreTable:
    """The Store's Gang objects, by (namespace, name)."""
    return GangTable(store.gangs, namespaced, seen=lambda gang: store.advance("gangs", gang), store=store)


_SOURCES = {api: source for source, (api, _) in GROUP_APIS.items()}
_KINDS_WITHOUT_OBJECT = {kind: source for source, kind in SOURCE_KINDS.items()}


def gang_source(gang: JSON) -> GangMarker | None:
    """The group a Gang object stands for, as a marker (its spec.source), None if unreadable."""
    source = (gang.get("spec") or {}).get("source") or {}
    name = source.get("name")
    if not isinstance(name, str) or not name:
        return None
    if source.get("kind") in _KINDS_WITHOUT_OBJECT:
        return GangMarker(_KINDS_WITHOUT_OBJECT[source["kind"]], name)
    api = str(source.get("apiVersion") or "").partition("/")[0]
    kind = _SOURCES.get(api)
    return GangMarker(kind, name) if kind is not None and source.get("kind") == "PodGroup" else None


def store_pdbs(store: Store) -> StoreTable:
    """The Store's PodDisruptionBudgets, by (namespace, name): preemption keeps them."""
    return StoreTable(store.pdbs, namespaced)


def store_composites(store: Store) -> StoreTable:
    """The Store's CompositePodGroups (Kubernetes 1.37), by (namespace, name)."""
    return StoreTable(
        store.composites,
        namespaced,
        typed=lambda: (f"{WAS_GROUP}/{store.composite_version}", "CompositePodGroup"),
    )


def store_groups(store: Store, api_group: str) -> StoreTable:
    """The Store's group objects of one API group (a PodGroup kind), by (group, ns, name)."""

    def typed() -> tuple[str, str]:
        version = store.pod_group_version if api_group == WAS_GROUP else "v1alpha1"
        return f"{api_group}/{version}", "PodGroup"

    return StoreTable(store.groups, lambda obj: (api_group, *namespaced(obj)), (api_group,), typed=typed)


def other_gates(pod: JSON) -> list[str]:
    """Scheduling gates of others (Kueue's, say): while a pod has one, it is not quorum's to
    release yet, however its gang stands — released, it could not bind, and its gang would time
    out."""
    return [
        str(g.get("name"))
        for g in (pod.get("spec") or {}).get("schedulingGates") or []
        if g.get("name") != GATE
    ]


def phase_of(pod: JSON) -> str:
    return str((pod.get("status") or {}).get("phase") or "Pending")


@dataclass
class GangView:
    namespace: str
    name: str
    marker: GangMarker
    pods: list[JSON]
    group: JSON | None = None
    min_member: int | None = None
    waiting: str | None = None  # why the gang cannot be planned yet (its group is missing, ...)
    # Pods of two groups under one gang name (a tenant named a group after another's shortened
    # name): neither planned nor recovered, so one group's trouble never removes the other's pods.
    merged: str | None = None
    basic: bool = False  # a Kubernetes PodGroup with the `basic` policy: pods go one by one
    disruption_mode: str | None = None  # Pod | PodGroup (either version's spelling)
    preemption_policy: str | None = None  # 1.37's PodGroup `preemptionPolicy`
    parent: str | None = None  # 1.37: the CompositePodGroup this gang counts toward
    tenant: str = ""  # whose gang it is, where the namespace's tenant label says (`tenant_of`)
    min_resources: dict[str, int] = field(default_factory=dict)
    schedule_timeout: int = 60
    topology_key: str | None = None  # all pods in one domain of this node label
    # Pods quorum released whose update the watch has not delivered yet: no longer gated.
    just_released: frozenset[str] = frozenset()
    failure: str | None = None  # reading the gang failed unexpectedly (reported, retried)
    # What its group object asks that quorum keeps and shows but does not enforce (a Volcano
    # PodGroup's queue, minTaskMember, priorityClassName): told once in an Event.
    unenforced: tuple[str, ...] = ()

    def is_gated(self, pod: JSON) -> bool:
        return is_gated(pod) and pod["metadata"]["uid"] not in self.just_released

    @property
    def key(self) -> tuple[str, str]:
        return (self.namespace, self.name)

    # A view is what one pass sees of its gang: what it derives from its pods is computed once.
    @cached_property
    def active(self) -> list[JSON]:
        return [
            p
            for p in self.pods
            if phase_of(p) not in ("Succeeded", "Failed")
            and not (p.get("metadata") or {}).get("deletionTimestamp")
        ]

    @cached_property
    def gated(self) -> list[JSON]:
        return [p for p in self.active if self.is_gated(p)]

    @cached_property
    def releasable(self) -> list[JSON]:
        """Gated pods with no gate but quorum's: the ones the planner may place."""
        return [p for p in self.gated if not other_gates(p)]

    @cached_property
    def delegated_to(self) -> str | None:
        """The Kubernetes PodGroup quorum makes for this gang of another dialect, where its pods
        name it (placement kube-scheduler: `quorum.core.gangs.delegated_pod_group`) and none is
        held at quorum's gate: kube-scheduler places the gang, quorum does not plan it."""
        if self.marker.source is GangSource.WORKLOAD_POD_GROUP or self.gated:
            return None
        name = delegated_pod_group(self.marker)
        named = any(names_unreleased(p, name) for p in self.active)
        return name if named else None

    def kube_scheduler_places(self, pod: JSON, placement: Placer) -> bool:
        """Whether kube-scheduler, not quorum, places this pod of the gang (quorum recovers none
        such): it names the PodGroup quorum makes for the gang, or, under placement
        kube-scheduler, it is a Workload Aware Scheduling pod that quorum never held nor
        released (no gate, no release's pin)."""
        if self.marker.source is not GangSource.WORKLOAD_POD_GROUP:
            return names_unreleased(pod, delegated_pod_group(self.marker))
        spec = pod.get("spec") or {}
        return placement is Placer.KUBE_SCHEDULER and not self.is_gated(pod) and pinned_node(spec) is None

    def kube_scheduler_group(self, placement: Placer) -> str | None:
        """The PodGroup kube-scheduler places this gang by, or None where quorum places it: a
        gang of another dialect whose pods name the one quorum makes (`delegated_to`), or, under
        placement kube-scheduler, a Workload Aware Scheduling gang none of whose pods is held
        at quorum's gate (a gang quorum placed before the switch included)."""
        if self.delegated_to is not None:
            return self.delegated_to
        if placement is Placer.KUBE_SCHEDULER and self.marker.source is GangSource.WORKLOAD_POD_GROUP:
            return None if self.gated else self.marker.group
        return None

    @cached_property
    def bound_and_unbound(self) -> tuple[int, list[JSON]]:
        """Active pods bound; active pods released but not bound yet."""
        active = self.active
        bound = sum(1 for p in active if (p.get("spec") or {}).get("nodeName"))
        unbound = [p for p in active if not self.is_gated(p) and not (p.get("spec") or {}).get("nodeName")]
        return bound, unbound

    def blocked(self) -> str | None:
        """What a person should know about gated pods that carry others' gates too."""
        gates = sorted({g for p in self.gated for g in other_gates(p)})
        count = sum(1 for p in self.gated if other_gates(p))
        if not count:
            return None
        if KUEUE_ADMISSION_GATE in gates:  # quota, not room: Kueue admits the workload first
            kueue = sum(1 for p in self.gated if KUEUE_ADMISSION_GATE in other_gates(p))
            return (
                f"waiting for Kueue to admit it (quota, not room): {kueue} pods carry Kueue's gate "
                f"{KUEUE_ADMISSION_GATE}"
                + (
                    f" (and {', '.join(g for g in gates if g != KUEUE_ADMISSION_GATE)})"
                    if len(gates) > 1
                    else ""
                )
                + "; quorum plans them once Kueue has admitted them"
            )
        return (
            f"{count} pods also carry other scheduling gates ({', '.join(gates)}): quorum plans them "
            f"once those are removed"
        )

    def counts(self) -> dict[str, int]:
        """A fresh dict each call (callers adjust it), computed once per view."""
        return dict(self._counts)

    @cached_property
    def _counts(self) -> dict[str, int]:
        active = self.active
        return {
            "members": len(active),
            "gated": sum(1 for p in active if self.is_gated(p)),
            "released": sum(1 for p in active if not self.is_gated(p)),
            "bound": sum(1 for p in active if (p.get("spec") or {}).get("nodeName")),
            "running": sum(1 for p in active if phase_of(p) == "Running"),
            "succeeded": sum(1 for p in self.pods if phase_of(p) == "Succeeded"),
            "failed": sum(1 for p in self.pods if phase_of(p) == "Failed"),
        }

    def to_core(self, held_since: float | None = None, convert: Callable[[JSON], Pod] = pod_from_api) -> Gang:
        assert self.min_member is not None
        counts = self.counts()
        min_member = 1 if self.basic else self.min_member
        created = queued_since(
            timestamp((self.group.get("metadata") or {}).get("creationTimestamp")) if self.group else None,
            [timestamp(p["metadata"].get("creationTimestamp")) for p in self.active],
            min_member,
        )
        return Gang(
            namespace=self.namespace,
            name=self.name,
            min_member=min_member,
            pods=tuple(convert(p) for p in self.releasable),
            members=counts["members"],
            released=0 if self.basic else counts["released"],
            priority=self.priority(),
            created=created,
            min_resources=self.min_resources,
            held_since=held_since,
            topology_key=self.topology_key,
            disruption_mode=self.disruption_mode,
            composite=self.parent,
            tenant=self.tenant,
        )

    def priority(self) -> int:
        """A Kubernetes 1.36 PodGroup's own `priority` when it has one; otherwise the highest of
        its pods' (admission resolved their priorityClassName)."""
        own = ((self.group or {}).get("spec") or {}).get("priority")
        pods = max(((p.get("spec") or {}).get("priority") or 0 for p in self.pods), default=0)
        if isinstance(own, int) and not isinstance(own, bool):
            # A system class counts only as far as its pods have it: only pods are held to the
            # platform's quota on those classes, so a group object alone cannot claim one.
            return own if own <= HIGHEST_USER_PRIORITY else min(own, pods)
        return pods


def names_unreleased(pod: JSON, pod_group: str) -> bool:
    """The pod names `pod_group` (spec.schedulingGroup) and quorum never released it (no
    release's pin): a pod admitted under placement kube-scheduler. A pod quorum released stays
    quorum's whatever it names: a tenant cannot take its pods out of recovery by naming a group."""
    spec = pod.get("spec") or {}
    named = (spec.get("schedulingGroup") or {}).get("podGroupName") == pod_group
    return named and not is_gated(pod) and pinned_node(spec) is None


def assemble(store: Store, just_released: frozenset[str] = frozenset()) -> list[GangView]:
    """Every gang that has pods, with its group object and minMember (or why not yet)."""
    by_gang: dict[tuple[str, str], list[JSON]] = defaultdict(list)
    for pod in store.pods.values():
        meta = pod["metadata"]
        name = store.gang_of(pod)
        if name:
            by_gang[(meta["namespace"], name)].append(pod)
    views = []
    for (namespace, name), pods in sorted(by_gang.items()):
        pods.sort(key=lambda p: p["metadata"]["name"])
        marker = _marker(pods[0], store.schedulers)
        if marker is None or (marker.source is GangSource.WORKLOAD_POD_GROUP and not store.workload_api):
            continue  # released as orphans
        view = GangView(namespace, name, marker, pods, just_released=just_released)
        view.tenant = tenant_of(store, namespace)
        try:
            _attach_group(view, store)
        except Exception as err:  # a shape of input nobody foresaw: this gang's failure only
            view.failure = f"reading its group failed: {type(err).__name__}: {err}"
        mine = (marker.source, marker.group)
        others = {
            m.describe()
            for p in pods[1:]
            if (m := _marker(p, store.schedulers)) is not None and (m.source, m.group) != mine
        }
        if others:
            view.merged = view.waiting = (
                f"pods of {marker.describe()} and of {', '.join(sorted(others))} carry the same gang name "
                f"{name}; quorum neither plans nor recovers either while they do: rename one of the groups"
            )
        views.append(view)
    return views


GROUP_DROPPED = (
    "GroupDropped",
    "the apiserver dropped spec.schedulingGroup (is the GenericWorkload feature gate off?), so this "
    "pod's group can never be found: quorum released it without gang admission",
)
GROUP_NOT_SERVED = (
    "GroupNotServed",
    "this cluster serves no scheduling.k8s.io PodGroup (v1beta1, v1alpha3 or v1alpha2), so the PodGroup "
    "this pod names can never exist: quorum released it without gang admission (serve the API with "
    "--runtime-config=scheduling.k8s.io/v1beta1=true on Kubernetes 1.37, scheduling.k8s.io/v1alpha2=true "
    "on 1.36, to have it held as a gang)",
)


VOLCANO_OFF = (
    "VolcanoDialectOff",
    "this pod was held as a member of a Volcano PodGroup, but quorum no longer takes Volcano's dialect "
    "(chart value schedulers.volcano is off): quorum released it without gang admission",
)


def orphans(store: Store) -> list[tuple[JSON, tuple[str, str]]]:
    """Gated gang pods whose group can never exist, with why (an Event's reason and message):
    the apiserver dropped spec.schedulingGroup after the webhook gated the pod (the
    GenericWorkload feature gate is off), the cluster does not serve the PodGroup API it
    names, or the install no longer takes Volcano's dialect. quorum releases them rather than
    leave them gated with no way forward."""
    found = []
    for pod in store.pods.values():
        if not (pod.get("spec") or {}).get("schedulingGates"):  # most pods, quickly: no gate at all
            continue
        if not is_gated(pod) or not (pod["metadata"].get("labels") or {}).get(GANG_LABEL):
            continue
        marker = _marker(pod, store.schedulers)
        if marker is None and str(pod["metadata"]["labels"][GANG_LABEL]).startswith("vpg-"):
            found.append((pod, VOLCANO_OFF))
        elif marker is None:
            found.append((pod, GROUP_DROPPED))
        elif marker.source is GangSource.WORKLOAD_POD_GROUP and not store.workload_api:
            found.append((pod, GROUP_NOT_SERVED))
    return found


def _marker(pod: JSON, schedulers: Collection[str]) -> GangMarker | None:
    spec = pod.get("spec") or {}
    group = (spec.get("schedulingGroup") or {}).get("podGroupName")
    meta = pod["metadata"]
    # The webhook rewrote any coscheduler name; the default scheduler's name is quorum's.
    return gang_marker(
        meta.get("labels") or {}, group, spec.get("schedulerName"), schedulers, meta.get("annotations")
    )


def unclaimed_marker(pod: JSON, schedulers: Collection[str]) -> GangMarker | None:
    """The group a pod names that asks for a scheduler quorum does not take and is not bound
    yet (quorum leaves it to that scheduler, and says so once), else None."""
    spec = pod.get("spec") or {}
    scheduler = spec.get("schedulerName") or ""
    if scheduler in schedulers or spec.get("nodeName") or pod["metadata"].get("deletionTimestamp"):
        return None
    group = (spec.get("schedulingGroup") or {}).get("podGroupName")
    meta = pod["metadata"]
    markers = gang_markers(meta.get("labels") or {}, group, meta.get("annotations"), volcano=True)
    return markers[0] if markers else None


class InvalidGroup(ValueError):
    """A group object (or label) a tenant wrote that quorum cannot use: the message says what
    is wrong and how to fix it."""


INT32_MAX = 2**31 - 1


def whole_number(value: object, what: str, default: int, least: int = 1) -> int:
    """A count from a group object: an int (or a string of one) from `least` to 2^31-1 (what
    the Gang's schema holds)."""
    if value is None:
        return default
    if isinstance(value, bool) or not isinstance(value, int | str):
        raise InvalidGroup(f"{what} must be a whole number from {least} to {INT32_MAX}; found {value!r}")
    try:
        if isinstance(value, str) and len(value) > 20:  # int() of a huge string costs time
            raise ValueError
        number = int(value)
    except ValueError:
        raise InvalidGroup(
            f"{what} must be a whole number from {least} to {INT32_MAX}; found {value!r}"
        ) from None
    if not least <= number <= INT32_MAX:
        raise InvalidGroup(f"{what} must be a whole number from {least} to {INT32_MAX}; found {number}")
    return number


def _attach_group(view: GangView, store: Store) -> None:
    """The group's object and what it says; a group that is malformed leaves the gang waiting
    with a sentence that says what to fix (never an exception for the pass)."""
    marker = view.marker
    if marker.source in SIZED_BY_PODS:
        meta = [p["metadata"] for p in view.pods]
        values = {size_on_pod(marker.source, m.get("labels") or {}, m.get("annotations") or {}) for m in meta}
        try:
            (value,) = values
            # The webhook's rule (it refuses such pods at creation); pods created while it was
            # down, or before it checked, wait here with the same advice.
            view.min_member = parse_min_available(value, marker.size_key)
        except ValueError:  # BadMinAvailable, or several values
            view.waiting = (
                f"{marker.size_key} must be one whole number from 1 to "
                f'{MAX_MIN_AVAILABLE} (write "4" for a gang of four) on every pod of the group; found '
                f"{sorted(str(v)[:20] for v in values)[:5]}"
            )
        return
    api_group, _ = GROUP_APIS[marker.source]
    group = store.groups.get((api_group, view.namespace, marker.group))
    if group is None:
        view.waiting = f"waiting for {marker.describe()} to exist in namespace {view.namespace}"
        return
    view.group = group
    try:
        _read_group(view, group)
    except (InvalidGroup, InvalidWorkloadObject, QuantityError) as err:
        view.waiting = f"{marker.describe()} is invalid: {err}; fix it to have the gang planned"
        return
    top = _attach_composite(view, store) if view.parent is not None else None
    if marker.source is GangSource.WORKLOAD_POD_GROUP and store.pod_group_version not in (None, "v1alpha2"):
        _check_scheduler_rules(
            view, group if top is None else top, "PodGroup" if top is None else "CompositePodGroup"
        )


def _check_scheduler_rules(view: GangView, root: JSON, kind: str) -> None:
    """1.37's kube-scheduler refuses a group's pods whose priority or preemption policy is not
    its root group's (`root`: the CompositePodGroup at the top, or the PodGroup): such a gang
    waits, told why, rather than be released to sit unscheduled."""
    if view.waiting is not None or not view.gated:
        return  # nothing to release (a running gang is not held up by it)
    spec = root.get("spec") or {}
    pods = [
        (
            str(p["metadata"]["name"]),
            int((p.get("spec") or {}).get("priority") or 0),
            str((p.get("spec") or {}).get("preemptionPolicy") or ""),
        )
        for p in view.active
    ]
    refusal = scheduler_refusal(kind, str((root.get("metadata") or {}).get("name")), spec, pods)
    if refusal is not None:
        view.waiting = refusal


def _attach_composite(view: GangView, store: Store) -> JSON | None:
    """A 1.37 PodGroup of a CompositePodGroup waits until the composite, and each composite
    above it, exists and is valid; a chain that loops or is deeper than Kubernetes allows
    holds it too. The CompositePodGroup at the top, if the chain holds."""
    assert view.parent is not None
    seen: list[str] = []
    name: str | None = view.parent
    obj: JSON | None = None
    while name is not None:
        if name in seen or len(seen) == MAX_COMPOSITE_DEPTH:
            chain = " -> ".join([*seen, name])
            view.waiting = (
                f"its CompositePodGroups {chain} loop or are nested more than {MAX_COMPOSITE_DEPTH} deep; "
                f"fix their parentCompositePodGroupName to have its gangs planned"
            )
            return None
        below = "its PodGroup's parent" if not seen else f"the parent of CompositePodGroup {seen[-1]}"
        seen.append(name)
        obj = store.composites.get((view.namespace, name))
        if obj is None:
            view.waiting = (
                f"waiting for CompositePodGroup {name} (scheduling.k8s.io), {below}, "
                f"to exist in namespace {view.namespace}"
            )
            return None
        try:
            name = composite_facts(obj).parent
        except InvalidWorkloadObject as err:
            view.waiting = f"CompositePodGroup {seen[-1]} is invalid: {err}; fix it to have its gangs planned"
            return None
    return obj


def composites(store: Store, views: Collection[GangView]) -> dict[tuple[str, str], Composite]:
    """The CompositePodGroups the views' gangs count toward, and the ones above those, each
    with its children admitted already (a gang released at least minMember; a composite with
    its own count met: the planner counts them as placed) and, with a topology key, the domains
    the bound pods of the admitted gangs under it are in (the others must go there too)."""
    admitted: defaultdict[tuple[str, str], list[GangView]] = defaultdict(list)
    facts: dict[tuple[str, str], CompositeFacts] = {}
    pending: list[tuple[str, str]] = []
    for view in views:
        if view.parent is None:
            continue
        key = (view.namespace, view.parent)
        pending.append(key)
        if (
            view.min_member is not None
            and view.waiting is None
            and view.counts()["released"] >= view.min_member
        ):
            admitted[key].append(view)
    while pending:  # each named composite and those above it, read once each
        key = pending.pop()
        if key in facts or (obj := store.composites.get(key)) is None:
            continue
        try:
            facts[key] = composite_facts(obj)
        except InvalidWorkloadObject:
            continue
        if (parent := facts[key].parent) is not None:
            pending.append((key[0], parent))
    below: defaultdict[tuple[str, str], list[tuple[str, str]]] = defaultdict(list)
    for key, fact in facts.items():
        if fact.parent is not None and (key[0], fact.parent) in facts and fact.parent != key[1]:
            below[(key[0], fact.parent)].append(key)

    def count(key: tuple[str, str], depth: int) -> int:
        met = sum(
            1
            for c in below[key]
            if depth < MAX_COMPOSITE_DEPTH and count(c, depth + 1) >= facts[c].min_group_count
        )
        return len(admitted[key]) + met

    def admitted_under(key: tuple[str, str], depth: int) -> list[GangView]:
        found = list(admitted[key])
        for c in below[key] if depth < MAX_COMPOSITE_DEPTH else []:
            found += admitted_under(c, depth + 1)
        return found

    found = {}
    for key, fact in facts.items():
        domains: set[str] = set()
        if fact.topology_key:
            for view in admitted_under(key, 1):
                for pod in view.active:
                    node = store.nodes.get(str((pod.get("spec") or {}).get("nodeName") or ""))
                    labels = ((node or {}).get("metadata") or {}).get("labels") or {}
                    if fact.topology_key in labels:
                        domains.add(str(labels[fact.topology_key]))
        found[key] = Composite(
            *key, fact.min_group_count, count(key, 1), fact.topology_key, frozenset(domains), fact.parent
        )
    return found


def _read_group(view: GangView, group: JSON) -> None:
    spec = group.get("spec") or {}
    if not isinstance(spec, dict):
        raise InvalidGroup(f"spec must be an object; found {type(spec).__name__}")
    view.topology_key = topology_key(group)
    if view.marker.source is GangSource.WORKLOAD_POD_GROUP:
        view.disruption_mode = disruption_mode(spec)
        view.preemption_policy = preemption_policy(spec)
        view.parent = parent_name(spec)
        policy = spec.get("schedulingPolicy") or {}
        if isinstance(policy, dict) and "gang" in policy:
            gang = policy.get("gang") or {}
            view.min_member = whole_number(
                gang.get("minCount") if isinstance(gang, dict) else gang, "schedulingPolicy.gang.minCount", 1
            )
        else:
            view.basic, view.min_member = True, 1
        return
    view.min_member = whole_number(spec.get("minMember"), "spec.minMember", 1)
    min_resources = spec.get("minResources") or {}
    if not isinstance(min_resources, dict):
        raise InvalidGroup(
            f"spec.minResources must be a map of resource to quantity; found {min_resources!r}"
        )
    try:
        view.min_resources = resources(min_resources)
    except QuantityError as err:
        raise InvalidGroup(f"spec.minResources: {err}") from None
    # 0 is the default, as scheduler-plugins reads it (the MPI Operator writes 0).
    view.schedule_timeout = (
        whole_number(spec.get("scheduleTimeoutSeconds"), "spec.scheduleTimeoutSeconds", 60, least=0) or 60
    )
    if view.marker.source is GangSource.VOLCANO_POD_GROUP:
        view.unenforced = volcano_unenforced(spec, view.min_member)


def volcano_unenforced(spec: JSON, min_member: int) -> tuple[str, ...]:
    """A Volcano PodGroup's fields that quorum shows but does not enforce, each said in words
    (docs/integrations.md, "Volcano's dialect")."""
    found = []
    if queue := spec.get("queue"):
        found.append(f"queue {str(queue)[:63]!r} (quorum has no Volcano queues; kept as written)")
    tasks = spec.get("minTaskMember")
    if isinstance(tasks, dict) and tasks:
        shown = ", ".join(f"{str(k)[:63]}: {str(v)[:10]}" for k, v in sorted(tasks.items())[:8])
        found.append(
            f"minTaskMember {{{shown}}} (quorum releases the group whole at minMember {min_member}, "
            f"without counting per task)"
        )
    if priority := spec.get("priorityClassName"):
        found.append(
            f"priorityClassName {str(priority)[:253]!r} (quorum orders the gang by its pods' priority, "
            f"which their own priorityClassName sets)"
        )
    return tuple(found)


def topology_key(group: JSON) -> str | None:
    """The node label all of the gang must share a value of: a Kubernetes PodGroup's
    `spec.schedulingConstraints.topology[].key` (at most one), or on the other PodGroups the
    annotation `quorum.dev/topology-key`."""
    spec = group.get("spec") or {}
    if isinstance(spec, dict) and (key := topology_of(spec)):
        return key
    value = ((group.get("metadata") or {}).get("annotations") or {}).get(TOPOLOGY_ANNOTATION)
    return str(value) if value else None
