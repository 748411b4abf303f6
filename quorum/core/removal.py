"""What `quorum uninstall` removes, in which order, and the rights each step takes: pure data
and rules (`quorum/commands/uninstall.py` carries them out).

quorum's objects are named here, once: the wheel and the image hold the `quorum` package only,
not `manifests/` or `crds/`, so the command cannot read them. `tests/unit/test_removal.py`
checks this table against `manifests/` and `crds/` both ways.

The order (docs/lifecycle.md, "Uninstall without stranding pods"), so that no pod is left gated,
no pod creation is refused on the way, and no Job or node is left held by quorum:

1. no new gates: the backstop's binding, then (once the apiserver no longer enforces it) the
   mutating webhook (and wait until the apiserver no longer calls it);
2. release every gated gang pod; then resume the Jobs quorum suspended, each once none of its
   pods is left (a recovery or a preemption suspends a Job, records it on the gang's Gang and
   resumes it once its pods are gone: once quorum is gone nothing would);
3. what protects the gate and admits pods: gate protection, the validating webhooks, the
   Deployments, the backstop policy;
4. quorum's CRDs (only those carrying quorum's label: a PodGroup CRD someone else installed
   stays), the fences, the cluster-wide RBAC, then quorum's reservation taints on nodes, then
   the namespace (and with it everything in it).

The reservation taints (`quorum.dev/reserved=<token>:NoSchedule`, docs/preemption.md) are what
a preemption in flight holds its nodes with; only quorum's operator removes them, so once it is
gone a node left with one takes no pod again. They go once quorum's operator may no longer
write a node (its ClusterRoleBinding is gone; its Deployment went in step 3), so that an
operator still running cannot put one back; and the command looks again until none is seen
`RESERVATION_QUIET` times in a row.

`admission_only` stops after step 3, without the Deployments, and then removes the reservation
taints as quorum's operator: what a Helm pre-delete hook runs before Helm deletes the rest in no
particular order. After it nothing of quorum gates a pod, refuses a pod creation, holds a Job
suspended or keeps a node reserved whatever goes next: the operator and the webhook server no
longer take part in admission, the fences left are policies inside the apiserver that depend on
nothing running, and the operator, which still runs until Helm deletes it, reserves nodes only
for a preemption of a gated gang, and no gang is gated any more (a preemption it had decided
just before the release is what the repeated look waits out).
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from enum import StrEnum
from typing import Any

PART_OF_LABEL = "app.kubernetes.io/part-of"
PART_OF_VALUE = "quorum"
OPERATOR_SERVICE_ACCOUNT = "quorum-operator"


@dataclass(frozen=True)
class Kind:
    group: str
    version: str
    plural: str
    kind: str
    namespaced: bool = False

    @property
    def api_version(self) -> str:
        return f"{self.group}/{self.version}" if self.group else self.version


ADMISSION = "admissionregistration.k8s.io"
POLICY = Kind(ADMISSION, "v1", "validatingadmissionpolicies", "ValidatingAdmissionPolicy")
POLICY_BINDING = Kind(
    ADMISSION, "v1", "validatingadmissionpolicybindings", "ValidatingAdmissionPolicyBinding"
)
MUTATING_WEBHOOKS = Kind(ADMISSION, "v1", "mutatingwebhookconfigurations", "MutatingWebhookConfiguration")
VALIDATING_WEBHOOKS = Kind(
    ADMISSION, "v1", "validatingwebhookconfigurations", "ValidatingWebhookConfiguration"
)
DEPLOYMENT = Kind("apps", "v1", "deployments", "Deployment", namespaced=True)
CRD = Kind("apiextensions.k8s.io", "v1", "customresourcedefinitions", "CustomResourceDefinition")
CLUSTER_ROLE = Kind("rbac.authorization.k8s.io", "v1", "clusterroles", "ClusterRole")
CLUSTER_ROLE_BINDING = Kind("rbac.authorization.k8s.io", "v1", "clusterrolebindings", "ClusterRoleBinding")
NAMESPACE = Kind("", "v1", "namespaces", "Namespace")
NODE = Kind("", "v1", "nodes", "Node")

WEBHOOKS = "quorum-webhooks"  # both webhook configurations
BACKSTOP = "quorum-gang-backstop"
GATE_PROTECTION = "quorum-gate-protection"
DEPLOYMENTS = ("quorum-operator", "quorum-webhooks", "quorum-sunk-scheduler")
# Each a ValidatingAdmissionPolicy with a binding of the same name. quorum-operator-eviction-fence
# is no longer shipped (README, upgrading): removed too, for installs that still have it.
FENCES = (
    "quorum-operator-fence",
    "quorum-records",
    "quorum-reserved-status",
    "quorum-reserved-tolerations",
    "quorum-preemption-immunity",
    "quorum-gang-pod-size",
    "quorum-sunk-scheduler-fence",
    "quorum-operator-eviction-fence",
)
RETIRED = ("quorum-operator-eviction-fence",)
CRDS = ("gangs.quorum.dev", "podgroups.scheduling.sigs.k8s.io", "podgroups.scheduling.x-k8s.io")
QUORUMS_OWN_CRDS = ("gangs.quorum.dev",)  # its objects are quorum's records; a PodGroup is a tenant's
CLUSTER_ROLE_BINDINGS = ("quorum-operator", "quorum-sunk-scheduler")
CLUSTER_ROLES = ("quorum-operator", "quorum-sunk-scheduler", "quorum:podgroups-editor", "quorum:gangs-viewer")
RESERVED_TAINT = "quorum.dev/reserved"  # quorum.k8s.writes.RESERVED_TAINT, the preemption's
RESERVATION_QUIET = 5  # looks in a row that find no reservation taint, `interval` apart

# The probes of step 1, created with a server-side dry run (admission runs, nothing is stored).
# The backstop's: a pod only the backstop refuses (quorum's gate without being a gang member);
# admitted once the apiserver no longer enforces the backstop's binding. The mutating webhook's:
# a gang member, which the webhook would gate; admitted ungated once the apiserver no longer
# calls it. Both meet Pod Security `restricted`, so a namespace that enforces it does not refuse
# them for another reason.
_PROBE_SPEC: dict[str, Any] = {
    "securityContext": {
        "runAsNonRoot": True,
        "runAsUser": 65532,
        "seccompProfile": {"type": "RuntimeDefault"},
    },
    "containers": [
        {
            "name": "c",
            "image": "registry.k8s.io/pause:3.10",
            "securityContext": {"allowPrivilegeEscalation": False, "capabilities": {"drop": ["ALL"]}},
        }
    ],
}
GATE = "quorum.dev/gang"
BACKSTOP_PROBE: dict[str, Any] = {
    "apiVersion": "v1",
    "kind": "Pod",
    "metadata": {"name": "quorum-backstop-probe"},
    "spec": {"schedulingGates": [{"name": GATE}], **_PROBE_SPEC},
}
MUTATING_PROBE: dict[str, Any] = {
    "apiVersion": "v1",
    "kind": "Pod",
    "metadata": {
        "name": "quorum-webhook-probe",
        "labels": {"pod-group.scheduling.sigs.k8s.io": "quorum-probe"},
    },
    "spec": _PROBE_SPEC,
}


def is_gated(pod: dict[str, Any]) -> bool:
    return any(g.get("name") == GATE for g in (pod.get("spec") or {}).get("schedulingGates") or [])


@dataclass(frozen=True)
class Ref:
    kind: Kind
    name: str
    namespace: str | None = None

    def __str__(self) -> str:
        where = f"{self.namespace}/" if self.namespace else ""
        return f"{self.kind.kind} {where}{self.name}"


class Action(StrEnum):
    DELETE = "delete"
    DELETE_IF_QUORUMS = "delete if labelled quorum's"  # a CRD: only with quorum's part-of label
    WAIT_BACKSTOP_DROPPED = "wait until the apiserver no longer enforces the backstop"
    WAIT_MUTATING_DROPPED = "wait until the apiserver no longer calls the mutating webhook"
    RELEASE_GATED = "release every gated gang pod"
    RESUME_JOBS = "resume the Jobs quorum suspended"
    REMOVE_RESERVATIONS = f"remove quorum's reservation taint {RESERVED_TAINT} from every node"


@dataclass(frozen=True)
class Step:
    number: int  # the step of the order above
    action: Action
    target: Ref | None = None


def removal_plan(namespace: str, admission_only: bool = False) -> tuple[Step, ...]:
    """The steps of the uninstall of quorum installed in `namespace`, in order."""

    def delete(number: int, kind: Kind, *names: str, namespaced: bool = False) -> list[Step]:
        return [Step(number, Action.DELETE, Ref(kind, n, namespace if namespaced else None)) for n in names]

    steps = [
        *delete(1, POLICY_BINDING, BACKSTOP),
        Step(1, Action.WAIT_BACKSTOP_DROPPED),
        *delete(1, MUTATING_WEBHOOKS, WEBHOOKS),
        Step(1, Action.WAIT_MUTATING_DROPPED),
        Step(2, Action.RELEASE_GATED),
        Step(2, Action.RESUME_JOBS),
        *delete(3, POLICY_BINDING, GATE_PROTECTION),
        *delete(3, POLICY, GATE_PROTECTION),
        *delete(3, VALIDATING_WEBHOOKS, WEBHOOKS),
    ]
    if not admission_only:
        steps += delete(3, DEPLOYMENT, *DEPLOYMENTS, namespaced=True)
    steps += delete(3, POLICY, BACKSTOP)
    if admission_only:
        return (*steps, Step(3, Action.REMOVE_RESERVATIONS))
    steps += [Step(4, Action.DELETE_IF_QUORUMS, Ref(CRD, name)) for name in CRDS]
    for fence in FENCES:
        steps += delete(4, POLICY_BINDING, fence) + delete(4, POLICY, fence)
    steps += delete(4, CLUSTER_ROLE_BINDING, *CLUSTER_ROLE_BINDINGS)
    steps += delete(4, CLUSTER_ROLE, *CLUSTER_ROLES)
    steps.append(Step(4, Action.REMOVE_RESERVATIONS))  # the operator may no longer write a node
    steps += delete(4, NAMESPACE, namespace)
    return tuple(steps)


def crd_resource(name: str) -> tuple[str, str]:
    """(group, plural) of the objects of the CRD `name` (plural.group)."""
    plural, _, group = name.partition(".")
    return group, plural


def is_quorums(labels: dict[str, str] | None) -> bool:
    return (labels or {}).get(PART_OF_LABEL) == PART_OF_VALUE


# -- rights -------------------------------------------------------------------------------------


@dataclass(frozen=True)
class Rule:
    """One RBAC rule; `namespace` None: cluster-wide (a ClusterRole's), else a Role's there."""

    group: str
    resource: str
    verbs: tuple[str, ...]
    names: tuple[str, ...] = ()  # resourceNames; () is any name
    namespace: str | None = None


def rights(steps: Sequence[Step], namespace: str, probe_namespace: str) -> list[Rule]:
    """The rules the identity that carries out `steps` needs, no more: each object's deletion
    by name; the probes' (dry-run) pod creation in `probe_namespace`; impersonating quorum's
    operator for the release, the Jobs it suspended (it may list Gangs, read Jobs and patch
    their spec.suspend) and the reservation taints (it may list nodes and patch their
    reservation taints); for quorum's CRDs, reading them (the label) and listing
    their objects (the count the line reports). Reservation taints removed after the operator's
    ClusterRoleBinding is deleted are removed as the caller: listing and patching nodes."""
    rules: list[Rule] = []
    operator_rbac_gone = False
    for step in steps:
        target = step.target
        if target == Ref(CLUSTER_ROLE_BINDING, OPERATOR_SERVICE_ACCOUNT):
            operator_rbac_gone = True
        if step.action is Action.DELETE and target is not None and target.kind is NAMESPACE:
            rules.append(Rule("", "namespaces", ("get", "delete"), (target.name,)))  # is it terminating?
        elif step.action is Action.DELETE and target is not None:
            rules.append(
                Rule(target.kind.group, target.kind.plural, ("delete",), (target.name,), target.namespace)
            )
        elif step.action is Action.DELETE_IF_QUORUMS and target is not None:
            rules.append(Rule(CRD.group, CRD.plural, ("get", "delete"), (target.name,)))
            group, plural = crd_resource(target.name)
            rules.append(Rule(group, plural, ("list",)))
        elif step.action in (Action.WAIT_BACKSTOP_DROPPED, Action.WAIT_MUTATING_DROPPED):
            rules.append(Rule("", "pods", ("create",), (), probe_namespace))
        elif step.action in (Action.RELEASE_GATED, Action.RESUME_JOBS) or (
            step.action is Action.REMOVE_RESERVATIONS and not operator_rbac_gone
        ):
            rules.append(
                Rule("", "serviceaccounts", ("impersonate",), (OPERATOR_SERVICE_ACCOUNT,), namespace)
            )
        elif step.action is Action.REMOVE_RESERVATIONS:
            rules.append(Rule(NODE.group, NODE.plural, ("list", "patch")))
    return merged(rules)


def merged(rules: Iterable[Rule]) -> list[Rule]:
    """Rules of the same group, resource, verbs and namespace as one (their names joined), in
    the order first seen; a rule for any name swallows named ones."""
    out: dict[tuple[str, str, tuple[str, ...], str | None], list[str] | None] = {}
    for rule in rules:
        key = (rule.group, rule.resource, rule.verbs, rule.namespace)
        names = out.setdefault(key, [])
        if not rule.names:
            out[key] = None
        elif names is not None:
            names.extend(n for n in rule.names if n not in names)
    return [Rule(g, r, v, tuple(n or ()), ns) for (g, r, v, ns), n in out.items()]


def rbac_manifests(rules: Sequence[Rule], account: str, namespace: str) -> list[dict[str, Any]]:
    """A ClusterRole and Roles (one per namespace) holding `rules`, each bound to the
    ServiceAccount `account` of `namespace`; all named after the account."""
    subject = [{"kind": "ServiceAccount", "name": account, "namespace": namespace}]
    rbac = "rbac.authorization.k8s.io"
    docs: list[dict[str, Any]] = []
    scopes = list(dict.fromkeys(r.namespace for r in rules))
    for scope in sorted(scopes, key=lambda s: (s is not None, s or "")):
        kind = "ClusterRole" if scope is None else "Role"
        meta: dict[str, Any] = {"name": account}
        if scope is not None:
            meta["namespace"] = scope
        docs.append(
            {
                "apiVersion": f"{rbac}/v1",
                "kind": kind,
                "metadata": meta,
                "rules": [_rule(r) for r in rules if r.namespace == scope],
            }
        )
        docs.append(
            {
                "apiVersion": f"{rbac}/v1",
                "kind": f"{kind}Binding",
                "metadata": dict(meta),
                "roleRef": {"apiGroup": rbac, "kind": kind, "name": account},
                "subjects": subject,
            }
        )
    return docs


def _rule(rule: Rule) -> dict[str, Any]:
    out: dict[str, Any] = {"apiGroups": [rule.group], "resources": [rule.resource], "verbs": list(rule.verbs)}
    if rule.names:
        out["resourceNames"] = list(rule.names)
    return out
