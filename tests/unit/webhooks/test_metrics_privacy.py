"""/metrics of both servers says how quorum is doing, never what tenants sent: no names, labels,
users or values from a review appear in it, and every label value comes from a fixed set (so a
tenant cannot grow the series either)."""

from __future__ import annotations

import re
from typing import Any

from aiohttp.test_utils import TestClient, TestServer
from prometheus_client import generate_latest

from quorum.operator import metrics as operator_metrics
from quorum.webhooks.registry import WEBHOOKS
from quorum.webhooks.server import make_app
from quorum.webhooks.settings import WebhookSettings
from tests.unit.webhooks.factories import pod, review_body

MARK = "tenantsecret7f3a"
LABEL = re.compile(r'(\w+)="([^"]*)"')
WEBHOOK_LABELS = {
    "webhook": {w.name for w in WEBHOOKS},
    "result": {"allowed", "denied", "error", "bad_request", "busy"},
    "le": None,  # histogram bucket bounds: numbers
}
OPERATOR_LABELS = {"phase", "reason", "action", "stage", "verb", "code", "kind", "le", "result", "generation"}


def label_values(text: str) -> list[tuple[str, str]]:
    return [m for line in text.splitlines() if not line.startswith("#") for m in LABEL.findall(line)]


async def test_webhook_metrics_carry_nothing_a_tenant_sent() -> None:
    http: TestClient[Any, Any] = TestClient(TestServer(make_app(WebhookSettings())))
    await http.start_server()
    try:
        tenant_pod = pod({f"x.coreweave.cloud/{MARK}": MARK, "app": MARK})
        tenant_pod["metadata"]["name"] = MARK
        for path, body in (
            ("/mutate/pods", review_body("Pod", tenant_pod, uid=MARK, user=f"{MARK}@example.com")),
            ("/validate/pods", review_body("Pod", tenant_pod, uid=MARK, user=f"{MARK}@example.com")),
            ("/validate/reserved-labels", review_body("Node", tenant_pod, uid=MARK)),
            ("/validate/gangs", review_body("Secret", {"metadata": {"name": MARK}}, uid=MARK)),
            ("/validate/interruptable", MARK.encode()),
            (f"/{MARK}", b"{}"),
        ):
            await http.post(path, data=body)
        text = await (await http.get("/metrics")).text()
    finally:
        await http.close()
    assert MARK not in text
    assert "quorum_webhook_requests_total" in text
    for name, value in label_values(text):
        allowed = WEBHOOK_LABELS.get(name, set())
        assert allowed is None or value in allowed, (name, value)


def test_operator_metrics_have_only_bounded_labels() -> None:
    text = generate_latest(operator_metrics.REGISTRY).decode()
    assert "quorum_operator_" in text
    names = {name for name, _ in label_values(text)}
    assert names <= OPERATOR_LABELS, names - OPERATOR_LABELS
