"""Fairness: backfill around a gang that does not fit, and capacity held for a starving one."""

from __future__ import annotations

import dataclasses

from hypothesis import given, settings
from hypothesis import strategies as st

from quorum.core.model import resources
from quorum.core.planner import Planner, PlannerSettings, plan_gangs
from tests.unit.test_planner import GPU, gang, node

STARVE = PlannerSettings(starvation_seconds=30)


def busy(*names: str, gpus: int = 8) -> dict[str, dict[str, int]]:
    return {n: resources({GPU: str(gpus), "cpu": "1", "pods": "1"}) for n in names}


def test_small_gangs_backfill_around_a_large_one_that_waited_briefly() -> None:
    nodes = [node(f"n{i}") for i in range(4)]
    large = gang("large", 4, gpus=8, created=0, held_since=100.0)
    small = gang("small", 1, gpus=8, created=1)
    plan = plan_gangs(nodes, busy("n0", "n1", "n2"), [large, small], STARVE, now=110.0)
    assert [r.gang.name for r in plan.releases] == ["small"]
    (hold,) = plan.holds
    assert hold.gang.name == "large" and not hold.held_nodes


def test_a_starving_gang_holds_the_nodes_closest_to_free() -> None:
    nodes = [node(f"n{i}") for i in range(6)]
    used = busy("n0", "n1", "n2") | busy("n3", gpus=4)  # n4, n5 free; n3 half free
    large = gang("large", 4, gpus=8, created=0, held_since=0.0)
    small = gang("small", 1, gpus=4, created=1)
    plan = plan_gangs(nodes, used, [large, small], STARVE, now=31.0)
    (hold,) = [h for h in plan.holds if h.gang.name == "large"]
    assert set(hold.held_nodes[:2]) == {"n4", "n5"}, "free nodes are held first"
    assert len(hold.held_nodes) == 4 and "n3" in hold.held_nodes
    assert "room for 2 of its 4 pods is free there now" in hold.held_message
    assert not plan.releases, "the small gang may not take the half-free held node n3"


def test_backfill_may_use_what_the_starving_gang_cannot() -> None:
    nodes = [node("a"), node("b")]
    large = gang("large", 2, gpus=8, created=0, held_since=0.0)
    cpu_only = gang("cpu", 1, gpus=0, created=1)
    plan = plan_gangs(nodes, busy("a"), [large, cpu_only], STARVE, now=60.0)
    assert [r.gang.name for r in plan.releases] == ["cpu"], "CPU beside held GPUs is still usable"
    assert plan.holds[0].held_nodes == ("b", "a")


def test_only_one_gang_holds_capacity_and_a_hopeless_gang_holds_none() -> None:
    nodes = [node(f"n{i}") for i in range(2)]
    hopeless = gang("hopeless", 3, gpus=8, created=0, held_since=0.0)  # 3 whole nodes: never
    first = gang("first", 2, gpus=8, created=1, held_since=0.0)
    second = gang("second", 2, gpus=8, created=2, held_since=0.0)
    plan = plan_gangs(nodes, busy("n0"), [hopeless, first, second], STARVE, now=100.0)
    held = {h.gang.name: h.held_nodes for h in plan.holds}
    assert held == {"hopeless": (), "first": ("n1", "n0"), "second": ()}


def test_an_admitted_gang_whose_extra_pods_do_not_fit_is_neither_released_nor_held() -> None:
    g = gang("g", 3, gpus=8, min_member=1)
    admitted = type(g)(g.namespace, g.name, 1, g.pods[:2], members=3, released=1)
    plan = plan_gangs([node("a")], busy("a"), [admitted])
    assert not plan.releases and not plan.holds


@settings(max_examples=60, deadline=None)
@given(
    running=st.lists(st.booleans(), min_size=4, max_size=8).filter(any),  # the large gang cannot fit
    small=st.integers(min_value=1, max_value=6),
    waited=st.floats(min_value=0, max_value=100),
)
def test_nothing_is_placed_on_the_room_held_for_a_starving_gang(
    running: list[bool], small: int, waited: float
) -> None:
    """Whatever is running, the small gangs released in a pass never take GPU room the
    starving gang was promised on its held nodes."""
    nodes = [node(f"n{i}") for i in range(len(running))]
    used = busy(*(f"n{i}" for i, r in enumerate(running) if r))
    large = gang("large", len(running), gpus=8, created=0, held_since=0.0)
    smalls = [gang(f"s{i}", 1, gpus=8, created=1 + i) for i in range(small)]
    plan = plan_gangs(nodes, used, [large, *smalls], STARVE, now=waited)
    hold = next(h for h in plan.holds if h.gang.name == "large")
    if waited >= 30:
        assert len(hold.held_nodes) == len(nodes) and not plan.releases
    else:
        assert not hold.held_nodes
        assert len(plan.releases) == min(small, running.count(False))


# -- the guard bounded: share, turns, rest (docs/threat-model.md, "How quorum is attacked") ------

BOUNDED = PlannerSettings(starvation_seconds=30, starvation_hold_seconds=100, starvation_rest_seconds=100)
BOUNDED_NO_REST = PlannerSettings(starvation_seconds=30, starvation_hold_seconds=100)


def test_a_gang_that_needs_more_than_its_share_holds_nothing_and_the_next_starving_gang_holds() -> None:
    """A gang that asks for every node whole while its owner keeps one pod running can never fit;
    with a share bound (here half the nodes its pods may use) it holds none, and the guard goes
    on to the next starving gang."""
    nodes = [node(f"n{i}") for i in range(4)]
    everything = gang("everything", 4, gpus=8, created=0, held_since=0.0)
    fair = gang("fair", 2, gpus=8, created=1, held_since=0.0)
    half = dataclasses.replace(BOUNDED, starvation_max_share=0.5)
    plan = plan_gangs(nodes, busy("n0", "n1", "n2", "n3"), [everything, fair], half, now=31.0)
    held = {h.gang.name: len(h.held_nodes) for h in plan.holds}
    assert held == {"everything": 0, "fair": 2}


def test_starving_gangs_take_turns() -> None:
    nodes = [node(f"n{i}") for i in range(4)]
    first = gang("first", 2, gpus=8, created=0, held_since=0.0)
    second = gang("second", 2, gpus=8, created=1, held_since=0.0)
    holders = []
    planner = Planner(BOUNDED)
    for now in (40.0, 110.0):  # two slots of 100 s, both within the gangs' first turn (30-130 s)
        plan = planner.plan(
            {n.name: n for n in nodes}, busy("n0", "n1", "n2", "n3"), [first, second], now=now
        )
        holders.append([h.gang.name for h in plan.holds if h.held_nodes])
    assert holders == [["first"], ["second"]]


@given(now=st.floats(min_value=0, max_value=2_000))
def test_a_starving_gang_holds_in_turns_and_rests_between(now: float) -> None:
    """Alone, a gang that never fits holds for 100 s of every 200 s after its first 30 s, never
    more: what the rest of the cluster may lose to it is bounded in time as well as in nodes."""
    nodes = [node(f"n{i}") for i in range(4)]
    alone = gang("alone", 2, gpus=8, created=0, held_since=0.0)
    plan = plan_gangs(nodes, busy("n0", "n1", "n2", "n3"), [alone], BOUNDED, now=now)
    holding = bool(plan.holds[0].held_nodes)
    assert holding == (now >= 30 and (now - 30) % 200 < 100)


def test_a_gang_whose_turn_ended_is_not_told_it_still_holds() -> None:
    """On one planner, pass after pass: when the turn passes to the next starving gang, the first
    one's hold no longer names nodes (a hold kept from the last pass must not say so)."""
    nodes = {f"n{i}": node(f"n{i}") for i in range(4)}
    used = busy("n0", "n1", "n2", "n3")
    first = gang("first", 2, gpus=8, created=0, held_since=0.0)
    second = gang("second", 2, gpus=8, created=1, held_since=0.0)
    planner = Planner(BOUNDED)
    held = []
    for now in (40.0, 110.0, 111.0):
        plan = planner.plan(nodes, used, [first, second], now=now, changed=None if now == 40.0 else ())
        held.append(sorted(h.gang.name for h in plan.holds if h.held_nodes))
    assert held == [["first"], ["second"], ["second"]]


def test_the_room_held_for_a_starving_gang_is_free_to_it_and_to_the_gangs_ahead_only() -> None:
    """What preemption decides with (`Planner.room_for`): the capacity held for the starving
    gang is taken from the gangs behind it, not from the gang itself nor the gangs before it."""
    nodes = {n.name: n for n in (node("n0"), node("n1"))}
    top = gang("top", 3, gpus=8, priority=10, created=0)  # ahead in queue order: never fits
    starving = gang("starving", 2, gpus=8, created=1, held_since=0.0)
    behind = gang("behind", 2, gpus=8, created=2)
    planner = Planner(STARVE)
    plan = planner.plan(nodes, busy("n0"), [top, starving, behind], now=60.0)
    assert {h.gang.name: h.held_nodes for h in plan.holds}["starving"] == ("n1", "n0")
    assert planner.room_for(behind.key)["n1"][GPU] == 0, "held from the gangs behind it"
    assert planner.room_for(starving.key)["n1"][GPU] == 8000, "its own"
    assert planner.room_for(top.key)["n1"][GPU] == 8000, "planned before the hold"
    assert planner.room_for(starving.key)["n0"][GPU] == 0, "what runs there is not freed"
    assert planner.room_for(("ns", "unknown"))["n1"][GPU] == 0


# -- between tenants -------------------------------------------------------------------------------


def test_the_search_budget_is_shared_between_tenants() -> None:
    """Tenant A's three older gangs each exhaust their search. Tenant B's gang is searched in the
    first pass (half the pass is B's), not left unsearched behind A's pass after pass; A's gang
    left unsearched goes first the next pass."""
    from dataclasses import replace

    from tests.unit.test_planner_robustness import fragmented

    nodes = {n.name: n for n in (node(f"n{i:02d}", gpus=8, cpu=130) for i in range(20))}
    hopeless = [replace(fragmented(f"a{i}", 20, created=i), namespace="team-a") for i in range(3)]
    other = replace(fragmented("b", 20, created=10), namespace="team-b")
    planner = Planner(PlannerSettings(gang_budget=5_000, pass_budget=10_000))
    holds = {h.gang.name: h.message for h in planner.plan(nodes, {}, [*hopeless, other]).holds}
    assert holds["b"].startswith("search budget exhausted after"), holds["b"]
    assert holds["a0"].startswith("search budget exhausted after"), holds["a0"]
    for name in ("a1", "a2"):
        assert holds[name].startswith("not searched this pass: its tenant's share"), holds[name]
    again = {h.gang.name: h.message for h in planner.plan(nodes, {}, [*hopeless, other], changed=()).holds}
    assert again["a1"].startswith("search budget exhausted"), "not searched last pass: goes first now"
    assert again["a2"].startswith("not searched this pass: its tenant's share"), again["a2"]
    assert again["b"].startswith("search budget exhausted"), "B keeps its share"


def test_starvation_turns_go_round_tenants_not_gangs() -> None:
    """Tenant A has three starving gangs that never fit, tenant B one: B holds in every other
    turn (today one in four), and A's gangs share A's turns."""
    from dataclasses import replace

    nodes = [node(f"n{i}") for i in range(4)]
    a = [replace(gang(f"a{i}", 2, gpus=8, created=i, held_since=0.0), namespace="team-a") for i in range(3)]
    b = replace(gang("b", 2, gpus=8, created=10, held_since=0.0), namespace="team-b")
    holders = []
    planner = Planner(BOUNDED_NO_REST)
    for turn in range(6):  # one pass in each 100 s turn, all after the first 30 s
        now = 100.0 * (turn + 1) + 10
        plan = planner.plan({n.name: n for n in nodes}, busy("n0", "n1", "n2", "n3"), [*a, b], now=now)
        holders.append([h.gang.name for h in plan.holds if h.held_nodes])
    assert [h[0] for h in holders].count("b") == 3, holders
    assert sorted(h[0] for h in holders if h[0] != "b") == ["a0", "a1", "a2"], holders


def test_a_starving_gang_whose_held_room_does_not_grow_rests_then_holds_again() -> None:
    """n0 is free, n1 busy with a pod that never ends: the gang of 2 whole nodes holds both,
    room for 1 of its pods. The room does not grow for 100 s, so it holds nothing for the next
    100 s (its hold says so) and then holds again. While pods on its held nodes keep finishing,
    it holds on."""
    idle = PlannerSettings(starvation_seconds=30, starvation_hold_seconds=10_000, starvation_idle_seconds=100)
    nodes = [node("n0"), node("n1"), node("n2")]
    stuck = gang("stuck", 2, gpus=8, created=0, held_since=0.0)
    planner = Planner(idle)
    by_name = {n.name: n for n in nodes}
    held = {}
    for now in (40.0, 100.0, 139.0, 141.0, 200.0, 241.0, 250.0):
        plan = planner.plan(by_name, busy("n1", "n2"), [stuck], now=now)
        (hold,) = plan.holds
        held[now] = (len(hold.held_nodes), hold.message)
    assert [held[t][0] for t in (40.0, 100.0, 139.0)] == [2, 2, 2]
    assert held[141.0][0] == 0 and "did not grow for 100s" in held[141.0][1], held[141.0]
    assert held[200.0][0] == 0 and "for 41s more" in held[200.0][1], held[200.0]
    assert held[241.0][0] == 2 and held[250.0][0] == 2, "rested: it holds again"
    assert planner.resting_tenants(200.0) == [stuck.owner] and planner.resting_tenants(250.0) == []

    four = {f"n{i}": node(f"n{i}") for i in range(4)}
    three = gang("three", 3, gpus=8, created=0, held_since=0.0)
    growing = Planner(idle)
    for now, used in ((40.0, busy("n1", "n2", "n3")), (120.0, busy("n2", "n3")), (200.0, busy("n2", "n3"))):
        (hold,) = growing.plan(four, used, [three], now=now).holds
        assert len(hold.held_nodes) == 3, (now, hold.held_message)  # 160 s, but it grew at 120 s


def test_namespaces_of_one_tenant_share_its_turns() -> None:
    """The attacker's three gangs in three namespaces, all of tenant `team=a` (the namespaces'
    tenant label): they share one tenant's turns, and B holds every other turn."""
    from dataclasses import replace

    nodes = [node(f"n{i}") for i in range(4)]
    a = [
        replace(gang(f"a{i}", 2, gpus=8, created=i, held_since=0.0), namespace=f"a-{i}", tenant="team=a")
        for i in range(3)
    ]
    b = replace(gang("b", 2, gpus=8, created=10, held_since=0.0), namespace="team-b")
    by_name = {n.name: n for n in nodes}
    holders = []
    planner = Planner(BOUNDED_NO_REST)
    for turn in range(6):
        plan = planner.plan(by_name, busy("n0", "n1", "n2", "n3"), [*a, b], now=100.0 * (turn + 1) + 10)
        holders.append(next(h.gang.name for h in plan.holds if h.held_nodes))
    assert holders.count("b") == 3, holders
    untagged = [replace(g, tenant="") for g in a]
    holders = []
    planner = Planner(BOUNDED_NO_REST)
    for turn in range(6):
        plan = planner.plan(
            by_name, busy("n0", "n1", "n2", "n3"), [*untagged, b], now=100.0 * (turn + 1) + 10
        )
        holders.append(next(h.gang.name for h in plan.holds if h.held_nodes))
    assert holders.count("b") < 3, "without the label, three namespaces are three tenants"


def test_another_gang_of_a_resting_tenant_does_not_take_the_turn_over() -> None:
    """The tenant's gang whose held room stopped growing makes its tenant rest: its other
    starving gang (of smaller pods, whose count of free room differs) holds nothing either."""
    idle = PlannerSettings(starvation_seconds=30, starvation_hold_seconds=10_000, starvation_idle_seconds=100)
    nodes = {n.name: n for n in (node("n0"), node("n1"), node("n2"))}
    big = gang("big", 2, gpus=8, created=0, held_since=0.0)
    small = gang("small", 4, gpus=4, created=1, held_since=0.0)
    planner = Planner(idle)
    for now in (40.0, 100.0, 139.0):
        planner.plan(nodes, busy("n1", "n2"), [big, small], now=now)
    plan = planner.plan(nodes, busy("n1", "n2"), [big, small], now=141.0)
    holds = {h.gang.name: h for h in plan.holds}
    assert not holds["big"].held_nodes and not holds["small"].held_nodes, holds
    assert "holds nothing for its tenant's gangs" in holds["small"].message, holds["small"].message


def test_a_tenant_that_begins_to_starve_has_the_next_turn() -> None:
    """Three tenants (namespaces, no tenant label) starve for ever and have had their turns;
    a fourth tenant's gang begins to starve: the next turn is its, not the fourth after."""
    from dataclasses import replace

    nodes = {n.name: n for n in (node(f"n{i}") for i in range(4))}
    hopeless = [
        replace(gang(f"a{i}", 2, gpus=8, created=i, held_since=0.0), namespace=f"a-{i}") for i in range(3)
    ]
    planner = Planner(BOUNDED_NO_REST)
    for turn in range(3):
        planner.plan(nodes, busy("n0", "n1", "n2", "n3"), hopeless, now=100.0 * (turn + 1) + 10)
    late = replace(gang("late", 2, gpus=8, created=50, held_since=350.0), namespace="b")
    holders = []
    for now in (390.0, 410.0):  # starving from 380 s; the next slot begins at 400 s
        plan = planner.plan(nodes, busy("n0", "n1", "n2", "n3"), [*hopeless, late], now=now)
        holders.append(next(h.gang.name for h in plan.holds if h.held_nodes))
    assert holders[1] == "late", holders


def test_a_tenants_gangs_taking_turns_do_not_reset_its_idle_clock() -> None:
    """Tenant A's three gangs never fit (n1 and n2 run pods that never end) and take A's turns
    of 50 s in a row: the room held for them does not grow for 100 s in all, so A rests (today
    each gang's clock starts anew in its own turn, and A holds for ever)."""
    idle = PlannerSettings(starvation_seconds=30, starvation_hold_seconds=50, starvation_idle_seconds=100)
    nodes = {n.name: n for n in (node("n0"), node("n1"), node("n2"))}
    gangs = [gang(f"a{i}", 2, gpus=8, created=i, held_since=0.0) for i in range(3)]
    planner = Planner(idle)
    holders, rested = [], None
    for now in range(40, 400, 10):
        plan = planner.plan(nodes, busy("n1", "n2"), gangs, now=float(now))
        holders.append({h.gang.name for h in plan.holds if h.held_nodes})
        if rested is None and any("holds nothing for its tenant's gangs" in h.message for h in plan.holds):
            rested = now
    assert {"a0", "a1", "a2"} <= set().union(*holders), "each gang had turns"
    assert rested is not None and rested <= 150, (rested, holders)


def test_a_tenant_that_deletes_and_remakes_its_gang_keeps_its_idle_clock() -> None:
    """Tenant A's gang never fits (n1 and n2 run pods that never end); every 80 s A deletes it
    and makes it again, so that it starves anew 30 s later. Its time starving adds up over the
    gangs: it rests (today its clock starts anew with each gang, and it never rests)."""
    idle = PlannerSettings(starvation_seconds=30, starvation_hold_seconds=10_000, starvation_idle_seconds=100)
    nodes = {n.name: n for n in (node("n0"), node("n1"), node("n2"))}
    planner = Planner(idle)
    rested = None
    for now in range(40, 600, 10):
        made = now // 80 * 80
        remade = gang(f"a{made}", 2, gpus=8, created=made, held_since=float(made))
        plan = planner.plan(nodes, busy("n1", "n2"), [remade], now=float(now))
        if any("holds nothing for its tenant's gangs" in h.message for h in plan.holds):
            rested = now
            break
    assert rested is not None and rested < 400, rested


def test_a_small_gang_of_a_tenant_admitted_does_not_give_it_the_next_turn() -> None:
    """Tenant A's gang never fits; every pass A also makes a 1-GPU gang that has starved and
    fits at once. Tenant B's gang starves too. The turns still alternate between A and B (had
    admitting A's small gang started A afresh, A would have had every turn)."""
    from dataclasses import replace

    nodes = {n.name: n for n in (node(f"n{i}") for i in range(4))}
    used = busy("n1", "n2", "n3") | busy("n0", gpus=7)  # room for 1 GPU on n0, nothing else
    never = replace(gang("never", 4, gpus=8, created=0, held_since=0.0), namespace="a")
    other = replace(gang("other", 2, gpus=8, created=5, held_since=0.0), namespace="b")
    planner = Planner(BOUNDED_NO_REST)
    holders = []
    for turn in range(6):
        small = replace(gang(f"small-{turn}", 1, gpus=1, created=-1, held_since=0.0), namespace="a")
        plan = planner.plan(nodes, used, [never, small, other], now=100.0 * (turn + 1) + 10)
        planner.admitted(plan.releases)
        assert [r.gang.name for r in plan.releases] == [small.name]
        holders.append(next(h.gang.name for h in plan.holds if h.held_nodes))
    assert holders.count("other") == 3, holders


def test_a_tenant_whose_progressing_gang_is_admitted_starts_its_idle_clock_afresh() -> None:
    """Tenant A's gang W holds n0 and n1; at 100 s n0 frees (progress), at 190 s n1 frees and W
    is admitted. A's next gang X then starves on busy nodes: its clock starts afresh, so it
    still holds at 250 s (had it gone on from W's, it would rest from about 210 s)."""
    idle = PlannerSettings(starvation_seconds=30, starvation_hold_seconds=10_000, starvation_idle_seconds=100)
    nodes = {n.name: n for n in (node("n0"), node("n1"), node("n2"))}
    w = gang("w", 2, gpus=8, created=0, held_since=0.0)
    planner = Planner(idle)
    for now, used in ((40.0, busy("n0", "n1", "n2")), (100.0, busy("n1", "n2")), (180.0, busy("n1", "n2"))):
        planner.plan(nodes, used, [w], now=now)
    plan = planner.plan(nodes, busy("n2"), [w], now=190.0)
    assert [r.gang.name for r in plan.releases] == ["w"]
    planner.admitted(plan.releases)
    x = gang("x", 2, gpus=8, created=150, held_since=150.0)
    for now in (200.0, 230.0, 250.0):
        (hold,) = planner.plan(nodes, busy("n0", "n1", "n2"), [x], now=now).holds
    assert hold.held_nodes and "holds nothing" not in hold.message, hold.message


def test_a_replan_of_the_pass_charges_no_tenant_a_turn() -> None:
    """The pass plans again without A's gang (it was short of devices, say): B's gang holds in
    that re-plan, but the turn stays A's, and A's clock gains nothing from the second call."""
    from dataclasses import replace

    nodes = {n.name: n for n in (node(f"n{i}") for i in range(4))}
    a = replace(gang("a", 2, gpus=8, created=0, held_since=0.0), namespace="a")
    b = replace(gang("b", 2, gpus=8, created=1, held_since=0.0), namespace="b")
    everything = busy("n0", "n1", "n2", "n3")
    planner = Planner(BOUNDED_NO_REST)
    first = planner.plan(nodes, everything, [a, b], now=110.0)
    assert [h.gang.name for h in first.holds if h.held_nodes] == ["a"]
    again = planner.plan(nodes, everything, [b], now=110.0, replan=True)
    assert [h.gang.name for h in again.holds if h.held_nodes] == ["b"]
    assert planner.turn_of == (1, "namespace a") and planner.guards["namespace b"].last_turn == -1
    assert planner.guards["namespace a"].idle == 0.0
    nxt = planner.plan(nodes, everything, [a, b], now=210.0)
    assert [h.gang.name for h in nxt.holds if h.held_nodes] == ["b"], "B's first turn is still to come"
