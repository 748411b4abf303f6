"""The two ways of admitting pods give the same answer (docs/webhooks.md, "Two ways to admit
pods"): generated pods are created (dry run) on an instance that admits them in the apiserver
(`policies`: the MutatingAdmissionPolicy quorum-pod-defaults and the ValidatingAdmissionPolicies,
with quorum-webhooks called only for gang names it must shorten) and on one that sends every pod
to quorum-webhooks (`webhooks`: the Python policies). For every pod: allowed or refused alike,
the same stored pod, the same refusal message and the same warnings. The apiserver is the CEL
evaluator; the Python policies are the webhook server's own.

Also, on the `policies` instance: a pod creation reaches quorum-webhooks only for a gang name it
must shorten, read from the server's own request counter.
"""

from __future__ import annotations

import json
import re
import ssl
import urllib.error
import urllib.request
from collections.abc import Iterator
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from devcluster.cluster import Instance
from devcluster.config import ClusterSpec
from devcluster.kubeconfig import RestClient

NAMESPACE = "pod-admission-ways"
PLAIN = ("g1", "train-a", "x")
SHORTENED = ("G1", "a.b", "t" * 60)  # upper case, a dot, a gang name over 63 characters
SCHEDULERS = (None, "default-scheduler", "cw-coscheduler", "coscheduler", "other-scheduler")


class Way:
    """One instance's apiserver, for dry-run pod creations as the admin."""

    def __init__(self, instance: Instance) -> None:
        self.rest: RestClient = instance.rest()
        instance.kubectl("create", "namespace", NAMESPACE, check=False)

    def create(self, pod: dict[str, Any]) -> tuple[int, dict[str, Any], list[str]]:
        request = urllib.request.Request(
            f"{self.rest.server}/api/v1/namespaces/{NAMESPACE}/pods?dryRun=All",
            data=json.dumps(pod).encode(),
            headers={"Content-Type": "application/json"},
            method="POST",
        )
        try:
            with urllib.request.urlopen(request, timeout=30, context=self.rest.context) as resp:
                return resp.status, json.loads(resp.read()), resp.headers.get_all("Warning") or []
        except urllib.error.HTTPError as err:
            return err.code, json.loads(err.read()), err.headers.get_all("Warning") or []


@pytest.fixture(scope="module")
def ways(cluster: Instance) -> Iterator[tuple[Way, Way]]:
    """(policies, webhooks): the session's instance admits pods in the apiserver (the default);
    a second one sends every pod to quorum-webhooks."""
    assert cluster.state() is not None and cluster.state().spec.pod_admission == "policies"  # type: ignore[union-attr]
    webhooks = Instance("pod-admission-webhooks")
    webhooks.down(quiet=True)
    webhooks.up(ClusterSpec(name=webhooks.name, operator=False, pod_admission="webhooks"))
    try:
        yield Way(cluster), Way(webhooks)
    finally:
        webhooks.down(quiet=True)


# -- generated pods ------------------------------------------------------------------------

names = st.sampled_from(PLAIN + SHORTENED)


@st.composite
def pods(draw: st.DrawFn) -> dict[str, Any]:
    labels: dict[str, str] = {}
    for key in (
        "pod-group.scheduling.sigs.k8s.io",
        "scheduling.x-k8s.io/pod-group",
        "pod-group.scheduling.sigs.k8s.io/name",
    ):
        if draw(st.integers(0, 3)) == 0:
            labels[key] = draw(names)
    if draw(st.booleans()):
        labels["pod-group.scheduling.sigs.k8s.io/min-available"] = draw(
            st.sampled_from(("4", "1", "100000", "100001", "04", "0", "two", "1234567"))
        )
    if draw(st.integers(0, 3)) == 0:
        labels["qos.coreweave.cloud/interruptable"] = draw(st.sampled_from(("true", "false", "yes")))
    if draw(st.integers(0, 7)) == 0:
        labels["quorum.dev/gang"] = draw(st.sampled_from(("pg-g1", "lbl-x", "other")))
    annotations: dict[str, str] = {}
    if draw(st.integers(0, 5)) == 0:
        annotations["quorum.dev/requested-scheduler"] = draw(
            st.sampled_from(("cw-coscheduler", "coscheduler", "x"))
        )
    gpus = draw(st.sampled_from((None, 0, 1, 8)))
    container: dict[str, Any] = {"name": "main", "image": "example.com/train:1"}
    if gpus is not None:
        container["resources"] = {"limits": {"nvidia.com/gpu": str(gpus), "cpu": "1"}}
    spec: dict[str, Any] = {"containers": [container]}
    if draw(st.integers(0, 4)) == 0:
        spec["initContainers"] = [
            {"name": "init", "image": "example.com/init:1", "resources": {"limits": {"nvidia.com/gpu": "1"}}}
        ]
    scheduler = draw(st.sampled_from(SCHEDULERS))
    if scheduler is not None:
        spec["schedulerName"] = scheduler
    if draw(st.integers(0, 4)) == 0:
        spec["schedulingGroup"] = {"podGroupName": draw(st.sampled_from(("w1", "w.b", "W")))}
    if draw(st.integers(0, 3)) == 0:
        spec["tolerations"] = draw(
            st.sampled_from(
                (
                    [{"key": "is_cpu_compute", "operator": "Exists"}],
                    [{"operator": "Exists"}],
                    [{"key": "is_cpu_compute", "operator": "Exists", "effect": "NoExecute"}],
                    [{"key": "other", "operator": "Exists", "effect": "NoSchedule"}],
                )
            )
        )
    if draw(st.integers(0, 5)) == 0:
        spec["schedulingGates"] = [{"name": draw(st.sampled_from(("quorum.dev/gang", "example.com/wait")))}]
    if draw(st.integers(0, 7)) == 0:
        spec["nodeName"] = "node-1"
    if draw(st.integers(0, 7)) == 0:
        spec["resourceClaims"] = [{"name": "gpu", "resourceClaimTemplateName": "one-gpu"}]
    metadata: dict[str, Any] = {"name": "p", "labels": labels, "annotations": annotations}
    if draw(st.integers(0, 5)) == 0:
        metadata["ownerReferences"] = [
            {
                "apiVersion": "v1",
                "kind": "ReplicationController",
                "name": "rc",
                "uid": "u1",
                "controller": True,
            }
        ]
    return {"apiVersion": "v1", "kind": "Pod", "metadata": metadata, "spec": spec}


# -- comparison ------------------------------------------------------------------------------

_DENIED = re.compile(r"denied (?:the )?request: (.*)$", re.DOTALL)
_VAP_WARNING = re.compile(
    r"^299 - \"Validation failed for ValidatingAdmissionPolicy '[^']+' with binding '[^']+': "
)


def refusal(status: dict[str, Any]) -> str:
    """A refusal's message without who made it (webhook or policy)."""
    message = str(status.get("message", ""))
    found = _DENIED.search(message)
    return found[1] if found else message


def warning(header: str) -> str:
    text = _VAP_WARNING.sub('299 - "', header)
    return text.removeprefix('299 - "').removesuffix('"')


def stored(pod: dict[str, Any]) -> dict[str, Any]:
    """What admission decided, without what differs between any two creations."""
    metadata = {
        k: v for k, v in pod["metadata"].items() if k not in ("uid", "creationTimestamp", "managedFields")
    }
    spec = dict(pod["spec"])
    spec.pop("volumes", None)  # the service-account volume's name is random
    for field in ("containers", "initContainers"):
        if field in spec:
            spec[field] = [{k: v for k, v in c.items() if k != "volumeMounts"} for c in spec[field]]
    spec["tolerations"] = sorted(spec.get("tolerations") or [], key=lambda t: json.dumps(t, sort_keys=True))
    status = {k: v for k, v in pod.get("status", {}).items() if k != "conditions"}
    return {"metadata": metadata, "spec": spec, "status": status}


@settings(max_examples=150, deadline=None, suppress_health_check=list(HealthCheck), derandomize=True)
@given(pod=pods())
def test_both_ways_admit_every_pod_alike(ways: tuple[Way, Way], pod: dict[str, Any]) -> None:
    policies, webhooks = ways
    code_p, body_p, warnings_p = policies.create(pod)
    code_w, body_w, warnings_w = webhooks.create(pod)
    said = (
        f"pod {json.dumps(pod)}\npolicies: {code_p} {body_p.get('message')}\n"
        f"webhooks: {code_w} {body_w.get('message')}"
    )
    if code_p == 422 and "until all schedulingGates have been cleared" in str(body_p.get("message")):
        # The one difference: a pod that sets a scheduling gate and spec.nodeName itself is refused
        # by the apiserver's own validation, before any ValidatingAdmissionPolicy is asked; the
        # webhook, called earlier, refuses it with its own message. Refused either way.
        assert pod["spec"].get("nodeName") and pod["spec"].get("schedulingGates"), said
        assert code_w == 403, said
        return
    assert code_p == code_w, said
    if code_p >= 300:
        assert refusal(body_p) == refusal(body_w), said
    else:
        assert stored(body_p) == stored(body_w), (
            f"{said}\n{json.dumps(stored(body_p))}\n{json.dumps(stored(body_w))}"
        )
        assert sorted(map(warning, warnings_p)) == sorted(map(warning, warnings_w)), said


def webhook_calls(instance: Instance, webhook: str) -> int:
    """How many requests quorum-webhooks has answered for `webhook`, from its own counter."""
    state = instance.state()
    assert state is not None
    request = urllib.request.Request(f"https://127.0.0.1:{state.ports.webhooks}/metrics")
    context = ssl.create_default_context(cafile=str(instance.layout.root / "webhooks-pki" / "ca.crt"))
    context.check_hostname = False
    with urllib.request.urlopen(request, timeout=10, context=context) as resp:
        text = resp.read().decode()
    pattern = re.compile(
        rf'^quorum_webhook_requests_total\{{webhook="{re.escape(webhook)}"[^}}]*\}} ([0-9.e+]+)$', re.M
    )
    return int(sum(float(m[1]) for m in pattern.finditer(text)))


def test_in_the_apiserver_way_pod_creation_reaches_quorum_webhooks_only_for_a_shortened_name(
    ways: tuple[Way, Way], cluster: Instance
) -> None:
    policies, _ = ways
    before = webhook_calls(cluster, "mutate-pods")
    plain = {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": "plain", "labels": {"pod-group.scheduling.sigs.k8s.io": "g1"}},
        "spec": {"schedulerName": "cw-coscheduler", "containers": [{"name": "main", "image": "x"}]},
    }
    code, body, _ = policies.create(plain)
    assert code == 201, body
    assert body["metadata"]["labels"]["quorum.dev/gang"] == "pg-g1"
    assert {"name": "quorum.dev/gang"} in body["spec"]["schedulingGates"]
    assert webhook_calls(cluster, "mutate-pods") == before  # the gang pod never left the apiserver
    shortened = json.loads(json.dumps(plain))
    shortened["metadata"]["labels"]["pod-group.scheduling.sigs.k8s.io"] = "G1"
    code, body, _ = policies.create(shortened)
    assert code == 201, body
    assert body["metadata"]["labels"]["quorum.dev/gang"].startswith("pg-g1-")  # hashed by the server
    assert webhook_calls(cluster, "mutate-pods") == before + 1
