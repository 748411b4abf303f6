"""The Gang's decisions, typed (quorum/core/record.py): whatever a Gang's status holds — written
by this version, an earlier one, or a person — reads without error, and what quorum writes reads
back the same."""

from __future__ import annotations

from typing import Any

import pytest
from hypothesis import given
from hypothesis import strategies as st

from quorum.core.record import (
    DECISIONS,
    Admission,
    Disruption,
    GangRecord,
    ManualRelease,
    Placement,
    Preempted,
    PreemptionRecord,
    Recovery,
    Resized,
    Target,
)

garbage = st.recursive(
    st.none() | st.booleans() | st.integers() | st.text(max_size=5),
    lambda c: (
        st.lists(c, max_size=3)
        | st.dictionaries(
            st.sampled_from(["attempt", "uid", "node", "token", "reason", "from", "to", "pods", "time"]),
            c,
            max_size=4,
        )
    ),
    max_leaves=12,
)


@given(st.dictionaries(st.sampled_from(DECISIONS), garbage))
def test_any_status_reads_without_error(status: dict[str, Any]) -> None:
    record = GangRecord.of({"status": status})
    for name in (
        "admission",
        "recovery",
        "disruption",
        "preemption",
        "preempted",
        "resized",
        "manual_release",
    ):
        getattr(record, name)
    assert isinstance(record.attempt, int)
    if record.admission is not None:
        assert all(isinstance(p.uid, str) and isinstance(p.node, str) for p in record.admission.placement)


def test_what_quorum_writes_reads_back_the_same() -> None:
    records: list[tuple[str, Any]] = [
        ("admission", Admission.placing(3, "2026-11-28T00:00:00Z", (Placement("p", "u", "n"),))),
        ("admission", Admission(4, "2026-11-28T00:00:00Z", pods=20000)),
        ("recovery", Recovery("PartiallyPlaced", 3, 2, "t", "t2", "m", ("job-a",))),
        ("disruption", Disruption("CompositePartiallyPlaced", 3, "t", "m", (Target("p", "u"),), (), "job")),
        ("preemption", PreemptionRecord("abc", "t", "d", "m", ({"kind": "gang", "pods": 2},))),
        ("preempted", Preempted("t", "m", "ns/pg-a", 3, "abc")),
        ("resized", Resized(2, 4, "t", 3)),
        ("manualRelease", ManualRelease("t", "ops", "why", 2, 3)),
    ]
    for name, written in records:
        parsed = getattr(
            GangRecord.of({"status": {name: written.to_json()}}),
            name.replace("manualRelease", "manual_release"),
        )
        assert parsed == written, name


def test_attempts_not_clocks_say_what_came_after() -> None:
    admission = Admission(5, "2026-11-28T10:00:00Z")
    assert ManualRelease("2026-11-28T09:00:00Z", attempt=5).overrides(admission), (
        "its caller's clock is behind"
    )
    assert not ManualRelease("2026-11-28T11:00:00Z", attempt=4).overrides(admission), (
        "quorum decided again since"
    )
    assert Preempted("2026-11-28T09:00:00Z", attempt=5).under(admission)
    assert not Preempted("2026-11-28T11:00:00Z", attempt=4).under(admission)
    assert ManualRelease("2026-11-28T11:00:00Z").overrides(admission), (
        "a record of an earlier version: by time"
    )


def test_a_conditional_write_tests_first_and_removes_only_what_a_test_says_is_there() -> None:
    from quorum.k8s.writes import conditional_status_patch

    expect = {"admission/attempt": 3, "disruption/reason": "PartiallyPlaced"}
    assert conditional_status_patch(expect, {"disruption": None, "recovery": {"failures": 0}}) == [
        {"op": "test", "path": "/status/admission/attempt", "value": 3},
        {"op": "test", "path": "/status/disruption/reason", "value": "PartiallyPlaced"},
        {"op": "remove", "path": "/status/disruption"},
        {"op": "add", "path": "/status/recovery", "value": {"failures": 0}},
    ]
    with pytest.raises(ValueError, match="removed only where a test says it is there"):
        conditional_status_patch({"admission/attempt": 3}, {"disruption": None})


# The apiserver's answers (Kubernetes 1.37) to a JSON Patch of a Gang's status whose `test`
# failed (a later decision), and to one whose value the Gang's schema refuses (a bug of ours).
TEST_FAILED = (
    b'{"kind":"Status","apiVersion":"v1","metadata":{},"status":"Failure","message":"the server '
    b'rejected our request due to an error in our request","reason":"Invalid","details":{},"code":422}'
)
SCHEMA_REFUSED = (
    b'{"kind":"Status","apiVersion":"v1","metadata":{},"status":"Failure","message":"Gang.quorum.dev '
    b'\\"pg-c\\" is invalid: [status.disruption.attempt: Invalid value: \\"string\\": disruption.attempt '
    b'in body must be of type integer: \\"string\\"]","reason":"Invalid","details":{"name":"pg-c",'
    b'"group":"quorum.dev","kind":"Gang","causes":[{"reason":"FieldValueTypeInvalid","message":"Invalid '
    b'value: \\"string\\": disruption.attempt in body must be of type integer: \\"string\\"",'
    b'"field":"status.disruption.attempt"}]},"code":422}'
)


def test_a_failed_test_is_a_later_decision_and_a_schema_refusal_is_not() -> None:
    from quorum.k8s.writes import did_not_apply

    assert did_not_apply(TEST_FAILED)
    assert not did_not_apply(SCHEMA_REFUSED)
    assert not did_not_apply(b"<html>bad gateway</html>"), "not the apiserver's answer: an error"
