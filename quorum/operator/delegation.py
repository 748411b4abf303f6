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

from collections.abc import Mapping

from quorum.core.delegation import kube_scheduler_hold, pod_group_size, unschedulable_message
from quorum.core.gangs import Placer
from quorum.core.planner import Hold
from quorum.core.workloads import WAS_GROUP
from quorum.k8s.api import KubeApi
from quorum.k8s.convert import delegation_member, owner_reference, pod_group_seen
from quorum.operator.gangs import GangView, Store
from quorum.operator.status import GangRecords
from quorum.operator.work import GangWork

GangKey = tuple[str, str]


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
            size = pod_group_size(view.min_member, map(delegation_member, view.active), name)
            if len(view.active) < size:
                continue  # kube-scheduler would hold its pods anyway: made once the gang is whole
            group = self.store.groups.get((WAS_GROUP, view.namespace, name))
            if group is not None and pod_group_seen(group).left_as_is(size):
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
            counts = view.counts()
            hold = kube_scheduler_hold(
                key,
                view.min_member,
                counts["members"],
                counts["bound"],
                name,
                None if group is None else pod_group_seen(group),
                unschedulable_message(map(delegation_member, view.active)),
                served=self.store.pod_group_version not in (None, "v1alpha2"),
                makes=view.delegated_to is not None,
            )
            if hold is not None:
                found[key] = hold
        return found
