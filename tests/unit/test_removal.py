"""`quorum.core.removal`: the one table of quorum's objects (the image has no manifests/), checked
against manifests/, crds/ and what the chart adds both ways; the namespaces quorum's admission
leaves out, checked against the manifests' selectors; the uninstall's order; the rights derived
from it."""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

import pytest
import yaml

from quorum.core import removal
from quorum.core.removal import Action, Ref
from quorum.install import render
from quorum.operator.leader import LeaseSettings

REPO = Path(__file__).resolve().parents[2]
MANIFESTS = REPO / "manifests"
CRDS = REPO / "crds"
TEMPLATES = REPO / "charts" / "quorum" / "templates"
PROBES = "probes"


def docs(paths: list[Path], namespace: str) -> list[dict[str, Any]]:
    return [d for p in paths for d in yaml.safe_load_all(render(p.read_text(), namespace)) if d]


def installed(namespace: str) -> list[dict[str, Any]]:
    """What `kubectl apply -f manifests/` and the optional manifests create (not the static
    admission files, which are no API objects)."""
    paths = sorted(MANIFESTS.glob("*.yaml")) + sorted((MANIFESTS / "optional").glob("*.yaml"))
    return docs(paths, namespace)


def removed(namespace: str) -> set[tuple[str, str, str | None]]:
    return {
        (s.target.kind.kind, s.target.name, s.target.namespace)
        for s in removal.removal_plan(namespace, probe_namespace=PROBES)
        if s.target is not None and s.action in (Action.DELETE, Action.DELETE_IF_QUORUMS)
    }


def made_elsewhere(namespace: str) -> set[tuple[str, str, str | None]]:
    """What quorum makes beyond manifests/: the chart's hook identities (in quorum's namespace
    and the probe namespace) and its dashboard ConfigMap, the Secrets of quorum's Certificates
    (cert-manager's, or `quorum certs ensure`'s), and the operator's leader Lease."""
    scopes = {"{{ $namespace }}": namespace, "{{ $probe }}": PROBES}
    made: set[tuple[str, str, str | None]] = set()
    for template in sorted(TEMPLATES.glob("hook-*.yaml")):
        for kind, meta in re.findall(r"^kind: (\w+)\nmetadata:\n((?:  .*\n)+)", template.read_text(), re.M):
            name = re.search(r"^  name: (\S+)", meta, re.M)
            where = re.search(r"^  namespace: (.+)$", meta, re.M)
            assert name is not None, (template.name, kind)
            made.add((kind, name.group(1), scopes[where.group(1).strip()] if where else None))
    assert '"quorum-dashboard"' in (TEMPLATES / "install.yaml").read_text()
    made.add(("ConfigMap", "quorum-dashboard", namespace))
    made |= {
        ("Secret", d["spec"]["secretName"], namespace)
        for d in installed(namespace)
        if d["kind"] == "Certificate"
    }
    made.add(("Lease", LeaseSettings().name, namespace))
    return made


@pytest.mark.parametrize("namespace", ["quorum-system", "gpu-admission"])
def test_every_installed_object_is_removed_by_name(namespace: str) -> None:
    """Each by name, not only with the namespace: a namespace quorum was installed into stays."""
    named = removed(namespace)
    left = [
        (d["kind"], d["metadata"]["name"], d["metadata"].get("namespace"))
        for d in installed(namespace)
        if (d["kind"], d["metadata"]["name"], d["metadata"].get("namespace")) not in named
    ]
    assert not left, f"objects of manifests/ that `quorum uninstall` would leave behind: {left}"
    hooks = {k for k in made_elsewhere(namespace) if k[0] != "Job"}  # a hook's Job stays for its log
    assert hooks <= named, f"what the chart and quorum make that it would leave: {hooks - named}"


@pytest.mark.parametrize("namespace", ["quorum-system", "gpu-admission"])
def test_every_object_removed_by_name_is_one_quorum_installs(namespace: str) -> None:
    shipped = {
        (d["kind"], d["metadata"]["name"], d["metadata"].get("namespace")) for d in installed(namespace)
    }
    shipped |= {
        ("CustomResourceDefinition", d["metadata"]["name"], None) for d in docs(crd_files(), namespace)
    }
    shipped |= made_elsewhere(namespace)
    retired = {
        (k, n, None)
        for n in removal.RETIRED
        for k in ("ValidatingAdmissionPolicy", "ValidatingAdmissionPolicyBinding")
    }
    assert removed(namespace) - shipped == retired


def crd_files() -> list[Path]:
    return sorted(CRDS.rglob("*.yaml"))


def test_quorums_crds_are_the_table_and_carry_its_label() -> None:
    crds = docs(crd_files(), "quorum-system")
    assert sorted(d["metadata"]["name"] for d in crds) == sorted(removal.CRDS)
    # The label is what tells quorum's CRD from one scheduler-plugins installed (README: quorum
    # creates its copy with `kubectl create`, so an existing one keeps its own labels).
    assert all(removal.is_quorums(d["metadata"].get("labels")) for d in crds)


def test_the_order_no_new_gates_then_release_then_protection_then_the_rest() -> None:
    plan = removal.removal_plan("quorum-system")
    order = [(s.action, str(s.target) if s.target else None) for s in plan]
    index = {entry: i for i, entry in enumerate(order)}

    def at(action: Action, target: str | None = None) -> int:
        return index[(action, target)]

    backstop_binding = at(Action.DELETE, "ValidatingAdmissionPolicyBinding quorum-gang-backstop")
    wait = at(Action.WAIT_BACKSTOP_DROPPED)
    mutating = at(Action.DELETE, "MutatingWebhookConfiguration quorum-webhooks")
    mutating_dropped = at(Action.WAIT_MUTATING_DROPPED)
    release = at(Action.RELEASE_GATED)
    resume = at(Action.RESUME_JOBS)
    gate = at(Action.DELETE, "ValidatingAdmissionPolicyBinding quorum-gate-protection")
    validating = at(Action.DELETE, "ValidatingWebhookConfiguration quorum-webhooks")
    operator = at(Action.DELETE, "Deployment quorum-system/quorum-operator")
    webhooks = at(Action.DELETE, "Deployment quorum-system/quorum-webhooks")
    crds = [i for i, (a, t) in enumerate(order) if a is Action.DELETE_IF_QUORUMS and "Definition" in str(t)]
    rbac = at(Action.DELETE, "ClusterRoleBinding quorum-operator")
    role = at(Action.DELETE, "ClusterRole quorum-operator")
    reservations = at(Action.REMOVE_RESERVATIONS)
    namespace = at(Action.DELETE_IF_QUORUMS, "Namespace quorum-system")
    lease = at(Action.HOLD_LEASE, "Lease quorum-system/quorum-operator")
    sweep = at(Action.SWEEP_GATED)
    gate_policy = at(Action.DELETE, "ValidatingAdmissionPolicy quorum-gate-protection")
    leader_role = at(Action.DELETE, "RoleBinding quorum-system/quorum-operator-leader-election")
    lease_gone = at(Action.DELETE, "Lease quorum-system/quorum-operator")
    # quorum-operator stops acting before anything else.
    assert lease == 0
    # Positive evidence before each admission object of step 1 goes.
    assert at(Action.CHECK_BACKSTOP_APPLIES, "ValidatingAdmissionPolicyBinding quorum-gang-backstop") + 1 == (
        backstop_binding
    )
    assert at(Action.CHECK_MUTATING_APPLIES, "MutatingWebhookConfiguration quorum-webhooks") + 1 == mutating
    # Pods an apiserver late to drop the webhook gated: once gate protection is gone.
    assert gate < gate_policy < sweep < validating
    # quorum's objects in its namespace, by name, once nothing of quorum writes nodes; the Lease
    # after the Role that lets a replica make it again.
    assert reservations < leader_role < lease_gone < namespace
    # The backstop refuses gang pods without the gate: it must be gone before the webhook that gates.
    assert backstop_binding < wait < mutating < mutating_dropped < release
    # The gate stays protected, and the operator there, until every gated pod is released.
    assert release < gate < operator and release < validating < webhooks
    # Jobs quorum suspended, resumed once no new pod is gated (their new pods run) and while
    # their records (the Gangs) and the operator's rights (it resumes them) are there.
    assert release < resume < min(crds) and resume < rbac
    assert webhooks < min(crds) and max(crds) < rbac < namespace == len(order) - 1
    # The reservation taints once nothing of quorum may put one back: the operator's Deployment
    # and its right to write nodes gone.
    assert operator < rbac < reservations and role < reservations < namespace
    assert [s.number for s in plan] == sorted(s.number for s in plan)


def test_admission_only_is_steps_zero_to_three_without_the_deployments_then_the_reservations() -> None:
    full = removal.removal_plan("gpu-admission")
    only = removal.removal_plan("gpu-admission", admission_only=True)
    assert list(only) == [
        *(s for s in full if s.number <= 3 and (s.target is None or s.target.kind is not removal.DEPLOYMENT)),
        removal.Step(3, Action.REMOVE_RESERVATIONS),
        # Last, the Lease left held past the operator pods' termination as Helm deletes them.
        removal.Step(3, Action.LEAVE_LEASE, Ref(removal.LEASE, removal.OPERATOR_LEASE, "gpu-admission")),
    ]
    assert not any(s.action is Action.LEAVE_LEASE for s in full)  # the full run deletes the Lease
    kinds = {s.target.kind.kind for s in only if s.target is not None}
    assert kinds == {
        "Lease",
        "ValidatingAdmissionPolicyBinding",
        "ValidatingAdmissionPolicy",
        "MutatingWebhookConfiguration",
        "MutatingAdmissionPolicyBinding",
        "MutatingAdmissionPolicy",
        "ValidatingWebhookConfiguration",
    }


def test_the_lease_is_held_briefly_at_a_time_and_left_held_past_the_operator_pods_termination() -> None:
    """Renewed once a quarter of the hold has passed (`quorum uninstall`), the hold need not
    outlast the run: two of `--timeout` (each wait's bound), 120 s at least; a run cut off, or a
    re-install after `--admission-only`, waits no more than that."""
    assert removal.lease_hold_seconds(60) == removal.LEASE_HOLD_SECONDS == 120
    assert removal.lease_hold_seconds(0.05) == 120
    assert removal.lease_hold_seconds(150.2) == 301
    # Left held past the operator pods' termination once Helm deletes them after the hook: their
    # grace is Kubernetes' default, 30 s (neither the manifest nor the chart's edits set one).
    operator = next(
        d
        for d in installed("quorum-system")
        if d["kind"] == "Deployment" and d["metadata"]["name"] == "quorum-operator"
    )
    assert "terminationGracePeriodSeconds" not in operator["spec"]["template"]["spec"]
    assert "terminationGracePeriodSeconds" not in (TEMPLATES / "_helpers.tpl").read_text()
    assert 30 < removal.LEASE_LEFT_SECONDS <= 60


def test_rights_are_each_deletion_by_name_the_probe_and_impersonating_the_operator_alone() -> None:
    rules = removal.rights(removal.removal_plan("gpu-admission", True), "gpu-admission", "probes")
    assert (
        removal.Rule("", "serviceaccounts", ("impersonate",), ("quorum-operator",), "gpu-admission") in rules
    )
    assert removal.Rule("", "pods", ("create",), (), "probes") in rules
    unnamed = [r for r in rules if not r.names]
    assert unnamed == [removal.Rule("", "pods", ("create",), (), "probes")]  # create cannot be named
    assert {v for r in rules for v in r.verbs} == {"delete", "create", "impersonate"}
    # The reservation taints as the operator (impersonated): its rights on nodes, not the hook's.
    assert not any(r.resource == "nodes" for r in rules)
    full = removal.rights(removal.removal_plan("gpu-admission"), "gpu-admission", "probes")
    assert removal.Rule("", "namespaces", ("get", "delete"), ("gpu-admission",)) in full
    # In the full run they go after the operator's RBAC: as the caller.
    assert removal.Rule("", "nodes", ("list", "patch")) in full
    listed = {(r.group, r.resource) for r in full if r.verbs == ("list",)}
    assert listed == {removal.crd_resource(n) for n in removal.CRDS}


def test_merged_rules_join_names_and_any_name_wins() -> None:
    a = removal.Rule("g", "r", ("delete",), ("x",))
    b = removal.Rule("g", "r", ("delete",), ("y", "x"))
    c = removal.Rule("g", "r", ("delete",), ())
    assert removal.merged([a, b]) == [removal.Rule("g", "r", ("delete",), ("x", "y"))]
    assert removal.merged([a, c, b]) == [c]


def test_rbac_manifests_bind_a_cluster_role_and_a_role_per_namespace() -> None:
    rules = removal.rights(removal.removal_plan("ns", True), "ns", "probes")
    manifests = removal.rbac_manifests(rules, "quorum-lifecycle", "ns")
    kinds = [(d["kind"], d["metadata"].get("namespace")) for d in manifests]
    assert kinds == [
        ("ClusterRole", None),
        ("ClusterRoleBinding", None),
        ("Role", "ns"),
        ("RoleBinding", "ns"),
        ("Role", "probes"),
        ("RoleBinding", "probes"),
    ]
    for binding in manifests[1::2]:
        assert binding["subjects"] == [
            {"kind": "ServiceAccount", "name": "quorum-lifecycle", "namespace": "ns"}
        ]


def test_refs_read_as_kubectl_names_them() -> None:
    assert str(Ref(removal.DEPLOYMENT, "quorum-operator", "ns")) == "Deployment ns/quorum-operator"
    assert str(Ref(removal.CRD, "gangs.quorum.dev")) == "CustomResourceDefinition gangs.quorum.dev"


def selector_values(doc: dict[str, Any]) -> list[str]:
    (expression,) = doc["matchExpressions"]
    assert (expression["key"], expression["operator"]) == ("kubernetes.io/metadata.name", "NotIn")
    return list(expression["values"])


@pytest.mark.parametrize("namespace", ["quorum-system", "gpu-admission"])
def test_the_namespaces_admission_leaves_out_are_the_manifests_selectors(namespace: str) -> None:
    """The probe namespace rule (`probe_namespace_problem`, the CLI's and the chart values') is
    what the mutating webhook and the backstop actually leave out."""
    found = {(d["kind"], d["metadata"]["name"]): d for d in installed(namespace)}
    mutating = found[("MutatingWebhookConfiguration", removal.WEBHOOKS)]
    backstop = found[("ValidatingAdmissionPolicy", removal.BACKSTOP)]
    selectors = [w["namespaceSelector"] for w in mutating["webhooks"]]
    selectors.append(backstop["spec"]["matchConstraints"]["namespaceSelector"])
    for selector in selectors:
        assert sorted(selector_values(selector)) == sorted(removal.admission_excluded(namespace))
    for left_out in removal.admission_excluded(namespace):
        assert removal.probe_namespace_problem(left_out, namespace) is not None
    assert removal.probe_namespace_problem("default", namespace) is None
