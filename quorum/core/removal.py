"""What `quorum uninstall` removes, in which order, and the rights each step takes: pure data
and rules (`quorum/commands/uninstall.py` carries them out).

quorum's objects are named here, once: the wheel and the image hold the `quorum` package only,
not `manifests/` or `crds/`, so the command cannot read them. `tests/unit/test_removal.py`
checks this table against `manifests/` and `crds/` both ways.

The order (docs/lifecycle.md, "Uninstall without stranding pods"), so that no pod is left gated,
no pod creation is refused on the way, and no Job or node is left held by quorum:

0. quorum-operator stops acting: the command takes its leader Lease (`OPERATOR_LEASE`, as the
   operator, which may write it) for `UNINSTALL_HOLDER` and waits until the replica that held it
   can no longer act (`quorum.operator.leader.LeaseSettings.acts_at_most` of the duration it
   recorded, plus `LEASE_MARGIN`); every replica then sees another holder and stays idle. From
   here on nothing of quorum suspends a Job, reserves a node or releases a pod but the command;
1. no new gates: the backstop's binding, then (once the apiserver no longer enforces it) the
   mutating webhook (and wait until the apiserver no longer calls it). Each deletion needs
   positive evidence first: the backstop's probe is refused while its binding is there (else
   the probe namespace is not one the backstop covers, and its acceptance afterwards would prove
   nothing), and the mutating webhook's probe comes back gated (else its server is down and it
   fails open: its deletion changes nothing for pods);
2. release every gated gang pod (only those created before the webhook's drop was seen,
   `GATED_MARGIN` after, can fail the run; later ones are released too and reported);
   then resume the Jobs quorum suspended, each once none of its pods
   is left (`quorum.core.lifecycle.job_may_resume`: once quorum is gone nothing would);
3. what protects the gate and admits pods: gate protection; then a sweep for pods a lagging
   apiserver gated meanwhile (released, until none is seen `QUIET_LOOKS` times in a row); the
   validating webhooks, the Deployments, the backstop policy;
4. quorum's CRDs (only those carrying quorum's label: a PodGroup CRD someone else installed
   stays), the fences, the cluster-wide RBAC (the chart's hook identities too, should a killed
   hook have left them), then quorum's reservation taints on nodes, then quorum's objects in
   its namespace by name (`NAMESPACED`; the Lease last) and the hook's Role in the probe
   namespace, and last the namespace itself only if it is quorum's (`is_quorums`: labelled
   app.kubernetes.io/part-of=quorum, as manifests/00-namespace.yaml and the chart's
   `namespace.create` make it). A namespace quorum was installed into (Helm's
   `--create-namespace`, a shared one) stays, with everything else in it.

The reservation taints (`quorum.dev/reserved=<token>:NoSchedule`, docs/preemption.md) are what
a preemption in flight holds its nodes with; only quorum's operator removes them, so once it is
gone a node left with one takes no pod again. They go once quorum's operator may no longer
write a node (its ClusterRoleBinding is gone; its Deployment went in step 3), and the command
looks again until none is seen `RESERVATION_QUIET` times in a row.

The Lease is held for `lease_hold_seconds` (a short time) and renewed while the run goes on,
whenever a quarter of that has passed since the last renewal: before each step, between the
looks of a step that waits, and from a background task during a long step. A run cut off leaves
it held at most that long; replicas honour it at most `MAX_UNINSTALL_HOLD`.

`admission_only` is steps 0 to 3 without the Deployments, and then removes the reservation
taints as quorum's operator: what a Helm pre-delete hook runs before Helm deletes the rest in no
particular order. After it nothing of quorum gates a pod, refuses a pod creation, holds a Job
suspended or keeps a node reserved whatever goes next: the webhooks no longer take part in
admission, the fences left are policies inside the apiserver that depend on nothing running,
and the operator's replicas, which run until Helm deletes them, see the Lease held by the
uninstall and do not act. Its last step leaves the Lease held for `LEASE_LEFT_SECONDS` more:
past the operator pods' termination as Helm deletes them right after the hook; a quorum
installed again into the namespace leads once that has passed.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from enum import StrEnum
from typing import Any

from quorum.core.gangs import GATE, RESERVED_TAINT

PART_OF_LABEL = "app.kubernetes.io/part-of"
PART_OF_VALUE = "quorum"
# The operator's ServiceAccount (quorum.install, the manifests and the chart name it so) and its
# leader Lease in quorum's namespace (quorum.operator.leader).
OPERATOR_SERVICE_ACCOUNT = "quorum-operator"
OPERATOR_LEASE = "quorum-operator"
# Who holds the Lease while `quorum uninstall` runs, and for how long at least
# (`lease_hold_seconds`): the run renews it whenever a quarter of that has passed, so that a
# hold left by a run cut off (or by the chart's hook, had it nothing to shorten it) ends soon.
UNINSTALL_HOLDER = "quorum-uninstall"
LEASE_HOLD_SECONDS = 120
# The longest hold of `UNINSTALL_HOLDER` quorum's replicas honour (quorum.operator.leader.Election);
# any other holder is judged by the replica's own lease duration, whatever it recorded.
MAX_UNINSTALL_HOLD = 600
# How long `--admission-only` leaves the Lease held once it is done: Helm deletes the operator's
# pods right after the hook, and they stop within their termination grace (30 s, the default:
# quorum's Deployments set none); 30 s more of margin. A quorum installed again acts after it.
LEASE_LEFT_SECONDS = 60
LEASE_MARGIN = 3.0  # seconds beyond `acts_at_most`: a write the old leader had already sent lands
GATED_MARGIN = 10.0  # seconds after the webhook's drop was seen that a gated pod is still quorum's
QUIET_LOOKS = 5  # looks in a row, `interval` apart, that find nothing (gated pods, taints)
DEFAULT_PROBE_NAMESPACE = "default"
# Namespaces quorum's admission leaves out besides its own: the namespaceSelector of the mutating
# webhook (manifests/30-webhook-configurations.yaml) and of the backstop
# (manifests/45-gang-backstop.yaml); tests/unit/test_removal.py checks both against this.
SYSTEM_NAMESPACES = ("kube-system", "kube-node-lease")


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
MUTATING_POLICY = Kind(ADMISSION, "v1", "mutatingadmissionpolicies", "MutatingAdmissionPolicy")
MUTATING_POLICY_BINDING = Kind(
    ADMISSION, "v1", "mutatingadmissionpolicybindings", "MutatingAdmissionPolicyBinding"
)
VALIDATING_WEBHOOKS = Kind(
    ADMISSION, "v1", "validatingwebhookconfigurations", "ValidatingWebhookConfiguration"
)
DEPLOYMENT = Kind("apps", "v1", "deployments", "Deployment", namespaced=True)
CRD = Kind("apiextensions.k8s.io", "v1", "customresourcedefinitions", "CustomResourceDefinition")
CLUSTER_ROLE = Kind("rbac.authorization.k8s.io", "v1", "clusterroles", "ClusterRole")
CLUSTER_ROLE_BINDING = Kind("rbac.authorization.k8s.io", "v1", "clusterrolebindings", "ClusterRoleBinding")
NAMESPACE = Kind("", "v1", "namespaces", "Namespace")
NODE = Kind("", "v1", "nodes", "Node")
LEASE = Kind("coordination.k8s.io", "v1", "leases", "Lease", namespaced=True)
SERVICE_ACCOUNT = Kind("", "v1", "serviceaccounts", "ServiceAccount", namespaced=True)
ROLE = Kind("rbac.authorization.k8s.io", "v1", "roles", "Role", namespaced=True)
ROLE_BINDING = Kind("rbac.authorization.k8s.io", "v1", "rolebindings", "RoleBinding", namespaced=True)
CONFIG_MAP = Kind("", "v1", "configmaps", "ConfigMap", namespaced=True)
SECRET = Kind("", "v1", "secrets", "Secret", namespaced=True)
SERVICE = Kind("", "v1", "services", "Service", namespaced=True)
RESOURCE_QUOTA = Kind("", "v1", "resourcequotas", "ResourceQuota", namespaced=True)
POD_DISRUPTION_BUDGET = Kind("policy", "v1", "poddisruptionbudgets", "PodDisruptionBudget", namespaced=True)
NETWORK_POLICY = Kind("networking.k8s.io", "v1", "networkpolicies", "NetworkPolicy", namespaced=True)
CERTIFICATE = Kind("cert-manager.io", "v1", "certificates", "Certificate", namespaced=True)
ISSUER = Kind("cert-manager.io", "v1", "issuers", "Issuer", namespaced=True)

WEBHOOKS = "quorum-webhooks"  # both webhook configurations
BACKSTOP = "quorum-gang-backstop"
GATE_PROTECTION = "quorum-gate-protection"
POD_DEFAULTS = "quorum-pod-defaults"  # the MutatingAdmissionPolicy that gates gang pods in the apiserver
# The pod policies beside it (manifests/35 and 36), each with a binding of the same name.
POD_POLICIES = (
    "quorum-gang-pods",
    "quorum-gang-pods-warnings",
    "quorum-interruptable-pods",
    "quorum-interruptable-gang-pods",
)
DEPLOYMENTS = ("quorum-operator", "quorum-webhooks", "quorum-sunk-scheduler")
# Each a ValidatingAdmissionPolicy with a binding of the same name. quorum-operator-eviction-fence
# is no longer shipped (README, upgrading): removed too, for installs that still have it.
FENCES = (
    "quorum-operator-fence",
    "quorum-operator-claim-fence",
    "quorum-operator-podgroup-fence",
    "quorum-records",
    "quorum-reserved-status",
    "quorum-reserved-tolerations",
    "quorum-preemption-immunity",
    "quorum-gang-pod-size",
    "quorum-token-secrets",
    "quorum-sunk-scheduler-fence",
    "quorum-operator-eviction-fence",
)
RETIRED = ("quorum-operator-eviction-fence",)
CRDS = (
    "gangs.quorum.dev",
    "podgroups.scheduling.sigs.k8s.io",
    "podgroups.scheduling.x-k8s.io",
    "podgroups.scheduling.volcano.sh",
)
QUORUMS_OWN_CRDS = ("gangs.quorum.dev",)  # its objects are quorum's records; a PodGroup is a tenant's
# The chart's hook identities (charts/quorum/templates/hook-*.yaml): each a ServiceAccount of
# quorum's namespace with a ClusterRole, a Role (the uninstall hook's also one in the probe
# namespace) and their bindings, all of its name; Helm deletes them when the hook ends, but a
# hook killed with its Helm process leaves them.
HOOKS = ("quorum-certs-hook", "quorum-uninstall-hook")
UNINSTALL_HOOK = "quorum-uninstall-hook"
CLUSTER_ROLE_BINDINGS = ("quorum-operator", "quorum-sunk-scheduler", *HOOKS)
CLUSTER_ROLES = (
    "quorum-operator",
    "quorum-sunk-scheduler",
    "quorum:podgroups-editor",
    "quorum:gangs-viewer",
    *HOOKS,
)
# quorum's objects in its namespace, deleted by name in this order (whether or not the namespace
# goes too): what cert-manager issues before its Secrets (it would issue them again), the
# Secrets quorum made (`quorum certs ensure`, cert-manager for quorum's Certificates), RBAC
# before the ServiceAccounts, and the operator's Lease last (after its Role: a replica still
# terminating can no longer make it again). The chart's dashboard ConfigMap is the chart's.
NAMESPACED: tuple[tuple[Kind, tuple[str, ...]], ...] = (
    (CERTIFICATE, ("quorum-webhooks", "quorum-webhooks-ca")),
    (ISSUER, ("quorum-webhooks-ca", "quorum-selfsigned")),
    (SECRET, ("quorum-webhooks-tls", "quorum-webhooks-ca")),
    (SERVICE, ("quorum-webhooks", "quorum-sunk-scheduler")),
    (POD_DISRUPTION_BUDGET, ("quorum-webhooks",)),
    (NETWORK_POLICY, ("quorum-webhooks", "quorum-operator", "quorum-sunk-scheduler")),
    (CONFIG_MAP, ("quorum-webhooks", "quorum-dashboard")),
    (RESOURCE_QUOTA, ("quorum-critical-pods",)),
    (ROLE_BINDING, ("quorum-operator-leader-election", *HOOKS)),
    (ROLE, ("quorum-operator-leader-election", *HOOKS)),
    (SERVICE_ACCOUNT, ("quorum-operator", "quorum-webhooks", "quorum-sunk-scheduler", *HOOKS)),
    (LEASE, (OPERATOR_LEASE,)),
)
RESERVATION_QUIET = QUIET_LOOKS  # looks in a row that find no reservation taint

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


def admission_excluded(namespace: str) -> tuple[str, ...]:
    """The namespaces quorum's admission (its mutating webhook and its backstop) leaves out, for
    quorum installed in `namespace`: the system namespaces and quorum's own."""
    return (*SYSTEM_NAMESPACES, namespace)


def probe_namespace_problem(probe_namespace: str, namespace: str) -> str | None:
    """Why `probe_namespace` cannot hold the uninstall's probes (quorum's admission leaves it
    out, so they would prove nothing), or None. The one rule of `quorum uninstall
    --probe-namespace`, the chart's `uninstall.probeNamespace` and `quorum manifests --values`."""
    if probe_namespace in admission_excluded(namespace):
        return (
            f"{probe_namespace}: quorum's backstop does not apply there, so the uninstall's probe would "
            "prove nothing; name a tenant namespace (default: default)"
        )
    return None


def lease_hold_seconds(timeout: float) -> int:
    """How long `quorum uninstall` holds the operator's Lease at each write: `LEASE_HOLD_SECONDS`,
    or twice `--timeout` if that is longer, at most `MAX_UNINSTALL_HOLD` (what replicas honour).
    It renews the Lease from a background task once a quarter of that has passed, however long
    a step runs."""
    return min(MAX_UNINSTALL_HOLD, max(LEASE_HOLD_SECONDS, math.ceil(2 * timeout)))


@dataclass(frozen=True)
class Ref:
    kind: Kind
    name: str
    namespace: str | None = None

    def __str__(self) -> str:
        where = f"{self.namespace}/" if self.namespace else ""
        return f"{self.kind.kind} {where}{self.name}"


class Action(StrEnum):
    HOLD_LEASE = "take quorum-operator's leader Lease and wait until no replica acts"
    DELETE = "delete"
    DELETE_IF_QUORUMS = "delete if labelled quorum's"  # a CRD or the namespace: quorum's label
    CHECK_BACKSTOP_APPLIES = "check that the backstop refuses the probe pod"
    WAIT_BACKSTOP_DROPPED = "wait until the apiserver no longer enforces the backstop"
    CHECK_MUTATING_APPLIES = "check that the mutating webhook gates the probe gang pod"
    WAIT_MUTATING_DROPPED = "wait until the apiserver no longer calls the mutating webhook"
    RELEASE_GATED = "release every gang pod quorum gated"
    RESUME_JOBS = "resume the Jobs quorum suspended"
    SWEEP_GATED = "release gang pods gated meanwhile until none is seen"
    REMOVE_RESERVATIONS = f"remove quorum's reservation taint {RESERVED_TAINT} from every node"
    LEAVE_LEASE = f"leave quorum-operator's Lease held for {LEASE_LEFT_SECONDS} s more"


@dataclass(frozen=True)
class Step:
    number: int  # the step of the order above
    action: Action
    target: Ref | None = None


def removal_plan(
    namespace: str, admission_only: bool = False, probe_namespace: str = DEFAULT_PROBE_NAMESPACE
) -> tuple[Step, ...]:
    """The steps of the uninstall of quorum installed in `namespace`, in order (the full one
    also deletes the uninstall hook's Role left in `probe_namespace`)."""

    def delete(number: int, kind: Kind, *names: str, namespaced: bool = False) -> list[Step]:
        return [Step(number, Action.DELETE, Ref(kind, n, namespace if namespaced else None)) for n in names]

    steps = [
        Step(0, Action.HOLD_LEASE, Ref(LEASE, OPERATOR_LEASE, namespace)),
        Step(1, Action.CHECK_BACKSTOP_APPLIES, Ref(POLICY_BINDING, BACKSTOP)),
        *delete(1, POLICY_BINDING, BACKSTOP),
        Step(1, Action.WAIT_BACKSTOP_DROPPED),
        Step(1, Action.CHECK_MUTATING_APPLIES, Ref(MUTATING_WEBHOOKS, WEBHOOKS)),
        *delete(1, MUTATING_WEBHOOKS, WEBHOOKS),
        *delete(1, MUTATING_POLICY_BINDING, POD_DEFAULTS),
        *delete(1, MUTATING_POLICY, POD_DEFAULTS),
        Step(1, Action.WAIT_MUTATING_DROPPED),
        Step(2, Action.RELEASE_GATED),
        Step(2, Action.RESUME_JOBS),
        *delete(3, POLICY_BINDING, GATE_PROTECTION),
        *delete(3, POLICY, GATE_PROTECTION),
        Step(3, Action.SWEEP_GATED),
        *delete(3, VALIDATING_WEBHOOKS, WEBHOOKS),
    ]
    for policy in POD_POLICIES:
        steps += delete(3, POLICY_BINDING, policy) + delete(3, POLICY, policy)
    if not admission_only:
        steps += delete(3, DEPLOYMENT, *DEPLOYMENTS, namespaced=True)
    steps += delete(3, POLICY, BACKSTOP)
    if admission_only:
        return (
            *steps,
            Step(3, Action.REMOVE_RESERVATIONS),
            Step(3, Action.LEAVE_LEASE, Ref(LEASE, OPERATOR_LEASE, namespace)),
        )
    steps += [Step(4, Action.DELETE_IF_QUORUMS, Ref(CRD, name)) for name in CRDS]
    for fence in FENCES:
        steps += delete(4, POLICY_BINDING, fence) + delete(4, POLICY, fence)
    steps += delete(4, CLUSTER_ROLE_BINDING, *CLUSTER_ROLE_BINDINGS)
    steps += delete(4, CLUSTER_ROLE, *CLUSTER_ROLES)
    steps.append(Step(4, Action.REMOVE_RESERVATIONS))  # the operator may no longer write a node
    for kind, names in NAMESPACED:
        steps += delete(4, kind, *names, namespaced=True)
    if probe_namespace != namespace:
        for kind in (ROLE_BINDING, ROLE):
            steps.append(Step(4, Action.DELETE, Ref(kind, UNINSTALL_HOOK, probe_namespace)))
    steps.append(Step(4, Action.DELETE_IF_QUORUMS, Ref(NAMESPACE, namespace)))
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
    by name (a dry-run deletion first asks whether the backstop's binding and the mutating
    webhook are there); the probes' (dry-run) pod creation in `probe_namespace`; impersonating
    quorum's operator for its Lease (it may read and update it), the release and the sweep, the
    Jobs it suspended (it may list Gangs and pods, read Jobs and patch their spec.suspend) and
    the reservation taints (it may list nodes and patch their reservation taints); for quorum's
    CRDs and namespace, reading them (the label) and, for the CRDs, listing their objects (the
    count the line reports). Reservation taints removed after the operator's
    ClusterRoleBinding is deleted are removed as the caller: listing and patching nodes."""
    rules: list[Rule] = []
    operator_rbac_gone = False
    for step in steps:
        target = step.target
        if target == Ref(CLUSTER_ROLE_BINDING, OPERATOR_SERVICE_ACCOUNT):
            operator_rbac_gone = True
        if step.action is Action.DELETE_IF_QUORUMS and target is not None and target.kind is NAMESPACE:
            rules.append(Rule("", "namespaces", ("get", "delete"), (target.name,)))  # labelled? terminating?
        elif step.action in (Action.CHECK_BACKSTOP_APPLIES, Action.CHECK_MUTATING_APPLIES):
            assert target is not None  # is it there (a dry-run deletion)? then the probe
            rules.append(Rule(target.kind.group, target.kind.plural, ("delete",), (target.name,)))
            rules.append(Rule("", "pods", ("create",), (), probe_namespace))
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
        elif step.action in (
            Action.HOLD_LEASE,
            Action.LEAVE_LEASE,
            Action.RELEASE_GATED,
            Action.RESUME_JOBS,
            Action.SWEEP_GATED,
        ) or (step.action is Action.REMOVE_RESERVATIONS and not operator_rbac_gone):
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
