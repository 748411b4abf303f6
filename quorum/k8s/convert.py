"""API objects (plain dicts, as the watch delivers them) to `quorum.core` models."""

from __future__ import annotations

from typing import Any

from quorum.core.delegation import Member, PodGroupSeen
from quorum.core.model import Node, Pod, PodClaim, Requirement, Taint, Toleration, resources
from quorum.core.preemption import INTERRUPTABLE_LABEL, PREEMPTIBLE_ANNOTATION, RunningPod
from quorum.core.requests import pod_requests as pod_requests  # re-exported: the operator reads it here
from quorum.core.times import timestamp as timestamp  # re-exported: API code reads it here

JSON = dict[str, Any]


def _affinity(spec: JSON) -> tuple[tuple[Requirement, ...], ...]:
    terms = (
        ((spec.get("affinity") or {}).get("nodeAffinity") or {}).get(
            "requiredDuringSchedulingIgnoredDuringExecution"
        )
        or {}
    ).get("nodeSelectorTerms") or []
    out = []
    for term in terms:
        reqs = tuple(
            Requirement(e["key"], e["operator"], tuple(e.get("values") or ()))
            for e in term.get("matchExpressions") or []
        )
        fields = tuple(
            Requirement(f["key"], f["operator"], tuple(f.get("values") or ()), field=True)
            for f in term.get("matchFields") or []
        )
        out.append(reqs + fields)
    return tuple(out)


def unmodeled_constraints(spec: JSON) -> tuple[str, ...]:
    """Hard constraints the planner does not model: a warning says quorum cannot guarantee the
    placement of such a gang (docs/architecture.md, "Rules every part keeps")."""
    found = []
    affinity = spec.get("affinity") or {}
    if (affinity.get("podAntiAffinity") or {}).get("requiredDuringSchedulingIgnoredDuringExecution"):
        found.append("required pod anti-affinity")
    if (affinity.get("podAffinity") or {}).get("requiredDuringSchedulingIgnoredDuringExecution"):
        found.append("required pod affinity")
    if any(
        c.get("whenUnsatisfiable", "DoNotSchedule") == "DoNotSchedule"
        for c in spec.get("topologySpreadConstraints") or []
    ):
        found.append("topology spread constraints")
    if any(p.get("hostPort") for c in spec.get("containers") or [] for p in c.get("ports") or []):
        found.append("host ports")
    if any("persistentVolumeClaim" in v or "ephemeral" in v for v in spec.get("volumes") or []):
        found.append("volumes (volume node affinity)")
    return tuple(found)


def pod_claims(pod: JSON) -> tuple[PodClaim, ...]:
    """The pod's DRA claims: each entry of `spec.resourceClaims`, with the claim made from its
    template once kube-controller-manager has made it (`status.resourceClaimStatuses`)."""
    made = {
        s.get("name"): s.get("resourceClaimName")
        for s in (pod.get("status") or {}).get("resourceClaimStatuses") or []
        if isinstance(s, dict)
    }
    return tuple(
        PodClaim(
            str(c.get("name", "")),
            c.get("resourceClaimName") or None,
            c.get("resourceClaimTemplateName") or None,
            made.get(c.get("name")) or None,
        )
        for c in (pod.get("spec") or {}).get("resourceClaims") or []
        if isinstance(c, dict)
    )


def pod_from_api(pod: JSON) -> Pod:
    meta, spec = pod["metadata"], pod.get("spec") or {}
    tolerations = tuple(
        Toleration(
            t.get("key") or "", t.get("operator") or "Equal", t.get("value") or "", t.get("effect") or ""
        )
        for t in spec.get("tolerations") or []
    )
    return Pod(
        uid=meta["uid"],
        name=meta["name"],
        requests=pod_requests(pod),
        tolerations=tolerations,
        node_selector=dict(spec.get("nodeSelector") or {}),
        affinity=_affinity(spec),
        unmodeled=unmodeled_constraints(spec),
        claims=pod_claims(pod),
    )


def node_from_api(node: JSON) -> Node:
    meta, spec, status = node["metadata"], node.get("spec") or {}, node.get("status") or {}
    labels = dict(meta.get("labels") or {})
    conditions = status.get("conditions") or []
    return Node(
        name=meta["name"],
        labels=labels,
        allocatable=resources(status.get("allocatable")),
        taints=tuple(Taint(t["key"], t["effect"], t.get("value") or "") for t in spec.get("taints") or []),
        unschedulable=bool(spec.get("unschedulable")),
        ready=any(c.get("type") == "Ready" and c.get("status") == "True" for c in conditions),
    )


GANG_LABEL = "quorum.dev/gang"
MIRROR_ANNOTATION = "kubernetes.io/config.mirror"


def running_pod_from_api(pod: JSON, requests: dict[str, int]) -> RunningPod:
    """A bound pod as preemption sees it (`requests`: its effective requests, computed once)."""
    meta, spec, status = pod["metadata"], pod.get("spec") or {}, pod.get("status") or {}
    labels = meta.get("labels") or {}
    annotations = meta.get("annotations") or {}
    owners = [r.get("kind") for r in meta.get("ownerReferences") or [] if r.get("controller")]
    priority = spec.get("priority")
    return RunningPod(
        uid=meta["uid"],
        namespace=meta.get("namespace", ""),
        name=meta.get("name", ""),
        node=spec.get("nodeName") or "",
        requests=requests,
        priority=priority if isinstance(priority, int) else 0,
        gang=labels.get(GANG_LABEL) or None,
        started=timestamp(status.get("startTime") or meta.get("creationTimestamp")),
        interruptable=labels.get(INTERRUPTABLE_LABEL) == "true",
        preemptible=annotations.get(PREEMPTIBLE_ANNOTATION) != "false",
        stays="DaemonSet" in owners or "Node" in owners or MIRROR_ANNOTATION in annotations,
        terminating=bool(meta.get("deletionTimestamp")),
    )


def gang_record(
    group: JSON | None, label_group: str, min_member: int, kind: str = "Labels"
) -> tuple[JSON, JSON | None]:
    """The spec and owner reference of the Gang object that stands for a gang, whoever places
    it: its source is its group object, which owns it (without blocking the group's deletion),
    or for a gang sized by its pods the kind and name its pods give (no owner)."""
    if group is None:
        return {"source": {"kind": kind, "name": label_group}, "minMember": min_member}, None
    owner = owner_reference(group)
    source = {k: owner[k] for k in ("apiVersion", "kind", "name", "uid")}
    return {"source": source, "minMember": min_member}, owner


def delegation_member(pod: JSON) -> Member:
    """A gang pod as placement kube-scheduler's decisions read it."""
    spec, status = pod.get("spec") or {}, pod.get("status") or {}
    said = next(
        (
            str(c.get("message") or "")
            for c in status.get("conditions") or []
            if c.get("type") == "PodScheduled"
            and c.get("status") == "False"
            and c.get("reason") == "Unschedulable"
        ),
        None,
    )
    group = (spec.get("schedulingGroup") or {}).get("podGroupName")
    return Member(bool(spec.get("nodeName")), group if isinstance(group, str) else None, said)


def pod_group_seen(group: JSON) -> PodGroupSeen:
    """A Kubernetes PodGroup (scheduling.k8s.io) as placement kube-scheduler's decisions read it."""
    labels = (group.get("metadata") or {}).get("labels") or {}
    gang = ((group.get("spec") or {}).get("schedulingPolicy") or {}).get("gang") or {}
    return PodGroupSeen(labels.get("app.kubernetes.io/managed-by") == "quorum", gang.get("minCount"))


def owner_reference(obj: JSON) -> JSON:
    """An owner reference to `obj` that neither controls nor blocks its deletion: the group object
    of a gang's Gang, or the owner of the PodGroup quorum makes for it (its group, or its Gang)."""
    meta = obj["metadata"]
    return {
        "apiVersion": obj["apiVersion"],
        "kind": obj["kind"],
        "name": meta["name"],
        "uid": meta["uid"],
        "blockOwnerDeletion": False,
        "controller": False,
    }


def newer_or_same(version: str, than: str) -> bool | None:
    """Whether an object's resourceVersion is at or after another of the same resource (KEP-5504:
    comparable as integers, GA in Kubernetes 1.35); None where either is not such an integer."""
    if not all(v.isdigit() and v[0] != "0" for v in (version, than)):
        return None
    return (len(version), version) >= (len(than), than)
