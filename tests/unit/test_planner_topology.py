"""Topology: all of a gang in one domain of a node label, least waste first, reasons per domain."""

from __future__ import annotations

from dataclasses import replace

from hypothesis import given, settings
from hypothesis import strategies as st

from quorum.core.model import Gang, Node, resources
from quorum.core.planner import PlannerSettings, plan_gangs
from tests.unit.test_planner import GPU, gang, node

RACK = "network.topology.kubernetes.io/rack"


def racked(name: str, rack: str, gpus: int = 8) -> Node:
    base = node(name, gpus=gpus)
    return replace(base, labels={**base.labels, RACK: rack})


def in_racks(g: Gang) -> Gang:
    return replace(g, topology_key=RACK)


def test_the_fitting_rack_with_the_least_room_is_chosen() -> None:
    nodes = [racked(f"a{i}", "r1") for i in range(4)] + [racked(f"b{i}", "r2") for i in range(6)]
    plan = plan_gangs(nodes, {}, [in_racks(gang("g", 4, gpus=8))])
    (release,) = plan.releases
    assert {n.labels[RACK] for _, n in release.placement} == {"r1"}, "r2 stays whole for a larger gang"


def test_a_gang_that_fits_only_across_racks_is_held_with_the_reason_per_rack() -> None:
    nodes = [racked(f"a{i}", "r1") for i in range(4)] + [racked(f"b{i}", "r2") for i in range(4)]
    busy = {"a3": resources({GPU: "8"}), "b2": resources({GPU: "8"}), "b3": resources({GPU: "8"})}
    plan = plan_gangs(nodes, busy, [in_racks(gang("g", 4, gpus=8))])
    assert not plan.releases
    (hold,) = plan.holds
    assert hold.message == (
        f"needs 4 pods in one rack (node label {RACK}); none has room: "
        "rack r1: 3 of 4 nodes have room (3 pods); rack r2: 2 of 4 nodes have room (2 pods)"
    )
    assert plan_gangs(nodes, busy, [gang("g", 4, gpus=8)]).releases, "without the constraint it fits"


def test_nodes_without_the_label_are_in_no_domain_and_said_so() -> None:
    nodes = [racked("a0", "r1"), node("loose")]
    plan = plan_gangs(nodes, {}, [in_racks(gang("g", 2, gpus=8))])
    assert plan.holds[0].message.endswith(f"; 1 eligible nodes have no {RACK} label")


def test_a_starving_gang_holds_capacity_within_one_rack() -> None:
    nodes = [racked(f"a{i}", "r1") for i in range(2)] + [racked(f"b{i}", "r2") for i in range(3)]
    busy = {n.name: resources({GPU: "8"}) for n in nodes if n.name != "b0"}
    starving = in_racks(gang("g", 3, gpus=8, held_since=0.0))
    plan = plan_gangs(nodes, busy, [starving], PlannerSettings(starvation_seconds=10), now=100)
    assert set(plan.holds[0].held_nodes) == {"b0", "b1", "b2"}, "only r2 can ever take 3 nodes"


@settings(max_examples=100, deadline=None)
@given(
    racks=st.lists(st.integers(1, 4), min_size=1, max_size=4),
    busy=st.lists(st.integers(0, 8), min_size=16, max_size=16),
    sizes=st.lists(st.integers(1, 5), min_size=1, max_size=5),
)
def test_every_released_topology_gang_is_in_one_rack_and_nothing_overflows(
    racks: list[int], busy: list[int], sizes: list[int]
) -> None:
    nodes = [racked(f"r{r}n{i}", f"r{r}") for r, count in enumerate(racks) for i in range(count)]
    used = {n.name: resources({GPU: str(busy[i % 16])}) for i, n in enumerate(nodes)}
    gangs = [in_racks(gang(f"g{i}", size, gpus=4, created=i)) for i, size in enumerate(sizes)]
    plan = plan_gangs(nodes, used, gangs)
    taken = dict.fromkeys((n.name for n in nodes), 0)
    for release in plan.releases:
        assert len({n.labels[RACK] for _, n in release.placement}) == 1
        for _, n in release.placement:
            taken[n.name] += 4
    for i, n in enumerate(nodes):
        assert busy[i % 16] + taken[n.name] <= 8
    first = gangs[0]  # planned before anything was committed: held only if no rack had room
    if any(h.gang.key == first.key for h in plan.holds):
        for r in range(len(racks)):
            room = sum((8 - busy[i % 16]) // 4 for i, n in enumerate(nodes) if n.labels[RACK] == f"r{r}")
            assert room < len(first.pods), f"rack r{r} had room for {room} pods"
