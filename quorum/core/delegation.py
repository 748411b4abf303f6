"""Placement kube-scheduler's decisions (docs/placement.md), over typed records: the minCount of
the Kubernetes PodGroup quorum makes for a gang kube-scheduler places, and why such a gang waits.
`quorum.operator.delegation` reads the records from the API objects and acts on the answers."""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass

from quorum.core.conditions import WAITING_FOR_KUBE_SCHEDULER
from quorum.core.model import Gang
from quorum.core.planner import Hold

GangKey = tuple[str, str]


@dataclass(frozen=True, slots=True)
class Member:
    """One active pod of a gang kube-scheduler places, as these decisions read it."""

    bound: bool  # spec.nodeName set
    pod_group: str | None  # spec.schedulingGroup.podGroupName
    unschedulable: str | None  # kube-scheduler's message, where its PodScheduled is False/Unschedulable


@dataclass(frozen=True, slots=True)
class PodGroupSeen:
    """The Kubernetes PodGroup a gang's pods name, as the watch shows it."""

    quorums: bool  # labelled app.kubernetes.io/managed-by: quorum
    min_count: object  # spec.schedulingPolicy.gang.minCount as written (None: none)

    def left_as_is(self, min_count: int) -> bool:
        """quorum writes a PodGroup only if it is quorum's and of another minCount: one that is
        not quorum's is left alone (the gang's hold says so)."""
        return not self.quorums or self.min_count == min_count


def pod_group_size(min_member: int, members: Iterable[Member], pod_group: str) -> int:
    """minCount of the PodGroup quorum makes: the gang's minMember, less its members bound without
    naming it (placed by quorum before the switch to placement kube-scheduler: kube-scheduler
    counts only the pods that name the group), and at least 1. A gang admitted under this
    placement has every pod naming it, so its minCount is its minMember."""
    running_before = sum(1 for m in members if m.bound and m.pod_group != pod_group)
    return max(1, min_member - running_before)


def unschedulable_message(members: Iterable[Member]) -> str | None:
    """kube-scheduler's latest word on why a pod of the gang does not fit, or None."""
    return next((m.unschedulable[:600] for m in members if not m.bound and m.unschedulable is not None), None)


def kube_scheduler_hold(
    key: GangKey,
    min_member: int,
    members: int,
    bound: int,
    pod_group: str,
    group: PodGroupSeen | None,
    unschedulable: str | None,
    served: bool = True,
    makes: bool = True,
) -> Hold | None:
    """Why a gang kube-scheduler places is not running whole yet, or None where at least
    minMember of its `members` pods are `bound`. `makes`: quorum makes its PodGroup (a gang of
    another dialect; a WAS gang names its own); `group`: that PodGroup (None: not there yet);
    `served`: the cluster serves a PodGroup version kube-scheduler places by."""
    if bound >= min_member:
        return None
    gang = Gang(*key, min_member, ())
    if members < min_member:
        return Hold(
            gang, "WaitingForMembers", f"{members} of {min_member} members exist (minMember {min_member})"
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
    if makes and group is not None and not group.quorums and group.min_count != min_member:
        return Hold(
            gang,
            "PodGroupNotQuorums",
            f"PodGroup {pod_group} (scheduling.k8s.io) exists and is not quorum's: kube-scheduler places "
            f"the pods by its minCount {group.min_count!r}, not the gang's {min_member}. Delete it to have "
            f"quorum make it, or give it minCount {min_member}",
        )
    if unschedulable is not None:
        return Hold(gang, "Unschedulable", f"kube-scheduler: {unschedulable}")
    made = "; quorum is making it" if makes and group is None else ""
    return Hold(
        gang,
        WAITING_FOR_KUBE_SCHEDULER,
        f"kube-scheduler places it whole as PodGroup {pod_group} (placement kube-scheduler){made}: "
        f"{bound} of {members} pods bound (minMember {min_member})",
    )
