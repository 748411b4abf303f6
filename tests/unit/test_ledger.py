"""The ledger: room promised to released pods, from the decision until the pod is bound."""

from __future__ import annotations

from typing import Any

from hypothesis import given
from hypothesis import strategies as st

from quorum.operator.gangs import Store
from quorum.operator.ledger import Ledger, placed_node, recorded_placement
from tests.unit.test_loop import pod

A, B = ("ns", "a"), ("ns", "b")


def test_usage_is_bound_pods_plus_reservations_and_the_inputs_stay_as_they_are() -> None:
    ledger = Ledger()
    bound = {"n1": {"cpu": 1000}}
    ledger.reserve(A, "p1", "n1", {"cpu": 500, "pods": 1000})
    ledger.reserve(A, "p2", "n2", {"cpu": 250})
    assert ledger.usage(bound) == {"n1": {"cpu": 1500, "pods": 1000}, "n2": {"cpu": 250}}
    assert bound == {"n1": {"cpu": 1000}}
    assert ledger.take_changed() == {"n1", "n2"} and ledger.take_changed() == set()


def test_a_reservation_ends_when_its_pod_is_bound_gone_or_finished_and_not_before() -> None:
    ledger = Ledger()
    pods = {uid: pod("a", i) for i, uid in enumerate(("a-0", "a-1", "a-2", "a-3"))}
    pods["a-3"]["status"]["phase"] = "Failed"
    for uid in ("a-0", "a-1", "a-2", "a-3", "gone"):
        ledger.reserve(A, uid, "n1", {"cpu": 1})
    ledger.settle(bound={"a-1"}, pods=pods)
    assert set(ledger.entries) == {"a-0", "a-2"}


def test_resume_reserves_released_unbound_pods_of_recorded_decisions_only() -> None:
    released, gated, bound = pod("a", 0), pod("a", 1), pod("a", 2)
    released["spec"]["schedulingGates"] = []
    bound["spec"]["schedulingGates"] = []
    gang = {
        "status": {
            "admission": {
                "placement": [
                    {"uid": "a-0", "node": "n1"},
                    {"uid": "a-1", "node": "n2"},
                    {"uid": "a-2", "node": "n3"},
                    {"uid": "gone", "node": "n4"},
                    {"uid": 7, "node": None},  # edited by hand: skipped
                ]
            }
        }
    }
    ledger = Ledger()
    ledger.reserve(B, "stale", "n9", {"cpu": 1})
    ledger.resume(
        {A: gang}, {"a-0": released, "a-1": gated, "a-2": bound}, bound={"a-2"}, gang_of=Store().gang_of
    )
    assert {uid: r.node for uid, r in ledger.entries.items()} == {"a-0": "n1"}


def pinned(spec: dict[str, Any], node: str) -> dict[str, Any]:
    """`spec` released and pinned to `node` as quorum pins it (`writes.pin_to_node`)."""
    term = {"matchFields": [{"key": "metadata.name", "operator": "In", "values": [node]}]}
    required = {"requiredDuringSchedulingIgnoredDuringExecution": {"nodeSelectorTerms": [term]}}
    return {**spec, "affinity": {"nodeAffinity": required}, "schedulingGates": []}


def test_resume_reserves_a_pod_on_the_node_it_is_pinned_to_not_an_older_record() -> None:
    """The record names n1, but a later release (a refused one kept on its real pin) put the pod
    on n2: kube-scheduler may bind it only there."""
    released = pod("a", 0)
    released["spec"] = pinned(released["spec"], "n2")
    gang = {"status": {"admission": {"placement": [{"uid": "a-0", "node": "n1"}]}}}
    ledger = Ledger()
    ledger.resume({A: gang}, {"a-0": released}, bound=set(), gang_of=Store().gang_of)
    assert {uid: r.node for uid, r in ledger.entries.items()} == {"a-0": "n2"}


def test_a_pods_placed_node_is_where_it_is_bound_or_pinned_while_it_lives() -> None:
    gated, pin, bound, done = pod("a", 0), pod("a", 1), pod("a", 2), pod("a", 3)
    pin["spec"] = pinned(pin["spec"], "n1")
    bound["spec"] = {**bound["spec"], "schedulingGates": [], "nodeName": "n2"}
    done["spec"] = {**bound["spec"]}
    done["status"] = {"phase": "Succeeded"}
    assert [placed_node(p) for p in (gated, pin, bound, done)] == [None, "n1", "n2", None]


@given(
    st.recursive(
        st.none() | st.integers() | st.text(max_size=5),
        lambda c: st.lists(c) | st.dictionaries(st.text(max_size=5), c),
    )
)
def test_a_recorded_placement_of_any_shape_reads_without_error(garbage: object) -> None:
    entries = recorded_placement({"status": {"admission": {"placement": garbage}}})
    assert all(isinstance(e.uid, str) and isinstance(e.node, str) for e in entries)
