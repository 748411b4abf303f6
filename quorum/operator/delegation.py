"""The operator's side of `placement: kube-scheduler` (docs/placement.md): kube-scheduler's gang
cycle places each gang, as the Kubernetes PodGroup its pods name, and quorum keeps the rest.

- **The PodGroup.** A gang of another dialect (a scheduler-plugins PodGroup, a label gang, a
  Kueue or Volcano group) has its pods named to the PodGroup `<gang name>` at admission; this
  module makes that PodGroup once the gang has its members (gang policy, minCount the gang's
  minMember, less the members quorum placed before a switch; labelled as quorum's, owned by the
  gang's group object, or by its Gang where it has none) and keeps its minCount in step.
  kube-scheduler holds the pods until it exists. A PodGroup of that name that is not quorum's
  is left alone, and the gang says so. A Workload Aware Scheduling gang names its own.
- **Why it waits.** A gang kube-scheduler has not bound whole is held, in the Gang's
  conditions, with kube-scheduler's own words (a pod's `PodScheduled` condition); one it binds
  within the forming grace is written once, admitted.
- quorum plans none of these gangs and records no decision for them; its recovery never takes a
  pod kube-scheduler places (`quorum.operator.recovery`), and its preemption is not for them.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from typing import Any

from quorum.core.conditions import WAITING_FOR_KUBE_SCHEDULER
from quorum.core.gangs import Placer
from quorum.core.model import Gang
from quorum.core.planner import Hold
from quorum.core.workloads import WAS_GROUP
from quorum.k8s.api import KubeApi
from quorum.k8s.convert import owner_reference
from quorum.k8s.writes import is_quorums
from quorum.k8s.writes import pod_group_min_count as min_count
from quorum.operator.gangs import GangView, Store
from quorum.operator.status import GangRecords
from quorum.operator.work import GangWork

GangKey = tuple[str, str]


def pod_group_size(min_member: int, pods: Iterable[Mapping[str, Any]], pod_group: str) -> int:
    """minCount of the PodGroup quorum makes: the gang's minMember, less its members bound without
    naming it (placed by quorum before the switch to placement kube-scheduler: kube-scheduler
    counts only the pods that name the group), and at least 1. A gang admitted under this
    placement has every pod naming it, so its minCount is its minMember."""
    running_before = sum(
        1
        for pod in pods
        if (pod.get("spec") or {}).get("nodeName")
        and ((pod.get("spec") or {}).get("schedulingGroup") or {}).get("podGroupName") != pod_group
    )
    return max(1, min_member - running_before)


def unschedulable_message(pods: Iterable[Mapping[str, Any]]) -> str | None:
    """kube-scheduler's latest word on why a pod of the gang does not fit, or None."""
    for pod in pods:
        if (pod.get("spec") or {}).get("nodeName"):
            continue
        for condition in (pod.get("status") or {}).get("conditions") or []:
            if (
                condition.get("type") == "PodScheduled"
                and condition.get("status") == "False"
                and condition.get("reason") == "Unschedulable"
            ):
                return str(condition.get("message") or "")[:600]
    return None


def kube_scheduler_hold(
    key: GangKey,
    min_member: int,
    counts: Mapping[str, int],
    pod_group: str,
    group: Mapping[str, Any] | None,
    unschedulable: str | None,
    served: bool = True,
    makes: bool = True,
) -> Hold | None:
    """Why a gang kube-scheduler places is not running whole yet, or None where at least
    minMember of its pods are bound. `makes`: quorum makes its PodGroup (a gang of another
    dialect; a WAS gang names its own); `group`: that PodGroup as the watch shows it (None: not
    there yet); `served`: the cluster serves a PodGroup version kube-scheduler places by."""
    if counts["bound"] >= min_member:
        return None
    gang = Gang(*key, min_member, ())
    if counts["members"] < min_member:
        return Hold(
            gang,
            "WaitingForMembers",
            f"{counts['members']} of {min_member} members exist (minMember {min_member})",
        )
    if not served:
        return Hold(
            gang,
            "PodGroupNotServed",
            f"its pods name PodGroup {pod_group} (placement kube-scheduler), but this cluster serves no "
            f"scheduling.k8s.io/v1beta1 PodGroup for quorum to make: serve it (Kubernetes 1.37+, "
            f"--runtime-config=scheduling.k8s.io/v1beta1=true, feature gate GenericWorkload) or install "
            f"quorum with placement quorum",
        )
    if makes and group is not None and not is_quorums(group) and min_count(group) != min_member:
        return Hold(
            gang,
            "PodGroupNotQuorums",
            f"PodGroup {pod_group} (scheduling.k8s.io) exists and is not quorum's: kube-scheduler places "
            f"the pods by its minCount {min_count(group)!r}, not the gang's {min_member}. Delete it to have "
            f"quorum make it, or give it minCount {min_member}",
        )
    if unschedulable is not None:
        return Hold(gang, "Unschedulable", f"kube-scheduler: {unschedulable}")
    made = "; quorum is making it" if makes and group is None else ""
    return Hold(
        gang,
        WAITING_FOR_KUBE_SCHEDULER,
        f"kube-scheduler places it whole as PodGroup {pod_group} (placement kube-scheduler){made}: "
        f"{counts['bound']} of {counts['members']} pods bound (minMember {min_member})",
    )


class Delegation:
    def __init__(self, api: KubeApi, records: GangRecords, work: GangWork, placement: Placer) -> None:
        self.api = api
        self.records = records
        self.store: Store = records.store
        self.work = work
        self.placement = placement

    def start_due(self, views: Mapping[GangKey, GangView]) -> None:
        """Make (or resize) the PodGroup of each gang of another dialect that names one, as that
        gang's task."""
        version = self.store.pod_group_version
        if version is None or version == "v1alpha2":
            return  # no PodGroup kube-scheduler reads by spec.schedulingGroup: the hold says so
        for key, view in views.items():
            name = view.delegated_to
            if name is None or view.min_member is None or view.waiting is not None or view.failure:
                continue
            if self.work.busy(key) or self.work.backing_off(key):
                continue
            size = pod_group_size(view.min_member, view.active, name)
            if len(view.active) < size:
                continue  # kube-scheduler would hold its pods anyway: made once the gang is whole
            group = self.store.groups.get((WAS_GROUP, view.namespace, name))
            if group is not None and (not is_quorums(group) or min_count(group) == size):
                continue
            self.work.start(key, "delegate", self.make(view, name, version, size))

    async def make(self, view: GangView, name: str, version: str, size: int) -> None:
        """The PodGroup, owned by the gang's group object (as its Gang is), or by its Gang where
        the gang has none (a label or Kueue gang): it goes with the gang."""
        owner = owner_reference(view.group or await self.records.ensure_gang(view))
        made = await self.api.ensure_pod_group(view.namespace, name, version, size, owner)
        self.store.assume_group((WAS_GROUP, view.namespace, name), made)

    def holds(self, views: Mapping[GangKey, GangView], held: Mapping[GangKey, Hold]) -> dict[GangKey, Hold]:
        """Why each gang kube-scheduler places waits, where no other hold says why already."""
        found: dict[GangKey, Hold] = {}
        for key, view in views.items():
            if key in held or view.min_member is None or view.waiting is not None:
                continue
            if (name := view.kube_scheduler_group(self.placement)) is None:
                continue
            group = self.store.groups.get((WAS_GROUP, view.namespace, name))
            hold = kube_scheduler_hold(
                key,
                view.min_member,
                view.counts(),
                name,
                group,
                unschedulable_message(view.active),
                served=self.store.pod_group_version not in (None, "v1alpha2"),
                makes=view.delegated_to is not None,
            )
            if hold is not None:
                found[key] = hold
        return found
