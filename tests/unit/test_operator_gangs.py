"""From watched objects to gangs and their status (plain data)."""

from __future__ import annotations

from typing import Any

from quorum.core.conditions import GangState, admitted, phase
from quorum.core.gangs import COSCHEDULER_NAMES, quorum_schedulers
from quorum.core.times import timestamp
from quorum.operator.gangs import (
    GROUP_DROPPED,
    GROUP_NOT_SERVED,
    VOLCANO_OFF,
    GangPods,
    Store,
    assemble,
    orphans,
    topology_key,
    unclaimed_marker,
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
    state = GangState(view.counts(), 1, now=0.0, waiting=view.waiting)
    assert admitted(state) == ("False", "WaitingForGroup", view.waiting)


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
    assert phase(counts, 2) == "Scheduling"


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


def test_a_kueue_pod_group_is_sized_by_its_total_count_annotation() -> None:
    """Kueue's plain-pod group: the group label names gang kpg-<name>, its size is the
    total-count annotation; a count that is not a size leaves it waiting with the advice, and
    its Gang record names its source by kind, with no group object."""
    from quorum.core.gangs import SOURCE_KINDS, GangSource
    from quorum.k8s.convert import gang_record
    from quorum.operator.gangs import gang_source

    member = gang_pod(
        "a", "a", labels={"kueue.x-k8s.io/pod-group-name": "job", "kueue.x-k8s.io/queue-name": "q"}
    )
    member["metadata"]["labels"].pop("pod-group.scheduling.sigs.k8s.io")
    member["metadata"]["labels"]["quorum.dev/gang"] = "kpg-job"  # as the webhook labels it
    member["metadata"]["annotations"] = {"kueue.x-k8s.io/pod-group-total-count": "3"}
    (view,) = assemble(Store(pods={"a": member}))
    assert view.name == "kpg-job" and view.min_member == 3 and view.waiting is None, view
    spec, owner = gang_record(None, view.marker.group, 3, SOURCE_KINDS[view.marker.source])
    assert owner is None and spec["source"] == {"kind": "KueuePodGroup", "name": "job"}
    back = gang_source({"spec": spec})
    assert back is not None and back.source is GangSource.KUEUE_POD_GROUP and back.gang_name == "kpg-job"
    member["metadata"]["annotations"]["kueue.x-k8s.io/pod-group-total-count"] = "3 pods"
    (view,) = assemble(Store(pods={"a": member}))
    assert (
        view.waiting is not None and "annotation kueue.x-k8s.io/pod-group-total-count must be" in view.waiting
    )


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
    not_served = Store(pods={"a": member}, pod_group_version=None)
    assert orphans(not_served) == [(member, GROUP_NOT_SERVED)] and assemble(not_served) == []
    reason, message = GROUP_NOT_SERVED
    assert reason == "GroupNotServed" and "--runtime-config=scheduling.k8s.io/v1beta1=true" in message


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
        "waiting for Kueue to admit it (quota, not room): 1 pods carry Kueue's gate "
        "kueue.x-k8s.io/admission; quorum plans them once Kueue has admitted them"
    )
    assert view.counts()["gated"] == 2
    kueue["spec"]["schedulingGates"][-1] = {"name": "example.com/hold"}
    (view,) = assemble(store)
    assert view.blocked() == (
        "1 pods also carry other scheduling gates (example.com/hold): "
        "quorum plans them once those are removed"
    )


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
    group["spec"]["priority"] = 2_000_001_000  # system-node-critical, named on the group alone
    assert assemble(store)[0].to_core().priority == 5, "a group cannot claim a system class its pods lack"
    member["spec"]["priority"] = 2_000_000_000
    assert assemble(store)[0].to_core().priority == 2_000_000_000, "as far as its pods have one"


def test_a_malformed_group_leaves_its_gang_waiting_with_what_to_fix() -> None:
    for spec, expected in [
        ({"minMember": "many"}, "spec.minMember must be a whole number from 1 to 2147483647; found 'many'"),
        ({"minMember": 0}, "spec.minMember must be a whole number from 1 to 2147483647; found 0"),
        ({"minMember": 10**12}, "found 1000000000000"),
        ({"minMember": 2, "minResources": {"nvidia.com/gpu": "lots"}}, "spec.minResources: 'lots'"),
        ({"minMember": 2, "minResources": ["gpu"]}, "spec.minResources must be a map"),
        ({"minMember": 2, "scheduleTimeoutSeconds": -1}, "spec.scheduleTimeoutSeconds"),
    ]:
        group = podgroup(2)
        group["spec"] = spec
        store = Store(pods={"a": gang_pod("a", "a")}, groups={("scheduling.sigs.k8s.io", "ns", "pg1"): group})
        (view,) = assemble(store)
        assert view.waiting is not None and view.failure is None
        assert view.waiting.startswith("PodGroup pg1 (scheduling.sigs.k8s.io) is invalid: "), view.waiting
        assert expected in view.waiting and view.waiting.endswith("fix it to have the gang planned")


def test_a_group_that_breaks_reading_is_that_gangs_failure_only() -> None:
    broken = podgroup(2)
    broken["metadata"] = {"name": "pg1"}  # no annotations map where one is read: .get on a str
    broken["metadata"]["annotations"] = "oops"
    other = gang_pod(
        "b", "b", labels={"pod-group.scheduling.sigs.k8s.io": "pg2", "quorum.dev/gang": "pg-pg2"}
    )
    good = podgroup(1)
    good["metadata"] = {**good["metadata"], "name": "pg2"}
    store = Store(
        pods={"a": gang_pod("a", "a"), "b": other},
        groups={
            ("scheduling.sigs.k8s.io", "ns", "pg1"): broken,
            ("scheduling.sigs.k8s.io", "ns", "pg2"): good,
        },
    )
    first, second = assemble(store)
    assert first.failure is not None and first.failure.startswith("reading its group failed: AttributeError")
    assert second.failure is None and second.min_member == 1


def test_a_gangs_age_in_the_queue_is_when_it_had_its_group_and_min_member_pods() -> None:
    """An old PodGroup reused for new pods, or one old pod kept while the rest come later, does
    not move a gang ahead: its age is the minMember-th oldest of its pods (times the apiserver
    set), and never older than its group."""

    def at(pod: dict[str, Any], when: str) -> dict[str, Any]:
        pod["metadata"]["creationTimestamp"] = when
        return pod

    old_group = podgroup(2)
    old_group["metadata"]["creationTimestamp"] = "2025-01-01T00:00:00Z"
    pods = {
        "a": at(gang_pod("a", "a"), "2026-11-22T00:00:00Z"),  # kept from long ago
        "b": at(gang_pod("b", "b"), "2026-11-25T10:00:00Z"),
        "c": at(gang_pod("c", "c"), "2026-11-25T11:00:00Z"),
    }
    store = Store(pods=pods, groups={("scheduling.sigs.k8s.io", "ns", "pg1"): old_group})
    (view,) = assemble(store)
    assert view.to_core().created == timestamp("2026-11-25T10:00:00Z"), "when it first had 2 pods"
    late_group = podgroup(1)
    late_group["metadata"]["creationTimestamp"] = "2026-11-25T12:00:00Z"
    store.groups[("scheduling.sigs.k8s.io", "ns", "pg1")] = late_group
    (view,) = assemble(store)
    assert view.to_core().created == timestamp("2026-11-25T12:00:00Z"), "not before its group"


def test_gang_pods_of_a_scheduler_quorum_does_not_take_are_kept_to_be_told_about() -> None:
    """A pod with a group marker asking for another scheduler, not bound: quorum leaves it to that
    scheduler and tells once (`Releaser.tell_unclaimed`); bound or quorum's, it is not kept."""
    store = Store()
    index = GangPods(store)
    volcano: dict[str, Any] = {
        "metadata": {
            "name": "lws-0",
            "namespace": "ns",
            "uid": "v",
            "annotations": {"scheduling.k8s.io/group-name": "lws-0-abc"},
        },
        "spec": {"schedulerName": "volcano", "containers": [{"name": "c"}]},
    }
    index.upsert(volcano)
    marker = unclaimed_marker(volcano, store.schedulers)
    assert set(store.unclaimed) == {"v"} and marker is not None and marker.gang_name == "vpg-lws-0-abc"
    index.upsert({**volcano, "spec": {**volcano["spec"], "nodeName": "n1"}})
    assert store.unclaimed == {}, "bound: its scheduler took it"
    ours = Store(schedulers=quorum_schedulers((*COSCHEDULER_NAMES, "volcano")))
    GangPods(ours).upsert(volcano)
    assert ours.unclaimed == {}, "volcano is quorum's there (the webhook gated it)"


def test_a_schedule_timeout_of_0_is_the_default_as_scheduler_plugins_reads_it() -> None:
    """The MPI Operator writes scheduleTimeoutSeconds: 0 on its PodGroups; scheduler-plugins takes
    0 as its default, and so does quorum (60 s), rather than hold the gang as invalid."""
    store = Store()
    pod = gang_pod("a", "a")
    pod["metadata"]["labels"] = {"scheduling.x-k8s.io/pod-group": "pi", "quorum.dev/gang": "xpg-pi"}
    store.pods["a"] = pod
    store.groups[("scheduling.x-k8s.io", "ns", "pi")] = {
        "apiVersion": "scheduling.x-k8s.io/v1alpha1",
        "kind": "PodGroup",
        "metadata": {"name": "pi", "namespace": "ns", "uid": "g"},
        "spec": {"minMember": 1, "scheduleTimeoutSeconds": 0},
    }
    (view,) = assemble(store)
    assert view.waiting is None and view.schedule_timeout == 60


def test_a_volcano_podgroup_is_read_and_what_quorum_does_not_enforce_is_said() -> None:
    """minMember and minResources are enforced; queue, minTaskMember and priorityClassName are
    kept, and said (docs/integrations.md, "Volcano's dialect")."""
    store = Store()
    pod = gang_pod("a", "a")
    pod["metadata"]["labels"] = {"quorum.dev/gang": "vpg-lws-0"}
    pod["metadata"]["annotations"] = {"scheduling.k8s.io/group-name": "lws-0"}
    store.schedulers = quorum_schedulers((*COSCHEDULER_NAMES, "volcano"))
    store.pods["a"] = pod
    store.groups[("scheduling.volcano.sh", "ns", "lws-0")] = {
        "apiVersion": "scheduling.volcano.sh/v1beta1",
        "kind": "PodGroup",
        "metadata": {"name": "lws-0", "namespace": "ns", "uid": "g"},
        "spec": {
            "minMember": 4,
            "minResources": {"nvidia.com/gpu": "32"},
            "queue": "research",
            "minTaskMember": {"leader": 1, "worker": 3},
            "priorityClassName": "high",
        },
    }
    (view,) = assemble(store)
    assert view.waiting is None and view.min_member == 4 and view.min_resources == {"nvidia.com/gpu": 32000}
    said = " / ".join(view.unenforced)
    assert "queue 'research'" in said and "minTaskMember {leader: 1, worker: 3}" in said and "'high'" in said
    store.schedulers = quorum_schedulers(COSCHEDULER_NAMES)
    assert assemble(store) == [], "without Volcano's dialect the annotation marks no gang"
    assert orphans(store) == [(pod, VOLCANO_OFF)], "a pod gated while it was on is released, told why"


def test_a_namespaces_tenant_label_names_its_gangs_tenant() -> None:
    """With a tenant label set, a namespace labelled with it gives its gangs that tenant (so a
    team's namespaces are one tenant for fairness); without the label, the namespace is."""
    from quorum.operator.gangs import store_namespaces

    store = Store(
        pods={"a": gang_pod("a", "a")},
        groups={("scheduling.sigs.k8s.io", "ns", "pg1"): podgroup(1)},
        tenant_label="example.com/team",
    )
    namespaces = store_namespaces(store)
    namespaces.replace_all([{"metadata": {"name": "ns", "labels": {"example.com/team": "vision"}}}])
    (view,) = assemble(store)
    gang = view.to_core()
    assert gang.tenant == "example.com/team=vision" and gang.owner == "example.com/team=vision"
    namespaces.upsert({"metadata": {"name": "ns", "labels": {}}})
    (view,) = assemble(store)
    assert view.to_core().owner == "namespace ns"
    store.tenant_label = ""
    namespaces.upsert({"metadata": {"name": "ns", "labels": {"example.com/team": "vision"}}})
    (view,) = assemble(store)
    assert view.to_core().owner == "namespace ns", "no tenant label set: the namespace is the tenant"
