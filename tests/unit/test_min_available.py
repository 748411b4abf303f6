"""A label-only gang's size (`pod-group.scheduling.sigs.k8s.io/min-available`): one parser for
the webhook, which refuses bad values at pod creation, and the operator, which leaves a gang with
one waiting with the same advice and never raises."""

from __future__ import annotations

import json
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from quorum.core.gangs import (
    LABEL_GANG_MIN_AVAILABLE,
    LABEL_GANG_NAME,
    MAX_MIN_AVAILABLE,
    BadMinAvailable,
    parse_min_available,
)
from quorum.operator.gangs import Store, assemble
from quorum.webhooks.metrics import Metrics
from quorum.webhooks.patch import AddSchedulingGate
from quorum.webhooks.policies import gang_gate
from quorum.webhooks.registry import WEBHOOKS
from quorum.webhooks.server import answer
from quorum.webhooks.settings import WebhookSettings
from tests.unit.webhooks.factories import pod, request, review_body

SETTINGS = WebhookSettings()
# From the issue: each must be refused, with what to write instead.
BAD = ["abc", "-1", "0", "1e9", " 3", "9" * 10_000, "1.5", "+2", "0x10", "٣", "𝟛", "04", "3 ", "4\n", "",
       "1_000", "100001", "2147483648", "Ⅳ"]  # fmt: skip


@pytest.mark.parametrize("value", BAD)
def test_bad_values_are_refused_with_what_to_write(value: str) -> None:
    with pytest.raises(BadMinAvailable) as err:
        parse_min_available(value)
    message = str(err.value)
    assert LABEL_GANG_MIN_AVAILABLE in message
    assert f"a whole number from 1 to {MAX_MIN_AVAILABLE}" in message
    assert 'write "4" for a gang of four pods' in message
    assert len(message) < 400, "a 10,000-character value is cut"


def test_a_missing_label_says_so() -> None:
    with pytest.raises(BadMinAvailable, match="is missing"):
        parse_min_available(None)


@given(st.integers(1, MAX_MIN_AVAILABLE))
def test_every_size_in_range_reads_back(n: int) -> None:
    assert parse_min_available(str(n)) == n


@settings(max_examples=500)
@given(st.one_of(st.text(), st.text(alphabet="0123456789 +-.e_x٣𝟛", max_size=8), st.integers(), st.none()))
def test_anything_else_is_refused_and_nothing_else_is_raised(value: Any) -> None:
    good = isinstance(value, str) and value.isascii() and value.isdigit() and value[0] != "0"
    good = good and int(value) <= MAX_MIN_AVAILABLE
    try:
        assert parse_min_available(value) == int(value)
        assert good
    except BadMinAvailable:
        assert not good


def gang_pod_labels(value: str | None) -> dict[str, str]:
    labels = {LABEL_GANG_NAME: "job-1"}
    if value is not None:
        labels[LABEL_GANG_MIN_AVAILABLE] = value
    return labels


@pytest.mark.parametrize("value", [*BAD, None])
def test_the_mutating_webhook_refuses_such_a_pod(value: str | None) -> None:
    decision = gang_gate.mutate(
        request("Pod", pod(gang_pod_labels(value), schedulerName="cw-coscheduler")), SETTINGS
    )
    assert not decision.allowed and decision.denied is not None
    assert decision.denied.startswith("pod is a member of label group job-1 (gang lbl-job-1), but label ")
    assert 'write "4" for a gang of four pods' in decision.denied


@settings(max_examples=300)
@given(st.one_of(st.text(max_size=12), st.integers(1, 2 * MAX_MIN_AVAILABLE).map(str)))
def test_the_webhook_admits_exactly_what_the_parser_reads(value: str) -> None:
    decision = gang_gate.mutate(request("Pod", pod(gang_pod_labels(value))), SETTINGS)
    try:
        parse_min_available(value)
    except BadMinAvailable:
        assert not decision.allowed
    else:
        assert decision.allowed and AddSchedulingGate("quorum.dev/gang") in decision.intents


def test_the_refusal_goes_back_to_the_apiserver_as_a_403_with_the_message() -> None:
    body = review_body("Pod", pod(gang_pod_labels("abc")), uid="u-7")
    status, payload = answer(WEBHOOKS[0], SETTINGS, Metrics(), body)
    assert status == 200
    response = json.loads(payload)["response"]
    assert response["uid"] == "u-7" and response["allowed"] is False
    assert response["status"]["code"] == 403 and "min-available is 'abc'" in response["status"]["message"]


@pytest.mark.parametrize(
    ("labels", "spec"),
    [
        ({"pod-group.scheduling.sigs.k8s.io": "pg1", **gang_pod_labels("abc")}, {}),  # joins pg1's gang
        (gang_pod_labels("abc"), {"schedulerName": "volcano"}),  # another scheduler's pod
        ({LABEL_GANG_MIN_AVAILABLE: "abc"}, {}),  # no group name: not a gang
    ],
)
def test_pods_that_are_not_of_a_label_only_gang_are_not_refused(
    labels: dict[str, str], spec: dict[str, Any]
) -> None:
    assert gang_gate.mutate(request("Pod", pod(labels, **spec)), SETTINGS).allowed


def operator_pod(uid: str, value: str | None) -> dict[str, Any]:
    return {
        "metadata": {
            "name": uid,
            "uid": uid,
            "namespace": "ns",
            "creationTimestamp": "2026-11-22T00:00:00Z",
            "labels": {"quorum.dev/gang": "lbl-job-1", **gang_pod_labels(value)},
        },
        "spec": {"containers": [{"name": "c"}], "schedulingGates": [{"name": "quorum.dev/gang"}]},
        "status": {"phase": "Pending"},
    }


@settings(max_examples=300)
@given(
    st.lists(
        st.one_of(st.none(), st.sampled_from(BAD), st.text(max_size=8), st.just("4")), min_size=1, max_size=4
    )
)
def test_the_operator_never_raises_and_waits_with_advice(values: list[str | None]) -> None:
    """Pods created while the webhook was down (its failurePolicy is Ignore), or before it
    checked: the gang waits, with what to write, or is sized when every pod agrees."""
    store = Store(pods={f"p{i}": operator_pod(f"p{i}", v) for i, v in enumerate(values)})
    (view,) = assemble(store)
    assert view.failure is None
    try:
        size = parse_min_available(values[0]) if len(set(values)) == 1 else None
    except BadMinAvailable:
        size = None
    if size is not None:
        assert view.min_member == size and view.waiting is None
    else:
        assert view.min_member is None and view.waiting is not None
        assert 'write "4" for a gang of four' in view.waiting and len(view.waiting) < 400
