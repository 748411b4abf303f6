"""Preemption in the scheduling loop, against the stateful fake API: the decision recorded
first, the freed nodes tainted and the preemptor's release tolerating them, victims marked then
deleted, a PodDisruptionBudget kept where it can be but never a veto, system-critical pods
never taken, and the end removing the taints."""

from __future__ import annotations

import copy
import dataclasses
import json
import re
import time
from typing import Any

import pytest

from quorum.core.planner import PlannerSettings
from quorum.k8s.usage import BoundPods
from quorum.operator import clock, snapshot
from quorum.operator import loop as loop_module
from quorum.operator.gangs import Store
from quorum.operator.loop import GangLoop
from quorum.operator.settings import PreemptionLoopSettings
from tests.unit.fake_api import FakeApi
from tests.unit.test_loop import NS, REPLICA_SET, cluster, pod, podgroup, released, settings, step

JSON = dict[str, Any]


def running(store: Store, bound: BoundPods, group: str, size: int, priority: int, nodes: list[str]) -> None:
    """A gang of `size` 8-GPU pods, released and bound to `nodes`, started an hour ago."""
    store.groups[("scheduling.sigs.k8s.io", NS, group)] = podgroup(group, size)
    for i in range(size):
        p = pod(group, i, owner=REPLICA_SET)
        p["spec"].update(schedulingGates=[], nodeName=nodes[i], priority=priority)
        p["status"] = {"phase": "Running", "startTime": "2026-11-23T00:00:00Z"}
        store.pods[p["metadata"]["uid"]] = p
        bound.upsert(p)


def held(store: Store, group: str, size: int, priority: int) -> None:
    store.groups[("scheduling.sigs.k8s.io", NS, group)] = podgroup(group, size)
    for i in range(size):
        p = pod(group, i, owner=REPLICA_SET)
        p["spec"]["priority"] = priority
        store.pods[p["metadata"]["uid"]] = p


def taints(store: Store, node: str) -> list[JSON]:
    return [t for t in store.nodes[node]["spec"].get("taints") or [] if t["key"] == "quorum.dev/reserved"]


def bind_released(store: Store, bound: BoundPods, api: FakeApi) -> None:
    """kube-scheduler's part: each released pod bound to the node its release pinned it to."""
    for uid, node in api.pinned.items():
        p = store.pods.get(uid)
        if p is not None and node is not None and not p["spec"].get("nodeName"):
            p = copy.deepcopy(p)
            p["spec"]["nodeName"] = node
            p["status"] = {"phase": "Running"}
            store.pods[uid] = p
            bound.upsert(p)


def victims_gone(bound: BoundPods, api: FakeApi) -> None:
    """The victims' deletion, as the pod watch delivers it."""
    for uid in api.victims_deleted:
        bound.remove(uid)


async def test_a_high_priority_gang_takes_a_low_priority_gang_whole_and_gets_its_nodes() -> None:
    store, bound = cluster(2, {})
    running(store, bound, "low", 2, 10, ["n0", "n1"])
    held(store, "high", 2, 1000)
    api = FakeApi(store)
    loop = GangLoop(api, store, bound, settings())
    await step(loop)  # held for lack of room; the preemption starts
    record = store.gangs[(NS, "pg-high")]["status"]["preemption"]
    assert record["victims"] == [
        {"kind": "gang", "namespace": NS, "name": "pg-low", "pods": 2, "priority": 10}
    ]
    assert "nodes" not in record, "the tenant reads the record: the nodes are found by their taint"
    assert sorted(api.victims_deleted) == ["low-0", "low-1"], "the whole gang, never one pod of it"
    assert {uid: r for uid, (r, _) in api.disruption_targets.items()} == {
        "low-0": "PreemptionByQuorum",
        "low-1": "PreemptionByQuorum",
    }
    _, told = api.disruption_targets["low-0"]
    assert told == f"preempted by {NS}/pg-high (priority 1000): needed 16 nvidia.com/gpu", told
    token = record["token"]
    assert [t["value"] for t in taints(store, "n0")] == [token] == [t["value"] for t in taints(store, "n1")]
    assert store.gangs[(NS, "pg-low")]["status"]["preempted"]["by"] == f"{NS}/pg-high"
    assert "Preempted" in api.reasons("pg-low") and "Preempting" in api.reasons("pg-high")

    victims_gone(bound, api)
    await step(loop)  # the room is free: the preemptor is released onto the reserved nodes
    assert sorted(api.pinned) == ["high-0", "high-1"]
    assert api.tolerated == {"high-0": token, "high-1": token}

    bind_released(store, bound, api)
    await step(loop)  # bound: the preemption ends, the taints go
    assert (
        "preemption" not in store.gangs[(NS, "pg-high")]["status"]
        or not store.gangs[(NS, "pg-high")]["status"]["preemption"]
    )
    assert taints(store, "n0") == [] and taints(store, "n1") == []
    assert "PreemptionEnded" in api.reasons("pg-high")


def budget(store: Store, name: str, group: str, allowed: int) -> None:
    store.pdbs[(NS, name)] = {
        "metadata": {"name": name, "namespace": NS},
        "spec": {"selector": {"matchLabels": {"pod-group.scheduling.sigs.k8s.io": group}}},
        "status": {"disruptionsAllowed": allowed},
    }


async def test_a_budget_that_allows_nothing_does_not_make_its_gang_immune() -> None:
    """A tenant's PodDisruptionBudget of 0 is kept where another victim would do, but it does
    not veto: priority decides, as with kube-scheduler's preemption. The victim is deleted (an
    eviction would be refused), and the preemptor's Event says which budget was passed."""
    store, bound = cluster(2, {})
    running(store, bound, "guarded", 1, 10, ["n0"])
    running(store, bound, "open", 1, 20, ["n1"])
    budget(store, "keep-guarded", "guarded", 0)
    held(store, "high", 1, 1000)
    api = FakeApi(store)
    loop = GangLoop(api, store, bound, settings())
    await step(loop)
    assert api.victims_deleted == ["open-0"], "the work its budget lets go, though of higher priority"

    store2, bound2 = cluster(1, {})
    running(store2, bound2, "guarded", 1, 10, ["n0"])
    budget(store2, "keep-guarded", "guarded", 0)
    held(store2, "high", 1, 1000)
    api2 = FakeApi(store2)
    await step(GangLoop(api2, store2, bound2, settings()))
    assert api2.victims_deleted == ["guarded-0"], "no other way to make room: the budget is passed"
    assert api2.disruption_targets["guarded-0"][0] == "PreemptionByQuorum", "marked before it went"
    [(warn, message)] = [(w, m) for name, r, m, w in api2.events if r == "Preempting" and name == "pg-high"]
    assert warn and f"past PodDisruptionBudget {NS}/keep-guarded (allows 0, takes 1)" in message, message


async def test_equal_priority_takes_nothing_and_says_why() -> None:
    store, bound = cluster(1, {})
    running(store, bound, "low", 1, 10, ["n0"])
    held(store, "same", 1, 10)
    api = FakeApi(store)
    loop = GangLoop(api, store, bound, settings())
    await step(loop)
    await step(loop)  # the status written after the decision
    assert api.victims_deleted == [] and taints(store, "n0") == []
    conditions = store.gangs[(NS, "pg-same")]["status"]["conditions"]
    unschedulable = next(c for c in conditions if c["type"] == "Unschedulable")
    assert "no preemption (NothingToPreempt)" in unschedulable["message"], unschedulable


async def test_a_stray_reservation_taint_is_removed() -> None:
    store, bound = cluster(1, {})
    store.nodes["n0"]["spec"]["taints"] = [
        {"key": "quorum.dev/reserved", "value": "gone", "effect": "NoSchedule"}
    ]
    api = FakeApi(store)
    loop = GangLoop(api, store, bound, settings())
    await step(loop)
    assert taints(store, "n0") == []


async def test_a_victim_job_whose_suspend_is_quorums_is_suspended_not_deleted_then_resumed() -> None:
    store, bound = cluster(2, {})
    job_owner = {"kind": "Job", "name": "train", "uid": "job-uid", "controller": True}
    store.groups[("scheduling.sigs.k8s.io", NS, "train")] = podgroup("train", 2)
    for i, name in enumerate(["n0", "n1"]):
        p = pod("train", i, owner=job_owner)
        p["spec"].update(schedulingGates=[], nodeName=name, priority=10)
        p["status"] = {"phase": "Running", "startTime": "2026-11-23T00:00:00Z"}
        store.pods[p["metadata"]["uid"]] = p
        bound.upsert(p)
    held(store, "high", 2, 1000)
    api = FakeApi(store)
    api.jobs[(NS, "train")] = {
        "metadata": {"name": "train", "uid": "job-uid"},
        "spec": {},
        "status": {"active": 2},
    }
    loop = GangLoop(api, store, bound, settings())
    await step(loop)
    assert api.victims_deleted == [] and api.jobs[(NS, "train")]["spec"]["suspend"] is True
    assert store.gangs[(NS, "pg-train")]["status"]["recovery"]["suspendedJobs"] == ["train"]
    for uid in ("train-0", "train-1"):  # the Job controller deletes its pods
        del store.pods[uid]
        bound.remove(uid)
    api.jobs[(NS, "train")]["status"] = {}
    loop.memory[(NS, "pg-train")].polled = None
    await step(loop)
    assert api.jobs[(NS, "train")]["spec"]["suspend"] is False, "resumed once its pods are gone"


async def test_a_preemption_whose_first_write_fails_backs_off_alone_and_the_pass_goes_on() -> None:
    store, bound = cluster(3, {})
    running(store, bound, "low", 2, 10, ["n0", "n1"])
    held(store, "high", 2, 1000)
    held(store, "small", 1, 0)
    api = FakeApi(store)
    api.fail("create_gang", when=lambda ns, name, *rest: name == "pg-high")  # its Gang: 500, always
    loop = GangLoop(api, store, bound, settings())
    await step(loop)  # raised out of the pass before: nothing else happened
    assert released(store, "small") == ["small-0"], "another gang is released in the same pass"
    assert api.victims_deleted == [] and all(taints(store, n) == [] for n in ("n0", "n1", "n2"))
    failure = loop.work.failures[(NS, "pg-high")]
    assert failure.stage == "preempt" and "etcdserver: request timed out" in failure.sentence()
    told = [(name, m) for name, r, m, warn in api.events if r == "PlanningFailed" and warn]
    assert told == [("high-0", failure.sentence())], "no Gang yet: told on its first pod"

    api.heal()
    loop.work.failures[(NS, "pg-high")] = dataclasses.replace(failure, until=0.0)
    await step(loop)  # its backoff over: the preemption is decided again and goes ahead
    assert sorted(api.victims_deleted) == ["low-0", "low-1"]


async def test_pods_of_a_system_critical_priority_are_never_victims_wherever_they_run() -> None:
    """Told apart by their PriorityClass, which the platform hands out, not by namespace: a
    customer may create pods in kube-system, and a pod of user priority there is taken."""
    store, bound = cluster(3, {})
    for i, (namespace, priority) in enumerate(
        [("kube-system", 2_000_000_000), ("team-a", 2_000_001_000), ("kube-system", 0)]
    ):
        p = pod(f"sys{i}", 0)
        p["metadata"].update(namespace=namespace, labels={})
        p["spec"].update(schedulingGates=[], nodeName=f"n{i}", priority=priority)
        p["status"] = {"phase": "Running"}
        store.pods[p["metadata"]["uid"]] = p
        bound.upsert(p)
    held(store, "high", 2, 1000)
    api = FakeApi(store)
    loop = GangLoop(api, store, bound, settings())
    await step(loop)
    await step(loop)  # the status written after the decision
    assert api.victims_deleted == [] and all(taints(store, f"n{i}") == [] for i in range(3))
    conditions = store.gangs[(NS, "pg-high")]["status"]["conditions"]
    unschedulable = next(c for c in conditions if c["type"] == "Unschedulable")
    assert "no preemption (WouldNotFit)" in unschedulable["message"], unschedulable

    held(store, "one", 1, 1000)  # needs one node: the kube-system pod of user priority is taken
    await step(loop)
    assert api.victims_deleted == ["sys2-0"]


def foreign(store: Store, bound: BoundPods, name: str, node: str) -> None:
    """A pod of no gang, bound to `node` by someone else, taking all its GPUs."""
    p = pod("x", 0)
    p["metadata"].update(name=name, uid=name, labels={})
    p["spec"].update(schedulingGates=[], nodeName=node, priority=0)
    p["status"] = {"phase": "Running", "startTime": "2026-11-23T00:00:00Z"}
    store.pods[name] = p
    bound.upsert(p)


async def test_a_preemption_whose_room_went_to_another_backs_the_next_one_off() -> None:
    """The room a preemption freed is taken by a pod that is not the preemptor's: the preemption
    ends without its gang bound, and the next one (with new victims) waits twice as long, then
    four times: fewer victims lose their work to a preemption that cannot succeed."""
    with clock.using(clock.ManualClock()) as now:
        store, bound = cluster(1, {})
        running(store, bound, "low", 1, 10, ["n0"])
        held(store, "high", 1, 1000)
        api = FakeApi(store)
        timeout = PreemptionLoopSettings().timeout_seconds
        retry = PreemptionLoopSettings().retry_seconds
        loop = GangLoop(api, store, bound, settings())
        for victims, (ended, backoff) in enumerate([(0.0, 2 * retry), (0.0, 4 * retry)], start=1):
            await step(loop)  # the preemption starts: the pod on n0 is deleted
            assert len(api.victims_deleted) == victims
            victims_gone(bound, api)
            foreign(store, bound, f"taker-{victims}", "n0")  # the freed room goes to someone else
            now.advance(timeout + 1 + ended)
            await step(loop)  # the deadline passed, the gang never bound: the preemption ends
            assert not store.gangs[(NS, "pg-high")]["status"].get("preemption")
            now.advance(backoff - 1)
            await step(loop)
            await step(loop)
            assert len(api.victims_deleted) == victims, "preempted again before its backoff ended"
            now.advance(2)
        for _ in range(3):  # once its backoff has ended it preempts again, within a pass or two
            await step(loop)
            if len(api.victims_deleted) == 3:
                break
        assert len(api.victims_deleted) == 3


async def test_a_starving_gang_may_take_the_work_on_the_nodes_held_for_it() -> None:
    """The starvation guard holds n0 for the gang; the work there is of higher priority first,
    then of lower. The room held for the gang is its own: freeing the lower-priority work makes
    it fit, and the preemption goes ahead (it was refused as WouldNotFit when the decision
    counted the gang's own hold as taken)."""
    with clock.using(clock.ManualClock()) as now:
        store, bound = cluster(1, {})
        running(store, bound, "top", 1, 5000, ["n0"])
        held(store, "high", 1, 1000)
        api = FakeApi(store)
        loop = GangLoop(api, store, bound, settings())
        await step(loop)
        assert api.victims_deleted == []
        now.advance(PlannerSettings().starvation_seconds + 1)
        await step(loop)  # starving: n0 is held for it
        await step(loop)
        conditions = {c["type"]: c for c in store.gangs[(NS, "pg-high")]["status"]["conditions"]}
        assert conditions["CapacityHeld"]["reason"] == "Starving", conditions["CapacityHeld"]
        assert "no preemption (NothingToPreempt)" in conditions["Unschedulable"]["message"]
        del store.pods["top-0"]  # the higher-priority work ends; work of priority 0 takes n0
        bound.remove("top-0")
        foreign(store, bound, "taker", "n0")
        now.advance(PreemptionLoopSettings().retry_seconds + 1)
        await step(loop)
        status = store.gangs[(NS, "pg-high")]["status"]
        assert api.victims_deleted == ["taker"], status["conditions"]
        assert [t["value"] for t in taints(store, "n0")] == [status["preemption"]["token"]]


async def test_a_gang_whose_preemption_ends_during_the_plan_is_not_shown_unheld(monkeypatch: Any) -> None:
    """The pass that ends a preemption does not plan its gang (its task is in flight). When the
    task ends while the plan runs, the gang's status waits for the next pass: composed now, it
    would show the gang not held (Unschedulable False), restarting its Unschedulable time and
    its starvation clock, depending on whether the task or the plan came first."""
    planned = snapshot.plan

    def slow_plan(*args: Any) -> Any:
        time.sleep(0.2)  # in the worker thread: the end task runs to its end meanwhile
        return planned(*args)

    with clock.using(clock.ManualClock()) as now:
        store, bound = cluster(1, {})
        running(store, bound, "low", 1, 10, ["n0"])
        held(store, "high", 1, 1000)
        api = FakeApi(store)
        loop = GangLoop(api, store, bound, settings())
        await step(loop)  # the preemption starts
        victims_gone(bound, api)
        foreign(store, bound, "taker", "n0")  # the freed room goes to someone else
        now.advance(PreemptionLoopSettings().timeout_seconds + 1)
        monkeypatch.setattr(loop_module, "plan", slow_plan)
        await step(loop)  # the preemption ends, during the plan
        assert not store.gangs[(NS, "pg-high")]["status"].get("preemption")
        monkeypatch.setattr(loop_module, "plan", planned)
        now.advance(1)
        await step(loop)
        written = [
            next(c["status"] for c in status["conditions"] if c["type"] == "Unschedulable")
            for ns, name, status in api.called("patch_gang_status")
            if name == "pg-high" and "conditions" in status
        ]
        assert written and set(written) == {"True"}, written


class Recording(FakeApi):
    """The fake API, also keeping each Event's namespace and kind."""

    def __init__(self, store: Store) -> None:
        super().__init__(store)
        self.posted: list[tuple[str, str, str, str, str]] = []  # (namespace, kind, name, reason, message)

    async def post_event(self, obj: JSON, reason: str, message: str, warning: bool = False) -> None:
        await super().post_event(obj, reason, message, warning)
        meta = obj["metadata"]
        self.posted.append((meta.get("namespace") or "", obj["kind"], meta["name"], reason, message))


def running_in(
    store: Store, bound: BoundPods, namespace: str, group: str, nodes: list[str], priority: int
) -> None:
    """`running`, in another namespace."""
    running(store, bound, group, len(nodes), priority, nodes)
    group_object = store.groups.pop(("scheduling.sigs.k8s.io", NS, group))
    group_object["metadata"]["namespace"] = namespace
    store.groups[("scheduling.sigs.k8s.io", namespace, group)] = group_object
    for i in range(len(nodes)):
        p = store.pods[f"{group}-{i}"]
        p["metadata"]["namespace"] = namespace
        bound.upsert(p)


def held_in(store: Store, namespace: str, group: str, size: int, priority: int) -> None:
    held(store, group, size, priority)
    group_object = store.groups.pop(("scheduling.sigs.k8s.io", NS, group))
    group_object["metadata"]["namespace"] = namespace
    store.groups[("scheduling.sigs.k8s.io", namespace, group)] = group_object
    for i in range(size):
        store.pods[f"{group}-{i}"]["metadata"]["namespace"] = namespace


async def test_each_namespace_is_told_only_of_its_own_and_the_platform_of_everything() -> None:
    """A gang of namespace ml-hi takes a gang of team-b (past team-b's budget) and a lone pod
    of team-c. Whatever quorum writes into a namespace (Gang status, Events, the victims'
    DisruptionTarget condition) names no object of another namespace and no node; the Event in
    quorum's own namespace names them all. A new leader, which knows the reserved nodes only
    by their taint, ends the preemption and removes them."""
    store, bound = cluster(3, {})
    running_in(store, bound, "team-b", "low", ["n0", "n1"], 10)
    foreign(store, bound, "solo", "n2")
    store.pods["solo"]["metadata"]["namespace"] = "team-c"
    bound.upsert(store.pods["solo"])
    store.pdbs[("team-b", "keep-low")] = {
        "metadata": {"name": "keep-low", "namespace": "team-b"},
        "spec": {"selector": {"matchLabels": {"pod-group.scheduling.sigs.k8s.io": "low"}}},
        "status": {"disruptionsAllowed": 0},
    }
    held_in(store, "ml-hi", "high", 3, 1000)
    api = Recording(store)
    await step(GangLoop(api, store, bound, settings()))
    assert sorted(api.victims_deleted) == ["low-0", "low-1", "solo"]

    written: dict[str, list[str]] = {}
    for namespace, name, status in api.called("patch_gang_status"):
        written.setdefault(namespace, []).append(f"{name} {json.dumps(status)}")
    for namespace, kind, name, reason, message in api.posted:
        written.setdefault(namespace, []).append(f"{kind} {name} {reason}: {message}")
    home = {"low-0": "team-b", "low-1": "team-b", "solo": "team-c"}
    for uid, (_, message) in api.disruption_targets.items():
        written.setdefault(home[uid], []).append(message)
    names = {
        "ml-hi": ["ml-hi", "pg-high", "high-0"],
        "team-b": ["team-b", "pg-low", "low-0", "low-1", "keep-low"],
        "team-c": ["team-c", "solo"],
    }
    nodes = [r"\bn0\b", r"\bn1\b", r"\bn2\b"]
    for reader in names:
        assert written.get(reader), f"nothing was written into {reader}"
        foreign_names = [re.escape(n) for ns, listed in names.items() if ns != reader for n in listed]
        for text in written[reader]:
            for pattern in [*foreign_names, *nodes]:
                assert not re.search(pattern, text), f"{reader} is told {pattern}: {text}"

    [preempting] = [m for ns, _, _, r, m in api.posted if ns == "ml-hi" and r == "Preempting"]
    assert preempting == (
        "needed 24 nvidia.com/gpu: preempting 1 gang and 1 pod: 3 pods of other namespaces (1 gang whole, "
        "1 pod alone; priority ≤ 10); past 1 PodDisruptionBudget of other namespaces; reserved 3 nodes"
    )
    told = (
        "preempted by a gang of another namespace (priority 1000): needed 24 nvidia.com/gpu; "
        "past PodDisruptionBudget team-b/keep-low (allows 0, takes 2)"
    )
    assert api.disruption_targets["low-0"] == ("PreemptionByQuorum", told)
    preempted = store.gangs[("team-b", "pg-low")]["status"]["preempted"]
    assert preempted["message"] == told and "by" not in preempted
    assert ("team-c", "Pod", "solo", "Preempted") in {p[:4] for p in api.posted}

    [(kind, name, platform)] = [(k, n, m) for ns, k, n, r, m in api.posted if ns == "quorum-system"]
    assert (kind, name) == ("Lease", "quorum-operator")
    for named in ("gang ml-hi/pg-high (priority 1000)", "team-b/pg-low", "team-c/solo", "team-b/keep-low"):
        assert named in platform, platform
    assert platform.endswith("reserved nodes n0, n1, n2")

    token = store.gangs[("ml-hi", "pg-high")]["status"]["preemption"]["token"]
    assert all([t["value"] for t in taints(store, n)] == [token] for n in ("n0", "n1", "n2"))
    victims_gone(bound, api)
    successor = GangLoop(api, store, bound, settings())  # a new leader: no memory of the taints
    await step(successor)
    bind_released(store, bound, api)
    await step(successor)
    assert not store.gangs[("ml-hi", "pg-high")]["status"].get("preemption")
    assert all(taints(store, n) == [] for n in ("n0", "n1", "n2")), "found again by their token"


async def test_a_node_that_cannot_be_reserved_ends_the_preemption_unnamed_to_the_tenant(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """n1 changed before its taint: nothing is taken, the taint already on n0 is removed, and the
    Gang's PreemptionEnded Event says why without naming the node (the log does)."""
    store, bound = cluster(2, {})
    running(store, bound, "low", 2, 10, ["n0", "n1"])
    held(store, "high", 2, 1000)
    api = FakeApi(store)
    taint = api.taint_node

    async def n1_changed(node: JSON, token: str, add: bool) -> bool:
        if add and node["metadata"]["name"] == "n1":
            return False
        return await taint(node, token, add)

    monkeypatch.setattr(api, "taint_node", n1_changed)
    await step(GangLoop(api, store, bound, settings()))
    assert api.victims_deleted == [] and api.disruption_targets == {}
    assert taints(store, "n0") == [] and taints(store, "n1") == []
    [ended] = [m for name, r, m, _ in api.events if r == "PreemptionEnded" and name == "pg-high"]
    assert ended == "a node changed or went before it could be reserved"


async def test_the_next_preemption_goes_to_another_tenant_than_the_last() -> None:
    """Tenant ns's gangs a1 and a2 and tenant team-b's b1, all of priority 1000, all held behind
    two low-priority gangs. a1 preempts first (queue order); once it ends, the next preemption is
    b1's, though a2 is ahead of it in queue order."""
    store, bound = cluster(4, {})
    running(store, bound, "low1", 2, 10, ["n0", "n1"])
    running(store, bound, "low2", 2, 10, ["n2", "n3"])
    held(store, "a1", 2, 1000)
    held(store, "a2", 2, 1000)
    store.groups[("scheduling.sigs.k8s.io", "team-b", "b1")] = {
        **podgroup("b1", 2),
        "metadata": {**podgroup("b1", 2)["metadata"], "namespace": "team-b"},
    }
    for i in range(2):
        p = pod("b1", i, owner=REPLICA_SET)
        p["metadata"]["namespace"] = "team-b"
        p["metadata"]["uid"] = f"team-b-b1-{i}"
        p["spec"]["priority"] = 1000
        store.pods[p["metadata"]["uid"]] = p
    api = FakeApi(store)
    loop = GangLoop(api, store, bound, settings())
    await step(loop)
    assert store.gangs[(NS, "pg-a1")]["status"].get("preemption"), "the first in queue order"
    victims_gone(bound, api)
    await step(loop)
    bind_released(store, bound, api)
    await step(loop)  # a1 bound: its preemption ends
    assert not store.gangs[(NS, "pg-a1")]["status"].get("preemption")
    await step(loop)
    assert store.gangs[("team-b", "pg-b1")]["status"].get("preemption"), "another tenant's turn"
    assert not (store.gangs.get((NS, "pg-a2")) or {}).get("status", {}).get("preemption")


async def test_a_new_gang_name_does_not_reset_its_tenants_backoff() -> None:
    """A preemption ends without its gang bound (the room went to someone else); the tenant
    deletes that gang and makes another: the new one waits out the same backoff before it may
    take anyone's work."""
    with clock.using(clock.ManualClock()) as now:
        store, bound = cluster(1, {})
        running(store, bound, "low", 1, 10, ["n0"])
        held(store, "high", 1, 1000)
        api = FakeApi(store)
        timeout = PreemptionLoopSettings().timeout_seconds
        retry = PreemptionLoopSettings().retry_seconds
        loop = GangLoop(api, store, bound, settings())
        await step(loop)  # the preemption starts
        assert api.victims_deleted == ["low-0"]
        victims_gone(bound, api)
        foreign(store, bound, "taker", "n0")
        now.advance(timeout + 1)
        await step(loop)  # expired
        assert not store.gangs[(NS, "pg-high")]["status"].get("preemption")
        del store.pods["high-0"], store.groups[("scheduling.sigs.k8s.io", NS, "high")]
        held(store, "renamed", 1, 1000)
        now.advance(2 * retry - 1)
        await step(loop)
        await step(loop)
        assert api.victims_deleted == ["low-0"], "a new name preempted before its tenant's backoff ended"
        now.advance(2)
        for _ in range(3):
            await step(loop)
            if len(api.victims_deleted) == 2:
                break
        assert api.victims_deleted == ["low-0", "taker"]
