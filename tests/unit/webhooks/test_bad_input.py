"""Regression tests for what the fuzzer (`tests/bench/fuzz_webhooks.py`) found: each input once
made the server answer 500, raise in a policy, or log a traceback."""

from __future__ import annotations

import gzip
import json
import logging
from collections.abc import AsyncIterator
from typing import Any

import orjson
import pytest
from aiohttp.http_exceptions import BadHttpMessage
from aiohttp.test_utils import TestClient, TestServer

from quorum.webhooks.main import MalformedHTTP
from quorum.webhooks.metrics import Metrics
from quorum.webhooks.objects import string_map
from quorum.webhooks.patch import apply_patch, build_patch
from quorum.webhooks.registry import WEBHOOKS, Webhook
from quorum.webhooks.review import shown
from quorum.webhooks.server import RUNNER_OPTIONS, answer, make_app
from quorum.webhooks.settings import WebhookSettings
from tests.unit.webhooks.factories import pod, review_body, workload

SETTINGS = WebhookSettings(max_body_bytes=64 * 1024)
BY_NAME = {w.name: w for w in WEBHOOKS}


def deep(levels: int) -> str:
    """A JSON list nested `levels` deep (Python's `repr` and `==` stop at about 1,000)."""
    return "[" * levels + "]" * levels


def review_with(kind: str, obj: dict[str, Any], old: dict[str, Any] | None = None, **deep_at: int) -> bytes:
    """A review of `obj` where each string "DEEP:<name>" is replaced by a list nested deep."""
    body = review_body(kind, obj, old=old, operation="UPDATE" if old else "CREATE").decode()
    for name, levels in deep_at.items():
        body = body.replace(json.dumps(f"DEEP:{name}"), deep(levels))
    return body.encode()


def assert_answered(webhook: Webhook, body: bytes, status: int = 200) -> dict[str, Any]:
    metrics = Metrics()
    got, payload = answer(webhook, SETTINGS, metrics, body)
    assert got == status, payload
    assert metrics.value("quorum_webhook_policy_errors_total", webhook=webhook.name) == 0, "a policy raised"
    result: dict[str, Any] = json.loads(payload)
    return result


@pytest.mark.parametrize("operation", [[], {}, ["CREATE"], {"CREATE": 1}])
def test_an_unhashable_operation_is_a_bad_review_not_a_500(operation: object) -> None:
    body = json.loads(review_body("Pod", pod()))
    body["request"]["operation"] = operation
    error = assert_answered(WEBHOOKS[0], json.dumps(body).encode(), status=400)
    assert "request.operation must be one of" in error["error"]


def test_a_deep_envelope_value_is_named_by_its_type_in_the_error() -> None:
    body = json.dumps({"apiVersion": "DEEP:v", "kind": "AdmissionReview"}).replace('"DEEP:v"', deep(1000))
    error = assert_answered(WEBHOOKS[0], body.encode(), status=400)
    assert "got a list 'AdmissionReview'" in error["error"]


@pytest.mark.parametrize(
    "spec",
    [
        {"containers": 5},
        {"containers": True},
        {"initContainers": 1.5},
        {"containers": [], "tolerations": 5},
        {"containers": [], "tolerations": True},
    ],
)
def test_containers_or_tolerations_that_are_not_lists(spec: dict[str, Any]) -> None:
    response = assert_answered(BY_NAME["mutate-pods"], review_body("Pod", {"metadata": {}, "spec": spec}))
    assert response["response"]["allowed"] is True


def test_owner_references_that_are_not_a_list() -> None:
    obj = pod({"qos.coreweave.cloud/interruptable": "true"})
    obj["metadata"]["ownerReferences"] = 5
    assert_answered(BY_NAME["validate-interruptable"], review_body("Pod", obj))


def test_a_statefulset_template_min_available_that_is_not_a_string() -> None:
    labels: Any = {
        "pod-group.scheduling.sigs.k8s.io/name": "a",
        "pod-group.scheduling.sigs.k8s.io/min-available": 3,
    }
    sts = workload("StatefulSet", labels, replicas=3)
    assert_answered(BY_NAME["validate-gangs"], review_body("StatefulSet", sts))


@pytest.mark.parametrize("metadata", [[1], "x", 5])
def test_a_patch_for_a_pod_whose_metadata_is_not_a_map(metadata: object) -> None:
    obj = {"metadata": metadata, "spec": {"schedulerName": "coscheduler", "containers": []}}
    response = assert_answered(BY_NAME["mutate-pods"], review_body("Pod", obj))["response"]
    assert response["allowed"] is True and "patch" in response
    from base64 import b64decode

    patched = apply_patch(obj, json.loads(b64decode(response["patch"])))
    assert patched["metadata"]["annotations"]["quorum.dev/requested-scheduler"] == "coscheduler"
    assert build_patch(patched, []) == []


@pytest.mark.parametrize("levels", [990, 1000, 1015])
@pytest.mark.parametrize(
    "key",
    [
        "qos.coreweave.cloud/interruptable",
        "pod-group.scheduling.sigs.k8s.io",
        "pod-group.scheduling.sigs.k8s.io/name",
        "pod-group.scheduling.sigs.k8s.io/min-available",
        "quorum.dev/gang",
        "foo.coreweave.cloud/x",
    ],
)
def test_label_and_annotation_values_nested_a_thousand_deep(key: str, levels: int) -> None:
    """Labels are strings on the apiserver; a list 1,000 deep once stopped `repr`, `str` and `==`
    in four policies with a RecursionError."""
    for where in ("labels", "annotations"):
        obj, old = pod({"pod-group.scheduling.sigs.k8s.io/name": "a"}), pod()
        obj["metadata"].setdefault(where, {})[key] = "DEEP:a"
        old["metadata"].setdefault(where, {})[key] = "DEEP:b"
        sts, old_sts = workload("StatefulSet", {key: "DEEP:a"}), workload("StatefulSet", {key: "DEEP:b"})
        ds, old_ds = workload("DaemonSet", {key: "DEEP:a"}), workload("DaemonSet", {key: "DEEP:b"})
        for webhook in WEBHOOKS:
            if "Pod" in webhook.kinds:
                assert_answered(webhook, review_with("Pod", obj, a=levels))
                assert_answered(webhook, review_with("Pod", obj, old, a=levels, b=levels))
            if "StatefulSet" in webhook.kinds:
                assert_answered(webhook, review_with("StatefulSet", sts, old_sts, a=levels, b=levels))
            if "DaemonSet" in webhook.kinds:
                assert_answered(webhook, review_with("DaemonSet", ds, old_ds, a=levels, b=levels))


@pytest.mark.parametrize("field", ["nodeName", "schedulerName", "schedulingGroup"])
def test_spec_values_nested_a_thousand_deep(field: str) -> None:
    obj = pod({"pod-group.scheduling.sigs.k8s.io": "a"}, **{field: "DEEP:x"})
    for webhook in WEBHOOKS:
        if "Pod" in webhook.kinds:
            assert_answered(webhook, review_with("Pod", obj, x=1010))


@pytest.mark.parametrize("section", ["limits", "requests"])
def test_a_resource_quantity_nested_a_thousand_deep(section: str) -> None:
    """Found by seed 2: the quantity parser's error message repr'd the value."""
    obj = pod()
    obj["spec"]["containers"][0]["resources"] = {section: {"nvidia.com/gpu": "DEEP:q"}}
    response = assert_answered(BY_NAME["mutate-pods"], review_with("Pod", obj, q=1000))["response"]
    assert response["allowed"] is True and "patch" not in response, "an unreadable amount gets no toleration"


def test_string_map_keeps_string_values_only() -> None:
    labels = {"a": "1", "b": 2}
    assert string_map({"a": "1"}) == {"a": "1"}
    assert string_map(labels) == {"a": "1"}
    assert string_map([1]) == {} and string_map(None) == {}


def test_shown_bounds_what_a_message_repeats() -> None:
    assert shown("abc") == "'abc'"
    assert shown("x" * 1000) == f"{'x' * 60!r}… (1000 characters)"
    assert shown(orjson.loads(deep(1000))) == "a list"
    assert shown({"a": 1}) == "an object"
    assert shown(None) == "None" and shown(3) == "3"


@pytest.fixture
async def http() -> AsyncIterator[TestClient[Any, Any]]:
    server = TestServer(make_app(SETTINGS))
    await server.start_server(**RUNNER_OPTIONS)  # as quorum.webhooks.main runs it
    client = TestClient(server)
    await client.start_server()
    yield client
    await client.close()


@pytest.mark.parametrize(
    "body",
    [b"\x00not gzip at all", gzip.compress(b"0" * (4 * 64 * 1024)), gzip.compress(review_body("Pod", pod()))],
)
async def test_a_content_encoding_is_refused_and_the_connection_stays_usable(
    http: TestClient[Any, Any], body: bytes
) -> None:
    """Garbage gzip once made aiohttp raise in the handler (500) and again while draining the
    body (the kept-alive connection dropped under the next request); a gzip bomb was unpacked."""
    response = await http.post("/mutate/pods", data=body, headers={"Content-Encoding": "gzip"})
    assert response.status == 400
    assert "Content-Encoding 'gzip' is not accepted" in (await response.json())["error"]
    for _ in range(3):  # the same pooled connection answers the next reviews
        response = await http.post("/mutate/pods", data=review_body("Pod", pod(), uid="next"))
        assert response.status == 200
        assert (await response.json())["response"]["uid"] == "next"


def test_malformed_http_is_one_warning_line_without_a_traceback() -> None:
    error = BadHttpMessage("Invalid character in Content-Length")
    record = logging.LogRecord(
        "aiohttp.server", logging.ERROR, __file__, 1, "Error handling request from %s", ("127.0.0.1",),
        (type(error), error, None),
    )  # fmt: skip
    assert MalformedHTTP().filter(record)
    assert record.levelno == logging.WARNING and record.exc_info is None
    assert record.getMessage() == (
        "malformed HTTP request from 127.0.0.1: 400, message: Invalid character in Content-Length"
    )
    other = logging.LogRecord("aiohttp.server", logging.ERROR, __file__, 1, "Unhandled exception", (), None)
    assert MalformedHTTP().filter(other) and other.levelno == logging.ERROR
