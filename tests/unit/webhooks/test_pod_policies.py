"""The pod policies in the apiserver (manifests/35-pod-defaults.yaml, 36-pod-policies.yaml) and the
choice between the two ways of admitting pods. That the CEL and the Python policies give the same
answers is tests/integration/test_pod_admission.py (the apiserver evaluates the CEL); here: the
lists written into the CEL are the webhook server's defaults, and each way renders what it says."""

from __future__ import annotations

from typing import Any

import pytest
import yaml

from quorum.install import (
    FALLBACK_CONDITION,
    MANIFESTS,
    POD_DEFAULTS_MANIFEST,
    for_pod_admission,
    render_files,
    without_fallback_condition,
)
from quorum.webhooks.policies.gang_gate import GANG_LABEL, GATE, REQUESTED_SCHEDULER
from quorum.webhooks.settings import WebhookSettings

DEFAULTS = WebhookSettings()


def cel_list(values: tuple[str, ...]) -> str:
    return "[" + ", ".join(f"'{v}'" for v in values) + "]"


def text(name: str) -> str:
    return (MANIFESTS / name).read_text()


def test_the_cel_names_what_the_webhook_servers_defaults_name() -> None:
    defaults, policies = text(POD_DEFAULTS_MANIFEST), text("36-pod-policies.yaml")
    both = defaults + policies
    assert cel_list(DEFAULTS.accelerator_resources) in defaults
    toleration = DEFAULTS.cpu_toleration
    assert (
        f"Object.spec.tolerations{{key: '{toleration.key}', operator: '{toleration.operator}', "
        f"effect: '{toleration.effect}'}}" in defaults
    )
    assert cel_list(DEFAULTS.quorum_scheduler_names) in both
    assert both.count(cel_list(DEFAULTS.quorum_scheduler_names)) >= 4
    assert cel_list(DEFAULTS.coscheduler_names) in both
    assert f"'{DEFAULTS.default_scheduler}'" in both
    assert DEFAULTS.resource_claims_are_accelerated and "resourceClaims" in defaults
    for key in (GATE, GANG_LABEL, REQUESTED_SCHEDULER, DEFAULTS.interruptable_label):
        assert key in both
    assert DEFAULTS.interruptable_on_gang == "warn" and "validationActions: [Warn]" in policies


def docs(stream: str) -> list[dict[str, Any]]:
    return [d for d in yaml.safe_load_all(stream) if d]


def mutating_pods_webhook(objects: list[dict[str, Any]]) -> dict[str, Any]:
    (config,) = [d for d in objects if d["kind"] == "MutatingWebhookConfiguration"]
    (webhook,) = config["webhooks"]
    assert webhook["name"] == "pods.mutate.quorum.dev"
    return dict(webhook)


@pytest.mark.parametrize("way", ["policies", "webhooks"])
def test_each_way_renders_its_objects(way: str) -> None:
    objects = docs(render_files(None, "quorum-system", pod_admission=way))
    kinds = {(d["kind"], d["metadata"]["name"]) for d in objects}
    in_apiserver = {
        ("MutatingAdmissionPolicy", "quorum-pod-defaults"),
        ("MutatingAdmissionPolicyBinding", "quorum-pod-defaults"),
        ("ValidatingAdmissionPolicy", "quorum-gang-pods-warnings"),
    }
    both = {
        ("ValidatingAdmissionPolicy", "quorum-gang-pods"),
        ("ValidatingAdmissionPolicy", "quorum-interruptable-pods"),
    }
    assert both <= kinds
    assert (in_apiserver <= kinds) == (way == "policies") and not (in_apiserver & kinds and way == "webhooks")
    conditions = [c["name"] for c in mutating_pods_webhook(objects).get("matchConditions", [])]
    assert conditions == ([FALLBACK_CONDITION] if way == "policies" else [])
    validating = [
        w["name"] for d in objects if d["kind"] == "ValidatingWebhookConfiguration" for w in d["webhooks"]
    ]
    assert "interruptable.pods.quorum.dev" not in validating  # a policy in both ways


def words(cel: str) -> str:
    """CEL with its whitespace made single spaces: YAML folds some line breaks."""
    return " ".join(cel.split())


def test_quorum_pod_defaults_is_skipped_only_where_its_cpu_toleration_is_not_needed() -> None:
    """Its condition says the toleration's part with the policy's own `tolerated` and `accelerated`
    (the rest of the condition, and that it skips no pod with something to change, is
    tests/integration/test_pod_admission.py: the apiserver evaluates it)."""
    (policy,) = [d for d in docs(text(POD_DEFAULTS_MANIFEST)) if d["kind"] == "MutatingAdmissionPolicy"]
    variables = {v["name"]: v["expression"] for v in policy["spec"]["variables"]}
    (condition,) = policy["spec"]["matchConditions"]
    expected = f"(!( {variables['accelerated']} ) && !( {variables['tolerated']} )) ||"
    assert words(condition["expression"]).startswith(words(expected))


def test_the_text_and_the_object_edits_of_the_webhooks_way_agree() -> None:
    """`quorum manifests` edits the text (keeping its comments); `--values` and the chart edit
    the parsed object: both must leave the same webhook."""
    written = text("30-webhook-configurations.yaml")
    by_text = mutating_pods_webhook(docs(for_pod_admission(written, "webhooks")))
    by_object = mutating_pods_webhook([without_fallback_condition(d) for d in docs(written)])
    assert by_text == by_object and "matchConditions" not in by_text
    assert for_pod_admission(written, "policies") == written
    with pytest.raises(ValueError, match="one of policies, webhooks"):
        for_pod_admission(written, "both")


def test_the_policies_stay_in_quorums_namespace_scope() -> None:
    """Every binding leaves the system namespaces and quorum's own out, as the webhooks do."""
    for name in (POD_DEFAULTS_MANIFEST, "36-pod-policies.yaml"):
        for doc in docs(text(name)):
            if doc["kind"].endswith("Binding"):
                (selector,) = doc["spec"]["matchResources"]["namespaceSelector"]["matchExpressions"]
                assert selector["operator"] == "NotIn"
                assert set(selector["values"]) == {"kube-system", "kube-node-lease", "quorum-system"}
