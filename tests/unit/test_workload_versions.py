"""Kubernetes 1.36 and 1.37 PodGroups read alike; a group's minMember changed live (1.37's
mutable gang.minCount) is recorded with an Event and never read as a member loss; a Gang
orphaned by an upgrade of its group's API is adopted by the group made again, its records kept.
Against the stateful fake API."""

from __future__ import annotations

from typing import Any

import pytest

from quorum.core.conditions import compose
from quorum.core.lifecycle import BackoffPolicy
from quorum.core.times import timestamp
from quorum.core.workloads import (
    DISRUPT_GROUP,
    DISRUPT_POD,
    InvalidWorkloadObject,
    composite_facts,
    disruption_mode,
)
from quorum.operator import clock
from quorum.operator.gangs import Store, assemble, composites
from quorum.operator.ledger import Ledger
from quorum.operator.recovery import Recoverer, growing
from quorum.operator.status import GangRecords
from tests.unit.fake_api import FakeApi
from tests.unit.test_operator_gangs import gang_pod, podgroup


def wpg_pod(name: str, group: str = "workers", gated: bool = True) -> dict[str, Any]:
    pod = gang_pod(name, name, gated=gated)
    pod["metadata"]["labels"] = {"quorum.dev/gang": f"wpg-{group}"}
    pod["spec"]["schedulingGroup"] = {"podGroupName": group}
    return pod


def k8s_podgroup(version: str, name: str = "workers", **spec: Any) -> dict[str, Any]:
    return {
        "apiVersion": f"scheduling.k8s.io/{version}",
        "kind": "PodGroup",
        "metadata": {
            "name": name,
            "namespace": "ns",
            "uid": f"uid-{name}",
            "creationTimestamp": "2026-11-22T00:00:00Z",
        },
        "spec": {"schedulingPolicy": {"gang": {"minCount": 2}}, **spec},
    }


@pytest.mark.parametrize(
    ("version", "mode", "want"),
    [
        ("v1alpha2", "PodGroup", DISRUPT_GROUP),
        ("v1alpha2", "Pod", DISRUPT_POD),
        ("v1beta1", {"all": {}}, DISRUPT_GROUP),
        ("v1beta1", {"single": {}}, DISRUPT_POD),
        ("v1beta1", None, None),
    ],
)
def test_both_spellings_of_disruption_mode_mean_the_same(version: str, mode: Any, want: str | None) -> None:
    spec = {} if mode is None else {"disruptionMode": mode}
    store = Store(pods={"a": wpg_pod("a"), "b": wpg_pod("b")}, pod_group_version=version)
    store.groups[("scheduling.k8s.io", "ns", "workers")] = k8s_podgroup(version, **spec)
    (view,) = assemble(store)
    assert view.waiting is None and view.min_member == 2
    assert view.disruption_mode == want and view.to_core().disruption_mode == want


@pytest.mark.parametrize("bad", [{"single": {}, "all": {}}, {"some": {}}, "Everything", 3])
def test_a_disruption_mode_of_neither_spelling_leaves_the_gang_waiting_with_the_fix(bad: Any) -> None:
    with pytest.raises(InvalidWorkloadObject, match="single"):
        disruption_mode({"disruptionMode": bad})
    store = Store(pods={"a": wpg_pod("a")})
    store.groups[("scheduling.k8s.io", "ns", "workers")] = k8s_podgroup("v1beta1", disruptionMode=bad)
    (view,) = assemble(store)
    assert view.waiting is not None and "spec.disruptionMode must be" in view.waiting


def test_preemption_policy_never_and_the_parent_composite_are_read() -> None:
    store = Store(pods={"a": wpg_pod("a")})
    group = k8s_podgroup("v1beta1", preemptionPolicy="Never", parentCompositePodGroupName="job")
    store.groups[("scheduling.k8s.io", "ns", "workers")] = group
    (view,) = assemble(store)
    assert view.preemption_policy == "Never" and view.parent == "job"
    assert view.waiting is not None and "waiting for CompositePodGroup job" in view.waiting
    store.composites[("ns", "job")] = {
        "metadata": {"name": "job", "namespace": "ns"},
        "spec": {
            "schedulingPolicy": {"gang": {"minGroupCount": 2}},
            "schedulingConstraints": {"topology": [{"key": "rack"}]},
        },
    }
    (view,) = assemble(store)
    assert view.waiting is None and view.to_core().composite == "job"
    (composite,) = composites(store, [view]).values()
    assert (composite.min_group_count, composite.admitted, composite.topology_key) == (2, 0, "rack")


def test_a_composite_with_a_bad_min_group_count_is_said_so() -> None:
    with pytest.raises(InvalidWorkloadObject, match="minGroupCount"):
        composite_facts(
            {"metadata": {"name": "c"}, "spec": {"schedulingPolicy": {"gang": {"minGroupCount": 0}}}}
        )
    assert (
        composite_facts(
            {"metadata": {"name": "c"}, "spec": {"schedulingPolicy": {"basic": {}}}}
        ).min_group_count
        == 1
    )


def gang_of(min_member: int, attempt: int = 1, owners: list[dict[str, Any]] | None = None) -> dict[str, Any]:
    return {
        "apiVersion": "quorum.dev/v1alpha1",
        "kind": "Gang",
        "metadata": {
            "name": "pg-pg1",
            "namespace": "ns",
            "ownerReferences": [{"uid": "g1"}] if owners is None else owners,
        },
        "spec": {"minMember": min_member, "source": {"kind": "PodGroup", "name": "pg1", "uid": "g1"}},
        "status": {"admission": {"attempt": attempt, "time": "2026-11-22T00:00:00Z"}, "bound": min_member},
    }


def running_store(min_member: int, gang: dict[str, Any]) -> Store:
    store = Store(pods={u: gang_pod(u, u, gated=False, phase_="Running") for u in ("a", "b")})
    for pod in store.pods.values():
        pod["spec"]["nodeName"] = "n1"
    store.groups[("scheduling.sigs.k8s.io", "ns", "pg1")] = podgroup(min_member)
    store.gangs[("ns", "pg-pg1")] = gang
    return store


async def test_a_group_that_grows_is_recorded_then_resized_and_never_read_as_a_loss() -> None:
    gang = gang_of(2)
    store = running_store(4, gang)
    assert growing(4, gang, 2), "before quorum records the new size: the Gang says 2"
    api = FakeApi(store)
    records = GangRecords(api, store)
    (view,) = assemble(store)
    kept = await records.ensure_gang(view)
    methods = [m for m, _ in api.calls]
    assert methods[:2] == ["patch_gang_status", "patch_gang"], "the resize recorded before the size"
    assert kept["spec"]["minMember"] == 4
    resized = store.gangs[("ns", "pg-pg1")]["status"]["resized"]
    assert (resized["from"], resized["to"], resized["attempt"]) == (2, 4, 1)
    assert growing(4, store.gangs[("ns", "pg-pg1")], 2), "no decision at the new size yet"
    later = {**store.gangs[("ns", "pg-pg1")]}
    later["status"] = {**later["status"], "admission": {"attempt": 2, "time": "2026-11-22T00:01:00Z"}}
    assert not growing(4, later, 2), "a release at the new size is a new decision"
    events = [args for m, args in api.calls if m == "post_event"]
    assert any(args[1] == "Resized" and "from 2 to 4" in args[2] for args in events)
    status = compose(records.state(view, None, None))
    assert (
        status.condition("Resized")["status"] == "True" and status.condition("Resized")["reason"] == "Growing"
    )


async def test_a_group_that_shrinks_makes_the_members_beyond_it_elastic() -> None:
    store = running_store(1, gang_of(2))
    api = FakeApi(store)
    records = GangRecords(api, store)
    (view,) = assemble(store)
    await records.ensure_gang(view)
    assert not growing(1, store.gangs[("ns", "pg-pg1")], 2)
    status = compose(records.state(view, None, None))
    assert status.condition("Resized")["status"] == "False"
    assert "members beyond 1 are elastic" in status.condition("Resized")["message"]


async def test_an_orphaned_gang_is_adopted_by_its_group_made_again_and_keeps_its_records() -> None:
    """The upgrade deletes the old group with propagationPolicy Orphan (the Gang loses its owner)
    and makes it again at the new version (a new uid): the Gang is re-pointed, not replaced."""
    gang = gang_of(2, owners=[])
    store = running_store(2, gang)
    group = store.groups[("scheduling.sigs.k8s.io", "ns", "pg1")]
    group["metadata"]["uid"] = "g2"
    api = FakeApi(store)
    records = GangRecords(api, store)
    (view,) = assemble(store)
    kept = await records.ensure_gang(view)
    assert "delete_gang" not in [m for m, _ in api.calls] and "create_gang" not in [m for m, _ in api.calls]
    assert kept["metadata"]["ownerReferences"][0]["uid"] == "g2" and kept["spec"]["source"]["uid"] == "g2"
    assert kept["status"]["admission"]["attempt"] == 1, "its records are kept"


async def test_a_group_remade_while_the_gang_still_names_the_old_one_is_a_new_gang() -> None:
    store = running_store(2, gang_of(2))
    store.groups[("scheduling.sigs.k8s.io", "ns", "pg1")]["metadata"]["uid"] = "g2"
    api = FakeApi(store)
    (view,) = assemble(store)
    await GangRecords(api, store).ensure_gang(view)
    assert [m for m, _ in api.calls][:2] == ["delete_gang", "create_gang"]


async def test_a_resize_the_watch_has_not_shown_yet_still_reads_as_growing() -> None:
    """Watch lag: the store's Gang has the new size but not yet the `resized` record; what the
    operator wrote is what recovery reads (the records' copy), so it is not a loss."""
    store = running_store(4, gang_of(2))
    api = FakeApi(store)
    records = GangRecords(api, store)
    (view,) = assemble(store)
    await records.ensure_gang(view)
    lagging = {**store.gangs[("ns", "pg-pg1")]}
    lagging["status"] = {k: v for k, v in lagging["status"].items() if k != "resized"}
    lagging["metadata"] = {**lagging["metadata"], "resourceVersion": "1"}  # a copy from before
    store.gangs[("ns", "pg-pg1")] = lagging
    seen = records.gang(("ns", "pg-pg1"))
    assert seen is not None and growing(4, seen, 2)


def test_on_1_37_pods_whose_priority_is_not_their_groups_wait_told_how_to_fix_it() -> None:
    """kube-scheduler 1.37 refuses a group's pods at another priority than the group's: quorum
    does not release them to sit unscheduled. On 1.36 the scheduler has no such rule."""
    pods = {"a": wpg_pod("a"), "b": wpg_pod("b")}
    for pod in pods.values():
        pod["spec"]["priority"] = 10
    for version, waits in (("v1beta1", True), ("v1alpha2", False)):
        store = Store(pods=pods, pod_group_version=version)
        store.groups[("scheduling.k8s.io", "ns", "workers")] = k8s_podgroup(version)
        (view,) = assemble(store)
        assert (view.waiting is not None) == waits
        if waits:
            assert view.waiting is not None and "priority 10 and its PodGroup workers 0" in view.waiting
            assert "priorityClassName" in view.waiting
    store = Store(pods=pods)
    store.groups[("scheduling.k8s.io", "ns", "workers")] = k8s_podgroup("v1beta1", priority=10)
    (view,) = assemble(store)
    assert view.waiting is None


def test_on_1_37_a_preemption_policy_unlike_the_groups_is_said_so() -> None:
    pods = {"a": wpg_pod("a"), "b": wpg_pod("b")}
    store = Store(pods=pods)
    store.groups[("scheduling.k8s.io", "ns", "workers")] = k8s_podgroup("v1beta1", preemptionPolicy="Never")
    (view,) = assemble(store)
    assert view.waiting is not None and "preemptionPolicy PreemptLowerPriority" in view.waiting
    for pod in pods.values():
        pod["spec"]["preemptionPolicy"] = "Never"
    (view,) = assemble(store)
    assert view.waiting is None


async def test_a_group_being_deleted_with_its_dependents_orphaned_adopts_nothing() -> None:
    """The upgrade deletes the group with propagationPolicy Orphan: while it is going, the Gang
    (its owner reference taken off by the garbage collector) must not take it as owner again,
    or it would go with it."""
    gang = gang_of(2, owners=[])
    store = running_store(2, gang)
    store.groups[("scheduling.sigs.k8s.io", "ns", "pg1")]["metadata"]["deletionTimestamp"] = (
        "2026-11-26T00:00:00Z"
    )
    api = FakeApi(store)
    records = GangRecords(api, store)
    (view,) = assemble(store)
    assert not records.record_changes(view)
    kept = await records.ensure_gang(view)
    assert "patch_gang" not in [m for m, _ in api.calls] and not kept["metadata"]["ownerReferences"]


def test_a_grown_gang_that_fell_below_its_old_size_is_not_growing_but_lost_members() -> None:
    """Growing shields only the old size still running: a member lost below it is a loss."""
    gang = gang_of(2)
    assert growing(4, gang, 2) and not growing(4, gang, 1)
    gang["spec"]["minMember"] = 4
    gang["status"]["resized"] = {"from": 2, "to": 4, "attempt": 1}
    assert growing(4, gang, 2) and not growing(4, gang, 1)


async def test_the_resize_names_the_decision_this_process_made_even_before_the_watch_shows_it() -> None:
    """The Gang the watch shows says attempt 1; this process has just written attempt 2 (not
    seen yet): the resize is recorded under 2, so once the watch catches up it still reads as
    growing, not as a loss of the gang that attempt 2 ran whole."""
    store = running_store(4, gang_of(2))
    api = FakeApi(store)
    records = GangRecords(api, store)
    await records.patch(("ns", "pg-pg1"), {"admission": {"attempt": 2, "time": "2026-11-22T00:02:00Z"}})
    store.gangs[("ns", "pg-pg1")] = gang_of(2)  # the watch still shows attempt 1
    (view,) = assemble(store)
    await records.ensure_gang(view)
    resized = records.gang(("ns", "pg-pg1"))["status"]["resized"]  # type: ignore[index]
    assert resized["attempt"] == 2


def composite_obj(name: str, min_groups: int = 2, parent: str | None = None, **spec: Any) -> dict[str, Any]:
    return {
        "metadata": {"name": name, "namespace": "ns"},
        "spec": {
            "schedulingPolicy": {"gang": {"minGroupCount": min_groups}},
            **({"parentCompositePodGroupName": parent} if parent else {}),
            **spec,
        },
    }


def test_a_gang_waits_for_every_composite_above_it_and_a_loop_is_said_so() -> None:
    store = Store(pods={"a": wpg_pod("a")})
    store.groups[("scheduling.k8s.io", "ns", "workers")] = k8s_podgroup(
        "v1beta1", parentCompositePodGroupName="slice"
    )
    store.composites[("ns", "slice")] = composite_obj("slice", parent="job")
    (view,) = assemble(store)
    assert view.waiting is not None
    assert "waiting for CompositePodGroup job (scheduling.k8s.io), the parent of CompositePodGroup slice" in (
        view.waiting
    )
    store.composites[("ns", "job")] = composite_obj("job", parent="slice")
    (view,) = assemble(store)
    assert (
        view.waiting is not None
        and "slice -> job -> slice loop or are nested more than 3 deep" in view.waiting
    )
    store.composites[("ns", "job")] = composite_obj("job", priority=10)
    (view,) = assemble(store)
    assert view.waiting is not None and "CompositePodGroup job" in view.waiting, (
        "priority is the top composite's"
    )
    for pod in store.pods.values():
        pod["spec"]["priority"] = 10
    (view,) = assemble(store)
    assert view.waiting is None and view.to_core().composite == "slice"


def test_a_slice_whose_count_is_met_counts_as_one_admitted_child_of_the_job() -> None:
    """Two slices of a job: s0's two gangs are released (s0 met), s1's are not: the job has one
    child admitted, s0 two, s1 none; a slice's admitted domains are its own gangs'."""
    pods: dict[str, dict[str, Any]] = {}
    store = Store(pods=pods)
    for s in range(2):
        for role in ("launcher", "worker"):
            group = f"{role}{s}"
            for i in range(2):
                pod = wpg_pod(f"{group}-{i}", group=group, gated=s == 1)
                if s == 0:
                    pod["spec"]["nodeName"] = "n1"
                pods[pod["metadata"]["uid"]] = pod
            store.groups[("scheduling.k8s.io", "ns", group)] = k8s_podgroup(
                "v1beta1", name=group, parentCompositePodGroupName=f"s{s}"
            )
        store.composites[("ns", f"s{s}")] = composite_obj(f"s{s}", parent="job")
    store.composites[("ns", "job")] = composite_obj(
        "job", schedulingConstraints={"topology": [{"key": "rack"}]}
    )
    store.nodes["n1"] = {"metadata": {"name": "n1", "labels": {"rack": "r1"}}}
    found = composites(store, assemble(store))
    assert {k[1]: (c.admitted, c.parent) for k, c in found.items()} == {
        "job": (1, None),
        "s0": (2, "job"),
        "s1": (0, "job"),
    }
    assert found[("ns", "job")].admitted_domains == {"r1"}, "the domain of the admitted gangs under it"


def test_a_grown_gangs_spare_released_before_it_grew_and_never_bound_is_replaced() -> None:
    """minCount 2 -> 3 with 2 running and a spare released under the old decision whose node was
    taken: growing keeps recovery off the running members, not off that pod (a ReplicaSet's is
    made again, a Job's reported)."""
    store = running_store(3, gang_of(2))
    spare = gang_pod("c", "c", gated=False)
    store.pods["c"] = spare
    records = GangRecords(FakeApi(store), store)
    recoverer = Recoverer(FakeApi(store), records, BackoffPolicy(), Ledger())
    (view,) = assemble(store)
    gang = store.gangs[("ns", "pg-pg1")]
    assert growing(3, gang, 2)
    with clock.using(clock.ManualClock()) as now:
        assert recoverer.due(view, gang, now.time()) is None, "its decision seen now: not timed out"
        now.advance(view.schedule_timeout / 2)
        assert recoverer.due(view, gang, now.time()) is None, "not yet timed out"
        now.advance(view.schedule_timeout / 2 + 1)
        assert recoverer.due(view, gang, now.time()) == "replace-stuck"
        recoverer.stuck.add("c")
        assert recoverer.due(view, gang, now.time()) is None, "once"


def test_a_growing_gang_released_by_hand_is_left_to_the_person() -> None:
    """`quorum release` after quorum's decision: theirs now, growing or not (no pod of it is
    made again for being stuck)."""
    store = running_store(3, gang_of(2))
    store.pods["c"] = gang_pod("c", "c", gated=False)
    gang = store.gangs[("ns", "pg-pg1")]
    gang["status"]["manualRelease"] = {"time": "2026-11-22T00:00:30Z", "by": "ops", "pods": 1}
    recoverer = Recoverer(FakeApi(store), GangRecords(FakeApi(store), store), BackoffPolicy(), Ledger())
    (view,) = assemble(store)
    released = timestamp(gang["status"]["admission"]["time"])
    assert growing(3, gang, 2) and recoverer.due(view, gang, released + view.schedule_timeout + 1) is None


async def test_the_version_a_decision_counts_as_shown_from_never_goes_back() -> None:
    """Two writes of one Gang in flight: the answers may come back in either order; the later
    version is the one a watch copy must reach."""

    class CrossingApi(FakeApi):
        answers = iter(["20", "10"])

        async def patch_gang_status(self, namespace: str, name: str, status: dict[str, Any]) -> str | None:
            await super().patch_gang_status(namespace, name, status)
            return next(self.answers)

    store = running_store(2, gang_of(2))
    records = GangRecords(CrossingApi(store), store)
    key = ("ns", "pg-pg1")
    await records.patch(key, {"disruption": {"reason": "PartiallyPlaced", "attempt": 1}})
    await records.patch(key, {"preemption": {"token": "t"}})
    store.gangs[key] = {
        **store.gangs[key],
        "metadata": {**store.gangs[key]["metadata"], "resourceVersion": "15"},
    }
    store.gangs[key]["status"] = {k: v for k, v in store.gangs[key]["status"].items() if k != "disruption"}
    seen = records.gang(key)
    assert seen is not None and seen["status"].get("disruption"), "a copy at 15 has not shown the write at 20"
