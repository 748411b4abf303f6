"""Which nodes a pod may use at all (predicates other than capacity), and why not.

Modelled: unschedulable and not-Ready nodes, the CKS lifecycle labels (only
`node.coreweave.cloud/state=production`; `reserved=<org>` when an org is set), taints with effect
NoSchedule/NoExecute (PreferNoSchedule is only a preference), `nodeSelector`, and required node
affinity. Capacity is checked by the planner against free resources."""

from __future__ import annotations

from dataclasses import dataclass

from quorum.core.model import Node, Pod, Resources, insufficient

STATE_LABEL = "node.coreweave.cloud/state"
RESERVED_LABEL = "node.coreweave.cloud/reserved"


@dataclass(frozen=True, slots=True)
class FitSettings:
    require_production: bool = True
    org: str | None = None  # when set, only nodes reserved for this org


def why_not(pod: Pod, node: Node, settings: FitSettings) -> str | None:
    """None if the pod may use the node; otherwise a short reason, used to count nodes by reason."""
    if node.unschedulable:
        return "cordoned"
    if not node.ready:
        return "not Ready"
    if settings.require_production and node.labels.get(STATE_LABEL, "production") != "production":
        return f"state {node.labels.get(STATE_LABEL)}"
    if settings.org is not None and node.labels.get(RESERVED_LABEL) != settings.org:
        return "reserved for another org"
    for taint in node.taints:
        if taint.effect in ("NoSchedule", "NoExecute") and not any(
            t.tolerates(taint) for t in pod.tolerations
        ):
            return f"taint {taint.key}"
    for key, value in pod.node_selector.items():
        if node.labels.get(key) != value:
            return f"nodeSelector {key}"
    # Terms are ORed, their requirements ANDed; an empty term selects no node (as in Kubernetes).
    if pod.affinity and not any(
        term and all(r.matches_node(node.name, node.labels) for r in term) for term in pod.affinity
    ):
        return "node affinity"
    return None


def prefers_not(pod: Pod, node: Node) -> int:
    """How many PreferNoSchedule taints of the node the pod does not tolerate (lower is better)."""
    return sum(
        1
        for taint in node.taints
        if taint.effect == "PreferNoSchedule" and not any(t.tolerates(taint) for t in pod.tolerations)
    )


@dataclass(frozen=True, slots=True)
class Refusal:
    """Why a node cannot take a pod now: the first predicate it fails (`why_not`), or else the
    first resource it has too little of free."""

    reason: str  # "cordoned", "taint is_cpu_compute", "Insufficient nvidia.com/gpu", ...
    resource: str | None = None  # the resource short, for "Insufficient ..."
    free: int = 0  # milli-units of it free on the node
    needed: int = 0  # milli-units of it one pod asks


def first_refusal(pod: Pod, node: Node, free: Resources, settings: FitSettings) -> Refusal | None:
    """Why the node cannot take the pod with `free` room left; None if it can. The planner's
    own tests, in its order: whether the node may be used at all, then capacity (`fits`)."""
    reason = why_not(pod, node, settings)
    if reason is not None:
        return Refusal(reason)
    short = insufficient(pod.requests, free)
    if short is None:
        return None
    return Refusal(f"Insufficient {short}", short, max(0, free.get(short, 0)), pod.requests[short])
