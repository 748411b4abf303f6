"""The ledger: capacity promised to pods quorum released, until they are bound.

A reservation is made the moment a release is decided, before any write, so that no later pass
can plan the same gated pods or the same room again. It ends only when the bound-pod index
shows the pod bound (its capacity is then counted there), when the pod is gone or finished,
when a recovery deleted it, or when its release was refused and the pod is not released and
pinned after all (a suspended Job's pod keeps its room until it is gone: kube-scheduler may bind
it until the Job controller deletes it). In between,
the pod's capacity would be counted nowhere: the release patch is seen by the watch before the
binding. The planner sees bound usage plus the ledger. A new leader rebuilds the ledger from the
decisions recorded on the Gang objects and from the released pods' own pins.
"""

from __future__ import annotations

from collections.abc import Callable, Container, Mapping
from dataclasses import dataclass
from typing import Any

from quorum.core.devices import DeviceKey, is_device_resource
from quorum.core.model import add
from quorum.core.record import GangRecord, Placement
from quorum.k8s.convert import pod_requests
from quorum.k8s.writes import pinned_node
from quorum.operator.gangs import is_gated

GangKey = tuple[str, str]
JSON = dict[str, Any]


@dataclass(frozen=True, slots=True)
class Reservation:
    gang: GangKey
    node: str
    requests: Mapping[str, int]
    # DRA devices chosen for its claims: taken from the plan's free devices until it binds, also
    # before the claims' allocation (written at release) reaches the watch.
    devices: tuple[DeviceKey, ...] = ()


class Ledger:
    def __init__(self) -> None:
        self.entries: dict[str, Reservation] = {}  # pod uid -> reservation
        self.changed: set[str] = set()  # nodes whose reserved usage changed since `take_changed`

    def __contains__(self, uid: object) -> bool:
        return uid in self.entries

    def __len__(self) -> int:
        return len(self.entries)

    @property
    def uids(self) -> frozenset[str]:
        return frozenset(self.entries)

    def reserve(
        self,
        gang: GangKey,
        uid: str,
        node: str,
        requests: Mapping[str, int],
        devices: tuple[DeviceKey, ...] = (),
    ) -> None:
        old = self.entries.get(uid)
        if old is not None:
            self.changed.add(old.node)
        # Device counts are of one pass's kinds: the devices themselves are what is kept.
        kept = {k: v for k, v in requests.items() if not is_device_resource(k)}
        self.entries[uid] = Reservation(gang, node, kept, devices)
        self.changed.add(node)

    def drop(self, uid: str) -> None:
        old = self.entries.pop(uid, None)
        if old is not None:
            self.changed.add(old.node)

    def of_gang(self, gang: GangKey) -> dict[str, Reservation]:
        return {uid: r for uid, r in self.entries.items() if r.gang == gang}

    def settle(self, bound: Container[str], pods: Mapping[str, JSON]) -> None:
        """End the reservations of pods now bound (the bound-pod index counts them), gone, or
        finished."""
        for uid in list(self.entries):
            pod = pods.get(uid)
            phase = ((pod or {}).get("status") or {}).get("phase")
            if uid in bound or pod is None or phase in ("Succeeded", "Failed"):
                self.drop(uid)

    def usage(self, bound_used: Mapping[str, Mapping[str, int]]) -> dict[str, dict[str, int]]:
        """What the planner counts as used: bound pods plus reservations (a new dict; the
        inputs are left as they are)."""
        used = {node: dict(r) for node, r in bound_used.items()}
        for reservation in self.entries.values():
            used[reservation.node] = add(used.get(reservation.node, {}), reservation.requests)
        return used

    def devices(self) -> set[DeviceKey]:
        return {key for r in self.entries.values() for key in r.devices}

    def take_changed(self) -> set[str]:
        changed, self.changed = self.changed, set()
        return changed

    def resume(
        self,
        gangs: Mapping[GangKey, JSON],
        pods: Mapping[str, JSON],
        bound: Container[str],
        gang_of: Callable[[JSON], str | None],
    ) -> None:
        """Start afresh from what the API shows: every pod of a recorded decision that is
        released (not gated) but not bound yet keeps its planned node reserved; so does every
        other gang pod released and pinned to a node but not bound (one of an earlier decision
        that a later one's record replaced: kube-scheduler may still bind it there)."""
        for uid in list(self.entries):
            self.drop(uid)
        for key, gang in gangs.items():
            for entry in recorded_placement(gang):
                pod = pods.get(entry.uid)
                if pod is not None and released_unbound(pod, bound):
                    # Where it is pinned, if the record is older than its last release.
                    self.reserve_pod(key, pod, pinned_node(pod.get("spec") or {}) or entry.node)
        for uid, pod in pods.items():
            gang_name = gang_of(pod)
            if uid in self.entries or not gang_name or not released_unbound(pod, bound):
                continue
            if (node := pinned_node(pod.get("spec") or {})) is not None:
                self.reserve_pod((str(pod["metadata"].get("namespace")), gang_name), pod, node)

    def reserve_pod(self, gang: GangKey, pod: JSON, node: str) -> None:
        try:
            requests = pod_requests(pod)
        except ValueError:  # requests the apiserver would never have let through
            return
        self.reserve(gang, pod["metadata"]["uid"], node, requests)


def placed_node(pod: JSON) -> str | None:
    """The node a released pod is bound or pinned to, if it is alive and unfinished (None for
    a gated, deleted or finished pod, or one placed nowhere)."""
    meta, spec = pod.get("metadata") or {}, pod.get("spec") or {}
    phase = (pod.get("status") or {}).get("phase")
    if is_gated(pod) or meta.get("deletionTimestamp") or phase in ("Succeeded", "Failed"):
        return None
    node = spec.get("nodeName") or pinned_node(spec)
    return str(node) if node else None


def released_unbound(pod: JSON, bound: Container[str] = frozenset()) -> bool:
    """Released (not gated), alive, and not bound: its room is promised."""
    meta, spec = pod.get("metadata") or {}, pod.get("spec") or {}
    phase = (pod.get("status") or {}).get("phase")
    return not (
        is_gated(pod)
        or meta.get("uid") in bound
        or spec.get("nodeName")
        or meta.get("deletionTimestamp")
        or phase in ("Succeeded", "Failed")
    )


def recorded_placement(gang: JSON | None) -> tuple[Placement, ...]:
    """The placement of the gang's recorded decision (`status.admission.placement`; none for a
    decision too large to record it); malformed entries (edited by hand) are skipped."""
    admission = GangRecord.of(gang).admission
    return admission.placement if admission is not None else ()
