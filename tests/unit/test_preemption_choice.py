"""Which work a held gang takes (quorum/core/preemption.py), on plain data: examples of each rule,
and properties on generated clusters, the chosen set checked against brute force."""

from __future__ import annotations

from itertools import combinations

from hypothesis import event, given, settings
from hypothesis import strategies as st

from quorum.core.model import Gang, Node, Pod, resources, subtract
from quorum.core.planner import plan_gangs
from quorum.core.preemption import (
    DisruptionBudget,
    GroupFacts,
    NoPreemption,
    Preemption,
    PreemptionSettings,
    RunningPod,
    Work,
    choose_victims,
    may_take,
    preference,
    units,
)

GPU = "nvidia.com/gpu"


def node(i: int, rack: str = "r0") -> Node:
    labels = {"node.coreweave.cloud/state": "production", "rack": rack}
    return Node(f"n{i}", labels, resources({GPU: 8, "cpu": 64, "pods": 110}))


def gang(size: int, gpus: int = 8, priority: int = 100, topology: str | None = None) -> Gang:
    pods = tuple(Pod(f"u{i}", f"p{i}", resources({GPU: gpus, "pods": 1})) for i in range(size))
    return Gang("hi", "pg-hi", size, pods, members=size, priority=priority, topology_key=topology)


def running(name: str, node_name: str, gpus: int = 8, **kw: object) -> RunningPod:
    return RunningPod(name, "lo", name, node_name, resources({GPU: gpus, "pods": 1}), **kw)  # type: ignore[arg-type]


def free_after(nodes: list[Node], pods: list[RunningPod]) -> dict[str, dict[str, int]]:
    free = {n.name: dict(n.allocatable) for n in nodes}
    for p in pods:
        free[p.node] = subtract(free[p.node], p.requests)
    return free


def choose(g: Gang, nodes: list[Node], pods: list[RunningPod], **kw: object) -> Preemption | NoPreemption:
    groups = kw.pop("groups", {})
    work = units(pods, groups)  # type: ignore[arg-type]
    return choose_victims(g, {n.name: n for n in nodes}, free_after(nodes, pods), work, **kw)  # type: ignore[arg-type]


def victims(result: Preemption | NoPreemption) -> list[str]:
    assert isinstance(result, Preemption), result
    return sorted(v.name for v in result.victims)


# -- the rules, by example ----------------------------------------------------------------------


def test_a_low_priority_gang_is_taken_whole() -> None:
    nodes = [node(0), node(1)]
    pods = [running("a", "n0", priority=10, gang="pg-lo"), running("b", "n1", priority=10, gang="pg-lo")]
    result = choose(gang(2), nodes, pods)
    assert isinstance(result, Preemption) and [v.key for v in result.victims] == [("gang", "lo", "pg-lo")]
    assert result.need == "16 nvidia.com/gpu" and "preempting 1 gang" in result.summary()


def test_of_two_victims_the_interruptable_one_is_taken() -> None:
    nodes = [node(0), node(1)]
    pods = [running("old", "n0", priority=10), running("int", "n1", priority=10, interruptable=True)]
    assert victims(choose(gang(1), nodes, pods)) == ["int"]


def test_lower_priority_before_younger() -> None:
    nodes = [node(0), node(1)]
    pods = [running("p20", "n0", priority=20, started=900), running("p10", "n1", priority=10, started=100)]
    assert victims(choose(gang(1), nodes, pods)) == ["p10"]


def test_equal_priority_only_interruptable_and_only_by_a_gang_that_is_not() -> None:
    nodes = [node(0)]
    plain = [running("eq", "n0", priority=100)]
    result = choose(gang(1), nodes, plain)
    assert isinstance(result, NoPreemption) and result.reason == "NothingToPreempt"
    soft = [running("eq", "n0", priority=100, interruptable=True)]
    assert victims(choose(gang(1), nodes, soft)) == ["eq"]
    assert isinstance(choose(gang(1), nodes, soft, interruptable=True), NoPreemption), "no turn-taking"


def test_work_marked_not_preemptible_is_never_taken() -> None:
    nodes = [node(0)]
    result = choose(gang(1), nodes, [running("keep", "n0", priority=1, preemptible=False)])
    assert isinstance(result, NoPreemption) and result.reason == "NothingToPreempt"
    facts = {("lo", "pg-lo"): GroupFacts(preemptible=False)}
    result = choose(gang(1), nodes, [running("m", "n0", priority=1, gang="pg-lo")], groups=facts)
    assert isinstance(result, NoPreemption)


def test_a_budget_is_kept_where_another_victim_will_do_but_never_vetoes() -> None:
    nodes = [node(0), node(1)]
    pods = [running("guarded", "n0", priority=1), running("other", "n1", priority=5)]
    budget = DisruptionBudget("lo", "keep-one", frozenset({"guarded"}), 0)
    kept = choose(gang(1), nodes, pods, budgets=[budget])
    assert victims(kept) == ["other"] and isinstance(kept, Preemption) and kept.past_budgets == ()
    passed = choose(gang(1), [nodes[0]], pods[:1], budgets=[budget])
    assert victims(passed) == ["guarded"], "a budget of 0 does not make its work immune"
    assert isinstance(passed, Preemption) and [str(b) for b in passed.past_budgets] == [
        "PodDisruptionBudget lo/keep-one (allows 0, takes 1)",
    ]
    assert "past PodDisruptionBudget lo/keep-one" in passed.summary()


def test_a_set_within_every_budget_beats_one_whose_items_each_keep_it_but_together_do_not() -> None:
    """a and b share a node and a budget that allows one; c, less preferred, would do alone."""
    nodes = [node(0), node(1)]
    pods = [
        running("a", "n0", 4, priority=1),
        running("b", "n0", 4, priority=1),
        running("c", "n1", priority=5),
    ]
    budget = DisruptionBudget("lo", "one-at-a-time", frozenset({"a", "b"}), 1)
    result = choose(gang(1), nodes, pods, budgets=[budget])
    assert victims(result) == ["c"] and isinstance(result, Preemption) and result.past_budgets == ()


def test_victims_that_each_keep_a_budget_but_together_pass_it_say_so() -> None:
    nodes = [node(0), node(1)]
    pods = [running("a", "n0", priority=1), running("b", "n1", priority=1)]
    budget = DisruptionBudget("lo", "one-at-a-time", frozenset({"a", "b"}), 1)
    result = choose(gang(2), nodes, pods, budgets=[budget])
    assert victims(result) == ["a", "b"]
    assert isinstance(result, Preemption) and [str(b) for b in result.past_budgets] == [
        "PodDisruptionBudget lo/one-at-a-time (allows 1, takes 2)",
    ]


def test_system_critical_pods_are_never_taken_nor_their_gangs() -> None:
    nodes = [node(0), node(1)]
    critical = [running("dns", "n0", priority=2_000_000_000), running("cni", "n1", priority=2_000_001_000)]
    result = choose(gang(1, priority=1_000_000_000), nodes, critical)
    assert isinstance(result, NoPreemption) and result.reason == "NothingToPreempt"
    mixed = [
        running("a", "n0", priority=1, gang="pg-lo"),
        running("b", "n1", priority=2_000_000_000, gang="pg-lo"),
    ]
    assert units(mixed, {}) == []
    highest_user = [running("top", "n0", priority=1_000_000_000)]
    assert isinstance(choose(gang(1), nodes, highest_user), NoPreemption), "of higher priority"


def test_never_for_a_gang_that_would_still_not_fit() -> None:
    nodes = [node(0)]
    result = choose(gang(2), nodes, [running("a", "n0", priority=1)])
    assert isinstance(result, NoPreemption) and result.reason == "WouldNotFit"


def test_no_work_is_taken_for_a_gang_whose_binding_quorum_cannot_show() -> None:
    """Required pod affinity (to a pod that may not exist) or host ports: quorum cannot show the
    gang would bind once room is made, so it takes nothing, and says so. Volumes, topology
    spreads and pod anti-affinity keep preemption; so does a gang whose members were placed
    before."""
    from dataclasses import replace

    nodes = [node(0)]
    pods = [running("a", "n0", priority=1)]

    def constrained(*constraints: str, released: int = 0) -> Gang:
        g = gang(1)
        return replace(g, pods=tuple(replace(p, unmodeled=constraints) for p in g.pods), released=released)

    result = choose(constrained("required pod affinity", "volumes (volume node affinity)"), nodes, pods)
    assert isinstance(result, NoPreemption) and result.reason == "Unproven", result
    assert result.message.startswith("its pods have required pod affinity, which quorum does not model")
    assert isinstance(choose(constrained("host ports"), nodes, pods), NoPreemption)
    ordinary = constrained(
        "volumes (volume node affinity)", "topology spread constraints", "required pod anti-affinity"
    )
    assert victims(choose(ordinary, nodes, pods)) == ["a"]
    assert victims(choose(constrained("required pod affinity", released=1), nodes, pods)) == ["a"]


def test_disruption_mode_pod_lets_single_pods_of_a_gang_go() -> None:
    nodes = [node(0), node(1)]
    pods = [running("a", "n0", priority=1, gang="pg-lo"), running("b", "n1", priority=1, gang="pg-lo")]
    facts = {("lo", "pg-lo"): GroupFacts(disruption_mode="Pod")}
    chosen = choose(gang(1), nodes, pods, groups=facts)
    assert isinstance(chosen, Preemption) and len(chosen.victims) == 1 and chosen.victims[0].kind == "pod"
    whole = choose(gang(1), nodes, pods)
    assert isinstance(whole, Preemption) and whole.victims[0].kind == "gang", "PodGroup mode: whole"


def test_daemon_and_terminating_pods_are_never_taken_nor_their_gangs() -> None:
    nodes = [node(0), node(1)]
    pods = [running("ds", "n0", priority=1, stays=True), running("t", "n1", priority=1, terminating=True)]
    assert isinstance(choose(gang(1), nodes, pods), NoPreemption)
    split = [
        running("a", "n0", priority=1, gang="pg-lo"),
        running("b", "n1", priority=1, gang="pg-lo", terminating=True),
    ]
    assert units(split, {}) == []


def test_topology_takes_victims_in_one_rack_and_says_which() -> None:
    nodes = [node(0, "r0"), node(1, "r0"), node(2, "r1"), node(3, "r1")]
    pods = [running(f"v{i}", f"n{i}", priority=10 + i) for i in range(4)]
    result = choose(gang(2, topology="rack"), nodes, pods)
    assert victims(result) == ["v0", "v1"]
    assert isinstance(result, Preemption) and result.need == "16 nvidia.com/gpu in rack r0"


def test_the_checks_are_bounded_and_what_is_taken_still_frees_enough() -> None:
    nodes = [node(i) for i in range(6)]
    pods = [running(f"v{i}", f"n{i}", priority=i) for i in range(6)]
    result = choose(gang(3), nodes, pods, settings=PreemptionSettings(max_checks=2))
    assert isinstance(result, Preemption) and len(result.victims) >= 3


# -- properties ---------------------------------------------------------------------------------


Case = tuple[list[Node], list[RunningPod], Gang, bool, list[DisruptionBudget]]


@st.composite
def clusters(draw: st.DrawFn) -> Case:
    count = draw(st.integers(1, 4))
    racks = draw(st.booleans())
    nodes = [node(i, f"r{i % 2}" if racks else "r0") for i in range(count)]
    pods: list[RunningPod] = []
    room = {n.name: 8 for n in nodes}
    for w in range(draw(st.integers(0, 6))):
        size = draw(st.integers(1, 2))
        gpus = draw(st.sampled_from([2, 4, 8]))
        where = [n.name for n in nodes if room[n.name] >= gpus]
        if len(where) < 1:
            break
        chosen = [draw(st.sampled_from(where)) for _ in range(size)]
        if any(room[c] < gpus * chosen.count(c) for c in chosen):
            continue
        priority = draw(st.sampled_from([1, 5, 100]))
        soft = draw(st.booleans())
        started = draw(st.integers(0, 3))
        gang_name = f"pg-w{w}" if size > 1 else None
        for i, c in enumerate(chosen):
            room[c] -= gpus
            pods.append(
                running(
                    f"w{w}-{i}",
                    c,
                    gpus,
                    priority=priority,
                    gang=gang_name,
                    interruptable=soft,
                    started=started,
                )
            )
    g = gang(draw(st.integers(1, 3)), draw(st.sampled_from([4, 8])), topology="rack" if racks else None)
    uids = [p.uid for p in pods]
    allowances = draw(st.lists(st.integers(0, 1), max_size=2)) if uids else []
    budgets = [
        DisruptionBudget("lo", f"pdb{i}", frozenset(draw(st.sets(st.sampled_from(uids)))), allowed)
        for i, allowed in enumerate(allowances)
    ]
    return nodes, pods, g, draw(st.booleans()), budgets


def budgets_first(ordered: list[Work], budgets: list[DisruptionBudget]) -> list[Work]:
    """The oracle's order: in preference order, what keeps every budget together with what came
    before it, then the rest."""
    within: list[Work] = []
    for work in ordered:
        uids = {p.uid for w in [*within, work] for p in w.pods}
        if all(len(uids & b.pods) <= b.allowed for b in budgets):
            within.append(work)
    return within + [w for w in ordered if w not in within]


def fits_without(g: Gang, nodes: list[Node], pods: list[RunningPod], gone: set[str]) -> bool:
    left = [p for p in pods if p.uid not in gone]
    used = {n.name: subtract(n.allocatable, free_after(nodes, left)[n.name]) for n in nodes}
    return bool(plan_gangs(nodes, used, [g]).releases)


@settings(max_examples=600, deadline=None)
@given(clusters())
def test_victims_may_be_taken_are_whole_free_enough_and_are_the_least_in_the_order(case: Case) -> None:
    """The order: work its budgets let go first, then `preference`; budgets never veto."""
    nodes, pods, g, soft_preemptor, budgets = case
    work = units(pods, {})
    result = choose_victims(
        g, {n.name: n for n in nodes}, free_after(nodes, pods), work, budgets, interruptable=soft_preemptor
    )
    allowed = budgets_first(
        sorted(
            (w for w in work if may_take(g.priority, soft_preemptor, w) and any(p.node for p in w.pods)),
            key=preference,
        ),
        budgets,
    )
    fitting = [
        set(c)
        for r in range(len(allowed) + 1)
        for c in combinations(range(len(allowed)), r)
        if fits_without(g, nodes, pods, {p.uid for i in c for p in allowed[i].pods})
    ]
    if not isinstance(result, Preemption):
        event(f"no preemption: {result.reason}")
        assert not fitting or fitting == [set()] or result.reason == "Fits", (result, fitting)
        assert (result.reason == "Fits") == (set() in fitting)
        return
    event(f"{len(result.victims)} victims")
    chosen = list(result.victims)
    for victim in chosen:
        assert may_take(g.priority, soft_preemptor, victim)
        if victim.kind == "gang":  # whole: every bound pod of that gang
            assert {p.uid for p in victim.pods} == {p.uid for p in pods if p.gang == victim.name}
    gone = {p.uid for v in chosen for p in v.pods}
    assert fits_without(g, nodes, pods, gone)
    keys = [w.key for w in allowed]
    taken = {keys.index(v.key) for v in chosen}
    best = min(fitting, key=lambda s: sorted(s, reverse=True))
    assert taken == best, ([allowed[i].name for i in sorted(taken)], [allowed[i].name for i in sorted(best)])
    passed = {b.name for b in budgets if len(gone & b.pods) > b.allowed}
    assert {b.name for b in result.past_budgets} == passed
    event("past a budget" if passed else "within budgets")


@settings(max_examples=100, deadline=None)
@given(clusters(), st.randoms(use_true_random=False))
def test_the_choice_does_not_depend_on_the_order_of_the_work(case: Case, rnd: object) -> None:
    nodes, pods, g, _, budgets = case
    work = units(pods, {})
    shuffled = list(work)
    rnd.shuffle(shuffled)  # type: ignore[attr-defined]
    by_name = {n.name: n for n in nodes}
    a = choose_victims(g, by_name, free_after(nodes, pods), work, budgets)
    b = choose_victims(g, by_name, free_after(nodes, pods), shuffled, budgets)
    assert type(a) is type(b)
    if isinstance(a, Preemption) and isinstance(b, Preemption):
        assert [v.key for v in a.victims] == [v.key for v in b.victims]


def test_work_is_ordered_interruptable_then_priority_then_youngest_then_fewest() -> None:
    def w(name: str, priority: int, started: float, pods: int = 1, soft: bool = False) -> Work:
        members = tuple(running(f"{name}{i}", "n0") for i in range(pods))
        return Work("pod", "lo", name, members, priority, started, soft)

    order = sorted(
        [w("c", 1, 5), w("a", 1, 9, soft=True), w("d", 2, 9), w("b", 1, 9, 2), w("e", 1, 9)], key=preference
    )
    assert [x.name for x in order] == ["a", "e", "b", "c", "d"]
