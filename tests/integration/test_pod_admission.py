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

import base64
import contextlib
import http.server
import json
import re
import shutil
import ssl
import tempfile
import threading
import time
import urllib.error
import urllib.request
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from hypothesis import HealthCheck, example, given, settings
from hypothesis import strategies as st

from devcluster.cluster import Instance
from devcluster.config import ClusterSpec
from devcluster.kubeconfig import RestClient
from quorum.core.gangs import COSCHEDULER_NAMES
from quorum.pki import CertificateAuthority

pytestmark = pytest.mark.kubernetes_1_36  # `make test` runs it again on 1.36 (each way on that release)

NAMESPACE = "pod-admission-ways"
PLAIN = ("g1", "train-a", "x")
SHORTENED = ("G1", "a.b", "t" * 60)  # upper case, a dot, a gang name over 63 characters
SCHEDULERS = (
    None,
    "default-scheduler",
    "cw-coscheduler",
    "coscheduler",
    "scheduler-plugins-scheduler",
    "other-scheduler",
)


Created = tuple[int, dict[str, Any], list[str]]  # HTTP status, body, Warning headers


class Way:
    """One instance's apiserver, for dry-run pod creations as the admin."""

    def __init__(self, instance: Instance) -> None:
        self.rest: RestClient = instance.rest()
        instance.kubectl("create", "namespace", NAMESPACE, check=False)

    def create(self, pod: dict[str, Any]) -> Created:
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


def _fault(pod: dict[str, Any], fault: str) -> None:
    """Break one rule of quorum's (or of the apiserver's) in `pod`."""
    labels, spec = pod["metadata"]["labels"], pod["spec"]
    if fault == "nodeName":  # on a gang pod
        spec["nodeName"] = "node-1"
    elif fault == "size":  # of a label gang, and of a Kueue group
        labels["pod-group.scheduling.sigs.k8s.io/min-available"] = "04"
        pod["metadata"]["annotations"]["kueue.x-k8s.io/pod-group-total-count"] = "04"
    elif fault == "forged-label":
        labels["quorum.dev/gang"] = "other"
    elif fault == "forged-annotation":
        pod["metadata"]["annotations"]["quorum.dev/requested-scheduler"] = "x"
    elif fault == "any-toleration":  # covers quorum.dev/reserved: quorum-reserved-tolerations
        spec["tolerations"] = [{"operator": "Exists"}]
    elif fault == "invalid-group":  # not a DNS subdomain: the apiserver's validation
        spec["schedulingGroup"] = {"podGroupName": "W"}
    elif fault == "interruptable":
        labels["qos.coreweave.cloud/interruptable"] = "yes"
    elif fault == "own-gate":  # quorum's gate on a pod of no gang: quorum-gang-backstop
        spec["schedulingGates"] = [{"name": "quorum.dev/gang"}]


FAULTS: tuple[str, ...] = ("nodeName", "size", "forged-label", "forged-annotation", "any-toleration")
FAULTS += ("invalid-group", "interruptable", "own-gate")


@st.composite
def pods(draw: st.DrawFn, faults: st.SearchStrategy[list[str]]) -> dict[str, Any]:
    """A pod as a tenant might write it: group markers (names quorum uses as written or must
    shorten), sizes, schedulers, GPUs or none, tolerations, gates, owners; then `faults`."""
    labels: dict[str, str] = {}
    for key in (
        "pod-group.scheduling.sigs.k8s.io",
        "scheduling.x-k8s.io/pod-group",
        "pod-group.scheduling.sigs.k8s.io/name",
        "kueue.x-k8s.io/pod-group-name",  # Kueue's plain-pod group
    ):
        if draw(st.integers(0, 3)) == 0:
            labels[key] = draw(names)
    if draw(st.booleans()):
        labels["pod-group.scheduling.sigs.k8s.io/min-available"] = draw(st.sampled_from(("4", "1", "100000")))
    if draw(st.integers(0, 3)) == 0:
        labels["qos.coreweave.cloud/interruptable"] = draw(st.sampled_from(("true", "false")))
    scheduler = draw(st.sampled_from(SCHEDULERS))
    annotations: dict[str, str] = {}
    if scheduler in COSCHEDULER_NAMES and draw(st.integers(0, 3)) == 0:
        annotations["quorum.dev/requested-scheduler"] = scheduler  # what quorum itself would write
    if draw(st.integers(0, 4)) == 0:
        annotations["scheduling.k8s.io/group-name"] = draw(names)  # Volcano's group marker
    if draw(st.booleans()):  # a Kueue group's size
        annotations["kueue.x-k8s.io/pod-group-total-count"] = draw(st.sampled_from(("2", "100000", "0", "x")))
    if draw(st.integers(0, 3)) == 0:  # a Kueue group admitted pod by pod: not a gang
        annotations["kueue.x-k8s.io/pod-group-fast-admission"] = "true"
    gpus = draw(st.sampled_from((None, 0, 1, 8)))
    container: dict[str, Any] = {"name": "main", "image": "example.com/train:1"}
    if gpus is not None:
        container["resources"] = {"limits": {"nvidia.com/gpu": str(gpus), "cpu": "1"}}
    spec: dict[str, Any] = {"containers": [container]}
    if draw(st.integers(0, 4)) == 0:
        spec["initContainers"] = [
            {"name": "init", "image": "example.com/init:1", "resources": {"limits": {"nvidia.com/gpu": "1"}}}
        ]
    if scheduler is not None:
        spec["schedulerName"] = scheduler
    if draw(st.integers(0, 4)) == 0:
        spec["schedulingGroup"] = {"podGroupName": draw(st.sampled_from(("w1", "w.b")))}
    if draw(st.integers(0, 3)) == 0:
        spec["tolerations"] = draw(
            st.sampled_from(
                (
                    [{"key": "is_cpu_compute", "operator": "Exists"}],
                    [{"key": "is_cpu_compute", "operator": "Exists", "effect": "NoExecute"}],
                    [{"key": "other", "operator": "Exists", "effect": "NoSchedule"}],
                )
            )
        )
    if draw(st.integers(0, 5)) == 0:
        spec["schedulingGates"] = [{"name": "example.com/wait"}]
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
    pod = {"apiVersion": "v1", "kind": "Pod", "metadata": metadata, "spec": spec}
    for fault in draw(faults):
        _fault(pod, fault)
    return pod


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


def label_gang_pod(size: str, scheduler: str = "cw-coscheduler") -> dict[str, Any]:
    return {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {
            "name": "p",
            "labels": {
                "pod-group.scheduling.sigs.k8s.io/name": "g1",
                "pod-group.scheduling.sigs.k8s.io/min-available": size,
            },
        },
        "spec": {
            "schedulerName": scheduler,
            "containers": [{"name": "main", "image": "example.com/train:1"}],
        },
    }


def claim_on_a_gang(gated: bool = False) -> dict[str, Any]:
    pod = label_gang_pod("4")
    pod["metadata"]["labels"] = {"quorum.dev/gang": "wpg-x"}
    if gated:
        pod["spec"]["schedulingGates"] = [{"name": "quorum.dev/gang"}]
    return pod


def with_labels(pod: dict[str, Any], labels: dict[str, str]) -> dict[str, Any]:
    pod["metadata"]["labels"].update(labels)
    return pod


def create_both(ways: tuple[Way, Way], pod: dict[str, Any]) -> tuple[Created, Created, str]:
    policies, webhooks = ways
    by_policies, by_webhooks = policies.create(pod), webhooks.create(pod)
    said = (
        f"pod {json.dumps(pod)}\npolicies: {by_policies[0]} {by_policies[1].get('message')}\n"
        f"webhooks: {by_webhooks[0]} {by_webhooks[1].get('message')}"
    )
    return by_policies, by_webhooks, said


@settings(max_examples=150, deadline=None, suppress_health_check=list(HealthCheck), derandomize=True)
@given(pod=pods(st.lists(st.sampled_from(FAULTS), max_size=1)))
@example(pod=label_gang_pod("1"))  # the common cases, whatever the draw
@example(pod=label_gang_pod("100000", "default-scheduler"))
@example(pod=label_gang_pod("100001"))
@example(pod=with_labels(label_gang_pod("4"), {"scheduling.x-k8s.io/pod-group": ""}))  # an empty marker
@example(pod=with_labels(label_gang_pod("4"), {"pod-group.scheduling.sigs.k8s.io": "g2"}))  # two groups
@example(pod=claim_on_a_gang())  # a quorum.dev/gang label on a pod of no group: refused
@example(pod=claim_on_a_gang(gated=True))  # the same, gated: a schedulingGroup the apiserver dropped
def test_both_ways_admit_every_pod_alike(ways: tuple[Way, Way], pod: dict[str, Any]) -> None:
    """Pods that break at most one rule: the same answer, stored pod, message and warnings."""
    (code_p, body_p, warnings_p), (code_w, body_w, warnings_w), said = create_both(ways, pod)
    if code_p == 422 and "until all schedulingGates have been cleared" in str(body_p.get("message")):
        # The inherent difference (docs/webhooks.md): a pod that sets a scheduling gate and
        # spec.nodeName itself is refused by the apiserver's validation, before any policy.
        assert pod["spec"].get("nodeName") and pod["spec"].get("schedulingGates"), said
        assert code_w in (403, 422), said
        return
    assert code_p == code_w, said
    if code_p >= 300:
        assert refusal(body_p) == refusal(body_w), said
    else:
        assert stored(body_p) == stored(body_w), f"{said}\n{stored(body_p)}\n{stored(body_w)}"
        assert sorted(map(warning, warnings_p)) == sorted(map(warning, warnings_w)), said


@settings(max_examples=60, deadline=None, suppress_health_check=list(HealthCheck), derandomize=True)
@given(pod=pods(st.lists(st.sampled_from(FAULTS), min_size=2, max_size=4, unique=True)))
def test_a_pod_that_breaks_several_rules_gets_the_same_answer(
    ways: tuple[Way, Way], pod: dict[str, Any]
) -> None:
    """Where a pod breaks several rules the two ways may name a different one first: the webhook
    refuses before the apiserver validates the pod, the policies after. The answer is the same."""
    (code_p, body_p, _), (code_w, body_w, _), said = create_both(ways, pod)
    assert (code_p >= 300) == (code_w >= 300), said
    if code_p < 300:
        assert stored(body_p) == stored(body_w), said


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


# -- a group marker that another mutating webhook adds ---------------------------------------

MARKER_SELECTOR = "test.quorum.dev/marked-by"
GPU = {"limits": {"nvidia.com/gpu": "1"}}


class _MarkerHandler(http.server.BaseHTTPRequestHandler):
    """A mutating webhook as Kueue's is for LeaderWorkerSet pods: it adds a group marker
    (a label gang of 2) to the pods it is called for."""

    def do_POST(self) -> None:
        review = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
        labels = "/metadata/labels/pod-group.scheduling.sigs.k8s.io~1"
        patch = [
            {"op": "add", "path": labels + "name", "value": "marked"},
            {"op": "add", "path": labels + "min-available", "value": "2"},
        ]
        response = {
            "uid": review["request"]["uid"],
            "allowed": True,
            "patchType": "JSONPatch",
            "patch": base64.b64encode(json.dumps(patch).encode()).decode(),
        }
        answer = {"apiVersion": "admission.k8s.io/v1", "kind": "AdmissionReview", "response": response}
        body = json.dumps(answer)
        self.send_response(200)
        self.send_header("Content-Type", "application/json")
        self.end_headers()
        self.wfile.write(body.encode())

    def log_message(self, *_: Any) -> None:
        pass


@contextlib.contextmanager
def group_marker_webhook(instance: Instance, configuration: str) -> Iterator[None]:
    """A MutatingWebhookConfiguration named `configuration` (the apiserver calls configurations in
    the order of their names) whose webhook, served here over TLS, marks the pods labelled
    test.quorum.dev/marked-by=<configuration>."""
    authority = CertificateAuthority.create("group-marker-ca")
    serving = authority.issue("group-marker", server_names=("127.0.0.1",), client=False)
    directory = Path(tempfile.mkdtemp(prefix="group-marker-"))
    crt, key = serving.write(directory, "serving")
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), _MarkerHandler)
    context = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    context.load_cert_chain(str(crt), str(key))
    server.socket = context.wrap_socket(server.socket, server_side=True)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    webhook = {
        "name": f"{configuration}.test.quorum.dev",
        "admissionReviewVersions": ["v1"],
        "sideEffects": "None",
        "failurePolicy": "Fail",
        "reinvocationPolicy": "Never",
        "timeoutSeconds": 5,
        "clientConfig": {
            "url": f"https://127.0.0.1:{server.server_address[1]}/mark",
            "caBundle": base64.b64encode(authority.pair.cert_pem).decode(),
        },
        "rules": [
            {"apiGroups": [""], "apiVersions": ["v1"], "operations": ["CREATE"], "resources": ["pods"]}
        ],
        "objectSelector": {"matchLabels": {MARKER_SELECTOR: configuration}},
    }
    config = {
        "apiVersion": "admissionregistration.k8s.io/v1",
        "kind": "MutatingWebhookConfiguration",
        "metadata": {"name": configuration},
        "webhooks": [webhook],
    }
    instance.kubectl("apply", "-f", "-", input_text=json.dumps(config))
    try:
        yield
    finally:
        instance.kubectl("delete", "mutatingwebhookconfiguration", configuration, "--ignore-not-found")
        server.shutdown()
        server.server_close()
        shutil.rmtree(directory, ignore_errors=True)


def _create_marked(way: Way, configuration: str) -> Created:
    """A one-GPU pod (quorum-pod-defaults has nothing to do for it) that the webhook
    `configuration` marks, created (dry run) once the apiserver calls that webhook (it reads new
    configurations in the background): until then the pod comes back unmarked."""
    pod = {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": "marked", "labels": {MARKER_SELECTOR: configuration}},
        "spec": {"containers": [{"name": "main", "image": "example.com/train:1", "resources": GPU}]},
    }
    deadline = time.monotonic() + 60
    while True:
        code, body, warnings = way.create(pod)
        marked = code != 201 or "pod-group.scheduling.sigs.k8s.io/name" in body["metadata"].get("labels", {})
        if marked or time.monotonic() > deadline:
            return code, body, warnings
        time.sleep(0.5)


def test_a_group_marker_another_webhook_adds_is_gated_in_the_apiserver_way(
    ways: tuple[Way, Way], cluster: Instance
) -> None:
    """quorum-pod-defaults ran before the marker existed and is not invoked again; the fallback
    condition of pods.mutate.quorum.dev, called after every configuration that sorts before
    quorum-webhooks, gates the pod. One that sorts after: the pod is refused, saying why."""
    policies, _ = ways
    before = webhook_calls(cluster, "mutate-pods")
    with group_marker_webhook(cluster, "kueue-like-group-marker"):  # before quorum-webhooks
        code, body, _ = _create_marked(policies, "kueue-like-group-marker")
    assert code == 201, body
    assert body["metadata"]["labels"]["pod-group.scheduling.sigs.k8s.io/name"] == "marked"
    assert body["metadata"]["labels"]["quorum.dev/gang"] == "lbl-marked"
    assert {"name": "quorum.dev/gang"} in body["spec"]["schedulingGates"]
    assert webhook_calls(cluster, "mutate-pods") > before  # gated by the server, not the policy

    with group_marker_webhook(cluster, "zz-group-marker"):  # after quorum-webhooks
        code, body, _ = _create_marked(policies, "zz-group-marker")
    assert code == 403, body
    assert "quorum-gang-backstop" in body["message"]
    assert "must sort before quorum-webhooks" in body["message"]
