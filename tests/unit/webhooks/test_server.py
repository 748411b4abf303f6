"""The server: bad input gets 400 with a reason, never a 500 or a traceback; policy errors get
the webhook's failure mode; uid echoed; health, readiness and metrics."""

from __future__ import annotations

import asyncio
import json
import logging
from collections.abc import AsyncIterator
from typing import Any

import pytest
from aiohttp.test_utils import TestClient, TestServer
from hypothesis import given, settings
from hypothesis import strategies as st

from quorum.webhooks.metrics import Metrics
from quorum.webhooks.registry import WEBHOOKS, OnError, Webhook
from quorum.webhooks.review import AdmissionRequest, Decision
from quorum.webhooks.server import BUDGET_KEY, BodyBudget, answer, make_app
from quorum.webhooks.settings import WebhookSettings
from tests.unit.webhooks.factories import pod, review_body

SETTINGS = WebhookSettings(max_body_bytes=64 * 1024)
MUTATE = WEBHOOKS[0]


@pytest.fixture
async def http() -> AsyncIterator[TestClient[Any, Any]]:
    client = TestClient(TestServer(make_app(SETTINGS)))
    await client.start_server()
    yield client
    await client.close()


async def test_review_is_answered_with_the_same_uid_and_a_patch(http: TestClient[Any, Any]) -> None:
    response = await http.post("/mutate/pods", data=review_body("Pod", pod(), uid="the-uid"))
    assert response.status == 200
    answer_ = await response.json()
    assert answer_["response"]["uid"] == "the-uid"
    assert answer_["response"]["allowed"] is True
    assert answer_["response"]["patchType"] == "JSONPatch"


@pytest.mark.parametrize(
    ("path", "body", "reason"),
    [
        ("/mutate/pods", b"{", "not valid JSON"),
        ("/mutate/pods", b"42", "must be a JSON object"),
        ("/mutate/pods", b"{}", "expected apiVersion"),
        (
            "/mutate/pods",
            json.dumps({"apiVersion": "admission.k8s.io/v1", "kind": "AdmissionReview"}).encode(),
            "no request",
        ),
        ("/mutate/pods", review_body("ConfigMap", {"metadata": {}}), "reviews Pod, not ConfigMap"),
        ("/validate/reserved-labels", review_body("Secret", {"metadata": {}}), "not Secret"),
        ("/mutate/pods", b"x" * (64 * 1024 + 1), "over the limit"),
    ],
)
async def test_bad_input_gets_400_with_a_reason(
    http: TestClient[Any, Any], path: str, body: bytes, reason: str
) -> None:
    response = await http.post(path, data=body)
    assert response.status == 400
    error = await response.json()
    assert reason in error["error"]
    assert "Traceback" not in error["error"]


async def test_wrong_method_and_path(http: TestClient[Any, Any]) -> None:
    assert (await http.get("/mutate/pods")).status == 405
    assert (await http.post("/nope", data=b"{}")).status == 404


async def test_health_readiness_and_metrics(http: TestClient[Any, Any]) -> None:
    assert (await http.get("/healthz")).status == 200
    await http.post("/mutate/pods", data=review_body("Pod", pod()))
    await http.post("/mutate/pods", data=b"{")
    response = await http.get("/metrics")
    assert response.headers["Content-Type"] == "text/plain; version=0.0.4; charset=utf-8"
    lines = (await response.text()).splitlines()
    assert 'quorum_webhook_requests_total{webhook="mutate-pods",result="allowed"} 1' in lines
    assert 'quorum_webhook_requests_total{webhook="mutate-pods",result="bad_request"} 1' in lines
    assert 'quorum_webhook_request_duration_seconds_count{webhook="mutate-pods"} 2' in lines
    assert 'quorum_webhook_request_duration_seconds_bucket{webhook="mutate-pods",le="+Inf"} 2' in lines
    assert 'quorum_webhook_mutations_total{webhook="mutate-pods"} 1' in lines
    # Every webhook's series exist from the start, at 0; no `_created` series.
    assert 'quorum_webhook_requests_total{webhook="validate-pods",result="denied"} 0' in lines
    assert 'quorum_webhook_policy_errors_total{webhook="mutate-pods"} 0' in lines
    assert "quorum_webhook_certificate_reloads_total 0" in lines
    assert not [line for line in lines if "_created" in line]


def test_metrics_text_keeps_its_names_labels_and_buckets() -> None:
    """The exposition scripts read: integral values as integers, the histogram's buckets."""
    metrics = Metrics()
    for _ in range(3):
        metrics.observe("w", "denied", 0.0003)
    metrics.observe("w", "allowed", 2.0)
    metrics.certificate_reloaded()
    lines = metrics.render().decode().splitlines()
    prefix = 'quorum_webhook_requests_total{webhook="w",'
    assert sum(int(line.rsplit(" ", 1)[1]) for line in lines if line.startswith(prefix)) == 4
    assert 'quorum_webhook_denials_total{webhook="w"} 3' in lines
    buckets = [line for line in lines if line.startswith("quorum_webhook_request_duration_seconds_bucket")]
    assert [line.split('le="')[1].split('"')[0] for line in buckets] == [
        "0.0001", "0.00025", "0.0005", "0.001", "0.002", "0.005", "0.01", "0.025", "0.05", "0.1", "0.25",
        "1.0", "+Inf",
    ]  # fmt: skip
    assert 'quorum_webhook_request_duration_seconds_bucket{webhook="w",le="0.0005"} 3' in lines
    assert 'quorum_webhook_request_duration_seconds_bucket{webhook="w",le="1.0"} 3' in lines
    assert 'quorum_webhook_request_duration_seconds_bucket{webhook="w",le="+Inf"} 4' in lines
    (total,) = [
        line for line in lines if line.startswith('quorum_webhook_request_duration_seconds_sum{webhook="w"} ')
    ]
    assert float(total.rsplit(" ", 1)[1]) == pytest.approx(2.0009)
    assert "quorum_webhook_certificate_reloads_total 1" in lines
    metrics.webhook("w").requests["allowed"].inc(2_000_000)
    assert 'quorum_webhook_requests_total{webhook="w",result="allowed"} 2000001' in metrics.render().decode()
    assert "# TYPE quorum_webhook_request_duration_seconds histogram" in lines
    assert Metrics().value("quorum_webhook_denials_total", webhook="w") == 0, "one registry per Metrics"


def broken(request: AdmissionRequest, settings: WebhookSettings) -> Decision:
    raise RuntimeError("bug")


@pytest.mark.parametrize(
    ("on_error", "allowed", "code"), [(OnError.ALLOW, True, None), (OnError.DENY, False, 500)]
)
def test_policy_error_takes_the_failure_mode_and_is_logged_and_counted(
    on_error: OnError, allowed: bool, code: int | None, caplog: pytest.LogCaptureFixture
) -> None:
    webhook = Webhook("w", "/w", True, frozenset({"Pod"}), (broken,), on_error)
    metrics = Metrics()
    with caplog.at_level(logging.ERROR):
        status, body = answer(webhook, SETTINGS, metrics, review_body("Pod", pod(), uid="uid-42"))
    assert status == 200
    response = json.loads(body)["response"]
    assert response["uid"] == "uid-42"
    assert response["allowed"] is allowed
    assert "patch" not in response
    if code:
        assert response["status"]["code"] == code
    assert "uid-42" in caplog.text
    assert metrics.value("quorum_webhook_policy_errors_total", webhook="w") == 1
    assert metrics.value("quorum_webhook_requests_total", webhook="w", result="error") == 1


bodies = st.one_of(
    st.binary(max_size=200),
    st.recursive(
        st.none() | st.booleans() | st.integers() | st.text(max_size=5),
        lambda c: st.lists(c, max_size=3) | st.dictionaries(st.text(max_size=10), c, max_size=4),
        max_leaves=10,
    ).map(lambda v: json.dumps(v).encode()),
    st.builds(
        lambda kind, obj, op: review_body(kind, obj, operation=op),
        st.sampled_from(["Pod", "Node", "Deployment", "CronJob", "Job", "Namespace"]),
        st.recursive(
            st.none() | st.text(max_size=3) | st.integers(),
            lambda c: (
                st.dictionaries(
                    st.sampled_from(
                        [
                            "metadata",
                            "labels",
                            "spec",
                            "template",
                            "containers",
                            "resources",
                            "limits",
                            "jobTemplate",
                            "tolerations",
                            "a/b",
                        ]
                    ),
                    c,
                    max_size=3,
                )
                | st.lists(c, max_size=2)
            ),
            max_leaves=12,
        ),
        st.sampled_from(["CREATE", "UPDATE", "DELETE"]),
    ),
)


@settings(max_examples=300, deadline=None)
@given(st.sampled_from(WEBHOOKS), bodies)
def test_no_input_makes_the_server_answer_500(webhook: Webhook, body: bytes) -> None:
    metrics = Metrics()
    status, payload = answer(webhook, SETTINGS, metrics, body)
    assert status in (200, 400)
    assert metrics.value("quorum_webhook_policy_errors_total", webhook=webhook.name) == 0, (
        "a policy raised on this input"
    )
    json.loads(payload)


async def trickle(size: int, chunk: int, pause: float, stop: asyncio.Event) -> AsyncIterator[bytes]:
    """A body sent slowly: `chunk` bytes every `pause` seconds, until `size` or `stop`."""
    sent = 0
    while sent < size and not stop.is_set():
        yield b"x" * chunk
        sent += chunk
        await asyncio.sleep(pause)


async def test_a_body_trickled_in_is_cut_off_and_holds_no_memory_after() -> None:
    quick = WebhookSettings(max_body_bytes=64 * 1024, body_seconds=0.3)
    async with TestClient(TestServer(make_app(quick))) as http:
        stop = asyncio.Event()
        body = trickle(60_000, 100, 0.05, stop)
        headers = {"Content-Length": "60000", "Content-Type": "application/json"}
        response = await http.post("/mutate/pods", data=body, headers=headers)
        stop.set()
        assert response.status == 400
        assert "not received whole within 0.3s" in (await response.json())["error"]
        assert http.app[BUDGET_KEY].held == 0


async def test_a_large_body_beyond_the_budget_waits_its_turn_unread_and_small_ones_go_on() -> None:
    """A slow body that declares 40 KB holds most of the 64 KB budget for large bodies (over
    8 KB): another large one waits, unread, while a small review is answered at once; when the
    slow one is cut off, the waiting one is read and answered."""
    tight = WebhookSettings(
        max_body_bytes=64 * 1024,
        bodies_in_flight_bytes=64 * 1024,
        small_body_bytes=8 * 1024,
        body_seconds=0.5,
    )
    large = review_body("Pod", {**pod(), "data": "x" * 30_000})
    async with TestClient(TestServer(make_app(tight))) as http:
        stop = asyncio.Event()
        headers = {"Content-Length": str(40 * 1024), "Content-Type": "application/json"}
        slow = asyncio.create_task(
            http.post("/mutate/pods", data=trickle(40 * 1024, 10, 0.05, stop), headers=headers)
        )
        async with asyncio.timeout(5):
            while http.app[BUDGET_KEY].held == 0:  # noqa: ASYNC110 (the server's state, polled)
                await asyncio.sleep(0.01)
        waiting = asyncio.create_task(http.post("/mutate/pods", data=large))
        small = await http.post("/mutate/pods", data=review_body("Pod", pod()))
        assert small.status == 200 and not waiting.done()
        assert (await slow).status == 400  # cut off after 0.5 s
        assert (await waiting).status == 200
        stop.set()
        assert http.app[BUDGET_KEY].held == 0


async def test_the_budget_refuses_what_it_cannot_hold_in_time() -> None:
    budget = BodyBudget(100)
    assert await budget.take(60, 0.1)
    assert not await budget.take(60, 0.05), "no room within the wait"
    assert not await budget.take(101, 1.0), "more than the whole budget: at once"
    later = asyncio.create_task(budget.take(60, 1.0))
    await budget.give(60)
    assert await later and budget.held == 60
