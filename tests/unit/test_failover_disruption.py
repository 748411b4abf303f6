"""The failover paths that once deleted healthy work, each as a fixed scenario against the
stateful fake API (the model test, test_disruption_model.py, hunts for them among many): a new
leader resumes a recorded release whose unreleased pods no longer fit, for a gang already
running above minMember, and for a preemptor whose victims are already gone."""

from __future__ import annotations

import copy

from quorum.k8s.usage import BoundPods
from quorum.operator import clock
from quorum.operator.gangs import Store
from quorum.operator.loop import GangLoop
from tests.unit.fake_api import FakeApi
from tests.unit.test_loop import NS, REPLICA_SET, cluster, pod, released, settings, step
from tests.unit.test_loop_preemption import bind_released, held, running, taints, victims_gone


def cordon(store: Store, name: str) -> None:
    node = store.nodes[name]
    node["spec"]["unschedulable"] = True
    node["metadata"]["resourceVersion"] = "2"


async def test_a_resumed_release_keeps_a_gang_running_above_min_member_and_plans_the_rest_anew() -> None:
    store, bound = cluster(6, {"a": 4}, owner=REPLICA_SET)
    store.groups[("scheduling.sigs.k8s.io", NS, "a")]["spec"]["minMember"] = 2
    api = FakeApi(store)
    first = GangLoop(api, store, bound, settings())
    late = {"a-2", "a-3"}  # the leader dies before these are released
    api.fail("release_pod", when=lambda p, n: p["metadata"]["uid"] in late)
    await step(first)
    assert released(store, "a") == ["a-0", "a-1"]
    bind_released(store, bound, api)  # minMember of its pods bound and running
    recorded = {e["uid"]: e["node"] for e in store.gangs[(NS, "pg-a")]["status"]["admission"]["placement"]}
    cordon(store, recorded["a-2"])  # one node of an unreleased pod is cordoned before the standby leads
    api.heal()
    second = GangLoop(api, store, bound, settings())
    second.resume()
    await step(second)
    await step(second)
    assert api.called("delete_pod") == [], "the running pods stay"
    assert {"a-0", "a-1"} <= set(store.pods)
    assert api.pinned["a-3"] == recorded["a-3"], "a-3 released onto its recorded node"
    assert api.pinned["a-2"] not in (None, recorded["a-2"]), "a-2 planned anew, away from the cordoned node"
    assert released(store, "a") == ["a-0", "a-1", "a-2", "a-3"]


async def test_a_preemptor_whose_release_was_cut_off_runs_on_the_freed_nodes_after_a_failover() -> None:
    store, bound = cluster(2, {})
    running(store, bound, "low", 2, 10, ["n0", "n1"])
    held(store, "high", 2, 1000)
    api = FakeApi(store)
    first = GangLoop(api, store, bound, settings())
    await step(first)  # the preemption: recorded, nodes tainted, victims deleted
    victims_gone(bound, api)
    token = store.gangs[(NS, "pg-high")]["status"]["preemption"]["token"]
    api.fail("release_pod", when=lambda p, n: p["metadata"]["uid"] == "high-1")  # the leader dies here
    await step(first)
    assert released(store, "high") == ["high-0"]
    api.heal()
    second = GangLoop(api, store, bound, settings())
    second.resume()
    await step(second)
    assert api.called("delete_pod") == [], "the preemptor is not recovered"
    assert released(store, "high") == ["high-0", "high-1"], "finished on its reserved nodes"
    assert api.tolerated["high-1"] == token
    bind_released(store, bound, api)
    await step(second)
    assert taints(store, "n0") == [] and taints(store, "n1") == [], "the preemption ended: nodes freed"


async def test_a_pass_before_the_gang_watch_shows_a_replacements_release_recovers_nothing() -> None:
    """A running gang loses a member; its replacement is released alone (a new decision); the
    Gang watch lags, and a pass runs on the old copy, whose decision is long past its timeout
    with 1 of 2 bound. The survivor keeps running."""
    with clock.using(clock.ManualClock()) as now:
        server, _ = cluster(2, {"a": 2}, owner=REPLICA_SET)
        api = FakeApi(server, BoundPods(), lag=True)
        api.server = server
        store, bound = api.relist()
        loop = GangLoop(api, store, bound, settings())
        loop.resume()
        await step(loop)  # released, decision 1
        for uid in ("a-0", "a-1"):  # kube-scheduler binds both
            p = copy.deepcopy(server.pods[uid])
            p["spec"]["nodeName"], p["status"] = api.pinned[uid], {"phase": "Running"}
            server.pods[uid] = p
            api.changed("pods", uid, p)
        api.deliver_all()
        await step(loop)
        now.advance(120)  # long past decision 1's timeout
        del server.pods["a-0"]  # a member is evicted; its ReplicaSet makes a-2, gated
        api.changed("pods", "a-0", None)
        replacement = pod("a", 2, owner=REPLICA_SET)
        server.pods["a-2"] = replacement
        api.changed("pods", "a-2", replacement)
        api.deliver("pods")
        await step(loop)  # a-2 released alone: decision 2
        assert server.gangs[(NS, "pg-a")]["status"]["admission"]["attempt"] == 2
        api.deliver("pods")  # the pod watch shows it; the Gang watch does not yet
        await step(loop)
        assert api.called("delete_pod") == [], "the running survivor is not recovered"
        assert "a-1" in server.pods


async def test_a_disruption_recorded_for_an_earlier_decision_deletes_nothing_and_is_cleared() -> None:
    store, bound = cluster(2, {"a": 2}, owner=REPLICA_SET)
    api = FakeApi(store)
    loop = GangLoop(api, store, bound, settings())
    await step(loop)  # released: decision 1
    gang = store.gangs[(NS, "pg-a")]
    gang["status"]["admission"]["attempt"] = 2  # the gang moved on (as a new leader would list it)
    gang["status"]["disruption"] = {
        "reason": "PartiallyPlaced",
        "attempt": 1,
        "pods": [{"name": "a-0", "uid": "a-0"}, {"name": "a-1", "uid": "a-1"}],
        "jobs": [],
    }
    second = GangLoop(api, store, bound, settings())
    second.resume()
    await step(second)
    assert api.called("delete_pod") == [], "obsolete: nothing is done by it"
    assert "disruption" not in store.gangs[(NS, "pg-a")]["status"]


async def test_a_new_leader_plans_once_its_watches_show_what_it_listed_a_deletion_too() -> None:
    """The takeover's catch-up: the leader lists the gang pods and Gangs afresh and plans
    nothing until its watches show each at that version — or deliver past it without it, as for
    a pod deleted since the list (not a wait for a deadline)."""
    with clock.using(clock.ManualClock()):
        server, _ = cluster(2, {"a": 2}, owner=REPLICA_SET)
        api = FakeApi(server, BoundPods(), lag=True)
        api.server = server
        store, bound = api.relist()
        gone = pod("b", 0)  # made before the takeover, its watch event not delivered yet
        server.pods["b-0"] = gone
        api.changed("pods", "b-0", gone)
        loop = GangLoop(api, store, bound, settings())
        await loop.take_over()
        assert loop.catch_up is not None and loop.catch_up.behind(store) == 1
        await step(loop)
        assert api.called("release_pod") == [], "nothing planned before the watches caught up"
        del server.pods["b-0"]  # deleted before the watch showed it
        api.changed("pods", "b-0", None)
        api.deliver("pods")
        assert loop.catch_up.behind(store) == 0, "its deletion delivered: caught up, no deadline waited"
        await step(loop)
        assert sorted(p["metadata"]["uid"] for p, _ in api.called("release_pod")) == ["a-0", "a-1"]


async def test_two_groups_under_one_gang_name_are_neither_planned_nor_recovered() -> None:
    """PodGroup `a.b` is shortened to gang `pg-a-b-<hash>`; a tenant names another PodGroup
    exactly that (`a-b-<hash>`). Merged into one gang, the recovery of one deleted the other's
    pods. Such a gang is now held, told why, and never recovered."""
    from quorum.core.gangs import GangSource, gang_name

    shared = gang_name(GangSource.SIGS_POD_GROUP, "a.b")
    lookalike = shared.removeprefix("pg-")
    with clock.using(clock.ManualClock()) as now:
        store, bound = cluster(2, {"a.b": 1, lookalike: 1}, owner=REPLICA_SET)
        for p in store.pods.values():
            p["metadata"]["labels"]["quorum.dev/gang"] = shared
        api = FakeApi(store)
        loop = GangLoop(api, store, bound, settings())
        await step(loop)
        assert api.called("release_pod") == [], "held"
        told = {name: m for name, reason, m, _ in api.events if reason == "WaitingForGroup"}
        assert set(told) == {"a.b-0", f"{lookalike}-0"}, "each pod told why it waits"
        assert all("carry the same gang name" in m and "rename one" in m for m in told.values())
        now.advance(3600)
        await step(loop)
        assert api.called("delete_pod") == [] and api.called("patch_gang_status_if") == []
