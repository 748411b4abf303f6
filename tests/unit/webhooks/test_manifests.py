"""The shipped manifests say what the issue asks of them."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import yaml

from devcluster.webhooks import local_webhook_configurations
from quorum.webhooks.registry import WEBHOOKS

MANIFESTS = Path(__file__).resolve().parents[3] / "manifests"


def docs(name: str) -> list[dict[str, Any]]:
    return [d for d in yaml.safe_load_all((MANIFESTS / name).read_text()) if d]


def test_every_webhook_is_scoped_and_short() -> None:
    configs = docs("30-webhook-configurations.yaml")
    paths = {w.path for w in WEBHOOKS}
    for config in configs:
        for webhook in config["webhooks"]:
            assert webhook["admissionReviewVersions"] == ["v1"]
            assert webhook["sideEffects"] == "None"
            assert webhook["timeoutSeconds"] <= 5
            assert webhook["failurePolicy"] in ("Fail", "Ignore")
            excluded = webhook["namespaceSelector"]["matchExpressions"][0]
            assert excluded["key"] == "kubernetes.io/metadata.name" and excluded["operator"] == "NotIn"
            assert set(excluded["values"]) == {"kube-system", "kube-node-lease", "quorum-system"}
            assert webhook["clientConfig"]["service"]["path"] in paths
            if webhook["failurePolicy"] == "Fail":
                narrowed = webhook.get("matchConditions") or webhook.get("objectSelector")
                assert narrowed, f"{webhook['name']} fails closed on every object"
            for rule in webhook["rules"]:
                assert not any("/" in r for r in rule["resources"]), "never subresources"


def test_deployment_is_hardened() -> None:
    deployment = next(d for d in docs("20-webhooks-deployment.yaml") if d["kind"] == "Deployment")
    spec = deployment["spec"]["template"]["spec"]
    assert deployment["spec"]["replicas"] == 2
    assert spec["securityContext"]["runAsNonRoot"] is True
    assert spec["securityContext"]["seccompProfile"] == {"type": "RuntimeDefault"}
    assert spec["affinity"]["podAntiAffinity"]
    container = spec["containers"][0]
    assert container["securityContext"] == {
        "allowPrivilegeEscalation": False,
        "readOnlyRootFilesystem": True,
        "capabilities": {"drop": ["ALL"]},
    }
    assert container["resources"]["requests"]
    kinds = {d["kind"] for d in docs("20-webhooks-deployment.yaml")}
    assert {"PodDisruptionBudget", "Service", "ConfigMap"} <= kinds


def test_gate_protection_matches_pods_exactly() -> None:
    policy = next(d for d in docs("40-gate-protection.yaml") if d["kind"] == "ValidatingAdmissionPolicy")
    rules = policy["spec"]["matchConstraints"]["resourceRules"]
    assert rules == [
        {"apiGroups": [""], "apiVersions": ["v1"], "operations": ["UPDATE"], "resources": ["pods"]}
    ]


def test_gate_protection_lets_quorum_through_in_its_match_conditions() -> None:
    """No parameter object (a missing one would deny every pod update), and the operator's own
    releases are settled by the match conditions alone (the validation is reached only by a
    removal nobody may make)."""
    policy, binding = docs("40-gate-protection.yaml")
    assert policy["kind"] == "ValidatingAdmissionPolicy"
    assert "paramKind" not in policy["spec"] and "paramRef" not in binding["spec"]
    conditions = " ".join(c["expression"] for c in policy["spec"]["matchConditions"])
    assert "system:serviceaccount:quorum-system:quorum-operator" in conditions
    assert "quorum:break-glass" in conditions
    assert [v["expression"] for v in policy["spec"]["validations"]] == ["false"]


def test_local_registration_uses_urls_and_the_ca() -> None:
    configs = local_webhook_configurations(
        (MANIFESTS / "30-webhook-configurations.yaml").read_text(), "https://127.0.0.1:9443", b"PEM"
    )
    for config in configs:
        for webhook in config["webhooks"]:
            assert webhook["clientConfig"]["url"].startswith("https://127.0.0.1:9443/")
            assert "service" not in webhook["clientConfig"]
            assert webhook["clientConfig"]["caBundle"] == "UEVN"


def test_operator_deployment_runs_as_its_service_account_hardened() -> None:
    (deployment,) = docs("50-operator-deployment.yaml")
    spec = deployment["spec"]["template"]["spec"]
    assert spec["serviceAccountName"] == "quorum-operator"
    assert spec["securityContext"]["runAsNonRoot"] is True
    container = spec["containers"][0]
    assert container["command"] == ["quorum-operator"]
    assert container["securityContext"]["readOnlyRootFilesystem"] is True
