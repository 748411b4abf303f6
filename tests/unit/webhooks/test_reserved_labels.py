from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from quorum.webhooks.policies.reserved_labels import reserved_domain, validate
from quorum.webhooks.settings import WebhookSettings
from tests.unit.webhooks.factories import pod, request, workload

SETTINGS = WebhookSettings()
DOMAINS = SETTINGS.reserved_label_domains


@pytest.mark.parametrize(
    ("key", "domain"),
    [
        ("foo.coreweave.cloud/bar", "coreweave.cloud"),
        ("coreweave.cloud/bar", "coreweave.cloud"),
        ("a.b.coreweave.com/x", "coreweave.com"),
        ("node.coreweave.cloud/state", "coreweave.cloud"),
        ("coreweave.cloud.example.com/x", None),
        ("notcoreweave.cloud/x", None),
        ("coreweave-cloud/x", None),
        ("coreweave.cloud", None),  # a name without prefix, no domain
        ("app", None),
        ("example.com/coreweave.cloud", None),
    ],
)
def test_domain_matching_is_on_label_boundaries(key: str, domain: str | None) -> None:
    assert reserved_domain(key, DOMAINS) == domain


dns_label = st.from_regex(r"[a-z0-9]([a-z0-9-]{0,8}[a-z0-9])?", fullmatch=True)
name = st.from_regex(r"[A-Za-z0-9]([A-Za-z0-9_.-]{0,10}[A-Za-z0-9])?", fullmatch=True)


@given(st.lists(dns_label, min_size=0, max_size=3), st.sampled_from(DOMAINS), name)
def test_every_subdomain_is_reserved(labels: list[str], domain: str, suffix: str) -> None:
    prefix = ".".join([*labels, domain])
    assert reserved_domain(f"{prefix}/{suffix}", DOMAINS) == domain


@given(dns_label, st.sampled_from(DOMAINS), dns_label, name)
def test_look_alikes_are_not_reserved(glued: str, domain: str, tld: str, suffix: str) -> None:
    assert reserved_domain(f"{glued}{domain}/{suffix}", DOMAINS) is None
    assert reserved_domain(f"{domain}.{tld}/{suffix}", DOMAINS) is None


def test_customer_adding_a_reserved_label_to_a_node_is_denied() -> None:
    old = {"metadata": {"name": "n1", "labels": {"kubernetes.io/hostname": "n1"}}}
    new = {
        "metadata": {
            "name": "n1",
            "labels": {"kubernetes.io/hostname": "n1", "foo.coreweave.cloud/bar": "true"},
        }
    }
    decision = validate(request("Node", new, old, operation="UPDATE", name="n1"), SETTINGS)
    assert not decision.allowed
    assert decision.denied is not None
    assert '"foo.coreweave.cloud/bar"' in decision.denied
    assert "*.coreweave.cloud or *.coreweave.com" in decision.denied
    assert "Node n1" in decision.denied


def test_changing_a_reserved_value_is_denied_keeping_it_passes() -> None:
    old = pod({"node.coreweave.cloud/x": "a", "app": "1"})
    changed = pod({"node.coreweave.cloud/x": "b", "app": "1"})
    kept = pod({"node.coreweave.cloud/x": "a", "app": "2"})
    assert not validate(request("Pod", changed, old, operation="UPDATE"), SETTINGS).allowed
    assert validate(request("Pod", kept, old, operation="UPDATE"), SETTINGS).allowed


def test_removing_a_reserved_label_is_denied_but_a_user_settable_one_passes() -> None:
    old = pod({"node.coreweave.cloud/x": "a", "qos.coreweave.cloud/interruptable": "true"})
    decision = validate(
        request("Pod", pod({"qos.coreweave.cloud/interruptable": "true"}), old, operation="UPDATE"), SETTINGS
    )
    assert decision.denied is not None and 'removing label "node.coreweave.cloud/x"' in decision.denied
    assert "Keep the label" in decision.denied
    kept = pod({"node.coreweave.cloud/x": "a"})
    assert validate(request("Pod", kept, old, operation="UPDATE"), SETTINGS).allowed


def test_interruptable_is_user_settable() -> None:
    assert validate(request("Pod", pod({"qos.coreweave.cloud/interruptable": "true"})), SETTINGS).allowed


@pytest.mark.parametrize("kind", ["Deployment", "ReplicaSet", "StatefulSet", "DaemonSet", "Job", "CronJob"])
def test_workload_templates_are_checked(kind: str) -> None:
    decision = validate(request(kind, workload(kind, {"team.coreweave.com/x": "1"})), SETTINGS)
    assert not decision.allowed
    assert decision.denied is not None and ".metadata.labels" in decision.denied


def test_namespace_labels_are_checked() -> None:
    ns = {"metadata": {"name": "a", "labels": {"ns.coreweave.cloud/org": "control-plane"}}}
    assert not validate(request("Namespace", ns), SETTINGS).allowed


def test_platform_identities_are_exempt_and_masters_is_not() -> None:
    node = {"metadata": {"name": "n", "labels": {"node.coreweave.cloud/state": "production"}}}
    assert validate(request("Node", node, user="quorum:node-lifecycle"), SETTINGS).allowed
    assert not validate(request("Node", node, user="admin", groups=("system:masters",)), SETTINGS).allowed
    by_group = WebhookSettings(platform_groups=("quorum:platform",))
    assert validate(request("Node", node, user="x", groups=("quorum:platform",)), by_group).allowed


def test_other_kinds_and_deletes_pass() -> None:
    cm = {"metadata": {"labels": {"a.coreweave.cloud/x": "1"}}}
    assert validate(request("ConfigMap", cm), SETTINGS).allowed
    assert validate(
        request("Pod", None, pod({"a.coreweave.cloud/x": "1"}), operation="DELETE"), SETTINGS
    ).allowed
