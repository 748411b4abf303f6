"""`placement: kube-scheduler` (docs/placement.md): the webhook names the gang's PodGroup instead
of gating the pod, the gang's markers read the same, and the operator makes the PodGroup (once,
at the gang's size, never over another's), plans and releases nothing, and says why the gang
waits in kube-scheduler's words."""

from __future__ import annotations

import copy
from typing import Any

import pytest
from hypothesis import given
from hypothesis import strategies as st

from quorum.core.delegation import (
    Member,
    PodGroupSeen,
    kube_scheduler_hold,
    pod_group_size,
    unschedulable_message,
)
from quorum.core.gangs import GangSource, Placer, delegated_pod_group, gang_markers
from quorum.core.workloads import WAS_GROUP
from quorum.k8s.convert import delegation_member, pod_group_seen
from quorum.k8s.writes import delegated_pod_group as delegated_pod_group_object
from quorum.operator import clock
from quorum.operator.gangs import Store
from quorum.operator.holds import KUBE_SCHEDULER_GRACE_SECONDS
from quorum.operator.loop import GangLoop
from quorum.webhooks.patch import AddSchedulingGate, SetLabel, SetSchedulingGroup, apply_patch, build_patch
from quorum.webhooks.policies import gang_gate
from quorum.webhooks.settings import WebhookSettings
from tests.unit.fake_api import FakeApi, server_error
from tests.unit.test_loop import NS, REPLICA_SET, bind, cluster, pod, settings, step
from tests.unit.test_loop_preemption import held, running
from tests.unit.test_member_loss import gang_of_four, lose, running_whole
from tests.unit.webhooks.factories import pod as webhook_pod
from tests.unit.webhooks.factories import request

JSON = dict[str, Any]
DELEGATED = WebhookSettings(placement=Placer.KUBE_SCHEDULER)


def test_a_gang_pod_names_its_gangs_pod_group_instead_of_the_gate() -> None:
    decision = gang_gate.mutate(
        request("Pod", webhook_pod({"pod-group.scheduling.sigs.k8s.io": "pg1"})), DELEGATED
    )
    assert decision.intents == [SetSchedulingGroup("pg-pg1"), SetLabel("quorum.dev/gang", "pg-pg1")]
    assert not any(isinstance(i, AddSchedulingGate) for i in decision.intents)
    original = webhook_pod({"pod-group.scheduling.sigs.k8s.io": "pg1"})
    patched = apply_patch(original, build_patch(original, decision.intents))
    assert patched["spec"]["schedulingGroup"] == {"podGroupName": "pg-pg1"}
    # Admitted again (a reinvocation), the pod needs nothing more.
    again = gang_gate.mutate(request("Pod", patched), DELEGATED)
    assert again.allowed and build_patch(patched, again.intents) == []


def test_a_workload_aware_gang_pod_keeps_its_own_pod_group_and_gets_no_gate() -> None:
    workers = webhook_pod({}, schedulingGroup={"podGroupName": "workers"})
    decision = gang_gate.mutate(request("Pod", workers), DELEGATED)
    assert decision.intents == [SetLabel("quorum.dev/gang", "wpg-workers")]


def test_a_gang_pod_that_names_another_scheduling_group_is_refused_saying_why() -> None:
    other = webhook_pod(
        {"pod-group.scheduling.sigs.k8s.io": "pg1"}, schedulingGroup={"podGroupName": "other"}
    )
    decision = gang_gate.mutate(request("Pod", other), DELEGATED)
    assert decision.denied is not None
    assert "sets spec.schedulingGroup.podGroupName='other'" in decision.denied
    assert "Remove spec.schedulingGroup" in decision.denied
    # Under the default placement the pod is gated as before (the second group is only warned of).
    assert (
        AddSchedulingGate("quorum.dev/gang")
        in gang_gate.mutate(request("Pod", other), WebhookSettings()).intents
    )


@given(
    st.sampled_from(["pod-group.scheduling.sigs.k8s.io", "scheduling.x-k8s.io/pod-group"]),
    st.from_regex(r"[a-z][a-z0-9.]{0,70}", fullmatch=True),
)
def test_a_pod_group_named_as_the_gang_is_not_a_second_group(label: str, group: str) -> None:
    (first,) = gang_markers({label: group}, None)
    markers = gang_markers({label: group}, delegated_pod_group(first))
    assert markers == [first]
    assert gang_markers({label: group}, "someone-elses")[1].source is GangSource.WORKLOAD_POD_GROUP


def test_why_a_gang_kube_scheduler_places_waits() -> None:
    key = (NS, "lbl-a")
    ours = PodGroupSeen(quorums=True, min_count=3)
    assert kube_scheduler_hold(key, 3, 3, 3, "lbl-a", ours, None) is None
    short = kube_scheduler_hold(key, 3, 2, 0, "lbl-a", ours, None)
    assert short is not None and short.reason == "WaitingForMembers"
    no_room = kube_scheduler_hold(
        key, 3, 3, 0, "lbl-a", ours, "0/3 nodes are available: 3 Insufficient nvidia.com/gpu."
    )
    assert no_room is not None and no_room.reason == "Unschedulable"
    assert no_room.message == "kube-scheduler: 0/3 nodes are available: 3 Insufficient nvidia.com/gpu."
    waiting = kube_scheduler_hold(key, 3, 3, 1, "lbl-a", None, None)
    assert (
        waiting is not None
        and waiting.reason == "WaitingForKubeScheduler"
        and "quorum is making it" in waiting.message
    )
    unserved = kube_scheduler_hold(key, 3, 3, 0, "lbl-a", None, None, served=False)
    assert unserved is not None and unserved.reason == "PodGroupNotServed" and "v1beta1" in unserved.message
    theirs = PodGroupSeen(quorums=False, min_count=1)
    other = kube_scheduler_hold(key, 3, 3, 0, "lbl-a", theirs, None)
    assert other is not None and other.reason == "PodGroupNotQuorums" and "Delete it" in other.message
    fits = kube_scheduler_hold(key, 3, 3, 0, "lbl-a", PodGroupSeen(quorums=False, min_count=3), None)
    assert fits is not None and fits.reason == "WaitingForKubeScheduler", "not quorum's, but of the size"


def test_a_pod_group_is_read_as_it_is_written() -> None:
    ours = delegated_pod_group_object(NS, "pg-a", "v1beta1", 3, {})
    assert pod_group_seen(ours) == PodGroupSeen(quorums=True, min_count=3)
    assert pod_group_seen(ours).left_as_is(3) and not pod_group_seen(ours).left_as_is(4)
    theirs = {"metadata": {}, "spec": {"schedulingPolicy": {"gang": {"minCount": "3"}}}}
    assert pod_group_seen(theirs) == PodGroupSeen(quorums=False, min_count="3")
    assert pod_group_seen(theirs).left_as_is(4), "not quorum's: never written"
    assert pod_group_seen({}) == PodGroupSeen(quorums=False, min_count=None)


def test_kube_schedulers_word_is_taken_from_an_unbound_pod_only() -> None:
    said = {"type": "PodScheduled", "status": "False", "reason": "Unschedulable", "message": "no room"}
    bound: JSON = {"spec": {"nodeName": "n0"}, "status": {"conditions": [said]}}
    unbound: JSON = {"spec": {}, "status": {"conditions": [said]}}
    assert delegation_member(unbound) == Member(bound=False, pod_group=None, unschedulable="no room")
    assert unschedulable_message([delegation_member(bound)]) is None
    assert unschedulable_message(map(delegation_member, [bound, unbound])) == "no room"
    long = Member(bound=False, pod_group=None, unschedulable="x" * 700)
    assert unschedulable_message([long]) == "x" * 600


def delegated_cluster(nodes: int, size: int) -> tuple[Store, Any]:
    """A label-less gang (scheduler-plugins PodGroup `a`) as placement kube-scheduler admits it:
    no gate, naming PodGroup pg-a."""
    store, bound = cluster(nodes, {"a": size})
    for uid, p in list(store.pods.items()):
        p = copy.deepcopy(p)
        p["spec"]["schedulingGates"] = []
        p["spec"]["schedulingGroup"] = {"podGroupName": "pg-a"}
        store.pods[uid] = p
    bound.replace_all(list(store.pods.values()))
    return store, bound


async def test_the_operator_makes_the_pod_group_once_and_releases_nothing() -> None:
    with clock.using(clock.ManualClock()) as now:
        await makes_the_pod_group_once(now)


async def makes_the_pod_group_once(now: clock.ManualClock) -> None:
    store, bound = delegated_cluster(nodes=3, size=3)
    api = FakeApi(store)
    loop = GangLoop(api, store, bound, settings(placement=Placer.KUBE_SCHEDULER))
    await step(loop)
    (made,) = api.called("ensure_pod_group")
    assert made[:4] == (NS, "pg-a", "v1beta1", 3)
    assert (made[4]["kind"], made[4]["name"]) == ("PodGroup", "a"), "owned by the gang's group, as its Gang"
    group = store.groups[(WAS_GROUP, NS, "pg-a")]
    assert group["spec"]["schedulingPolicy"] == {"gang": {"minCount": 3}}
    assert not api.called("release_pod") and not api.pinned
    await step(loop)
    assert len(api.called("ensure_pod_group")) == 1, "made again although the watch shows it"
    assert (NS, "pg-a") not in store.gangs, "its wait is written only once it lasts"
    now.advance(KUBE_SCHEDULER_GRACE_SECONDS + 1)
    await step(loop)
    gang = store.gangs[(NS, "pg-a")]
    admitted = next(c for c in gang["status"]["conditions"] if c["type"] == "Admitted")
    assert (admitted["status"], admitted["reason"]) == ("False", "WaitingForKubeScheduler")
    assert "WaitingForKubeScheduler" not in api.reasons("pg-a"), "its normal path: no Event"
    # kube-scheduler binds the three: the gang is admitted, and still nothing was released by quorum.
    for i, uid in enumerate(sorted(store.pods)):
        p = copy.deepcopy(store.pods[uid])
        p["spec"]["nodeName"] = f"n{i}"
        p["status"]["phase"] = "Running"
        store.pods[uid] = p
        bound.upsert(p)
    await step(loop)
    gang = store.gangs[(NS, "pg-a")]
    admitted = next(c for c in gang["status"]["conditions"] if c["type"] == "Admitted")
    assert admitted["status"] == "True"
    assert "admission" not in gang["status"], "a decision recorded for a gang quorum did not place"
    assert not api.called("release_pod") and not api.called("delete_pod")


async def test_a_gang_kube_scheduler_binds_within_the_forming_grace_is_written_once_admitted() -> None:
    with clock.using(clock.ManualClock()) as now:
        store, bound = delegated_cluster(nodes=3, size=3)
        api = FakeApi(store)
        loop = GangLoop(
            api, store, bound, settings(placement=Placer.KUBE_SCHEDULER, forming_grace_seconds=2.0)
        )
        await step(loop)
        assert api.called("ensure_pod_group") and (NS, "pg-a") not in store.gangs, "nothing written yet"
        for i, uid in enumerate(sorted(store.pods)):
            p = copy.deepcopy(store.pods[uid])
            p["spec"]["nodeName"] = f"n{i}"
            store.pods[uid] = p
            bound.upsert(p)
        now.advance(1)
        await step(loop)
        gang = store.gangs[(NS, "pg-a")]
        assert next(c for c in gang["status"]["conditions"] if c["type"] == "Admitted")["status"] == "True"
        assert len(api.called("patch_gang_status")) == 1 and not api.events


async def test_the_forming_grace_of_a_gang_kube_scheduler_places_counts_from_when_it_is_whole() -> None:
    with clock.using(clock.ManualClock()) as now:
        store, bound = delegated_cluster(nodes=3, size=3)
        last = store.pods.pop("a-2")
        bound.replace_all(list(store.pods.values()))
        api = FakeApi(store)
        loop = GangLoop(
            api, store, bound, settings(placement=Placer.KUBE_SCHEDULER, forming_grace_seconds=2.0)
        )
        await step(loop)  # 2 of 3 members: waits, unwritten
        now.advance(1.9)
        store.pods["a-2"] = last
        bound.upsert(last)
        await step(loop)  # whole: its PodGroup made, kube-scheduler's turn from now
        assert api.called("ensure_pod_group")
        now.advance(1.0)  # 2.9 s after its first pod, 1 s after it was whole
        await step(loop)
        assert (NS, "pg-a") not in store.gangs, "written before kube-scheduler had its grace"
        now.advance(KUBE_SCHEDULER_GRACE_SECONDS)
        await step(loop)
        assert (NS, "pg-a") not in store.gangs, "its wait is counted from when it was whole"
        now.advance(1.5)
        await step(loop)
        gang = store.gangs[(NS, "pg-a")]
        assert next(c for c in gang["status"]["conditions"] if c["type"] == "Admitted")["reason"] == (
            "WaitingForKubeScheduler"
        )


async def test_a_failed_pod_group_write_is_the_gangs_failure_and_is_made_again() -> None:
    store, bound = delegated_cluster(nodes=3, size=3)
    api = FakeApi(store)
    api.fail("ensure_pod_group", times=1, error=server_error())
    loop = GangLoop(api, store, bound, settings(placement=Placer.KUBE_SCHEDULER))
    await step(loop)
    assert (WAS_GROUP, NS, "pg-a") not in store.groups
    assert loop.work.failure_message((NS, "pg-a")) is not None
    while (WAS_GROUP, NS, "pg-a") not in store.groups:  # its backoff is 0.05 s in these settings
        await step(loop)
    assert len(api.called("ensure_pod_group")) == 2


async def test_a_pod_group_that_is_not_quorums_is_left_alone_and_the_gang_says_so() -> None:
    store, bound = delegated_cluster(nodes=3, size=3)
    store.groups[(WAS_GROUP, NS, "pg-a")] = {
        "metadata": {"name": "pg-a", "namespace": NS},
        "spec": {"schedulingPolicy": {"gang": {"minCount": 1}}},
    }
    api = FakeApi(store)
    loop = GangLoop(api, store, bound, settings(placement=Placer.KUBE_SCHEDULER))
    await step(loop)
    assert not api.called("ensure_pod_group")
    gang = store.gangs[(NS, "pg-a")]
    admitted = next(c for c in gang["status"]["conditions"] if c["type"] == "Admitted")
    assert admitted["reason"] == "PodGroupNotQuorums"


async def switched_with_a_replacement(policy: str | None) -> tuple[Store, Any, FakeApi, GangLoop]:
    """A gang of four quorum placed before the switch to placement kube-scheduler (its decision
    on record); then a member is lost, and its replacement names the gang's PodGroup."""
    store, bound, api = gang_of_four(policy)
    loop = GangLoop(api, store, bound, settings(placement=Placer.KUBE_SCHEDULER))
    await running_whole(loop, store, bound, api)
    assert store.gangs[(NS, "pg-a")]["status"]["admission"]["attempt"] == 1
    lose(store, bound, "a-1")
    replacement = pod("a", 4, owner=REPLICA_SET)
    replacement["spec"]["schedulingGates"] = []
    replacement["spec"]["schedulingGroup"] = {"podGroupName": "pg-a"}
    store.pods["a-4"] = replacement
    return store, bound, api, loop


async def test_a_replacement_kube_scheduler_places_is_never_deleted_however_long_it_waits() -> None:
    with clock.using(clock.ManualClock()) as now:
        store, _, api, loop = await switched_with_a_replacement(None)
        await step(loop)
        # Looked at: the operator made the PodGroup the replacement names, of minCount 1: the
        # three members quorum placed run, and kube-scheduler counts only pods that name it.
        assert store.groups[(WAS_GROUP, NS, "pg-a")]["spec"]["schedulingPolicy"] == {"gang": {"minCount": 1}}
        now.advance(3600)  # far past the gang's scheduleTimeoutSeconds
        await step(loop)
        await step(loop)
        assert not api.called("delete_pod") and not api.called("set_job_suspend")
        assert "StuckPodReplaced" not in api.reasons("pg-a")


async def test_restart_gang_restarts_the_members_quorum_placed_and_leaves_kube_schedulers() -> None:
    store, _, api, loop = await switched_with_a_replacement("RestartGang")
    await step(loop)
    deleted = sorted(args[0]["metadata"]["name"] for args in api.called("delete_pod"))
    assert deleted == ["a-0", "a-2", "a-3"], "the members quorum placed, recorded and told"
    assert store.gangs[(NS, "pg-a")]["status"]["recovery"]["reason"] == "MemberLost"
    assert "GangRestarted" in api.reasons("pg-a")


def test_a_pod_group_counts_the_members_quorum_placed_before_the_switch() -> None:
    named = Member(bound=False, pod_group="pg-a", unschedulable=None)
    before = delegation_member({"spec": {"nodeName": "n0"}})
    assert pod_group_size(4, [named] * 4, "pg-a") == 4, "admitted under this placement: its minMember"
    assert pod_group_size(4, [before] * 3 + [named], "pg-a") == 1
    assert pod_group_size(4, [before] * 2 + [named] * 2, "pg-a") == 2
    assert pod_group_size(2, [before] * 5, "pg-a") == 1, "never below 1"
    bound_naming = Member(bound=True, pod_group="pg-a", unschedulable=None)
    assert pod_group_size(4, [bound_naming] * 2 + [named] * 2, "pg-a") == 4


async def test_a_tenant_cannot_take_its_pods_out_of_recovery_by_naming_its_gangs_pod_group() -> None:
    """The gate way: a tenant's gang pods name `pg-a` in spec.schedulingGroup themselves (the
    webhook lets a group named as the gang pass). quorum releases them as usual; the one that
    never binds is still recovered at its timeout, and quorum makes no PodGroup for the gang."""
    with clock.using(clock.ManualClock()) as now:
        store, bound = cluster(2, {"a": 2}, owner=REPLICA_SET)
        for uid, p in list(store.pods.items()):
            p = copy.deepcopy(p)
            p["spec"]["schedulingGroup"] = {"podGroupName": "pg-a"}
            store.pods[uid] = p
        bound.replace_all(list(store.pods.values()))
        api = FakeApi(store)
        loop = GangLoop(api, store, bound, settings())
        await step(loop)
        assert len(api.called("release_pod")) == 2
        bind(store, bound, api, ["a-0"])  # a-1 never binds
        now.advance(61)  # its timeout ends
        await step(loop)
        assert store.gangs[(NS, "pg-a")]["status"]["recovery"]["failures"] == 1, "recovered as any gang"
        assert api.called("delete_pod") and not api.called("ensure_pod_group")


@pytest.mark.parametrize("placement", [Placer.QUORUM, Placer.KUBE_SCHEDULER])
async def test_quorum_preempts_only_for_the_gangs_it_places(placement: Placer) -> None:
    """placement.md's table: quorum's whole-gang preemption is not for a gang kube-scheduler
    places (kube-scheduler's own preemption applies to its pods). The same cluster, a running
    low-priority gang and a high-priority one with no room, under each placement."""
    with clock.using(clock.ManualClock()) as now:
        store, bound = cluster(2, {})
        running(store, bound, "low", 2, 10, ["n0", "n1"])
        held(store, "high", 2, 1000)
        said = {"type": "PodScheduled", "status": "False", "reason": "Unschedulable", "message": "no room"}
        if placement is Placer.KUBE_SCHEDULER:
            for name in ("high-0", "high-1"):  # admitted so, and tried by kube-scheduler
                p = store.pods[name]
                p["spec"].update(schedulingGates=[], schedulingGroup={"podGroupName": "pg-high"})
                p["status"] = {"phase": "Pending", "conditions": [said]}
        api = FakeApi(store)
        loop = GangLoop(api, store, bound, settings(placement=placement))
        await step(loop)
        now.advance(KUBE_SCHEDULER_GRACE_SECONDS + 1)
        await step(loop)
        status = store.gangs[(NS, "pg-high")]["status"]
        admitted = next(c for c in status["conditions"] if c["type"] == "Admitted")
        if placement is Placer.QUORUM:
            assert sorted(api.victims_deleted) == ["low-0", "low-1"] and status["preemption"]
            return
        # Looked at and judged: its PodGroup made, its wait in kube-scheduler's words.
        assert api.called("ensure_pod_group")
        assert (admitted["reason"], admitted["message"]) == ("Unschedulable", "kube-scheduler: no room")
        assert not api.victims_deleted and not api.disruption_targets and not api.called("delete_pod")
        assert not status.get("preemption") and "Preempting" not in api.reasons("pg-high")


@pytest.mark.parametrize("placement", [Placer.QUORUM, Placer.KUBE_SCHEDULER])
async def test_quorum_orders_only_the_gangs_it_places(placement: Placer) -> None:
    """placement.md's table: queue order (and the starvation guard, fairness, topology and
    reserved room that act through it) is quorum's only where quorum releases. Two gangs, room
    for one: under placement quorum the planner lets the higher priority through and holds the
    other; under kube-scheduler quorum writes no pod of either, and what binds first is
    kube-scheduler's choice (their pods carry no gate, as the first test of this file shows)."""
    store, bound = cluster(1, {})
    held(store, "low", 1, 10)
    held(store, "high", 1, 1000)
    if placement is Placer.KUBE_SCHEDULER:
        for name, group in (("low-0", "pg-low"), ("high-0", "pg-high")):
            store.pods[name]["spec"].update(schedulingGates=[], schedulingGroup={"podGroupName": group})
    api = FakeApi(store)
    loop = GangLoop(api, store, bound, settings(placement=placement))
    await step(loop)
    if placement is Placer.QUORUM:
        assert list(api.pinned) == ["high-0"], "quorum's order: the higher priority first"
        return
    made = sorted(args[1] for args in api.called("ensure_pod_group"))
    assert made == ["pg-high", "pg-low"], "both looked at: each gang's PodGroup made"
    assert not api.called("release_pod") and not api.pinned
