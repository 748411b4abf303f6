"""The planner cannot be stopped by one input: no recursion as deep as a gang, work bounded in node
visits, absurd gangs held with a reason, and an error in one gang confined to that gang."""

from __future__ import annotations

import itertools
import re
import sys
from collections.abc import Mapping, Sequence
from typing import Any

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from quorum.core.explain import explain
from quorum.core.index import NodeIndex
from quorum.core.model import Gang, Node, Pod, Requirement, Taint, Toleration, add, fits, resources
from quorum.core.planner import Plan, Planner, PlannerSettings, plan_gangs, queue_order
from tests.unit.test_planner import GPU, node, pod

RACK = "network.topology.kubernetes.io/rack"
HOSTNAME = "kubernetes.io/hostname"


def worker(uid: str, gpus: int, cpu: int, **kw: Any) -> Pod:
    return pod(uid, gpus, cpu=str(cpu), **kw)


def mixed(name: str, launcher_cpu: int, workers: int, gpus: int, cpu: int = 1, **kw: Any) -> Gang:
    """A launcher (CPU only) and `workers` alike GPU workers: all of them needed."""
    workers_ = (worker(f"{name}-w{i}", gpus, cpu) for i in range(workers))
    pods = (worker(f"{name}-launcher", 0, launcher_cpu), *workers_)
    return Gang("ns", name, len(pods), pods, members=len(pods), **kw)


def only_hold(plan: Plan) -> tuple[str, str]:
    assert not plan.releases
    (hold,) = plan.holds
    return hold.reason, hold.message


# -- the inputs that raised RecursionError ---------------------------------------------------------


def test_a_thousand_eight_gpu_workers_over_999_nodes_is_held_at_once_with_numbers() -> None:
    nodes = [node(f"n{i}") for i in range(999)]
    plan = plan_gangs(nodes, {}, [mixed("big", 1, 1000, gpus=8)])
    assert only_hold(plan) == (
        "Unschedulable",
        "needs 8000 nvidia.com/gpu in all for 1001 pods; eligible nodes have 7992 free: short by 8",
    )
    assert plan.visits == 0, "known without any search"


def test_1300_one_gpu_workers_over_160_nodes_is_held_at_once_with_numbers() -> None:
    nodes = [node(f"n{i}") for i in range(160)]
    plan = plan_gangs(nodes, {}, [mixed("big", 1, 1300, gpus=1)])
    assert only_hold(plan) == (
        "Unschedulable",
        "needs 1300 nvidia.com/gpu in all for 1301 pods; eligible nodes have 1280 free: short by 20",
    )


def test_a_search_deeper_than_the_recursion_limit_runs_out_of_budget_not_of_stack() -> None:
    # 130 nodes of 8 GPUs and 130 CPUs; 1034 workers (1 GPU, 16 CPU) and a launcher (100 CPU):
    # enough of everything in all, but a node with the launcher takes only one worker, so at most
    # 129 * 8 + 1 = 1033 workers fit. Greedy fails; the search goes 1034 pods deep and runs out.
    nodes = [node(f"n{i:03d}", gpus=8, cpu=130) for i in range(130)]
    gang = mixed("deep", 100, 1034, gpus=1, cpu=16)
    plan = plan_gangs(nodes, {}, [gang], PlannerSettings(gang_budget=200_000))
    reason, message = only_hold(plan)
    assert reason == "BudgetExhausted"
    found = re.match(r"search budget exhausted after (\d+) placements tried \((\d+) node visits\); ", message)
    assert found, message
    assert int(found[1]) > max(1034, sys.getrecursionlimit()), "it went deeper than a recursion could"
    assert int(found[2]) == plan.visits <= 200_000
    assert message.endswith("only 1034 of the gang's pods fit together")


def test_one_whole_node_short_is_proven_at_the_first_step_of_the_search() -> None:
    # 1 launcher + 301 eight-GPU workers, 300 whole nodes free and 4,700 half-free ones: enough
    # GPUs in all, but only 300 nodes take a worker; the search proves it at its first step.
    nodes = [node(f"n{i:04d}") for i in range(5000)]
    used = {f"n{i:04d}": resources({GPU: "4"}) for i in range(300, 5000)}
    plan = plan_gangs(nodes, used, [mixed("m", 1, 301, gpus=8)])
    reason, message = only_hold(plan)
    assert reason == "Unschedulable"
    assert "300 such pods fit in all: short by 1" in message
    assert plan.visits <= 1000


# -- budgets ---------------------------------------------------------------------------------------


def fragmented(name: str, nodes: int, created: float) -> Gang:
    """A mixed gang that fits only by search, if at all (see the deep test): one worker too many."""
    return mixed(name, 100, 8 * (nodes - 1) + 2, gpus=1, cpu=16, created=created)


def test_the_pass_budget_limits_search_not_the_gangs_of_alike_pods_behind() -> None:
    nodes = [node(f"n{i:02d}", gpus=8, cpu=130) for i in range(20)]
    first, second = fragmented("first", 20, created=0), fragmented("second", 20, created=1)
    smalls = [
        Gang("ns", f"s{i}", 2, (pod(f"s{i}a"), pod(f"s{i}b")), members=2, created=2 + i) for i in range(5)
    ]
    tight = PlannerSettings(gang_budget=5_000, pass_budget=1)
    plan = plan_gangs(nodes, {}, [first, second, *smalls], tight)
    assert [r.gang.name for r in plan.releases] == [f"s{i}" for i in range(5)]
    holds = {h.gang.name: h for h in plan.holds}
    assert holds["first"].reason == "BudgetExhausted"
    assert holds["first"].message.startswith("search budget exhausted after ")
    assert "(5000 node visits); needs 155 pods placed together" in holds["first"].message
    assert holds["second"].reason == "BudgetExhausted"
    assert holds["second"].message == (
        "not searched this pass: the pass's search budget (1 node visits) went to gangs ahead of it; "
        "it goes first among its priority next pass; greedy placement fit 154 of the needed 155"
    )
    assert plan.visits == 5_000


def test_a_gang_held_for_want_of_the_pass_budget_is_searched_in_a_later_pass() -> None:
    nodes = {n.name: n for n in (node(f"n{i:02d}", gpus=8, cpu=130) for i in range(20))}
    first, second = fragmented("first", 20, created=0), fragmented("second", 20, created=1)
    planner = Planner(PlannerSettings(gang_budget=5_000, pass_budget=1))
    planner.plan(nodes, {}, [first, second])
    again = planner.plan(nodes, {}, [first, second], changed=())
    holds = {h.gang.name: h.message for h in again.holds}
    assert holds["second"].startswith("search budget exhausted"), "its turn: the first is known"
    assert again.visits == 5_000


def test_a_topology_gang_shares_one_budget_over_its_domains() -> None:
    racks = [
        Node(f"r{r}n{i}", {RACK: f"r{r}"}, node(f"r{r}n{i}", gpus=8, cpu=130).allocatable)
        for r in range(3)
        for i in range(10)
    ]
    gang = fragmented("g", 10, created=0)
    gang = Gang("ns", "g", gang.min_member, gang.pods, members=gang.members, topology_key=RACK)
    plan = plan_gangs(racks, {}, [gang], PlannerSettings(gang_budget=3_000))
    reason, message = only_hold(plan)
    assert reason == "BudgetExhausted"
    assert message.startswith("search budget exhausted after ")
    assert f"needs 75 pods in one rack (node label {RACK}); none has room" in message
    assert plan.visits <= 3_000


# -- absurd gangs ----------------------------------------------------------------------------------


def test_too_many_shapes_is_held_with_what_makes_a_shape_and_nothing_is_indexed() -> None:
    shapes = tuple(worker(f"p{i}", 0, 1 + i) for i in range(70))
    many = Gang("ns", "many", 70, shapes, members=70)
    fine = Gang("ns", "fine", 1, (pod("ok"),), members=1, created=1)
    planner = Planner()
    plan = planner.plan({"a": node("a")}, {}, [many, fine])
    assert [r.gang.name for r in plan.releases] == ["fine"]
    (hold,) = plan.holds
    assert hold.reason == "TooManyShapes"
    assert hold.message.startswith(
        "the gang's pods come in 70 distinct shapes, more than the 64 a gang may have"
    )
    assert "resource requests, tolerations, nodeSelector and required node affinity" in hold.message
    assert set(planner.index.shapes) == {fine.pods[0].shape}


def test_gangs_without_pods_or_with_odd_min_member_do_not_fail() -> None:
    queue = [
        Gang("ns", "empty", 0, (), members=0),
        Gang("ns", "empty-waiting", 3, (), members=0),
        Gang("ns", "zero", 0, (pod("z0"), pod("z1")), members=2),
        Gang("ns", "negative", -5, (pod("n0"),), members=1),
        Gang("ns", "above", 10, (pod("a0"),), members=1),
        Gang("ns", "released-beyond", 2, (pod("r0"),), members=3, released=7),
    ]
    plan = plan_gangs([node("a")], {}, queue)
    assert {h.gang.name: h.reason for h in plan.holds} == {
        "empty-waiting": "WaitingForMembers",
        "above": "WaitingForMembers",
    }
    assert {r.gang.name for r in plan.releases} == {"zero", "negative", "released-beyond"}


class Exploding(dict[str, int]):
    """Requests that can be listed (a pod's shape is built from them) but not read one by one."""

    def get(self, key: str, default: Any = None) -> Any:
        raise RuntimeError("boom")


def test_an_error_in_one_gang_holds_that_gang_and_the_pass_goes_on() -> None:
    bad = Pod("bad", "bad", Exploding({GPU: 1000}))
    queue = [
        Gang("ns", "bad", 1, (bad,), members=1),
        Gang("ns", "good", 1, (pod("g"),), members=1, created=1),
    ]
    planner = Planner()
    nodes = {"a": node("a")}
    plan = planner.plan(nodes, {}, queue)
    assert [r.gang.name for r in plan.releases] == ["good"]
    (hold,) = plan.holds
    assert (hold.reason, hold.message) == ("PlanningFailed", "planning failed: RuntimeError: boom")
    assert not planner.synced, "the index may be half-updated: rebuilt next pass"
    again = planner.plan(nodes, {}, queue[1:], changed=())
    assert [r.gang.name for r in again.releases] == ["good"] and planner.synced


def test_explain_copes_with_every_pod_placed() -> None:
    index = NodeIndex(PlannerSettings().fit, PlannerSettings().accelerators)
    a = node("a")
    index.set_node(a, dict(a.allocatable))
    p = pod("p")
    gang = Gang("ns", "g", 2, (p,), members=1)
    message = explain(gang, 2, [p], [(p, a)], {p.shape: index.shape(p)}, 1)
    assert message == "needs 2 pods placed together; only 1 of the gang's pods fit together"
    assert (
        explain(gang, 1, [], [], {}, 1)
        == "needs 1 pods placed together; only 0 of the gang's pods fit together"
    )


# -- the search stays complete with its shortcuts --------------------------------------------------


@st.composite
def small_mixed(draw: st.DrawFn) -> tuple[list[Node], Gang]:
    taint = Taint("dedicated", "NoSchedule", "x")
    nodes = [
        node(
            f"n{i}",
            gpus=draw(st.sampled_from([2, 4, 8])),
            cpu=draw(st.sampled_from([4, 8, 16])),
            taints=(taint,) if draw(st.integers(0, 3)) == 0 else (),
        )
        for i in range(draw(st.integers(1, 4)))
    ]
    pods = []
    for i in range(draw(st.integers(1, 5))):
        kw: dict[str, Any] = {}
        if draw(st.integers(0, 3)) == 0:
            kw["node_selector"] = {HOSTNAME: f"n{draw(st.integers(0, len(nodes) - 1))}"}
        if draw(st.booleans()):
            kw["tolerations"] = (Toleration("dedicated", "Exists"),)
        pods.append(worker(f"p{i}", draw(st.integers(0, 5)), draw(st.integers(1, 8)), **kw))
    min_member = draw(st.integers(1, len(pods)))
    return nodes, Gang("ns", "g", min_member, tuple(pods), members=len(pods))


def feasible(gang: Gang, nodes: list[Node]) -> bool:
    """Brute force: some min_member of the pods placed on nodes they may use, within room."""
    options: list[list[Node | None]] = []
    for p in gang.pods:
        usable: list[Node | None] = [
            n
            for n in nodes
            if all(n.labels.get(k) == v for k, v in p.node_selector.items())
            and all(any(t.tolerates(taint) for t in p.tolerations) for taint in n.taints)
        ]
        options.append([*usable, None])
    for choice in itertools.product(*options):
        if sum(c is not None for c in choice) < gang.min_member:
            continue
        load: dict[str, dict[str, int]] = {}
        for p, n in zip(gang.pods, choice, strict=True):
            if n is not None:
                load[n.name] = add(load.get(n.name, {}), p.requests)
        if all(fits(load[n.name], n.allocatable) for n in nodes if n.name in load):
            return True
    return False


@settings(max_examples=400, deadline=None)
@given(small_mixed())
def test_the_search_finds_every_gang_that_fits(instance: tuple[list[Node], Gang]) -> None:
    nodes, gang = instance
    plan = plan_gangs(nodes, {}, [gang])
    assert bool(plan.releases) == feasible(gang, nodes), (plan.holds, nodes, gang)


# -- property: whatever comes in, the planner answers and stays within its rules --------------------

RESOURCES = (GPU, "cpu", "memory", "pods")
sane = st.sampled_from([0, 1000, 2000, 3000, 4000, 8000, 16000])
absurd = st.one_of(st.integers(1, 10**6), st.sampled_from([10**30, 10**40 + 7]))
amounts = st.one_of(sane, sane, sane, absurd)
requests = st.one_of(sane, sane, sane, absurd, st.integers(-(10**6), -1))
taints = st.sampled_from(
    [
        Taint("dedicated", "NoSchedule", "x"),
        Taint("is_gpu", "PreferNoSchedule", "true"),
        Taint("gone", "NoExecute"),
    ]
)
tolerations = st.sampled_from(
    [Toleration("dedicated", "Exists"), Toleration("is_gpu", "Exists"), Toleration()]
)


@st.composite
def clusters(draw: st.DrawFn) -> tuple[dict[str, Node], dict[str, dict[str, int]]]:
    nodes: dict[str, Node] = {}
    used: dict[str, dict[str, int]] = {}
    for i in range(draw(st.integers(0, 40))):
        name = f"n{i}"
        if draw(st.booleans()):  # a GPU node as they come
            gpus, cpu = draw(st.sampled_from([0, 4, 8])), draw(st.sampled_from([4, 8, 16]))
            allocatable = {GPU: gpus * 1000, "cpu": cpu * 1000, "memory": 64 * 2**30 * 1000, "pods": 110_000}
        else:
            allocatable = draw(st.dictionaries(st.sampled_from(RESOURCES), amounts, max_size=4))
        labels = {HOSTNAME: name}
        if draw(st.booleans()):
            labels[RACK] = draw(st.sampled_from(["r0", "r1", "r2"]))
        if draw(st.integers(0, 7)) == 0:
            labels["node.coreweave.cloud/state"] = "triage"
        nodes[name] = Node(
            name,
            labels,
            allocatable,
            taints=tuple(draw(st.lists(taints, max_size=2))),
            unschedulable=draw(st.integers(0, 9)) == 0,
            ready=draw(st.integers(0, 9)) != 0,
        )
        if draw(st.booleans()):
            used[name] = draw(st.dictionaries(st.sampled_from(RESOURCES), requests, max_size=3))
    return nodes, used


@st.composite
def pods_of(draw: st.DrawFn, gang: int, racks: bool) -> tuple[Pod, ...]:
    count = draw(st.sampled_from([0, 1, 2, 3, 5, 8, 20, 80, 300]))
    variety = draw(st.sampled_from([1, 2, 3, 0, -1]))  # 0: nearly every pod its own shape
    kinds = [
        draw(st.dictionaries(st.sampled_from(RESOURCES), requests, max_size=4))
        for _ in range(max(1, variety))
    ]
    if variety == -1:  # a launcher and workers, as mixed gangs come (greedy often fails them)
        count = draw(st.integers(2, 40))
        role = {GPU: draw(st.sampled_from([1, 2, 4])) * 1000, "cpu": draw(st.sampled_from([1, 2, 3])) * 1000}
        kinds = [role] * (count - 1) + [{"cpu": draw(st.sampled_from([6, 10, 14])) * 1000}]
    pods = []
    for j in range(count):
        asks = dict(kinds[j % len(kinds)])
        if variety == 0:
            asks["cpu"] = 1000 + j  # many shapes: up to hundreds
        kw: dict[str, Any] = {}
        if draw(st.integers(0, 5)) == 0:
            kw["tolerations"] = (draw(tolerations),)
        if racks and draw(st.integers(0, 5)) == 0:
            kw["node_selector"] = {RACK: draw(st.sampled_from(["r0", "r1"]))}
        if draw(st.integers(0, 9)) == 0:
            kw["affinity"] = ((Requirement(RACK, "In", ("r1", "r2")),),)
        pods.append(Pod(f"g{gang}p{j}", f"g{gang}p{j}", asks, **kw))
    return tuple(pods)


@st.composite
def queues(draw: st.DrawFn) -> list[Gang]:
    gangs = []
    for g in range(draw(st.integers(0, 6))):
        racks = draw(st.booleans())
        pods = draw(pods_of(g, racks))
        fair = st.integers(1, max(1, len(pods)))
        odd = st.sampled_from([-3, 0, len(pods) + 1, 10**9])
        gangs.append(
            Gang(
                "ns",
                f"g{draw(st.integers(0, 4))}",  # keys may repeat
                draw(st.one_of(fair, fair, fair, odd)),
                pods,
                members=len(pods),
                released=draw(st.sampled_from([0, 0, 0, 1, 3, -2])),
                priority=draw(st.integers(-1, 1)),
                created=float(g),
                min_resources=draw(st.dictionaries(st.sampled_from(RESOURCES), requests, max_size=1)),
                held_since=draw(st.sampled_from([None, 0.0])),
                topology_key=RACK if racks and draw(st.booleans()) else None,
            )
        )
    return gangs


def check(
    plan: Plan,
    nodes: Mapping[str, Node],
    used: Mapping[str, Mapping[str, int]],
    queue: Sequence[Gang],
    s: PlannerSettings,
) -> None:
    assert plan.visits <= s.pass_budget + s.gang_budget
    taken: dict[str, dict[str, int]] = {}
    released = []
    for release in plan.releases:
        gang = release.gang
        assert len(release.placement) >= gang.min_member - gang.released
        assert len(release.placement) <= len(gang.pods)
        released.append(gang)
        for p, n in release.placement:
            assert any(p is q for q in gang.pods)
            asks = {k: v for k, v in p.requests.items() if v > 0}
            taken[n.name] = add(taken.get(n.name, {}), asks)
    for name, load in taken.items():
        usage = {k: v for k, v in used.get(name, {}).items() if v > 0}  # negative usage frees nothing
        room = add(nodes[name].allocatable, {k: -v for k, v in usage.items()})
        for k, v in load.items():
            assert v <= room.get(k, 0), (name, k, v, room)
    held = [h.gang for h in plan.holds]
    for h in plan.holds:
        assert h.reason in ("WaitingForMembers", "Unschedulable", "BudgetExhausted", "TooManyShapes"), h
    for gang in queue:
        admitted = gang.min_member - gang.released <= 0
        if gang.pods and gang not in released and not admitted:
            assert gang in held, gang.key


@settings(
    max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large]
)
@given(
    cluster=clusters(),
    queue=queues(),
    gang_budget=st.sampled_from([0, 50, 2_000, 250_000]),
    pass_budget=st.sampled_from([0, 100, 5_000, 750_000]),
    max_shapes=st.sampled_from([1, 8, 64, 64]),
    changes=st.data(),
)
def test_whatever_comes_in_the_planner_answers_within_its_rules(
    cluster: tuple[dict[str, Node], dict[str, dict[str, int]]],
    queue: list[Gang],
    gang_budget: int,
    pass_budget: int,
    max_shapes: int,
    changes: st.DataObject,
) -> None:
    nodes, used = cluster
    s = PlannerSettings(
        gang_budget=gang_budget,
        pass_budget=pass_budget,
        max_shapes_per_gang=max_shapes,
        starvation_seconds=50,
    )
    check(plan_gangs(list(nodes.values()), used, queue, s, now=100.0), nodes, used, queue, s)
    planner = Planner(s)
    check(planner.plan(nodes, used, queue, now=100.0), nodes, used, queue, s)
    # Some nodes change (usage, cordoned, gone): the incremental path.
    changed = changes.draw(
        st.sets(st.sampled_from(sorted(nodes)), max_size=5) if nodes else st.just(set[str]())
    )
    nodes, used = dict(nodes), {k: dict(v) for k, v in used.items()}
    for name in sorted(changed):
        match changes.draw(st.sampled_from(["free", "busy", "cordon", "gone"])):
            case "free":
                used.pop(name, None)
            case "busy":
                used[name] = dict(nodes[name].allocatable)
            case "cordon":
                n = nodes[name]
                nodes[name] = Node(n.name, n.labels, n.allocatable, n.taints, unschedulable=True)
            case _:
                del nodes[name]
    queue = sorted(queue, key=queue_order)[: changes.draw(st.integers(0, len(queue)))]
    check(planner.plan(nodes, used, queue, now=200.0, changed=changed), nodes, used, queue, s)
