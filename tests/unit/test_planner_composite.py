"""Composite gangs (Kubernetes 1.37 CompositePodGroup): of a composite's child gangs,
minGroupCount are released together or none; the room of a failed try is given back."""

from __future__ import annotations

from dataclasses import replace

from hypothesis import given, settings
from hypothesis import strategies as st

from quorum.core.model import Composite, Gang, Node, resources
from quorum.core.planner import Plan, Planner
from tests.unit.test_planner import GPU, gang, node

RACK = "rack"


def child(name: str, n: int, gpus: int, composite: str = "job", created: float = 0) -> Gang:
    return gang(name, n, gpus=gpus, composite=composite, created=created)


def racked(name: str, rack: str, gpus: int = 8) -> Node:
    base = node(name, gpus)
    return replace(base, labels={**base.labels, RACK: rack})


def plan(
    nodes: list[Node],
    queue: list[Gang],
    *composites: Composite,
    used: dict[str, dict[str, int]] | None = None,
) -> Plan:
    return Planner().plan(
        {n.name: n for n in nodes}, used or {}, queue, composites={c.key: c for c in composites}
    )


def test_children_that_each_fit_alone_but_not_together_release_none() -> None:
    nodes = [node("a"), node("b")]  # 16 GPUs
    queue = [child("leader", 1, 8), child("workers", 2, 8)]  # 24 GPUs together
    result = plan(nodes, queue, Composite("ns", "job", 2))
    assert not result.releases
    assert {h.reason for h in result.holds} == {"WaitingForGroups"}
    assert "CompositePodGroup job needs 2 of its gangs" in result.holds[0].message


def test_children_that_fit_together_are_released_together() -> None:
    nodes = [node("a"), node("b"), node("c")]
    queue = [child("leader", 1, 8), child("workers", 2, 8)]
    result = plan(nodes, queue, Composite("ns", "job", 2))
    assert {r.gang.name for r in result.releases} == {"leader", "workers"}
    used = [n.name for r in result.releases for _, n in r.placement]
    assert len(used) == len(set(used)) == 3, "one whole node each: the room of one is taken before the next"


def test_the_room_of_a_failed_composite_goes_to_the_gang_behind_it() -> None:
    nodes = [node("a"), node("b")]
    queue = [child("leader", 1, 8), child("workers", 2, 8), gang("other", 2, gpus=8, created=1)]
    result = plan(nodes, queue, Composite("ns", "job", 2))
    assert [r.gang.name for r in result.releases] == ["other"], (
        "the composite's tentative room was given back"
    )


def test_min_group_count_below_the_children_releases_those_that_fit() -> None:
    nodes = [node("a"), node("b")]
    queue = [child("leader", 1, 8), child("workers", 2, 8)]
    result = plan(nodes, queue, Composite("ns", "job", 1))
    assert [r.gang.name for r in result.releases] == ["leader"]
    assert [(h.gang.name, h.reason) for h in result.holds] == [("workers", "Unschedulable")]


def test_children_admitted_already_count_toward_min_group_count() -> None:
    result = plan([node("a")], [child("workers", 1, 8)], Composite("ns", "job", 2, admitted=1))
    assert [r.gang.name for r in result.releases] == ["workers"]


def test_a_composite_topology_puts_every_child_in_one_rack() -> None:
    nodes = [racked("a1", "r1"), racked("b1", "r2"), racked("b2", "r2")]
    queue = [child("leader", 1, 8), child("workers", 1, 8)]
    result = plan(nodes, queue, Composite("ns", "job", 2, topology_key=RACK))
    racks = {n.labels[RACK] for r in result.releases for _, n in r.placement}
    assert len(result.releases) == 2 and racks == {"r2"}, "r1 has room for one child only"


def test_no_rack_with_room_for_all_holds_them_all_and_says_so() -> None:
    nodes = [racked("a1", "r1"), racked("b1", "r2")]
    result = plan(
        nodes, [child("leader", 1, 8), child("workers", 1, 8)], Composite("ns", "job", 2, topology_key=RACK)
    )
    assert not result.releases
    assert "in one rack (node label rack; 2 tried)" in result.holds[0].message


@settings(max_examples=200, deadline=None)
@given(
    sizes=st.lists(st.tuples(st.integers(1, 3), st.sampled_from([2, 4, 8])), min_size=1, max_size=4),
    nodes_count=st.integers(0, 5),
    min_groups=st.integers(1, 4),
    admitted=st.integers(0, 2),
)
def test_a_composite_is_released_with_at_least_min_group_count_or_not_at_all(
    sizes: list[tuple[int, int]], nodes_count: int, min_groups: int, admitted: int
) -> None:
    """Whatever the sizes: either nothing of the composite is released, or with the admitted
    ones at least minGroupCount are; and no node is given more than it has."""
    nodes = [node(f"n{i}") for i in range(nodes_count)]
    queue = [child(f"c{i}", n, gpus, created=i) for i, (n, gpus) in enumerate(sizes)]
    result = plan(nodes, queue, Composite("ns", "job", min_groups, admitted=admitted))
    released = len(result.releases)
    assert released == 0 or released + admitted >= min_groups
    if released == 0:
        assert all(h.reason in ("WaitingForGroups", "Unschedulable") for h in result.holds)
    taken: dict[str, int] = {}
    for release in result.releases:
        for pod, where in release.placement:
            taken[where.name] = taken.get(where.name, 0) + pod.requests[GPU]
    assert all(gpus <= resources({GPU: "8"})[GPU] for gpus in taken.values())


def test_a_starving_gang_of_a_composite_holds_no_capacity_and_the_room_stays_whole() -> None:
    """The starvation guard holds nodes for one gang; a composite's gangs go together or not at
    all, so none of them holds any: a failed composite leaves every node's room as it was."""
    nodes = [node("a"), node("b")]
    queue = [
        replace(child("leader", 1, 8), held_since=0.0),
        replace(child("workers", 2, 8), held_since=0.0),
    ]
    planner = Planner()
    result = planner.plan(
        {n.name: n for n in nodes},
        {},
        queue,
        now=10_000.0,
        composites={("ns", "job"): Composite("ns", "job", 2)},
    )
    assert not result.releases and all(not h.held_nodes for h in result.holds)
    assert all(planner.index.free[n.name] == n.allocatable for n in nodes)


def test_composites_with_topology_share_a_bounded_number_of_domain_tries_per_pass() -> None:
    """Each domain tried indexes the composite's pods pinned there (a sweep of every node, not
    counted by the search budget): a tenant's many composites cannot make a pass unbounded."""
    nodes = [racked(f"n{i}", f"r{i}", gpus=8) for i in range(40)]
    queue, composites = [], []
    for c in range(5):  # each needs two whole nodes in one rack: none fits, each tries 32 racks
        queue += [
            child(f"a{c}", 1, 8, composite=f"c{c}", created=c),
            child(f"b{c}", 1, 8, composite=f"c{c}", created=c),
        ]
        composites.append(Composite("ns", f"c{c}", 2, topology_key=RACK))
    result = plan(nodes, queue, *composites)
    assert not result.releases
    untried = [h for h in result.holds if "was not tried this pass" in h.message]
    assert untried and {h.gang.composite for h in untried} == {"c2", "c3", "c4"}, (
        "64 tries: two composites' worth"
    )


def test_an_admitted_gangs_spare_pod_does_not_count_it_twice() -> None:
    """minGroupCount 3, one gang admitted with a spare pod that fits, one that fits, one that
    does not: 2 of 3 placed, so nothing new is released."""
    nodes = [node("a"), node("b")]
    admitted = replace(child("a", 1, 8), released=1, min_member=1, members=2)
    queue = [admitted, child("b", 1, 8), child("c", 2, 8)]
    result = plan(nodes, queue, Composite("ns", "job", 3, admitted=1))
    assert not result.releases, [r.gang.name for r in result.releases]


def test_a_composites_gangs_go_to_the_domain_its_admitted_gangs_run_in() -> None:
    nodes = [racked("a1", "r1"), racked("b1", "r2"), racked("b2", "r2")]
    result = plan(
        nodes,
        [child("workers", 1, 8)],
        Composite("ns", "job", 2, admitted=1, topology_key=RACK, admitted_domains=frozenset({"r1"})),
    )
    (release,) = result.releases
    assert release.placement[0][1].labels[RACK] == "r1", "beside the admitted launcher, not in the roomier r2"
    split = Composite("ns", "job", 2, admitted=1, topology_key=RACK, admitted_domains=frozenset({"r1", "r2"}))
    assert not plan(nodes, [child("workers", 1, 8)], split).releases, "admitted gangs split: no single domain"


# -- nested composites: a composite of composites (a multi-slice job of launcher+workers slices)


def slice_of(name: str, parent: str = "job", min_groups: int = 2, **kw: object) -> Composite:
    return Composite("ns", name, min_groups, parent=parent, **kw)  # type: ignore[arg-type]


def two_slices(gpus_each: int = 8) -> list[Gang]:
    """Slices s0 and s1, each a launcher and a worker gang of one pod."""
    return [
        child(f"{role}{s}", 1, gpus_each, composite=f"s{s}", created=s)
        for s in range(2)
        for role in ("launcher", "worker")
    ]


def test_slices_that_each_fit_alone_but_not_together_release_none() -> None:
    nodes = [node("a"), node("b"), node("c")]  # room for one slice and a half
    result = plan(nodes, two_slices(), Composite("ns", "job", 2), slice_of("s0"), slice_of("s1"))
    assert not result.releases
    assert len(result.holds) == 4 and {h.reason for h in result.holds} == {"WaitingForGroups"}
    assert "CompositePodGroup job needs 2 of its groups placed together" in result.holds[0].message


def test_slices_that_fit_together_are_all_released() -> None:
    nodes = [node(n) for n in "abcd"]
    result = plan(nodes, two_slices(), Composite("ns", "job", 2), slice_of("s0"), slice_of("s1"))
    assert len(result.releases) == 4
    used = [n.name for r in result.releases for _, n in r.placement]
    assert sorted(used) == list("abcd")


def test_one_slice_of_min_group_count_one_goes_and_the_other_waits_for_its_own_gangs() -> None:
    nodes = [node(n) for n in "abc"]
    result = plan(nodes, two_slices(), Composite("ns", "job", 1), slice_of("s0"), slice_of("s1"))
    assert {r.gang.name for r in result.releases} == {"launcher0", "worker0"}
    assert {h.gang.name for h in result.holds} == {"launcher1", "worker1"}
    assert all("CompositePodGroup s1 needs 2 of its gangs" in h.message for h in result.holds)


def test_a_slice_whose_count_is_met_already_counts_once_toward_the_job() -> None:
    """s0 runs (admitted 2 of 2): the job (2 of 2 slices, one admitted) needs s1 placed whole."""
    queue = [child("launcher1", 1, 8, composite="s1"), child("worker1", 1, 8, composite="s1")]
    composites = (Composite("ns", "job", 2, admitted=1), slice_of("s0", admitted=2), slice_of("s1"))
    assert len(plan([node("a"), node("b")], queue, *composites).releases) == 2
    assert not plan([node("a")], queue, *composites).releases


def test_the_job_picks_one_rack_and_each_slice_one_block_inside_it() -> None:
    def at(name: str, rack: str, block: str) -> Node:
        base = racked(name, rack)
        return replace(base, labels={**base.labels, "block": block})

    # r1 has two blocks of one node: no slice fits in a block there. r2 has two blocks of two.
    nodes = [at("a", "r1", "b1"), at("b", "r1", "b2")] + [
        at(f"c{i}", "r2", f"b{3 + i // 2}") for i in range(4)
    ]
    result = plan(
        nodes,
        two_slices(),
        Composite("ns", "job", 2, topology_key=RACK),
        slice_of("s0", topology_key="block"),
        slice_of("s1", topology_key="block"),
    )
    assert len(result.releases) == 4
    by_slice: dict[str, set[str]] = {}
    for release in result.releases:
        for _, where in release.placement:
            assert where.labels[RACK] == "r2"
            by_slice.setdefault(str(release.gang.composite), set()).add(where.labels["block"])
    assert all(len(blocks) == 1 for blocks in by_slice.values()) and by_slice["s0"] != by_slice["s1"]


def test_a_loop_of_parents_is_planned_no_higher_than_where_it_loops() -> None:
    """s0 -> s1 -> s0: each composite is planned, and the planner ends (the operator holds such
    gangs, told to fix it; the planner must not loop whatever it is given)."""
    queue = [child("a", 1, 8, composite="s0"), child("b", 1, 8, composite="s1")]
    result = plan(
        [node("a"), node("b")],
        queue,
        slice_of("s0", parent="s1", min_groups=1),
        slice_of("s1", parent="s0", min_groups=1),
    )
    assert len(result.releases) + len(result.holds) == 2


@settings(max_examples=200, deadline=None)
@given(
    slices=st.lists(
        st.tuples(st.lists(st.sampled_from([2, 4, 8]), min_size=1, max_size=3), st.integers(1, 3)),
        min_size=1,
        max_size=3,
    ),
    nodes_count=st.integers(0, 5),
    min_slices=st.integers(1, 3),
)
def test_each_level_is_all_or_nothing(
    slices: list[tuple[list[int], int]], nodes_count: int, min_slices: int
) -> None:
    """A job of slices of gangs: under each composite either nothing is released, or at least
    its minGroupCount of children are placed; the job's count counts slices placed."""
    nodes = [node(f"n{i}") for i in range(nodes_count)]
    queue = [
        child(f"s{s}g{g}", 1, gpus, composite=f"s{s}", created=s)
        for s, (gangs, _) in enumerate(slices)
        for g, gpus in enumerate(gangs)
    ]
    composites = [Composite("ns", "job", min_slices)] + [
        slice_of(f"s{s}", min_groups=need) for s, (_, need) in enumerate(slices)
    ]
    result = plan(nodes, queue, *composites)
    released: dict[str, int] = {}
    for release in result.releases:
        released[str(release.gang.composite)] = released.get(str(release.gang.composite), 0) + 1
    for s, (_, need) in enumerate(slices):
        assert released.get(f"s{s}", 0) in (0, *range(need, 4)), f"slice s{s}: {released}"
    assert not released or len(released) >= min_slices, released
    taken: dict[str, int] = {}
    for release in result.releases:
        for pod, where in release.placement:
            taken[where.name] = taken.get(where.name, 0) + pod.requests[GPU]
    assert all(gpus <= resources({GPU: "8"})[GPU] for gpus in taken.values())
