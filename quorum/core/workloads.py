"""Kubernetes Workload Aware Scheduling (`scheduling.k8s.io`) across its versions
(docs/workloads.md, "Versions").

- 1.36: PodGroup and Workload at v1alpha2; `disruptionMode: Pod | PodGroup`; the scheduler's
  condition `PodGroupScheduled`.
- 1.37: at v1beta1 and v1alpha3, CompositePodGroup at v1alpha3 only; `disruptionMode:
  {single: {}} | {all: {}}`; `PodGroupInitiallyScheduled`; `preemptionPolicy`;
  `parentCompositePodGroupName`; a mutable `gang.minCount`.

quorum reads whichever version the cluster serves (API discovery, re-checked while it runs) and
takes the same meaning from each spelling: the functions here turn one PodGroup or
CompositePodGroup object, of any version, into the facts quorum plans with.
"""

from __future__ import annotations

from collections.abc import Collection, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

WAS_GROUP = "scheduling.k8s.io"
# The versions quorum reads, best first: v1beta1 is stable enough to build on; v1alpha3 serves the
# same PodGroup with CompositePodGroup beside it; v1alpha2 is Kubernetes 1.36's only one.
POD_GROUP_VERSIONS = ("v1beta1", "v1alpha3", "v1alpha2")
COMPOSITE_VERSIONS = ("v1alpha3",)
# kube-scheduler's condition on a PodGroup it placed, by version; quorum's own sit beside it.
SCHEDULER_CONDITIONS = ("PodGroupScheduled", "PodGroupInitiallyScheduled")

# quorum's names for the two disruption modes (1.36 spelled them so; 1.37 made them a union).
DISRUPT_POD = "Pod"  # preemption may take single pods of the gang
DISRUPT_GROUP = "PodGroup"  # the gang goes (or stays) whole
_UNION_MODES = {"single": DISRUPT_POD, "all": DISRUPT_GROUP}


def preferred(served: Collection[str], wanted: Sequence[str]) -> str | None:
    """The first of `wanted` that the cluster serves, or None."""
    return next((version for version in wanted if version in served), None)


class InvalidWorkloadObject(ValueError):
    """A PodGroup or CompositePodGroup quorum cannot use: the message says what is wrong."""


def disruption_mode(spec: Mapping[str, Any]) -> str | None:
    """`Pod` or `PodGroup` from either spelling (1.36's string, 1.37's `{single:{}}|{all:{}}`);
    None where it is not set (each version's default is `Pod`)."""
    value = spec.get("disruptionMode")
    if value is None:
        return None
    if value in (DISRUPT_POD, DISRUPT_GROUP):
        return str(value)
    if isinstance(value, Mapping):
        modes = [_UNION_MODES[k] for k in value if k in _UNION_MODES]
        if len(modes) == 1 and len(value) == 1:
            return modes[0]
    raise InvalidWorkloadObject(
        f"spec.disruptionMode must be {{single: {{}}}} or {{all: {{}}}} (Kubernetes 1.36: Pod or PodGroup); "
        f"found {value!r}"
    )


def preemption_policy(spec: Mapping[str, Any]) -> str | None:
    """1.37's `spec.preemptionPolicy`: `Never` keeps the group from preempting anything."""
    value = spec.get("preemptionPolicy")
    if value is None or value in ("Never", "PreemptLowerPriority"):
        return value if isinstance(value, str) else None
    raise InvalidWorkloadObject(
        f"spec.preemptionPolicy must be Never or PreemptLowerPriority; found {value!r}"
    )


# CompositePodGroups above a PodGroup, at most: Kubernetes' WorkloadMaxTreeDepth (4) counts the
# PodGroup too, and kube-scheduler marks a deeper tree Invalid.
MAX_COMPOSITE_DEPTH = 3


def parent_name(spec: Mapping[str, Any]) -> str | None:
    """The CompositePodGroup a 1.37 PodGroup (or CompositePodGroup) belongs to."""
    value = spec.get("parentCompositePodGroupName")
    return value if isinstance(value, str) and value else None


@dataclass(frozen=True, slots=True)
class CompositeFacts:
    """What quorum plans with from one CompositePodGroup: how many of its children must fit
    together (`gang.minGroupCount`; `basic` is 1), its topology and its parent."""

    name: str
    min_group_count: int
    topology_key: str | None = None
    parent: str | None = None


INT32_MAX = 2**31 - 1


def composite_facts(obj: Mapping[str, Any]) -> CompositeFacts:
    metadata = obj.get("metadata") or {}
    spec = obj.get("spec") or {}
    if not isinstance(spec, Mapping):
        raise InvalidWorkloadObject(f"spec must be an object; found {type(spec).__name__}")
    policy = spec.get("schedulingPolicy") or {}
    count = 1
    if isinstance(policy, Mapping) and "gang" in policy:
        gang = policy.get("gang") or {}
        value = gang.get("minGroupCount") if isinstance(gang, Mapping) else None
        if isinstance(value, bool) or not isinstance(value, int) or not 1 <= value <= INT32_MAX:
            raise InvalidWorkloadObject(
                f"spec.schedulingPolicy.gang.minGroupCount must be a whole number from 1; found {value!r}"
            )
        count = value
    return CompositeFacts(str(metadata.get("name", "")), count, topology_of(spec), parent_name(spec))


def topology_of(spec: Mapping[str, Any]) -> str | None:
    """`spec.schedulingConstraints.topology[].key` (at most one), the same in every version."""
    constraints = spec.get("schedulingConstraints")
    topology = constraints.get("topology") if isinstance(constraints, Mapping) else None
    for constraint in topology if isinstance(topology, list) else []:
        if isinstance(constraint, Mapping) and isinstance(constraint.get("key"), str) and constraint["key"]:
            return str(constraint["key"])
    return None


def scheduler_refusal(
    group_kind: str,
    group_name: str,
    group_spec: Mapping[str, Any],
    pods: Collection[tuple[str, int, str]],
) -> str | None:
    """Why Kubernetes 1.37's kube-scheduler would refuse a gang's pods once released, or None: it
    schedules the pods of a group only if each has its root group's priority (`spec.priority`,
    0 without a priorityClassName) and preemption policy (`PreemptLowerPriority` unless set).
    `pods`: (name, priority, preemptionPolicy) of each. A gang quorum released anyway would sit
    unscheduled; it waits instead, told how to fix it."""
    priority = group_spec.get("priority")
    priority = priority if isinstance(priority, int) and not isinstance(priority, bool) else 0
    policy = group_spec.get("preemptionPolicy") or "PreemptLowerPriority"
    for name, pod_priority, pod_policy in pods:
        if pod_priority != priority:
            return (
                f"pod {name} has priority {pod_priority} and its {group_kind} {group_name} {priority}: "
                f"Kubernetes 1.37 schedules a group's pods only at the group's priority (give the "
                f"{group_kind}, or its Workload template, the pods' priorityClassName)"
            )
        if (pod_policy or "PreemptLowerPriority") != policy:
            return (
                f"pod {name} has preemptionPolicy {pod_policy or 'PreemptLowerPriority'} and its "
                f"{group_kind} {group_name} {policy}: Kubernetes 1.37 schedules a group's pods only with "
                f"the group's preemption policy (use a PriorityClass whose preemptionPolicy matches)"
            )
    return None


_SERVER_FIELDS = ("uid", "resourceVersion", "creationTimestamp", "generation", "managedFields", "finalizers")


def to_v1beta1(obj: Mapping[str, Any]) -> dict[str, Any]:
    """A Kubernetes 1.36 (v1alpha2) Workload or PodGroup as 1.37 writes it (v1beta1), to be made
    again after the upgrade (docs/workloads.md, "Upgrading from 1.36"): `podGroupTemplateRef.
    workload{workloadName, podGroupTemplateName}` becomes `workloadRef{workloadName,
    templateName}`, `disruptionMode: Pod | PodGroup` becomes `{single: {}} | {all: {}}`; what the
    server sets (uid, versions, status, the resolved priority) is left for it to set again."""
    kind = obj.get("kind")
    if kind not in ("Workload", "PodGroup"):
        raise InvalidWorkloadObject(f"only Workloads and PodGroups are converted, not {kind}")
    meta = {k: v for k, v in (obj.get("metadata") or {}).items() if k not in _SERVER_FIELDS}
    meta.pop("deletionTimestamp", None)
    meta.pop("deletionGracePeriodSeconds", None)
    owners = [
        o
        for o in meta.get("ownerReferences") or []
        if not str(o.get("apiVersion", "")).startswith(f"{WAS_GROUP}/")
    ]
    if owners:
        meta["ownerReferences"] = owners
    else:
        meta.pop("ownerReferences", None)
    spec = dict(obj.get("spec") or {})
    if kind == "PodGroup":
        spec = _group_spec(spec)
        ref = spec.pop("podGroupTemplateRef", None)
        workload = (ref or {}).get("workload") if isinstance(ref, Mapping) else None
        if isinstance(workload, Mapping):
            spec["workloadRef"] = {
                "workloadName": workload.get("workloadName"),
                "templateName": workload.get("podGroupTemplateName"),
            }
    else:
        spec["podGroupTemplates"] = [_group_spec(dict(t)) for t in spec.get("podGroupTemplates") or []]
    return {"apiVersion": f"{WAS_GROUP}/v1beta1", "kind": kind, "metadata": meta, "spec": spec}


def _group_spec(spec: dict[str, Any]) -> dict[str, Any]:
    mode = disruption_mode(spec)
    if mode is not None:
        spec["disruptionMode"] = {"single" if mode == DISRUPT_POD else "all": {}}
    spec.pop("priority", None)  # resolved again from priorityClassName
    return spec
