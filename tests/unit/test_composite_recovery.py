"""A 1.37 CompositePodGroup is admitted whole and recovered whole: once one of its gangs is
partially placed and fewer than minGroupCount of them run whole, the others are recovered too,
those that run included, each recorded and told (docs/lifecycle.md, "When quorum removes a pod")."""

from __future__ import annotations

from quorum.operator import clock
from quorum.operator.loop import GangLoop
from tests.unit.fake_api import FakeApi
from tests.unit.test_loop import NS, REPLICA_SET, cluster, pod, settings, step
from tests.unit.test_workload_versions import composite_obj, k8s_podgroup

GANGS = {"launcher": 1, "workers": 2}  # gang -> minCount (and pods)


def composite_cluster(min_groups: int) -> tuple[FakeApi, GangLoop]:
    store, bound = cluster(3, {})
    store.composite_version = "v1alpha3"
    store.composites[(NS, "job")] = {
        **composite_obj("job", min_groups),
        "apiVersion": "scheduling.k8s.io/v1alpha3",
    }
    store.composites[(NS, "job")]["metadata"]["namespace"] = NS
    for name, size in GANGS.items():
        group = k8s_podgroup("v1beta1", name=name, parentCompositePodGroupName="job")
        group["metadata"]["namespace"] = NS
        group["spec"]["schedulingPolicy"] = {"gang": {"minCount": size}}
        store.groups[("scheduling.k8s.io", NS, name)] = group
        for i in range(size):
            p = pod(name, i, 8, REPLICA_SET)
            p["metadata"]["labels"] = {"quorum.dev/gang": f"wpg-{name}"}
            p["spec"]["schedulingGroup"] = {"podGroupName": name}
            store.pods[p["metadata"]["uid"]] = p
    bound.replace_all(list(store.pods.values()))
    api = FakeApi(store, bound)
    return api, GangLoop(api, store, bound, settings())


def bind_all_but(api: FakeApi, loop: GangLoop, missing: str) -> None:
    """kube-scheduler binds every released pod but `missing` (its node was taken)."""
    for uid, node in api.pinned.items():
        if uid != missing and node is not None:
            p = loop.store.pods[uid]
            p["spec"]["nodeName"], p["status"] = node, {"phase": "Running"}
            loop.bound.upsert(p)


async def test_a_composite_short_of_min_group_count_is_recovered_whole_its_running_gang_too() -> None:
    with clock.using(clock.ManualClock()) as now:
        api, loop = composite_cluster(min_groups=2)
        await step(loop)
        assert set(api.pinned) == {"launcher-0", "workers-0", "workers-1"}, "released together"
        bind_all_but(api, loop, "workers-1")
        await step(loop)
        assert api.called("delete_pod") == [], "in time"
        now.advance(61)
        await step(loop)  # the workers are partially placed: recovered
        await step(loop)  # then the launcher, which runs, with its composite
        deleted = sorted(p["metadata"]["name"] for (p,) in api.called("delete_pod"))
        assert deleted == ["launcher-0", "workers-0", "workers-1"]
        disruption = [s for (_, n, _, s) in api.called("patch_gang_status_if") if n == "wpg-launcher"]
        assert disruption and disruption[0]["disruption"]["reason"] == "CompositePartiallyPlaced"
        told = [m for name, reason, m, _ in api.events if name == "launcher" and reason == "PartiallyPlaced"]
        assert told and "CompositePodGroup job has 1 of minGroupCount 2 gangs bound whole" in told[0], told


async def test_a_composite_with_min_group_count_gangs_whole_keeps_them() -> None:
    with clock.using(clock.ManualClock()) as now:
        api, loop = composite_cluster(min_groups=1)
        await step(loop)
        bind_all_but(api, loop, "workers-1")
        now.advance(61)
        await step(loop)
        await step(loop)
        deleted = sorted(p["metadata"]["name"] for (p,) in api.called("delete_pod"))
        assert deleted == ["workers-0", "workers-1"], "only the partially placed gang"
        assert "launcher-0" in loop.store.pods and not loop.store.pods["launcher-0"]["metadata"].get(
            "deletionTimestamp"
        )


def test_a_gang_admitted_after_its_siblings_recovery_is_a_new_try_not_taken_for_the_old_one() -> None:
    """Found by review: with spare gangs, one recovered gang (`a`) stayed "partially placed" until
    its next decision, so each sibling the composite admitted again afterwards was recovered
    with it as soon as it ran whole, before the others bound."""
    from quorum.operator.recovery import CompositeState, PartialSibling

    state = CompositeState("job", 3, {}, whole=1, partial=(PartialSibling("a", at=100.0),))
    assert state.recovers(decided_at=90.0) == ("a",), "decided before a's recovery: it goes with it"
    assert state.recovers(decided_at=110.0) == (), "admitted again after it: a new try"
    due = CompositeState("job", 3, {}, whole=1, partial=(PartialSibling("a"),))
    assert due.recovers(decided_at=110.0) == ("a",), "a partially placed now takes every sibling"
    whole = CompositeState("job", 1, {}, whole=1, partial=(PartialSibling("a"),))
    assert whole.recovers(decided_at=0.0) == (), "minGroupCount run whole: nothing"


def test_a_sibling_recovered_by_an_earlier_leader_is_ordered_by_the_records_with_a_margin() -> None:
    """A new leader knows of a predecessor's recovery only by its record (wall clock, whole
    seconds): it takes along a sibling whose decision is on record well before that recovery,
    never one admitted about then or after (another leader's clock may run ahead), and none
    whose decision has no readable time."""
    from quorum.operator.recovery import RECORDED_ORDER_MARGIN_SECONDS as MARGIN
    from quorum.operator.recovery import CompositeState, PartialSibling

    state = CompositeState("job", 2, {}, whole=1, partial=(PartialSibling("a", recorded_at=1000.0),))
    late = 10_000.0  # this process first saw every decision after the failover
    assert state.recovers(late, 1000.0 - 60) == ("a",), "admitted a timeout before: goes with it"
    assert state.recovers(late, 1000.0 - MARGIN) == ("a",)
    assert state.recovers(late, 1000.0 - MARGIN + 1) == (), "within the margin: not taken"
    assert state.recovers(late, 1010.0) == (), "admitted again after it: a new try"
    assert state.recovers(late, None) == (), "no time on record: not taken"
