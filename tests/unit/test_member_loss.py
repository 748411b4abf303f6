"""A running gang that loses members, in the scheduling loop against the stateful fake API:
`Replace` releases the replacement alone; `RestartGang` recovers the rest by owner kind, once
per loss, and the gang is admitted again whole; no restart while the gang is still being
released, finishing, taken whole, or suspended by someone else."""

from __future__ import annotations

import copy
from typing import Any

from quorum.core.lifecycle import MemberLossPolicy
from quorum.k8s.usage import BoundPods
from quorum.operator.gangs import Store, assemble
from quorum.operator.loop import GangLoop
from tests.unit.fake_api import FakeApi
from tests.unit.test_loop import NS, REPLICA_SET, cluster, pod, released, settings, step
from tests.unit.test_loop_preemption import bind_released

JSON = dict[str, Any]
KEY = (NS, "pg-a")
ANNOTATION = "quorum.dev/member-loss-policy"
JOB = {"kind": "Job", "name": "train", "uid": "job-uid", "controller": True}


def gang_of_four(policy: str | None, owner: JSON = REPLICA_SET) -> tuple[Store, BoundPods, FakeApi]:
    """Four 8-GPU nodes, gang a of 4 pods (minMember 4), its PodGroup annotated with `policy`."""
    store, bound = cluster(4, {"a": 4}, owner=owner)
    if policy is not None:
        store.groups[("scheduling.sigs.k8s.io", NS, "a")]["metadata"]["annotations"] = {ANNOTATION: policy}
    return store, bound, FakeApi(store)


async def running_whole(loop: GangLoop, store: Store, bound: BoundPods, api: FakeApi) -> None:
    await step(loop)
    assert released(store, "a") == ["a-0", "a-1", "a-2", "a-3"]
    bind_released(store, bound, api)
    await step(loop)
    assert store.gangs[KEY]["status"]["bound"] == 4


def lose(store: Store, bound: BoundPods, uid: str, replacement: int | None = None) -> str:
    """A member deleted (as the watch shows it), and its controller's gated replacement; the
    node it ran on."""
    node = str(store.pods[uid]["spec"]["nodeName"])
    del store.pods[uid]
    bound.remove(uid)
    if replacement is not None:
        new = pod("a", replacement, owner=REPLICA_SET)
        store.pods[new["metadata"]["uid"]] = new
    return node


def sync_deleted(store: Store, bound: BoundPods) -> None:
    """The pod watch's deletions reach the bound-pod index too."""
    for uid in [u for u in bound.pods if u not in store.pods]:
        bound.remove(uid)


def condition(store: Store, kind: str) -> JSON:
    return next(c for c in store.gangs[KEY]["status"]["conditions"] if c["type"] == kind)


async def test_replace_releases_the_replacement_alone_and_the_rest_runs_on() -> None:
    store, bound, api = gang_of_four(None)  # the cluster default: Replace
    loop = GangLoop(api, store, bound, settings())
    await running_whole(loop, store, bound, api)
    lose(store, bound, "a-1", replacement=4)
    await step(loop)
    assert released(store, "a") == ["a-0", "a-2", "a-3", "a-4"]
    assert [e["uid"] for e in store.gangs[KEY]["status"]["admission"]["placement"]] == ["a-4"]
    assert not api.called("delete_pod") and "GangRestarted" not in api.reasons("pg-a")


async def test_restart_gang_recovers_the_rest_once_and_the_gang_is_admitted_again_whole() -> None:
    store, bound, api = gang_of_four("RestartGang")
    loop = GangLoop(api, store, bound, settings())
    await running_whole(loop, store, bound, api)
    node = lose(store, bound, "a-1", replacement=4)
    await step(loop)

    assert sorted(args[0]["metadata"]["name"] for args in api.called("delete_pod")) == ["a-0", "a-2", "a-3"]
    assert released(store, "a") == [], "the replacement waits for the gang, not released alone"
    recovery = store.gangs[KEY]["status"]["recovery"]
    assert recovery["reason"] == "MemberLost" and recovery["attempt"] == 1 and recovery["failures"] == 0
    expected = f"1 of 4 members lost (pod a-1 on node {node} deleted); 3 left, minMember 4; RestartGang: "
    assert recovery["message"].startswith(expected + "deleted 3 pods for their controllers to make again")
    (event,) = [(m, w) for o, r, m, w in api.events if r == "GangRestarted" and o == "pg-a"]
    assert event == (recovery["message"], True)
    assert "GangRestarted" in api.reasons("a"), "on the PodGroup too"

    await step(loop)  # the status, once the restart's task has ended
    assert len(api.called("delete_pod")) == 3, "once per loss, not every pass"
    restarted = condition(store, "Restarted")
    assert restarted["status"] == "True" and restarted["reason"] == "MemberLost"
    assert condition(store, "PartiallyPlaced")["status"] == "False", "not a partial placement"
    assert condition(store, "Backoff")["status"] == "False", "no backoff: admitted as soon as whole"

    sync_deleted(store, bound)
    for i in (5, 6, 7):  # the ReplicaSet makes the others again, gated
        new = pod("a", i, owner=REPLICA_SET)
        store.pods[new["metadata"]["uid"]] = new
    await step(loop)
    admission = store.gangs[KEY]["status"]["admission"]
    assert admission["attempt"] == 2 and len(admission["placement"]) == 4, "admitted again whole"
    assert released(store, "a") == ["a-4", "a-5", "a-6", "a-7"]
    bind_released(store, bound, api)
    await step(loop)
    again = condition(store, "Restarted")
    assert again["status"] == "False" and again["reason"] == "Readmitted" and again["message"]

    lose(store, bound, "a-6", replacement=8)  # a new loss of the new decision: acted on again
    await step(loop)
    assert len(api.called("delete_pod")) == 6
    assert store.gangs[KEY]["status"]["recovery"]["attempt"] == 2


async def test_a_new_leader_restarts_a_gang_whose_status_on_record_says_it_ran_whole() -> None:
    store, bound, api = gang_of_four("RestartGang")
    first = GangLoop(api, store, bound, settings())
    await running_whole(first, store, bound, api)
    lose(store, bound, "a-2")
    second = GangLoop(api, store, bound, settings())  # never saw the gang whole itself
    second.resume()
    await step(second)
    assert sorted(args[0]["metadata"]["name"] for args in api.called("delete_pod")) == ["a-0", "a-1", "a-3"]
    assert store.gangs[KEY]["status"]["recovery"]["message"].startswith("members lost: 3 left, minMember 4")


async def test_no_restart_while_the_gang_is_still_being_released() -> None:
    store, bound, api = gang_of_four("RestartGang")
    loop = GangLoop(api, store, bound, settings())
    await step(loop)
    for uid in ("a-0", "a-1"):  # two of the four bound so far
        p = copy.deepcopy(store.pods[uid])
        p["spec"]["nodeName"] = api.pinned[uid]
        store.pods[uid] = p
        bound.upsert(p)
    lose(store, bound, "a-0", replacement=4)
    await step(loop)
    assert not api.called("delete_pod") and "recovery" not in store.gangs[KEY]["status"]


async def test_no_restart_when_a_member_succeeded_the_rest_is_taken_or_all_went() -> None:
    for what in ("succeeded", "taken", "preempted", "all gone"):
        store, bound, api = gang_of_four("RestartGang")
        loop = GangLoop(api, store, bound, settings())
        await running_whole(loop, store, bound, api)
        if what == "succeeded":  # a Job finishing: one pod done, then one deleted
            done = copy.deepcopy(store.pods["a-0"])
            done["status"] = {"phase": "Succeeded"}
            store.pods["a-0"] = done
            lose(store, bound, "a-1")
        elif what == "taken":  # the rest is marked as going (an eviction of the whole gang)
            for uid in ("a-1", "a-2", "a-3"):
                p = copy.deepcopy(store.pods[uid])
                p["status"]["conditions"] = [{"type": "DisruptionTarget", "status": "True"}]
                store.pods[uid] = p
            lose(store, bound, "a-0")
        elif what == "preempted":
            store.gangs[KEY]["status"]["preempted"] = {"by": "ns/pg-b", "time": "2099-01-01T00:00:00Z"}
            lose(store, bound, "a-0")
        else:
            for uid in ("a-0", "a-1", "a-2", "a-3"):
                lose(store, bound, uid, replacement=int(uid[-1]) + 4)
        await step(loop)
        assert not api.called("delete_pod"), what
        assert "GangRestarted" not in api.reasons("pg-a"), what


async def test_a_jobs_gang_is_restarted_by_suspending_the_job_unless_someone_else_suspended_it() -> None:
    for suspended_by_someone in (False, True):
        store, bound, api = gang_of_four("RestartGang", owner=JOB)
        api.jobs[(NS, "train")] = {
            "metadata": {"name": "train", "uid": "job-uid"},
            "spec": {"suspend": suspended_by_someone},
        }
        loop = GangLoop(api, store, bound, settings())
        await running_whole(loop, store, bound, api)
        failed = copy.deepcopy(store.pods["a-3"])
        failed["status"] = {"phase": "Failed"}
        store.pods["a-3"] = failed
        await step(loop)
        suspends = api.called("set_job_suspend")
        if suspended_by_someone:
            assert not suspends and "recovery" not in store.gangs[KEY]["status"]
            continue
        assert suspends == [(NS, "train", "job-uid", True)]
        recovery = store.gangs[KEY]["status"]["recovery"]
        assert recovery["suspendedJobs"] == ["train"] and recovery["reason"] == "MemberLost"
        assert "pod a-3 on node" in recovery["message"] and " failed)" in recovery["message"]
        assert "suspended Job train until its pods are gone" in recovery["message"]
        for uid in ("a-0", "a-1", "a-2"):
            assert store.pods[uid]["metadata"].get("deletionTimestamp"), "on its way out: not admitted"


async def test_a_label_only_gang_takes_its_policy_from_its_pods_and_a_bad_value_is_told_once() -> None:
    store, bound = cluster(4, {})
    for i in range(2):
        p = pod("l", i, owner=REPLICA_SET)
        p["metadata"]["labels"] = {
            "quorum.dev/gang": "pg-l",
            "pod-group.scheduling.sigs.k8s.io/name": "l",
            "pod-group.scheduling.sigs.k8s.io/min-available": "2",
        }
        p["metadata"]["annotations"] = {ANNOTATION: "Restart"}
        store.pods[p["metadata"]["uid"]] = p
    api = FakeApi(store)
    loop = GangLoop(api, store, bound, settings(member_loss_policy=MemberLossPolicy.RESTART_GANG))
    for _ in range(3):
        await step(loop)
    warnings = [m for o, r, m, w in api.events if r == "InvalidMemberLossPolicy" and w]
    assert len(warnings) == 1 and "found 'Restart': the cluster default RestartGang applies" in warnings[0]
    for p in store.pods.values():
        p["metadata"]["annotations"] = {ANNOTATION: "Replace"}
    (view,) = assemble(store)
    assert loop.recoverer.policy_of(view) == (MemberLossPolicy.REPLACE, None), (
        "the pods' own, over the default"
    )
