"""The validating webhooks' matchConditions (CEL in manifests/30-webhook-configurations.yaml)
against the server's own policies, on generated requests, with the settings of the shipped
ConfigMap:

- a webhook that fails closed is called exactly when the server refuses (so an outage refuses
  nothing that would pass, and no refusal is skipped);
- a webhook that fails open is called whenever the server would refuse or warn.

The conditions are evaluated by cel-python, a CEL interpreter independent of the apiserver's
cel-go; the integration tests show the apiserver agrees on the cases that matter.
"""

from __future__ import annotations

from functools import cache
from pathlib import Path
from typing import Any

import celpy
import yaml
from celpy.adapter import json_to_cel
from celpy.celtypes import BoolType
from hypothesis import given, settings
from hypothesis import strategies as st

from quorum.install import DEFAULT_NAMESPACE, operator_username
from quorum.webhooks.registry import WEBHOOKS
from quorum.webhooks.review import AdmissionRequest, UserInfo
from quorum.webhooks.server import evaluate
from quorum.webhooks.settings import WebhookSettings

MANIFESTS = Path(__file__).resolve().parents[3] / "manifests"
OPERATOR = operator_username(DEFAULT_NAMESPACE)

RESOURCES = {
    "Node": ("", "nodes"),
    "Namespace": ("", "namespaces"),
    "Pod": ("", "pods"),
    "Deployment": ("apps", "deployments"),
    "ReplicaSet": ("apps", "replicasets"),
    "StatefulSet": ("apps", "statefulsets"),
    "DaemonSet": ("apps", "daemonsets"),
    "Job": ("batch", "jobs"),
    "CronJob": ("batch", "cronjobs"),
}
KEYS = (
    "node.coreweave.cloud/state",
    "coreweave.cloud/x",
    "foo.coreweave.com/bar",
    "coreweave.com/y",
    "qos.coreweave.cloud/interruptable",
    "notcoreweave.cloud/x",
    "coreweave.cloud.example.com/x",
    "app",
    "team.example.com/x",
    "quorum.dev/gang",
    "quorum.dev/other",
    "pod-group.scheduling.sigs.k8s.io",
    "kueue.x-k8s.io/pod-group-name",
)
VALUES = ("true", "false", "a", "b")
USERS = (
    ("quorum:node-lifecycle", ("quorum:platform",)),
    ("customer@example.com", ("quorum:customers", "system:authenticated")),
    ("admin", ("system:masters",)),
    (OPERATOR, ("system:serviceaccounts",)),
)


@cache
def shipped_settings() -> WebhookSettings:
    configmap = next(
        d
        for d in yaml.safe_load_all((MANIFESTS / "20-webhooks-deployment.yaml").read_text())
        if d and d["kind"] == "ConfigMap"
    )
    return WebhookSettings(**yaml.safe_load(configmap["data"]["settings.yaml"]))


@cache
def validating_webhooks() -> list[tuple[dict[str, Any], Any]]:
    """Each validating webhook with its conditions compiled into one program."""
    config = next(
        d
        for d in yaml.safe_load_all((MANIFESTS / "30-webhook-configurations.yaml").read_text())
        if d and d["kind"] == "ValidatingWebhookConfiguration"
    )
    env = celpy.Environment()
    out = []
    for webhook in config["webhooks"]:
        conditions = webhook.get("matchConditions") or [{"expression": "true"}]
        expression = " && ".join(f"({c['expression']})" for c in conditions)
        out.append((webhook, env.program(env.compile(expression))))
    return out


def matches_rules(webhook: dict[str, Any], kind: str, operation: str) -> bool:
    group, resource = RESOURCES[kind]
    return any(
        group in rule["apiGroups"] and resource in rule["resources"] and operation in rule["operations"]
        for rule in webhook["rules"]
    )


def selected(webhook: dict[str, Any], obj: dict[str, Any], old: dict[str, Any] | None) -> bool:
    """objectSelector (only `Exists` is used): the apiserver matches the new or the old object."""
    selector = webhook.get("objectSelector")
    if not selector:
        return True
    keys = [e["key"] for e in selector["matchExpressions"]]
    return any(
        all(k in ((o or {}).get("metadata", {}).get("labels") or {}) for k in keys) for o in (obj, old)
    )


def called(program: Any, request: AdmissionRequest) -> bool:
    activation = {
        "object": json_to_cel(request.object),
        "oldObject": json_to_cel(request.old_object),
        "request": json_to_cel(
            {
                "operation": request.operation,
                "userInfo": {"username": request.user.username, "groups": list(request.user.groups)},
            }
        ),
    }
    result = program.evaluate(activation)
    # A CEL error in a matchCondition makes the apiserver apply the failurePolicy: never allowed.
    assert isinstance(result, BoolType), f"CEL error: {result!r}"
    return bool(result)


labels = st.dictionaries(st.sampled_from(KEYS), st.sampled_from(VALUES), max_size=5)


def metadata(draw: st.DrawFn, owned: bool) -> dict[str, Any]:
    meta: dict[str, Any] = {"name": "x"}
    found = draw(labels)
    empty_map = draw(st.booleans())
    if found or empty_map:
        meta["labels"] = found
    annotations = draw(
        st.dictionaries(
            st.sampled_from(
                (
                    "quorum.dev/x",
                    "note",
                    "scheduling.k8s.io/group-name",
                    "kueue.x-k8s.io/pod-group-fast-admission",
                )
            ),
            st.just("v"),
            max_size=2,
        )
    )
    if annotations:
        meta["annotations"] = annotations
    if owned:
        meta["ownerReferences"] = [{"kind": "ReplicaSet", "name": "r", "uid": "u", "controller": True}]
    return meta


def shaped(kind: str, meta: dict[str, Any]) -> dict[str, Any]:
    if kind in ("Node", "Namespace"):
        return {"metadata": meta}
    if kind == "Pod":
        return {"metadata": meta, "spec": {"containers": [{"name": "c", "image": "pause"}]}}
    template = {"metadata": meta, "spec": {"containers": [{"name": "c", "image": "pause"}]}}
    if kind == "CronJob":
        return {"metadata": {"name": "w"}, "spec": {"jobTemplate": {"spec": {"template": template}}}}
    return {"metadata": {"name": "w"}, "spec": {"replicas": 1, "template": template}}


@st.composite
def requests(draw: st.DrawFn) -> AdmissionRequest:
    kind = draw(st.sampled_from(sorted(RESOURCES)))
    operation = draw(st.sampled_from(("CREATE", "UPDATE")))
    user, groups = draw(st.sampled_from(USERS))
    owned = draw(st.booleans())
    obj = shaped(kind, metadata(draw, owned))
    old = None
    if operation == "UPDATE":
        # Often the same labels (an update that changes something else), else other ones.
        old = draw(st.just(obj) | st.builds(lambda m: shaped(kind, m), st.just(metadata(draw, owned))))
    group, _ = RESOURCES[kind]
    return AdmissionRequest("uid", kind, group, operation, "ns", "x", UserInfo(user, groups), obj, old)


def quorum_keys_at_creation(request: AdmissionRequest) -> bool:
    meta = (request.object or {}).get("metadata", {})
    keys = [*(meta.get("labels") or {}), *(meta.get("annotations") or {})]
    return request.operation == "CREATE" and any(k.startswith("quorum.dev/") for k in keys)


@settings(max_examples=600, deadline=None)
@given(requests())
def test_each_webhook_is_called_when_its_server_would_judge(request: AdmissionRequest) -> None:
    by_path = {w.path: w for w in WEBHOOKS}
    for webhook, program in validating_webhooks():
        if not matches_rules(webhook, request.kind, request.operation):
            continue
        assert request.object is not None
        is_called = selected(webhook, request.object, request.old_object) and called(program, request)
        server = by_path[webhook["clientConfig"]["service"]["path"]]
        decision = evaluate(server, request, shipped_settings())
        if webhook["failurePolicy"] == "Fail":
            if webhook["name"] == "labels.pods.quorum.dev" and quorum_keys_at_creation(request):
                # At creation the condition sends every quorum key but the plain gang label the
                # mutating webhook sets; the server accepts a few more (a shortened gang name).
                assert is_called or decision.allowed, webhook["name"]
                continue
            assert is_called == (not decision.allowed), (webhook["name"], decision)
        elif webhook["name"] == "gangs.statefulsets.quorum.dev":
            # Its server path also runs the quorum-key rule, which gangs.workloads calls for.
            if request.operation == "CREATE" and decision.warnings:
                assert is_called, (webhook["name"], decision)
        elif not decision.allowed or decision.warnings:
            assert is_called, (webhook["name"], decision)


def test_the_conditions_name_the_settings_of_the_configmap() -> None:
    """The lists written into the CEL are the server's settings."""
    text = (MANIFESTS / "30-webhook-configurations.yaml").read_text()
    shipped = shipped_settings()
    for domain in shipped.reserved_label_domains:
        assert f"k.startsWith('{domain}/') || k.contains('.{domain}/')" in text
    assert f"k != '{shipped.user_settable_labels[0]}'" in text and len(shipped.user_settable_labels) == 1
    users = ", ".join(f"'{u}'" for u in shipped.platform_users)
    assert f"request.userInfo.username in [{users}]" in text
    groups = ", ".join(f"'{g}'" for g in shipped.platform_groups)
    assert f"request.userInfo.groups.exists(g, g in [{groups}])" in text
    assert shipped.operator_users == (OPERATOR,) and OPERATOR in text
