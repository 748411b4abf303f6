"""The order of a preemption's steps (docs/preemption.md, "The order"): every victim recorded
on its own Gang (a Job to suspend in `status.recovery.suspendedJobs`, what recovery and `quorum
uninstall` resume) before anything is done to any victim; the platform's record and the
victims' Events before the first mark; then marks, suspensions, deletions. A write that fails
at any point, or a leader cut off between victims, leaves no Job suspended without a record,
and recovery (this leader's or a new one's) resumes every suspended one once its pods are gone."""

from __future__ import annotations

import asyncio
import copy
from collections.abc import Callable
from typing import Any

import pytest

from quorum.k8s.usage import BoundPods
from quorum.operator.gangs import Store
from quorum.operator.loop import GangLoop
from tests.unit.fake_api import FakeApi
from tests.unit.test_loop import NS, REPLICA_SET, cluster, pod, podgroup, settings, step
from tests.unit.test_loop_preemption import held

JSON = dict[str, Any]
JOBS = ("a", "b")  # victim gangs whose pods are a Job's (pg-a: Job a), each on its own node


class OrderedApi(FakeApi):
    """Checks, at each act on a victim, that what must come before it has: its Job recorded on
    its Gang before it is suspended; every victim recorded and the platform's Event posted
    before the first mark."""

    def __init__(self, store: Store) -> None:
        super().__init__(store)
        self.wrong: list[str] = []

    def recorded(self, gang: str) -> list[str]:
        status = (self.server.gangs.get((NS, gang)) or {}).get("status") or {}
        return list((status.get("recovery") or {}).get("suspendedJobs") or [])

    async def mark_disruption_target(self, pod: JSON, reason: str, message: str) -> bool:
        if not self.will_fail("mark_disruption_target", pod, reason, message):
            if not any(o == "quorum-operator" and r == "Preempting" for o, r, _, _ in self.events):
                self.wrong.append(f"marked {pod['metadata']['name']} before the platform's record")
            for job in JOBS:
                if job not in self.recorded(f"pg-{job}"):
                    self.wrong.append(f"marked {pod['metadata']['name']} before Job {job} was recorded")
        return await super().mark_disruption_target(pod, reason, message)

    async def set_job_suspend(self, namespace: str, name: str, uid: str, suspend: bool) -> bool:
        failing = self.will_fail("set_job_suspend", namespace, name, uid, suspend)
        if suspend and not failing and name not in self.recorded(f"pg-{name}"):
            self.wrong.append(f"suspended Job {name} before its Gang recorded it")
        return await super().set_job_suspend(namespace, name, uid, suspend)


def scene(api_type: type[OrderedApi] = OrderedApi) -> tuple[Store, BoundPods, OrderedApi, GangLoop]:
    """Two victim Job gangs (a, b) and a ReplicaSet's gang (c), one node each; a gang of higher
    priority needs all three nodes."""
    store, bound = cluster(3, {})
    for i, name in enumerate(JOBS):
        owner = {"kind": "Job", "name": name, "uid": f"job-{name}", "controller": True}
        store.groups[("scheduling.sigs.k8s.io", NS, name)] = podgroup(name, 1)
        p = pod(name, 0, owner=owner)
        p["spec"].update(schedulingGates=[], nodeName=f"n{i}", priority=10)
        p["status"] = {"phase": "Running", "startTime": "2026-11-23T00:00:00Z"}
        store.pods[p["metadata"]["uid"]] = p
        bound.upsert(p)
    store.groups[("scheduling.sigs.k8s.io", NS, "c")] = podgroup("c", 1)
    p = pod("c", 0, owner=REPLICA_SET)
    p["spec"].update(schedulingGates=[], nodeName="n2", priority=10)
    p["status"] = {"phase": "Running", "startTime": "2026-11-23T00:00:00Z"}
    store.pods[p["metadata"]["uid"]] = p
    bound.upsert(p)
    api = api_type(store)
    for name in JOBS:
        api.jobs[(NS, name)] = {
            "metadata": {"name": name, "namespace": NS, "uid": f"job-{name}"},
            "spec": {},
            "status": {"active": 1},
        }
    loop = GangLoop(api, store, bound, settings())
    return store, bound, api, loop


async def admitted(loop: GangLoop, store: Store) -> None:
    """The victims' Gangs exist (a pass makes them), then the preemptor arrives."""
    await step(loop)
    assert all((NS, f"pg-{n}") in store.gangs for n in (*JOBS, "c"))
    held(store, "high", 3, 1000)


def suspended(api: FakeApi) -> list[str]:
    return sorted(name for (_, name), job in api.jobs.items() if job["spec"].get("suspend"))


def unrecorded(api: OrderedApi) -> list[str]:
    return [name for name in suspended(api) if name not in api.recorded(f"pg-{name}")]


async def jobs_controller_and_recovery(store: Store, bound: BoundPods, api: FakeApi, loop: GangLoop) -> None:
    """A suspended Job's controller deletes its pods; then recovery passes."""
    for name in suspended(api):
        uid = f"{name}-0"
        if store.pods.pop(uid, None) is not None:
            bound.remove(uid)
        api.jobs[(NS, name)]["status"] = {}
    for key in list(loop.memory.entries):
        loop.memory[key].polled = None
    await step(loop)


async def test_every_victim_is_recorded_and_told_before_the_first_mark_and_a_job_before_its_suspension() -> (
    None
):
    store, bound, api, loop = scene()
    await admitted(loop, store)
    await step(loop)
    assert api.wrong == []
    assert suspended(api) == ["a", "b"] and api.victims_deleted == ["c-0"]
    platform = [
        i for i, (o, r, _, _) in enumerate(api.events) if o == "quorum-operator" and r == "Preempting"
    ]
    first_mark = min(i for i, (m, _) in enumerate(api.calls) if m == "mark_disruption_target")
    posted = [i for i, (m, args) in enumerate(api.calls) if m == "post_event" and args[1] == "Preempting"]
    assert platform and posted and max(posted) < first_mark, "the full record before the first mark"
    await jobs_controller_and_recovery(store, bound, api, loop)
    assert suspended(api) == [], "each resumed once its pods are gone"
    assert api.recorded("pg-a") == [] == api.recorded("pg-b")


def victim_event(obj: JSON, reason: str, *_: Any) -> bool:
    return bool(obj["metadata"]["name"] == "pg-a" and reason == "Preempted")


FAULTS: dict[str, tuple[str, Callable[..., bool]]] = {
    "victim a's Event": ("post_event", victim_event),
    "the platform's Event": (
        "post_event",
        lambda obj, reason, *_: obj["metadata"]["name"] == "quorum-operator",
    ),
    "victim b's status": (
        "patch_gang_status",
        lambda ns, name, status: name == "pg-b" and "preempted" in status,
    ),
    "victim a's mark": ("mark_disruption_target", lambda p, *_: p["metadata"]["name"] == "a-0"),
    "Job a's suspension": ("set_job_suspend", lambda ns, name, uid, suspend: name == "a" and suspend),
    "victim c's deletion": ("delete_victim", lambda p: p["metadata"]["name"] == "c-0"),
}


@pytest.mark.parametrize("where", sorted(FAULTS))
async def test_a_write_that_fails_anywhere_leaves_no_job_suspended_without_a_record(where: str) -> None:
    store, bound, api, loop = scene()
    await admitted(loop, store)
    method, when = FAULTS[where]
    api.fail(method, when=when)
    await step(loop)
    assert api.wrong == []
    assert unrecorded(api) == [], f"suspended without a record: {unrecorded(api)}"
    if method in ("post_event", "patch_gang_status"):  # before the first mark: nothing taken
        assert suspended(api) == [] and api.victims_deleted == [] and api.disruption_targets == {}
        assert not (store.gangs[(NS, "pg-high")].get("status") or {}).get("preemption"), "ended"
        for name in (*JOBS, "c"):  # else a member lost later would be taken for preempted
            status = api.server.gangs[(NS, f"pg-{name}")].get("status") or {}
            assert not status.get("preempted"), f"pg-{name} still recorded as preempted: {status}"
    api.heal()
    for _ in range(3):
        await jobs_controller_and_recovery(store, bound, api, loop)
        assert unrecorded(api) == []
    assert suspended(api) == [], "every suspended Job resumed by recovery once its pods are gone"
    assert api.recorded("pg-a") == [] == api.recorded("pg-b"), "records of Jobs never suspended dropped"


async def test_a_leader_cut_off_between_victims_leaves_them_to_the_next_one() -> None:
    """The old leader records victim a, then hangs recording b and is cut off: nothing was done
    to any victim; the new leader's recovery drops the record of Job a, never suspended."""
    store, bound, api, loop = scene()
    await admitted(loop, store)
    gate = api.hang("patch_gang_status", lambda ns, name, status: name == "pg-b" and "preempted" in status)
    await loop.step()
    for _ in range(50):
        await asyncio.sleep(0)
    assert api.recorded("pg-a") == ["a"] and suspended(api) == [], "a recorded, nothing suspended yet"
    await loop.work.cancel_all()
    gate.set()
    api.heal()
    assert unrecorded(api) == [] and api.disruption_targets == {} and api.victims_deleted == []
    new = GangLoop(api, store, bound, settings())
    new.resume()
    for _ in range(3):
        await jobs_controller_and_recovery(store, bound, api, new)
        assert api.wrong == [] and unrecorded(api) == []
    assert suspended(api) == []


async def test_a_leader_cut_off_between_suspensions_leaves_the_suspended_job_recorded_and_resumed() -> None:
    store, bound, api, loop = scene()
    await admitted(loop, store)
    gate = api.hang("set_job_suspend", lambda ns, name, uid, suspend: name == "b" and suspend)
    await loop.step()
    for _ in range(200):
        await asyncio.sleep(0)
    assert suspended(api) == ["a"] and unrecorded(api) == []
    await loop.work.cancel_all()
    gate.set()
    api.heal()
    new = GangLoop(api, store, bound, settings())
    new.resume()
    for _ in range(3):
        await jobs_controller_and_recovery(store, bound, api, new)
        assert api.wrong == [] and unrecorded(api) == []
    assert suspended(api) == [], "Job a resumed by the new leader's recovery; b's record dropped"
    assert api.recorded("pg-a") == [] == api.recorded("pg-b")


async def test_recovery_does_not_drop_a_job_a_preemption_recorded_and_has_yet_to_suspend() -> None:
    """A recovery pass of the victim between its record and its suspension sees the Job not
    suspended: it is not taken for resumed by someone else while this process may suspend it."""
    store, _, api, loop = scene()
    await admitted(loop, store)
    gate = api.hang("mark_disruption_target")
    await loop.step()
    for _ in range(200):
        await asyncio.sleep(0)
    assert api.recorded("pg-a") == ["a"] and suspended(api) == []
    for key in list(loop.memory.entries):
        loop.memory[key].polled = None
    await loop.step()  # recovery of pg-a and pg-b runs meanwhile
    for _ in range(50):
        await asyncio.sleep(0)
    assert api.recorded("pg-a") == ["a"] and api.recorded("pg-b") == ["b"], "kept while it may be suspended"
    gate.set()
    api.heal()
    await step(loop)
    assert suspended(api) == ["a", "b"] and unrecorded(api) == [] and api.wrong == []


class AnswerFromTheCallApi(OrderedApi):
    """A Job read answers with the Job as it was when the call went out (a slow answer)."""

    async def read_job(self, namespace: str, name: str) -> JSON | None:
        sent = copy.deepcopy(self.jobs.get((namespace, name)))
        await super().read_job(namespace, name)
        return sent


async def test_a_recovery_read_that_crosses_the_suspension_does_not_drop_the_jobs_record() -> None:
    """Found by review: the victim's recovery reads Job a (not suspended yet); the preemption
    suspends it and lets it go before the answer comes: the stale answer must not take it for
    resumed by someone else and drop its record (nothing would resume it)."""
    store, _, api, loop = scene(AnswerFromTheCallApi)
    await admitted(loop, store)
    marks = api.hang("mark_disruption_target")
    await loop.step()
    for _ in range(200):
        await asyncio.sleep(0)
    assert api.recorded("pg-a") == ["a"] and suspended(api) == []
    reads = api.hang("read_job", lambda ns, name: name == "a")
    for key in list(loop.memory.entries):
        loop.memory[key].polled = None
    await loop.step()  # pg-a's recovery reads Job a: the answer (not suspended) is on its way
    for _ in range(50):
        await asyncio.sleep(0)
    marks.set()
    for _ in range(200):
        await asyncio.sleep(0)
    assert "a" in suspended(api) and "a" not in loop.memory[(NS, "pg-a")].suspending
    reads.set()
    api.heal()
    await step(loop)
    assert unrecorded(api) == [], f"suspended without a record: {unrecorded(api)}"
