"""Parsing AdmissionReviews: every malformed input is a BadReview with a reason."""

from __future__ import annotations

import base64
import json
from typing import Any

import pytest
from hypothesis import given
from hypothesis import strategies as st

from quorum.webhooks.review import BadReview, Decision, parse_review, response_body
from tests.unit.webhooks.factories import pod, review_body


def test_a_good_review_is_parsed() -> None:
    request = parse_review(review_body("Pod", pod({"a": "b"}), uid="abc"))
    assert request.uid == "abc"
    assert request.kind == "Pod"
    assert request.operation == "CREATE"
    assert request.user.username == "customer@example.com"
    assert request.object is not None and request.object["metadata"]["labels"] == {"a": "b"}


def good() -> dict[str, Any]:
    data: dict[str, Any] = json.loads(review_body("Pod", pod()))
    return data


@pytest.mark.parametrize(
    ("body", "reason"),
    [
        (b"{not json", "not valid JSON"),
        (b"\xff\xfe", "not valid JSON"),
        (b"[1, 2]", "must be a JSON object"),
        (b'"text"', "must be a JSON object"),
        (b"null", "must be a JSON object"),
        (json.dumps({**good(), "apiVersion": "admission.k8s.io/v1beta1"}).encode(), "expected apiVersion"),
        (json.dumps({**good(), "kind": "Pod"}).encode(), "expected apiVersion"),
        (json.dumps({k: v for k, v in good().items() if k != "request"}).encode(), "no request"),
        (json.dumps({**good(), "request": {**good()["request"], "uid": ""}}).encode(), "request.uid"),
        (json.dumps({**good(), "request": {**good()["request"], "uid": 7}}).encode(), "request.uid"),
        (json.dumps({**good(), "request": {**good()["request"], "kind": "Pod"}}).encode(), "request.kind"),
        (
            json.dumps({**good(), "request": {**good()["request"], "operation": "PATCH"}}).encode(),
            "operation",
        ),
        (json.dumps({**good(), "request": {**good()["request"], "object": [1]}}).encode(), "request.object"),
        (
            json.dumps({**good(), "request": {**good()["request"], "userInfo": {"groups": "g"}}}).encode(),
            "groups",
        ),
    ],
)
def test_bad_reviews_say_what_is_wrong(body: bytes, reason: str) -> None:
    with pytest.raises(BadReview, match=reason):
        parse_review(body)


json_values = st.recursive(
    st.none() | st.booleans() | st.integers() | st.floats(allow_nan=False) | st.text(max_size=5),
    lambda children: (
        st.lists(children, max_size=3) | st.dictionaries(st.text(max_size=8), children, max_size=4)
    ),
    max_leaves=12,
)


@given(json_values)
def test_any_json_is_parsed_or_refused_with_a_reason(value: object) -> None:
    try:
        parse_review(json.dumps(value).encode())
    except BadReview as err:
        assert str(err)


@given(
    st.dictionaries(
        st.sampled_from(["uid", "kind", "operation", "object", "userInfo", "oldObject"]),
        json_values,
        max_size=6,
    )
)
def test_any_request_object_is_parsed_or_refused(request: dict) -> None:  # type: ignore[type-arg]
    body = json.dumps({"apiVersion": "admission.k8s.io/v1", "kind": "AdmissionReview", "request": request})
    try:
        parse_review(body.encode())
    except BadReview as err:
        assert str(err)


@given(st.text(min_size=1, max_size=40), st.booleans())
def test_response_echoes_the_uid(uid: str, allowed: bool) -> None:
    decision = Decision() if allowed else Decision(denied="no")
    answer = json.loads(
        response_body(uid, decision, [{"op": "add", "path": "/x", "value": 1}] if allowed else None)
    )
    assert answer["response"]["uid"] == uid
    assert answer["response"]["allowed"] is allowed
    assert answer["apiVersion"] == "admission.k8s.io/v1" and answer["kind"] == "AdmissionReview"
    if allowed:
        assert json.loads(base64.b64decode(answer["response"]["patch"])) == [
            {"op": "add", "path": "/x", "value": 1}
        ]
    else:
        assert answer["response"]["status"]["message"] == "no"
