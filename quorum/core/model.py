"""The planner's view of a cluster: nodes, pods and gangs, as plain immutable data.

Resources are integers in milli-units (1 CPU = 1000, 1 GiB = 1073741824000, 1 GPU = 1000), so
every sum and comparison is exact. `quorum.k8s.convert` builds these from API objects.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field

from quorum.core.quantity import parse_quantity

Resources = Mapping[str, int]


def milli(quantity: str | int | float) -> int:
    """A quantity in milli-units, rounded up (a request is never under-counted)."""
    return math.ceil(parse_quantity(quantity) * 1000)


def resources(amounts: Mapping[str, str | int | float] | None) -> dict[str, int]:
    return {k: milli(v) for k, v in (amounts or {}).items()}


def add(a: Resources, b: Resources) -> dict[str, int]:
    out = dict(a)
    for k, v in b.items():
        out[k] = out.get(k, 0) + v
    return out


def subtract(a: Resources, b: Resources) -> dict[str, int]:
    out = dict(a)
    for k, v in b.items():
        out[k] = out.get(k, 0) - v
    return out


def fits(requests: Resources, free: Resources) -> bool:
    return insufficient(requests, free) is None


def insufficient(requests: Resources, free: Resources) -> str | None:
    """The first resource (in the order of `requests`) of which `free` has less than asked; None
    if the requests fit."""
    for k, v in requests.items():
        if v > 0 and free.get(k, 0) < v:
            return k
    return None


def total(items: Iterable[Resources]) -> dict[str, int]:
    out: dict[str, int] = {}
    for r in items:
        out = add(out, r)
    return out


@dataclass(frozen=True, slots=True)
class Taint:
    key: str
    effect: str
    value: str = ""


@dataclass(frozen=True, slots=True)
class Toleration:
    key: str = ""
    operator: str = "Equal"
    value: str = ""
    effect: str = ""

    def tolerates(self, taint: Taint) -> bool:
        if self.effect and self.effect != taint.effect:
            return False
        if self.operator == "Exists":
            return not self.key or self.key == taint.key
        return self.key == taint.key and self.value == taint.value


@dataclass(frozen=True, slots=True)
class Requirement:
    """One requirement of a required node affinity term: a matchExpression (on the node's
    labels) or, with `field`, a matchField (on `metadata.name`, the only node field Kubernetes
    supports there)."""

    key: str
    operator: str  # In, NotIn, Exists, DoesNotExist, Gt, Lt
    values: tuple[str, ...] = ()
    field: bool = False

    def matches_node(self, name: str, labels: Mapping[str, str]) -> bool:
        return self.matches({self.key: name} if self.field else labels)

    def matches(self, labels: Mapping[str, str]) -> bool:
        value = labels.get(self.key)
        match self.operator:
            case "In":
                return value is not None and value in self.values
            case "NotIn":
                return value is None or value not in self.values
            case "Exists":
                return value is not None
            case "DoesNotExist":
                return value is None
            case "Gt" | "Lt":
                try:
                    have, want = int(value or ""), int(self.values[0])
                except (ValueError, IndexError):
                    return False
                return have > want if self.operator == "Gt" else have < want
        return False


@dataclass(frozen=True, slots=True)
class Node:
    name: str
    labels: Mapping[str, str]
    allocatable: Resources
    taints: tuple[Taint, ...] = ()
    unschedulable: bool = False
    ready: bool = True


@dataclass(frozen=True, slots=True)
class PodClaim:
    """One entry of a pod's `spec.resourceClaims`: its name, and the claim or template named."""

    name: str
    claim: str | None = None  # resourceClaimName
    template: str | None = None  # resourceClaimTemplateName
    made: str | None = None  # the claim made from the template (pod status resourceClaimStatuses)


@dataclass(frozen=True, slots=True)
class Pod:
    """A gated gang pod as the planner needs it."""

    uid: str
    name: str
    requests: Resources  # effective: containers + sidecars, init max, overhead, pods: 1000
    tolerations: tuple[Toleration, ...] = ()
    node_selector: Mapping[str, str] = field(default_factory=dict)
    # Required node affinity: a node must match every requirement of at least one term.
    affinity: tuple[tuple[Requirement, ...], ...] = ()
    unmodeled: tuple[str, ...] = ()  # hard constraints quorum does not model (for a warning)
    # Its DRA claims (`quorum.core.devices` counts them into `requests` before a plan).
    claims: tuple[PodClaim, ...] = ()
    # Pods of one shape fit the same nodes the same way; computed once (the planner asks often).
    shape: tuple[object, ...] = field(init=False, repr=False, compare=False)

    def __post_init__(self) -> None:
        shape = (
            tuple(sorted(self.requests.items())),
            self.tolerations,
            tuple(sorted(self.node_selector.items())),
            self.affinity,
        )
        object.__setattr__(self, "shape", shape)


@dataclass(frozen=True, slots=True)
class Gang:
    namespace: str
    name: str
    min_member: int
    pods: tuple[Pod, ...]  # gated members waiting for release
    members: int = 0  # pods of the gang that exist (gated or not)
    released: int = 0  # members already released earlier
    priority: int = 0
    created: float = 0.0
    min_resources: Resources = field(default_factory=dict)
    # Since when the gang has been plannable but held for lack of room (None: not held).
    held_since: float | None = None
    # All pods in one domain of this node label (a rack, a block, a zone), or anywhere.
    topology_key: str | None = None
    # `disruptionMode` (Pod | PodGroup; 1.37's single | all): how this gang may be preempted.
    disruption_mode: str | None = None
    # The CompositePodGroup (same namespace) whose minGroupCount this gang counts toward.
    composite: str | None = None
    # Whose gang it is, for fairness between teams (docs/lifecycle.md, "Between tenants"); ""
    # for its namespace.
    tenant: str = ""
    # One pod of each shape among its pods, in order (computed once: the planner asks often).
    shapes: tuple[Pod, ...] = field(init=False, repr=False, compare=False)

    def __post_init__(self) -> None:
        firsts: dict[tuple[object, ...], Pod] = {}
        for pod in self.pods:
            firsts.setdefault(pod.shape, pod)
        object.__setattr__(self, "shapes", tuple(firsts.values()))

    @property
    def key(self) -> tuple[str, str]:
        return (self.namespace, self.name)

    @property
    def owner(self) -> str:
        """The tenant the gang counts for (`tenant_name`)."""
        return tenant_name(self.namespace, self.tenant)


def tenant_name(namespace: str, tenant: str = "") -> str:
    """The tenant a gang of `namespace` counts for: its tenant label's `<label>=<value>`, or the
    namespace."""
    return tenant or f"namespace {namespace}"


@dataclass(frozen=True, slots=True)
class Composite:
    """A Kubernetes 1.37 CompositePodGroup: of its children (gangs, or composites below it),
    `min_group_count` are placed together or none is; all of them in one domain of
    `topology_key` if it has one."""

    namespace: str
    name: str
    min_group_count: int
    admitted: int = 0  # children admitted already (a composite: its own count met): they count
    topology_key: str | None = None
    # The topology domains the admitted gangs' bound pods are in: the others go there too.
    admitted_domains: frozenset[str] = frozenset()
    parent: str | None = None  # the CompositePodGroup (same namespace) it counts toward

    @property
    def key(self) -> tuple[str, str]:
        return (self.namespace, self.name)
