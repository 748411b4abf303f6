"""The planner: plain data, examples and properties."""

from __future__ import annotations

import itertools
from collections import defaultdict

from hypothesis import given, settings
from hypothesis import strategies as st

from quorum.core.fit import FitSettings
from quorum.core.model import Gang, Node, Pod, Taint, Toleration, add, fits, resources
from quorum.core.planner import PlannerSettings, plan_gangs, queue_order

GPU = "nvidia.com/gpu"


def node(name: str, gpus: int = 8, cpu: int = 128, state: str = "production", **kw: object) -> Node:
    alloc = {"cpu": str(cpu), "memory": "1Ti", "pods": "110"}
    if gpus:
        alloc[GPU] = str(gpus)
    labels = {"kubernetes.io/hostname": name, "node.coreweave.cloud/state": state}
    return Node(name=name, labels=labels, allocatable=resources(alloc), **kw)  # type: ignore[arg-type]


def pod(uid: str, gpus: int = 1, cpu: str = "1", **kw: object) -> Pod:
    req = {"cpu": cpu, "memory": "1Gi", "pods": "1"}
    if gpus:
        req[GPU] = str(gpus)
    return Pod(uid=uid, name=uid, requests=resources(req), **kw)  # type: ignore[arg-type]


def gang(
    name: str, n: int, gpus: int = 1, min_member: int | None = None, created: float = 0, **kw: object
) -> Gang:
    pods = tuple(pod(f"{name}-{i}", gpus) for i in range(n))
    return Gang(
        "ns",
        name,
        min_member if min_member is not None else n,
        pods,
        members=n,
        created=created,
        **kw,  # type: ignore[arg-type]
    )


def test_a_gang_that_fits_is_released_whole_and_packed() -> None:
    plan = plan_gangs([node("a"), node("b"), node("c")], {}, [gang("g", 2, gpus=4)])
    assert not plan.holds
    (release,) = plan.releases
    assert {n.name for _, n in release.placement} == {"a"}, "two 4-GPU pods share one 8-GPU node"


def test_best_fit_uses_the_fuller_node() -> None:
    used = {"b": resources({GPU: "4"})}
    plan = plan_gangs([node("a"), node("b")], used, [gang("g", 1, gpus=4)])
    assert plan.releases[0].placement[0][1].name == "b"


def test_waiting_for_members_says_how_many() -> None:
    g = Gang("ns", "pg1", 4, (pod("p0"), pod("p1")), members=2)
    plan = plan_gangs([node("a")], {}, [g])
    assert not plan.releases
    assert plan.holds[0].reason == "WaitingForMembers"
    assert plan.holds[0].message == "2 of 4 members exist (minMember 4)"


def test_two_gangs_that_cannot_both_fit_first_comes_first() -> None:
    nodes = [node("a"), node("b")]
    first, second = gang("first", 2, gpus=8, created=1), gang("second", 2, gpus=8, created=2)
    plan = plan_gangs(nodes, {}, [second, first])
    assert [r.gang.name for r in plan.releases] == ["first"]
    assert plan.holds[0].gang.name == "second" and plan.holds[0].reason == "Unschedulable"


def test_priority_before_age() -> None:
    old, urgent = gang("old", 2, gpus=8, created=1), gang("urgent", 2, gpus=8, created=2, priority=100)
    plan = plan_gangs([node("a"), node("b")], {}, [old, urgent])
    assert [r.gang.name for r in plan.releases] == ["urgent"]


def test_backfill_a_small_gang_behind_a_big_one() -> None:
    big, small = gang("big", 3, gpus=8, created=1), gang("small", 1, gpus=8, created=2)
    plan = plan_gangs([node("a"), node("b")], {}, [big, small])
    assert [r.gang.name for r in plan.releases] == ["small"]


def test_fragmentation_is_explained_in_numbers() -> None:
    # 16 GPUs free in all, but 4 on each of 4 nodes: no node takes an 8-GPU pod.
    nodes = [node(f"n{i}") for i in range(4)]
    used = {f"n{i}": resources({GPU: "4"}) for i in range(4)}
    plan = plan_gangs(nodes, used, [gang("g", 2, gpus=8)])
    (hold,) = plan.holds
    assert hold.message == (
        "needs 2 pods placed together; 2 pods × 8 nvidia.com/gpu, 1 cpu, 1Gi memory; "
        "4 of 4 nodes eligible; 0 have room for one; 0 such pods fit in all: short by 2"
    )


def test_ineligible_nodes_are_counted_by_reason_and_never_used() -> None:
    nodes = [
        node("good"),
        node("triage", state="triage", taints=(Taint("node.coreweave.cloud/reserved", "NoSchedule", "h"),)),
        node("cordoned", unschedulable=True),
        node("down", ready=False),
        node("cpu", gpus=0, taints=(Taint("is_cpu_compute", "NoSchedule"),)),
    ]
    plan = plan_gangs(nodes, {}, [gang("g", 2, gpus=8)])
    (hold,) = plan.holds
    assert (
        "1 of 5 nodes eligible (1 cordoned, 1 not Ready, 1 state triage, 1 taint is_cpu_compute)"
        in hold.message
    )
    plan = plan_gangs(nodes, {}, [gang("g", 1, gpus=8)])
    assert plan.releases[0].placement[0][1].name == "good"


def test_cpu_gang_goes_to_cpu_nodes() -> None:
    cpu_taint = Taint("is_cpu_compute", "NoSchedule")
    nodes = [
        node("gpu", taints=(Taint("is_gpu", "PreferNoSchedule", "true"),)),
        node("cpu", gpus=0, taints=(cpu_taint,)),
    ]
    tolerate = (Toleration("is_cpu_compute", "Exists", effect="NoSchedule"),)
    cpu_gang = Gang(
        "ns", "c", 2, tuple(pod(f"c{i}", gpus=0, tolerations=tolerate) for i in range(2)), members=2
    )
    plan = plan_gangs(nodes, {}, [cpu_gang])
    assert {n.name for _, n in plan.releases[0].placement} == {"cpu"}


def test_node_selector_and_affinity_are_constraints() -> None:
    nodes = [node("a"), node("b")]
    pinned = Gang("ns", "g", 1, (pod("p", node_selector={"kubernetes.io/hostname": "b"}),), members=1)
    assert plan_gangs(nodes, {}, [pinned]).releases[0].placement[0][1].name == "b"


def test_min_resources_must_be_free() -> None:
    g = gang("g", 1, gpus=1, min_resources=resources({GPU: "32"}))
    plan = plan_gangs([node("a"), node("b")], {}, [g])
    assert plan.holds[0].message == "minResources not free: needs 32 nvidia.com/gpu, eligible nodes have 16"


def test_members_released_before_count_towards_min_member() -> None:
    g = Gang("ns", "g", 4, (pod("p3"),), members=4, released=3)
    plan = plan_gangs([node("a")], {}, [g])
    assert len(plan.releases[0].placement) == 1


def test_mixed_gang_found_by_search_when_greedy_fails() -> None:
    # Two nodes of 8 GPUs. Pods 5, 3, 4, 4: greedy (big first, best fit) puts 5 and 4 apart and
    # strands the rest; the search finds 5+3 | 4+4.
    nodes = [node("a"), node("b")]
    pods = (pod("p5", 5), pod("p4a", 4), pod("p4b", 4), pod("p3", 3))
    plan = plan_gangs(nodes, {}, [Gang("ns", "m", 4, pods, members=4)])
    assert plan.releases, plan.holds
    by_node: dict[str, int] = defaultdict(int)
    for p, n in plan.releases[0].placement:
        by_node[n.name] += p.requests[GPU]
    assert sorted(by_node.values()) == [8000, 8000]


# -- properties ------------------------------------------------------------------------------


@st.composite
def instances(draw: st.DrawFn) -> tuple[list[Node], dict[str, dict[str, int]], list[Gang]]:
    nodes = [
        node(
            f"n{i}",
            gpus=draw(st.sampled_from([0, 4, 8])),
            cpu=draw(st.sampled_from([8, 16])),
            unschedulable=draw(st.booleans().filter(lambda _: True)) and draw(st.integers(0, 5)) == 0,
        )
        for i in range(draw(st.integers(1, 4)))
    ]
    used = {  # what bound pods already use: never more than a node has
        n.name: {
            k: draw(st.integers(0, v // 1000)) * 1000 for k, v in n.allocatable.items() if k in (GPU, "cpu")
        }
        for n in nodes
        if draw(st.booleans())
    }
    gangs = []
    for g in range(draw(st.integers(1, 3))):
        sizes = draw(st.lists(st.integers(0, 8), min_size=1, max_size=4))
        pods = tuple(pod(f"g{g}p{i}", gpus=s, cpu=str(draw(st.integers(1, 8)))) for i, s in enumerate(sizes))
        gangs.append(Gang("ns", f"g{g}", len(pods), pods, members=len(pods), created=float(g)))
    return nodes, used, gangs


@settings(max_examples=300, deadline=None)
@given(instances())
def test_never_over_commits_and_releases_whole_gangs(
    instance: tuple[list[Node], dict[str, dict[str, int]], list[Gang]],
) -> None:
    nodes, used, gangs = instance
    plan = plan_gangs(nodes, used, gangs)
    load = {n.name: dict(used.get(n.name, {})) for n in nodes}
    for release in plan.releases:
        assert len(release.placement) >= release.gang.min_member - release.gang.released
        assert len({p.uid for p, _ in release.placement}) == len(release.placement)
        for p, n in release.placement:
            assert not n.unschedulable
            load[n.name] = add(load[n.name], p.requests)
    for n in nodes:
        assert fits(load[n.name], n.allocatable), (n.name, load[n.name], n.allocatable)
    decided = [r.gang.key for r in plan.releases] + [h.gang.key for h in plan.holds]
    assert sorted(decided) == sorted(g.key for g in gangs)


def brute_force(gang_: Gang, nodes: list[Node], used: dict[str, dict[str, int]]) -> bool:
    usable = [n for n in nodes if not n.unschedulable]
    for choice in itertools.product(usable, repeat=len(gang_.pods)):
        load = {n.name: dict(used.get(n.name, {})) for n in nodes}
        for p, n in zip(gang_.pods, choice, strict=True):
            load[n.name] = add(load[n.name], p.requests)
        if all(fits(load[n.name], n.allocatable) for n in usable):
            return True
    return False


@settings(max_examples=300, deadline=None)
@given(instances())
def test_complete_for_the_head_gang(
    instance: tuple[list[Node], dict[str, dict[str, int]], list[Gang]],
) -> None:
    nodes, used, gangs = instance
    head = min(gangs, key=queue_order)
    plan = plan_gangs(nodes, used, gangs, PlannerSettings(fit=FitSettings()))
    if brute_force(head, nodes, used):
        assert head.key in [r.gang.key for r in plan.releases]
    else:
        assert head.key not in [r.gang.key for r in plan.releases]


@settings(max_examples=100, deadline=None)
@given(st.integers(1, 8), st.integers(1, 8))
def test_a_gang_that_fits_on_fewer_nodes_is_not_spread(pods: int, gpus: int) -> None:
    nodes = [node(f"n{i}") for i in range(8)]
    plan = plan_gangs(nodes, {}, [gang("g", pods, gpus=gpus)])
    if pods * gpus > 64:
        return
    per_node = 8 // gpus
    used_nodes = {n.name for _, n in plan.releases[0].placement}
    assert len(used_nodes) == -(-pods // per_node)
