"""A release writes the Gang's status once: the decision together with the status the gang has
once its pods are released; the pass after it writes nothing more unless a release failed. The
group's status follows with the gang's next write, or `GROUP_LAG_INTERVALS` intervals later. A
status counts as written only once the apiserver took it (against the stateful fake API)."""

from __future__ import annotations

from typing import Any

from quorum.core.conditions import compose
from quorum.core.record import Admission
from quorum.operator import clock
from quorum.operator.gangs import GangView, Store, assemble
from quorum.operator.status import GROUP_LAG_INTERVALS, GangRecords
from tests.unit.fake_api import FakeApi
from tests.unit.test_operator_gangs import gang_pod, podgroup

GANG = {
    "apiVersion": "quorum.dev/v1alpha1",
    "kind": "Gang",
    "metadata": {"name": "pg-pg1", "namespace": "ns", "ownerReferences": [{"uid": "g1"}]},
    "spec": {"minMember": 2},
}


def decided(raw: dict[str, object]) -> Admission:
    admission = Admission.of(raw)
    assert admission is not None
    return admission


def released_store() -> Store:
    store = Store(pods={u: gang_pod(u, u) for u in ("a", "b")})
    store.groups[("scheduling.sigs.k8s.io", "ns", "pg1")] = podgroup(2)
    store.gangs[("ns", "pg-pg1")] = GANG
    return store


async def pass_write(records: GangRecords, view: GangView, released_now: int) -> bool:
    """What the pass does for a gang: compose its status and write it if it is due."""
    write = records.due(view, compose(records.state(view, None, None, released_now)), None)
    if write is not None:
        await records.write(view, write)
    return write is not None


def writes(api: FakeApi) -> list[tuple[str, dict[str, Any]]]:
    out = []
    for method, args in api.calls:
        if method == "patch_gang_status":
            out.append(("gang", args[2]))
        elif method == "patch_group_status":
            out.append(("podgroups", args[3]))
    return out


async def test_the_decision_and_the_released_status_are_one_write_and_the_group_follows() -> None:
    store = released_store()
    api = FakeApi(store)
    (view,) = assemble(store)
    with clock.using(clock.ManualClock()) as now:
        records = GangRecords(api, store)
        admission = {"attempt": 1, "time": "t", "placement": [{"uid": "a"}, {"uid": "b"}]}
        await records.record_release(view, GANG, decided(admission), 2)
        assert not await pass_write(records, view, 2), "the pass, with both releases done, writes nothing"
        assert [what for what, _ in writes(api)] == ["gang"]
        now.advance(GROUP_LAG_INTERVALS * records.pacing.interval)
        assert await pass_write(records, view, 2), "no write of the gang's came: the group's alone"
        assert not await pass_write(records, view, 2), "and once"

    assert [what for what, _ in writes(api)] == ["gang", "podgroups"]
    gang, group = writes(api)[0][1], writes(api)[1][1]
    assert gang["admission"] == {**admission, "pods": None}, "written whole: a compact one before it goes"
    assert (gang["phase"], gang["released"], gang["gated"]) == ("Scheduling", 2, 0)
    admitted = next(c for c in gang["conditions"] if c["type"] == "Admitted")
    assert admitted["status"] == "True" and admitted["lastTransitionTime"]
    assert group["phase"] == "Scheduling" and group["scheduleStartTime"]


async def test_the_group_status_of_a_release_goes_with_the_gangs_next_write() -> None:
    """Its pods bind before the lag ends: one write of each, the group's saying scheduled."""
    store = released_store()
    api = FakeApi(store)
    (view,) = assemble(store)
    with clock.using(clock.ManualClock()) as now:
        records = GangRecords(api, store)
        await records.record_release(view, GANG, decided({"attempt": 1, "placement": []}), 2)
        for uid in ("a", "b"):
            store.pods[uid]["spec"] = {**store.pods[uid]["spec"], "schedulingGates": [], "nodeName": "n1"}
        (bound,) = assemble(store)
        assert bound.counts()["bound"] == 2
        assert not await pass_write(records, bound, 0), "counters alone settle for an interval"
        now.advance(records.pacing.interval)
        assert await pass_write(records, bound, 0)
        now.advance(GROUP_LAG_INTERVALS * records.pacing.interval)
        assert not await pass_write(records, bound, 0), "the group's status is not behind any more"
    assert [what for what, _ in writes(api)] == ["gang", "gang", "podgroups"]
    assert writes(api)[-1][1]["scheduled"] == 2


async def test_a_failed_release_is_corrected_by_the_next_write() -> None:
    store = released_store()
    api = FakeApi(store)
    (view,) = assemble(store)
    records = GangRecords(api, store, interval=0.0)
    await records.record_release(view, GANG, decided({"attempt": 1, "placement": []}), 2)
    assert await pass_write(records, view, 1)  # one pod was gone by its release

    gang_writes = [body for what, body in writes(api) if what == "gang"]
    assert len(gang_writes) == 2
    assert (gang_writes[-1]["released"], gang_writes[-1]["gated"]) == (1, 1)
    assert "admission" not in gang_writes[-1], "the decision is not written again"


async def test_a_failed_group_write_is_written_again() -> None:
    store = released_store()
    api = FakeApi(store)
    api.fail("patch_group_status", times=1)
    (view,) = assemble(store)
    with clock.using(clock.ManualClock()) as now:
        records = GangRecords(api, store)
        await records.record_release(view, GANG, decided({"attempt": 1, "placement": []}), 2)
        now.advance(GROUP_LAG_INTERVALS * records.pacing.interval)
        write = records.due(view, compose(records.state(view, None, None, 2)), None)
        assert write is not None and write.group_only
        try:
            await records.write(view, write)
        except Exception:
            records.failed(view.key)  # what the gang's task does when its write raises
        now.advance(records.pacing.interval)
        assert await pass_write(records, view, 2)  # the group's status, and the Gang's again

    assert [what for what, _ in writes(api)] == ["gang", "podgroups", "gang", "podgroups"]
    assert writes(api)[-1][1]["phase"] == "Scheduling"


async def test_a_refused_status_write_is_not_taken_as_written_and_is_made_again() -> None:
    store = released_store()
    api = FakeApi(store)
    api.fail("patch_gang_status", times=1)
    (view,) = assemble(store)
    records = GangRecords(api, store, interval=0.0)
    write = records.due(view, compose(records.state(view, None, None)), None)
    assert write is not None
    try:
        await records.write(view, write)
    except Exception:
        records.failed(view.key)  # what the gang's task does when its write raises
    assert records.written(view.key) is None
    assert await pass_write(records, view, 0), "the next pass writes the same status again"
    assert [what for what, _ in writes(api)] == ["gang", "podgroups", "gang", "podgroups"]
    assert store.gangs[view.key]["status"]["phase"] == "Pending"


async def test_a_podgroup_whose_crd_is_not_quorums_gets_no_status_from_quorum() -> None:
    """scheduler-plugins' own CRD (its controller writes phase and counters): quorum writes
    only its Gang."""
    store = released_store()
    store.owned_group_apis = frozenset({"scheduling.x-k8s.io"})
    api = FakeApi(store)
    (view,) = assemble(store)
    with clock.using(clock.ManualClock()) as now:
        records = GangRecords(api, store)
        await records.record_release(view, GANG, decided({"attempt": 1, "placement": []}), 2)
        now.advance(GROUP_LAG_INTERVALS * records.pacing.interval)
        await pass_write(records, view, 2)
    assert [what for what, _ in writes(api)] == ["gang"]


async def test_a_decision_counts_until_the_watch_shows_it_and_no_longer() -> None:
    """`GangRecords.gang`: what this process wrote is on top of the store's older copy until
    the watch delivers a copy that has it (a merge patch's nulls are removals); then the
    store's copy is the gang again, and a new Gang under the name starts clean."""
    from quorum.operator.gangs import Store
    from quorum.operator.status import GangRecords
    from tests.unit.fake_api import FakeApi

    key = ("ns", "g")
    store = Store()
    store.gangs[key] = {"metadata": {"name": "g", "namespace": "ns"}, "status": {"recovery": {"failures": 1}}}
    api = FakeApi(store, lag=True)
    records = GangRecords(api, store)
    written = {"failures": 0, "nextAttemptTime": None, "message": "withdrawn"}
    assert await records.patch(key, {"recovery": written, "phase": "Running"})
    seen = records.gang(key)
    assert seen is not None and seen["status"]["recovery"] == {"failures": 0, "message": "withdrawn"}
    assert "phase" not in seen["status"], "only decisions are kept on top"
    api.deliver("gangs")
    assert records.gang(key) is store.gangs[key] and not records.memory[key].unseen, "shown: the store's copy"
    assert await records.patch(key, {"disruption": {"reason": "PartiallyPlaced"}})
    records.forget(key)
    assert records.gang(key) is store.gangs[key], "a Gang made again starts from what the watch shows"


async def test_a_new_leader_writes_the_group_status_of_a_release_on_record_within_the_lag() -> None:
    """The last leader recorded a release and failed over before the group's status followed:
    the new one writes the group's status within the lag, though the Gang's is unchanged."""
    store = released_store()
    api = FakeApi(store)
    (view,) = assemble(store)
    with clock.using(clock.ManualClock()) as now:
        before = GangRecords(api, store)
        await before.record_release(view, GANG, decided({"attempt": 1, "placement": []}), 2)
        store.gangs[view.key] = {**GANG, "status": writes(api)[0][1]}  # what the watch shows
        records = GangRecords(api, store)  # the next leader
        records.resume()
        assert not await pass_write(records, view, 2)
        now.advance(GROUP_LAG_INTERVALS * records.pacing.interval)
        assert await pass_write(records, view, 2)
    assert [what for what, _ in writes(api)] == ["gang", "podgroups"]
