"""From watched objects to gangs and their status (plain data)."""

from __future__ import annotations

from typing import Any

from quorum.operator.gangs import (
    GROUP_DROPPED,
    GROUP_NOT_SERVED,
    Store,
    admitted_condition,
    assemble,
    orphans,
    phase,
    topology_key,
)


def gang_pod(
    name: str, uid: str, gated: bool = True, phase_: str = "Pending", labels: dict[str, str] | None = None
) -> dict[str, Any]:
    spec: dict[str, Any] = {"containers": [{"name": "c"}], "schedulerName": "default-scheduler"}
    if gated:
        spec["schedulingGates"] = [{"name": "quorum.dev/gang"}]
    return {
        "metadata": {
            "name": name,
            "uid": uid,
            "namespace": "ns",
            "creationTimestamp": "2026-11-22T00:00:00Z",
            "labels": {
                "quorum.dev/gang": "pg-pg1",
                "pod-group.scheduling.sigs.k8s.io": "pg1",
                **(labels or {}),
            },
        },
        "spec": spec,
        "status": {"phase": phase_},
    }


def podgroup(min_member: int) -> dict[str, Any]:
    return {
        "apiVersion": "scheduling.sigs.k8s.io/v1alpha1",
        "kind": "PodGroup",
        "metadata": {
            "name": "pg1",
            "namespace": "ns",
            "uid": "g1",
            "creationTimestamp": "2026-11-22T00:00:00Z",
        },
        "spec": {"minMember": min_member, "minResources": {"nvidia.com/gpu": 16}},
    }


def test_pods_wait_for_their_group_with_a_reason() -> None:
    store = Store(pods={"a": gang_pod("a", "a")})
    (view,) = assemble(store)
    assert view.waiting == "waiting for PodGroup pg1 (scheduling.sigs.k8s.io) to exist in namespace ns"
    assert admitted_condition(view, view.counts(), None, 0) == ("False", "WaitingForGroup", view.waiting)


def test_group_gives_min_member_and_min_resources() -> None:
    store = Store(
        pods={"a": gang_pod("a", "a"), "b": gang_pod("b", "b", gated=False, phase_="Running")},
        groups={("scheduling.sigs.k8s.io", "ns", "pg1"): podgroup(2)},
    )
    (view,) = assemble(store)
    assert view.min_member == 2 and view.min_resources == {"nvidia.com/gpu": 16000}
    gang = view.to_core()
    assert [p.uid for p in gang.pods] == ["a"] and gang.released == 1 and gang.members == 2
    counts = view.counts()
    assert counts == {
        "members": 2,
        "gated": 1,
        "released": 1,
        "bound": 0,
        "running": 1,
        "succeeded": 0,
        "failed": 0,
    }
    assert phase(view, counts) == "Scheduling"


def test_just_released_pods_are_not_planned_again() -> None:
    store = Store(
        pods={"a": gang_pod("a", "a")}, groups={("scheduling.sigs.k8s.io", "ns", "pg1"): podgroup(1)}
    )
    (view,) = assemble(store, frozenset({"a"}))
    assert view.gated == [] and view.counts()["released"] == 1


def test_label_only_gang_reads_min_available_and_refuses_nonsense() -> None:
    good = gang_pod(
        "a",
        "a",
        labels={
            "pod-group.scheduling.sigs.k8s.io/name": "job",
            "pod-group.scheduling.sigs.k8s.io/min-available": "3",
        },
    )
    good["metadata"]["labels"].pop("pod-group.scheduling.sigs.k8s.io")
    (view,) = assemble(Store(pods={"a": good}))
    assert view.min_member == 3 and view.waiting is None
    good["metadata"]["labels"]["pod-group.scheduling.sigs.k8s.io/min-available"] = "many"
    (view,) = assemble(Store(pods={"a": good}))
    assert view.waiting is not None and "min-available must be one whole number" in view.waiting


def test_pods_whose_scheduling_group_was_dropped_are_orphans() -> None:
    dropped = gang_pod("a", "a")
    dropped["metadata"]["labels"] = {"quorum.dev/gang": "wpg-workers"}
    assert orphans(Store(pods={"a": dropped})) == [(dropped, GROUP_DROPPED)]
    assert orphans(Store(pods={"b": gang_pod("b", "b")})) == []


def test_pods_that_name_a_workload_podgroup_the_cluster_does_not_serve_are_orphans() -> None:
    member = gang_pod("a", "a")
    member["metadata"]["labels"] = {"quorum.dev/gang": "wpg-workers"}
    member["spec"]["schedulingGroup"] = {"podGroupName": "workers"}
    served = Store(pods={"a": member})
    assert orphans(served) == [] and [v.name for v in assemble(served)] == ["wpg-workers"]
    not_served = Store(pods={"a": member}, workload_api=False)
    assert orphans(not_served) == [(member, GROUP_NOT_SERVED)] and assemble(not_served) == []
    reason, message = GROUP_NOT_SERVED
    assert reason == "GroupNotServed" and "--runtime-config=scheduling.k8s.io/v1alpha2=true" in message


def test_pods_with_others_gates_are_not_quorums_to_release_yet() -> None:
    kueue = gang_pod("b", "b")
    kueue["spec"]["schedulingGates"].append({"name": "kueue.x-k8s.io/admission"})
    store = Store(
        pods={"a": gang_pod("a", "a"), "b": kueue},
        groups={("scheduling.sigs.k8s.io", "ns", "pg1"): podgroup(2)},
    )
    (view,) = assemble(store)
    assert [p["metadata"]["name"] for p in view.releasable] == ["a"]
    assert [p.name for p in view.to_core().pods] == ["a"], "the planner never sees pod b"
    assert view.blocked() == (
        "1 pods also carry other scheduling gates (kueue.x-k8s.io/admission): "
        "quorum plans them once those are removed"
    )
    assert view.counts()["gated"] == 2


def test_the_topology_key_comes_from_the_group() -> None:
    annotated = podgroup(2)
    annotated["metadata"]["annotations"] = {"quorum.dev/topology-key": "network.topology.kubernetes.io/rack"}
    store = Store(pods={"a": gang_pod("a", "a")}, groups={("scheduling.sigs.k8s.io", "ns", "pg1"): annotated})
    (view,) = assemble(store)
    assert view.to_core().topology_key == "network.topology.kubernetes.io/rack"
    was = {"spec": {"schedulingConstraints": {"topology": [{"key": "topology.kubernetes.io/zone"}]}}}
    assert topology_key(was) == "topology.kubernetes.io/zone"
    assert topology_key(podgroup(2)) is None


def test_a_workload_podgroups_priority_and_disruption_mode_go_to_the_gang() -> None:
    member = gang_pod("a", "a")
    member["metadata"]["labels"] = {"quorum.dev/gang": "wpg-w"}
    member["spec"]["schedulingGroup"] = {"podGroupName": "w"}
    member["spec"]["priority"] = 5
    group: dict[str, Any] = {
        "apiVersion": "scheduling.k8s.io/v1alpha2",
        "kind": "PodGroup",
        "metadata": {"name": "w", "namespace": "ns", "uid": "u"},
        "spec": {
            "schedulingPolicy": {"gang": {"minCount": 1}},
            "priority": 100,
            "disruptionMode": "PodGroup",
        },
    }
    store = Store(pods={"a": member}, groups={("scheduling.k8s.io", "ns", "w"): group})
    (view,) = assemble(store)
    gang = view.to_core()
    assert gang.priority == 100 and gang.disruption_mode == "PodGroup"
    del group["spec"]["priority"]
    assert assemble(store)[0].to_core().priority == 5, "else the pods' own"
