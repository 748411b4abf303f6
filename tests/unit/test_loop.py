"""The scheduling loop against a stateful fake API that can fail or hang any call: one gang's
trouble stays that gang's, reservations live from the decision until the pod is bound, failed
writes are made again, and a restart finishes recorded releases only where they still fit."""

from __future__ import annotations

import asyncio
import copy
import time
from collections.abc import Callable
from typing import Any

from quorum.core.lifecycle import BackoffPolicy
from quorum.core.planner import PlannerSettings
from quorum.k8s.usage import BoundPods
from quorum.operator import clock
from quorum.operator.gangs import Store
from quorum.operator.loop import GangLoop
from quorum.operator.settings import LoopSettings
from tests.unit.fake_api import FakeApi, server_error

JSON = dict[str, Any]
NS = "ns"
REPLICA_SET = {"kind": "ReplicaSet", "name": "rs", "uid": "rs", "controller": True}  # a pod's controller


def node(name: str, gpus: int = 8) -> JSON:
    return {
        "metadata": {
            "name": name,
            "resourceVersion": "1",
            "labels": {"node.coreweave.cloud/state": "production"},
        },
        "spec": {},
        "status": {
            "allocatable": {"nvidia.com/gpu": str(gpus), "cpu": "128", "memory": "1Ti", "pods": "110"},
            "conditions": [{"type": "Ready", "status": "True"}],
        },
    }


def pod(group: str, index: int, gpus: int = 8, owner: JSON | None = None) -> JSON:
    meta: JSON = {
        "name": f"{group}-{index}",
        "uid": f"{group}-{index}",
        "namespace": NS,
        "creationTimestamp": "2026-11-22T00:00:00Z",
        "labels": {"quorum.dev/gang": f"pg-{group}", "pod-group.scheduling.sigs.k8s.io": group},
    }
    if owner is not None:
        meta["ownerReferences"] = [owner]
    return {
        "metadata": meta,
        "spec": {
            "schedulingGates": [{"name": "quorum.dev/gang"}],
            "schedulerName": "default-scheduler",
            "containers": [
                {"name": "c", "resources": {"requests": {"nvidia.com/gpu": str(gpus), "cpu": "1"}}}
            ],
        },
        "status": {"phase": "Pending"},
    }


def podgroup(name: str, min_member: int) -> JSON:
    return {
        "apiVersion": "scheduling.sigs.k8s.io/v1alpha1",
        "kind": "PodGroup",
        "metadata": {
            "name": name,
            "namespace": NS,
            "uid": f"uid-{name}",
            "creationTimestamp": "2026-11-22T00:00:00Z",
        },
        "spec": {"minMember": min_member},
    }


def cluster(
    nodes: int, gangs: dict[str, int], gpus: int = 8, owner: JSON | None = None
) -> tuple[Store, BoundPods]:
    """A store as the watches would fill it: `nodes` 8-GPU nodes and gangs (name -> pods of
    `gpus` GPUs each, minMember all of them)."""
    store = Store()
    for i in range(nodes):
        store.nodes[f"n{i}"] = node(f"n{i}")
    for name, size in gangs.items():
        store.groups[("scheduling.sigs.k8s.io", NS, name)] = podgroup(name, size)
        for i in range(size):
            p = pod(name, i, gpus, owner)
            store.pods[p["metadata"]["uid"]] = p
    bound = BoundPods()
    bound.replace_all(list(store.pods.values()))
    return store, bound


def settings(**overrides: Any) -> LoopSettings:
    base: JSON = {
        "forming_grace_seconds": 0.0,
        "status_interval_seconds": 0.0,
        "gang_timeout_seconds": 5.0,
        "failure_backoff": BackoffPolicy(0.05, 0.2),
    }
    return LoopSettings(**{**base, **overrides})


async def settle(loop: GangLoop) -> None:
    """Wait until every gang's task has ended (a positive signal: the task table is empty)."""
    while loop.work.running or loop.reports:
        await asyncio.gather(*loop.work.running, *loop.reports, return_exceptions=True)


async def step(loop: GangLoop) -> None:
    await loop.step()
    await settle(loop)


def released(store: Store, gang: str) -> list[str]:
    return sorted(
        uid
        for uid, p in store.pods.items()
        if p["metadata"]["labels"]["quorum.dev/gang"] == f"pg-{gang}" and not p["spec"]["schedulingGates"]
    )


def bind(store: Store, bound: BoundPods, api: FakeApi, uids: list[str]) -> None:
    """kube-scheduler binds released pods to the node their release pinned them to."""
    for uid in uids:
        p = copy.deepcopy(store.pods[uid])
        p["spec"]["nodeName"] = api.pinned[uid]
        store.pods[uid] = p
        bound.upsert(p)


async def eventually(check: Callable[[], bool], what: str) -> None:
    deadline = time.monotonic() + 5
    while not check():
        assert time.monotonic() < deadline, f"timed out waiting for {what}"
        await asyncio.sleep(0.01)


async def test_a_gang_whose_status_writes_fail_delays_no_other_gang_and_is_written_once_they_work() -> None:
    store, bound = cluster(4, {"a": 2, "b": 2}, gpus=16)  # neither fits: both held, both written
    api = FakeApi(store)
    api.fail("patch_gang_status", when=lambda ns, name, status: name == "pg-a")
    loop = GangLoop(api, store, bound, settings())
    await step(loop)
    assert loop.work.failures[(NS, "pg-a")].stage == "status"
    assert "the apiserver answered 500" in loop.work.failures[(NS, "pg-a")].message
    assert store.gangs[(NS, "pg-b")]["status"]["conditions"][1]["status"] == "True"  # b: Unschedulable
    assert ("pg-a", "PlanningFailed") in [(o, r) for o, r, _, w in api.events if w]
    api.heal()
    await asyncio.sleep(0.06)  # the backoff (0.05 s) ends
    await step(loop)
    status = store.gangs[(NS, "pg-a")]["status"]
    assert status["phase"] == "Pending" and (NS, "pg-a") not in loop.work.failures
    unschedulable = next(c for c in status["conditions"] if c["type"] == "Unschedulable")
    assert unschedulable["status"] == "True"


async def test_one_gangs_hung_write_holds_neither_the_pass_nor_another_gangs_release() -> None:
    store, bound = cluster(4, {"a": 2, "b": 2})
    api = FakeApi(store)
    gate = api.hang("create_gang", when=lambda ns, name, spec, owner: name == "pg-a")
    loop = GangLoop(api, store, bound, settings(gang_timeout_seconds=0.2))
    await loop.step()  # returns although a's task hangs
    assert loop.work.busy((NS, "pg-a"))
    await eventually(lambda: released(store, "b") == ["b-0", "b-1"], "gang b released")
    assert released(store, "a") == []
    assert len(loop.ledger.of_gang((NS, "pg-a"))) == 2, "a's room stays reserved while its task runs"
    await loop.step()  # a later pass does not plan a's pods again while its task runs
    assert len(api.called("create_gang")) == 2
    await settle(loop)  # a's task is cut off after 0.2 s
    assert loop.work.failures[(NS, "pg-a")].message == "timed out after 0s" or "timed out" in (
        loop.work.failures[(NS, "pg-a")].message
    )
    assert loop.ledger.of_gang((NS, "pg-a")) == {}, "nothing was recorded: nothing stays promised"
    gate.set()
    api.heal()
    await asyncio.sleep(0.06)
    await step(loop)
    assert released(store, "a") == ["a-0", "a-1"]


async def test_a_failed_pod_release_keeps_its_reservation_and_is_finished_on_the_recorded_node() -> None:
    store, bound = cluster(2, {"a": 2, "c": 1})
    api = FakeApi(store)
    api.fail("release_pod", times=1, when=lambda p, n: p["metadata"]["uid"] == "a-1")
    loop = GangLoop(api, store, bound, settings())
    await step(loop)
    assert released(store, "a") == ["a-0"] and loop.work.failures[(NS, "pg-a")].stage == "release"
    recorded = {e["uid"]: e["node"] for e in store.gangs[(NS, "pg-a")]["status"]["admission"]["placement"]}
    assert set(loop.ledger.of_gang((NS, "pg-a"))) == {"a-0", "a-1"}
    assert released(store, "c") == [], "the pod that failed keeps its room: gang c (one more node) waits"
    await asyncio.sleep(0.06)
    await step(loop)
    assert released(store, "a") == ["a-0", "a-1"] and api.pinned["a-1"] == recorded["a-1"]
    assert (NS, "pg-a") not in loop.work.failures
    assert len(store.gangs[(NS, "pg-a")]["status"]["admission"]["placement"]) == 2, "no second plan"
    bind(store, bound, api, ["a-0", "a-1"])
    await step(loop)
    assert loop.ledger.of_gang((NS, "pg-a")) == {}, "bound: the bound-pod index counts them now"


async def test_a_refused_decision_releases_nothing_and_promises_nothing() -> None:
    store, bound = cluster(2, {"a": 2})
    api = FakeApi(store)
    api.fail("patch_gang_status", error=server_error(422, "status.admission: Invalid value"), times=1)
    loop = GangLoop(api, store, bound, settings())
    await step(loop)
    failure = loop.work.failures[(NS, "pg-a")]
    assert failure.stage == "release" and "422" in failure.message and "status.admission" in failure.message
    assert released(store, "a") == [] and len(loop.ledger) == 0
    await asyncio.sleep(0.06)
    await step(loop)
    assert released(store, "a") == ["a-0", "a-1"]


async def test_a_restart_keeps_released_unbound_pods_reserved_and_finishes_the_release_where_it_fits() -> (
    None
):
    store, bound = cluster(2, {"a": 2, "b": 1})
    api = FakeApi(store)
    api.fail("release_pod", when=lambda p, n: p["metadata"]["uid"] == "a-1")  # the leader dies here
    first = GangLoop(
        api,
        store,
        bound,
        settings(),
    )
    await first.step()
    await settle(first)
    assert released(store, "a") == ["a-0"]
    api.heal()
    second = GangLoop(api, store, bound, settings())  # a new leader, from what the API shows
    second.resume()
    assert set(second.ledger.of_gang((NS, "pg-a"))) == {"a-0"}, "released, unbound: kept reserved"
    await step(second)
    assert released(store, "a") == ["a-0", "a-1"], "finished on the recorded nodes"
    assert released(store, "b") == [], "no room is handed out twice: b waits"


async def test_a_resumed_release_whose_nodes_filled_meanwhile_is_planned_anew_not_overcommitted() -> None:
    store, bound = cluster(2, {"a": 2}, owner=REPLICA_SET)
    api = FakeApi(store)
    api.fail("release_pod", when=lambda p, n: p["metadata"]["uid"] == "a-1")
    first = GangLoop(api, store, bound, settings())
    await step(first)
    node_of_a1 = next(
        e["node"] for e in store.gangs[(NS, "pg-a")]["status"]["admission"]["placement"] if e["uid"] == "a-1"
    )
    api.heal()
    squatter = pod("other", 0)  # someone else's pod took a-1's node while no leader acted
    squatter["spec"] = {**squatter["spec"], "schedulingGates": [], "nodeName": node_of_a1}
    squatter["metadata"]["labels"] = {}
    bound.upsert(squatter)
    second = GangLoop(api, store, bound, settings())
    second.resume()
    await step(second)
    assert "a-1" not in api.pinned, "not released onto a full node"
    assert api.called("delete_pod") == [], "nothing recovered before the gang's timeout"
    assert "recovery" not in store.gangs[(NS, "pg-a")]["status"]
    assert set(second.ledger.of_gang((NS, "pg-a"))) == {"a-0"}, "a-1 is planned anew, a-0 keeps its node"
    assert released(store, "a") == ["a-0"]


async def test_what_the_loop_keeps_per_gang_is_forgotten_when_the_gang_goes() -> None:
    store, bound = cluster(1, {"a": 2}, gpus=8)  # 2 x 8 GPUs on one 8-GPU node: held
    api = FakeApi(store)
    loop = GangLoop(api, store, bound, settings())
    await step(loop)
    key = (NS, "pg-a")
    assert loop.records.written(key) is not None and loop.holds.first_seen
    for uid in ("a-0", "a-1"):
        del store.pods[uid]
    del store.gangs[key]
    await step(loop)
    assert key not in loop.memory, "forgotten in one go: what was written, told, seen"
    assert not loop.holds.first_seen and not loop.records.told_waiting


async def test_a_gang_held_for_lack_of_room_gets_capacity_held_once_it_has_starved() -> None:
    store, bound = cluster(2, {"large": 2})
    for i in range(2):  # both nodes busy with someone else's bound pods
        busy = pod("busy", i)
        busy["metadata"]["labels"] = {}
        busy["spec"] = {**busy["spec"], "schedulingGates": [], "nodeName": f"n{i}"}
        bound.upsert(busy)
    api = FakeApi(store)
    loop = GangLoop(api, store, bound, settings(planner=PlannerSettings(starvation_seconds=0.0)))
    await step(loop)  # held, and its Gang made: Unschedulable since now
    assert loop.records.held_since((NS, "pg-large")) is not None, (
        "the hold's start survives the Gang's creation"
    )
    await step(loop)
    held = next(
        c for c in store.gangs[(NS, "pg-large")]["status"]["conditions"] if c["type"] == "CapacityHeld"
    )
    assert held["status"] == "True" and "holding 2 nodes for this gang" in held["message"]


async def test_a_recovered_gang_waits_out_its_backoff_even_while_the_store_shows_an_older_gang() -> None:
    with clock.using(clock.ManualClock()) as now:
        store, bound = cluster(2, {"a": 2}, owner=REPLICA_SET)
        api = FakeApi(store)
        loop = GangLoop(api, store, bound, settings(backoff=BackoffPolicy(30.0, 30.0)))
        await step(loop)
        bind(store, bound, api, ["a-0"])  # a-1 never binds
        before = copy.deepcopy(store.gangs[(NS, "pg-a")])
        now.advance(61)  # its timeout ends
        await step(loop)
        assert store.gangs[(NS, "pg-a")]["status"]["recovery"]["failures"] == 1
        store.gangs[(NS, "pg-a")] = before  # the watch lags: an older Gang, without the recovery
        for i in range(2, 4):  # the ReplicaSet makes its pods again, gated
            p = pod("a", i, owner=REPLICA_SET)
            store.pods[p["metadata"]["uid"]] = p
        await step(loop)
        assert released(store, "a") == [], "not planned before the backoff ends"
        written = loop.records.written((NS, "pg-a"))
        assert written is not None and written["conditions"][0]["reason"] == "Backoff"


async def test_a_gang_whose_status_write_is_in_flight_is_still_planned_and_released_after_it() -> None:
    store, bound = cluster(1, {"a": 1})
    busy = pod("busy", 0)
    busy["metadata"]["labels"] = {}
    busy["spec"] = {**busy["spec"], "schedulingGates": [], "nodeName": "n0"}
    bound.upsert(busy)
    api = FakeApi(store)
    loop = GangLoop(api, store, bound, settings())
    await step(loop)  # held: its Gang and status written
    gate = asyncio.Event()

    async def hung_status_write() -> None:
        await gate.wait()

    assert loop.work.start((NS, "pg-a"), "status", hung_status_write())
    bound.remove("busy-0")  # room frees
    await loop.step()
    assert set(loop.ledger.of_gang((NS, "pg-a"))) == {"a-0"}, "planned while its status write hangs"
    assert loop.work.stages[(NS, "pg-a")] == "release" and released(store, "a") == []
    gate.set()
    await settle(loop)
    assert released(store, "a") == ["a-0"], "released right after the status write"


async def test_losing_the_lease_stops_the_loop_even_while_events_pour_in() -> None:
    for _ in range(20):
        store, bound = cluster(1, {})
        for kind in ("pods", "nodes"):
            store.sync_event(kind).set()
        loop = GangLoop(FakeApi(store), store, bound, settings())
        running = asyncio.create_task(loop.run())

        async def flood(target: GangLoop = loop) -> None:
            while True:
                target.wake()
                await asyncio.sleep(0.001)

        flooding = asyncio.create_task(flood())
        await asyncio.sleep(0.02)
        running.cancel()  # what leader election does, once, when the Lease is lost
        done, _ = await asyncio.wait([running], timeout=2)
        flooding.cancel()
        assert done, "the loop went on after its cancel"
        assert not loop.leading and not loop.health.leading


async def test_a_recovery_that_fails_is_tried_again() -> None:
    with clock.using(clock.ManualClock()) as now:
        store, bound = cluster(2, {"a": 2})  # bare pods: recovery reports them and records it
        api = FakeApi(store)
        loop = GangLoop(api, store, bound, settings())
        await step(loop)
        bind(store, bound, api, ["a-0"])  # a-1 never binds
        now.advance(61)  # its timeout ends
        api.fail("patch_gang_status_if", times=1, when=lambda ns, name, expect, status: "recovery" in status)
        await step(loop)
        assert loop.work.failures[(NS, "pg-a")].stage == "recover"
        assert "recovery" not in store.gangs[(NS, "pg-a")]["status"]
        now.advance(1)  # its failure's backoff ends
        await step(loop)
        recovery = store.gangs[(NS, "pg-a")]["status"]["recovery"]
        assert recovery["failures"] == 1 and "left 2 pods as they are" in recovery["message"]
        assert (NS, "pg-a") not in loop.work.failures


async def test_a_pod_release_the_apiserver_refuses_is_final_and_the_pod_is_planned_anew() -> None:
    store, bound = cluster(2, {"a": 2})
    api = FakeApi(store)
    original = api.release_pod
    refused: list[str] = []

    async def refuse_once(pod_: JSON, node_: str | None, tolerate: str | None = None) -> bool:
        if pod_["metadata"]["uid"] == "a-1" and not refused:
            refused.append("a-1")  # a 422: its `test` failed (the pod changed meanwhile)
            return False
        return await original(pod_, node_, tolerate)

    api.release_pod = refuse_once  # type: ignore[method-assign,assignment]
    loop = GangLoop(api, store, bound, settings())
    await step(loop)
    assert released(store, "a") == ["a-0"] and "a-1" not in loop.ledger
    assert not loop.memory[(NS, "pg-a")].unfinished and (NS, "pg-a") not in loop.work.failures
    await step(loop)
    assert released(store, "a") == ["a-0", "a-1"], "planned anew, as the pod the gang still needs"
    assert store.gangs[(NS, "pg-a")]["status"]["admission"]["attempt"] == 2


async def test_a_new_leader_rewrites_no_unchanged_status_and_announces_no_hold_again() -> None:
    store, bound = cluster(1, {"a": 2})  # held: 2 x 8 GPUs, one 8-GPU node
    api = FakeApi(store)
    first = GangLoop(api, store, bound, settings())
    await step(first)
    writes = len(api.called("patch_gang_status"))
    events = len(api.events)
    second = GangLoop(api, store, bound, settings())
    second.resume()
    await step(second)
    assert len(api.called("patch_gang_status")) == writes, "nothing changed: nothing written"
    assert len(api.events) == events, "the hold was announced already"
    assert second.records.held_since((NS, "pg-a")) == first.records.held_since((NS, "pg-a"))
