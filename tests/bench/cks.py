"""Seed 002's admission policies alone, as a platform would run them without quorum: the `cks`
way of `make bench-admission`, the baseline quorum's own admission is compared with.

Built from quorum's manifests, so that both ways judge with the same CEL:

- MutatingAdmissionPolicy `cks-cpu-toleration`: the `is_cpu_compute` toleration for a pod that
  requests no GPU (quorum-pod-defaults' `accelerated` and `tolerated` expressions and its
  toleration patch), skipped by matchConditions for a pod that needs nothing;
- ValidatingAdmissionPolicy `cks-reserved-labels`: labels in `*.coreweave.cloud` or
  `*.coreweave.com` refused on pods, nodes and namespaces, for every identity but the platform's
  (reserved-labels.objects.quorum.dev's matchConditions, evaluated in the apiserver);
- ValidatingAdmissionPolicy `cks-interruptable-gang-pods`: quorum-interruptable-gang-pods as quorum
  ships it (a warning for `qos.coreweave.cloud/interruptable: "true"` on a pod of a group).

A dev tool: nothing here ships in quorum's image or manifests.
"""

from __future__ import annotations

import copy
from pathlib import Path
from typing import Any

import yaml

MANIFESTS = Path(__file__).resolve().parents[2] / "manifests"
JSON = dict[str, Any]
LABELS = {"app.kubernetes.io/part-of": "cks-baseline"}


def _documents(name: str) -> list[JSON]:
    return [d for d in yaml.safe_load_all((MANIFESTS / name).read_text()) if d]


def _named(docs: list[JSON], kind: str, name: str) -> JSON:
    return next(d for d in docs if d["kind"] == kind and d["metadata"]["name"] == name)


def _variable(policy: JSON, name: str) -> str:
    return str(next(v["expression"] for v in policy["spec"]["variables"] if v["name"] == name))


def _binding(kind: str, policy: str, namespaces: JSON, actions: list[str] | None = None) -> JSON:
    spec: JSON = {"policyName": policy, "matchResources": {"namespaceSelector": namespaces}}
    if actions is not None:
        spec["validationActions"] = actions
    return {
        "apiVersion": "admissionregistration.k8s.io/v1",
        "kind": kind,
        "metadata": {"name": policy, "labels": LABELS},
        "spec": spec,
    }


def cpu_toleration(defaults: JSON, namespaces: JSON) -> list[JSON]:
    accelerated = _variable(defaults, "accelerated")
    tolerated = _variable(defaults, "tolerated")
    patch = (
        "(has(object.spec.tolerations) ? [] : "
        "[JSONPatch{op: 'add', path: '/spec/tolerations', value: []}]) + "
        "[JSONPatch{op: 'add', path: '/spec/tolerations/-', "
        "value: Object.spec.tolerations{key: 'is_cpu_compute', operator: 'Exists', effect: 'NoSchedule'}}]"
    )
    policy = {
        "apiVersion": "admissionregistration.k8s.io/v1",
        "kind": "MutatingAdmissionPolicy",
        "metadata": {"name": "cks-cpu-toleration", "labels": LABELS},
        "spec": {
            "failurePolicy": "Ignore",
            "reinvocationPolicy": "Never",
            "matchConstraints": {
                "resourceRules": [
                    {
                        "apiGroups": [""],
                        "apiVersions": ["v1"],
                        "operations": ["CREATE"],
                        "resources": ["pods"],
                    }
                ]
            },
            "matchConditions": [
                {
                    "name": "requests-no-gpu-and-lacks-the-toleration",
                    "expression": f"!({accelerated}) && !({tolerated})",
                }
            ],
            "mutations": [{"patchType": "JSONPatch", "jsonPatch": {"expression": patch}}],
        },
    }
    return [policy, _binding("MutatingAdmissionPolicyBinding", "cks-cpu-toleration", namespaces)]


def reserved_labels(webhooks: JSON, namespaces: JSON) -> list[JSON]:
    hook = next(w for w in webhooks["webhooks"] if w["name"] == "reserved-labels.objects.quorum.dev")
    policy = {
        "apiVersion": "admissionregistration.k8s.io/v1",
        "kind": "ValidatingAdmissionPolicy",
        "metadata": {"name": "cks-reserved-labels", "labels": LABELS},
        "spec": {
            "failurePolicy": "Fail",
            "matchConstraints": {
                "resourceRules": [
                    {
                        "apiGroups": [""],
                        "apiVersions": ["v1"],
                        "operations": ["CREATE", "UPDATE"],
                        "resources": ["pods", "nodes", "namespaces"],
                    }
                ]
            },
            "matchConditions": copy.deepcopy(hook["matchConditions"]),
            "validations": [
                {
                    "expression": "false",
                    "message": (
                        "labels under *.coreweave.cloud and *.coreweave.com are set, changed and removed "
                        "by the platform only (labels users may set: qos.coreweave.cloud/interruptable)"
                    ),
                    "reason": "Forbidden",
                }
            ],
        },
    }
    return [policy, _binding("ValidatingAdmissionPolicyBinding", "cks-reserved-labels", namespaces, ["Deny"])]


def interruptable(policies: list[JSON], namespaces: JSON) -> list[JSON]:
    policy = copy.deepcopy(_named(policies, "ValidatingAdmissionPolicy", "quorum-interruptable-gang-pods"))
    policy["metadata"] = {"name": "cks-interruptable-gang-pods", "labels": LABELS}
    return [
        policy,
        _binding("ValidatingAdmissionPolicyBinding", "cks-interruptable-gang-pods", namespaces, ["Warn"]),
    ]


def cks_policies() -> list[JSON]:
    """The policies and bindings of the `cks` way, for `kubectl apply`."""
    defaults_docs = _documents("35-pod-defaults.yaml")
    defaults = _named(defaults_docs, "MutatingAdmissionPolicy", "quorum-pod-defaults")
    binding = _named(defaults_docs, "MutatingAdmissionPolicyBinding", "quorum-pod-defaults")
    namespaces = copy.deepcopy(binding["spec"]["matchResources"]["namespaceSelector"])
    webhooks = _named(
        _documents("30-webhook-configurations.yaml"), "ValidatingWebhookConfiguration", "quorum-webhooks"
    )
    return [
        *cpu_toleration(defaults, namespaces),
        *reserved_labels(webhooks, namespaces),
        *interruptable(_documents("36-pod-policies.yaml"), namespaces),
    ]
