"""The incremental planner decides exactly what a fresh pass decides, whatever happened between
passes: pods finishing, nodes cordoned or coming and going, gangs arriving, released or gone."""

from __future__ import annotations

from dataclasses import replace

from hypothesis import given, settings
from hypothesis import strategies as st

from quorum.core.model import Gang, Pod, add, resources, subtract
from quorum.core.planner import Plan, Planner, PlannerSettings, plan_gangs
from tests.unit.test_planner import GPU, node
from tests.unit.test_planner_topology import RACK, racked

SETTINGS = PlannerSettings(starvation_seconds=50)


def outcome(plan: Plan) -> tuple[object, ...]:
    releases = [(r.gang.key, [(p.uid, n.name) for p, n in r.placement]) for r in plan.releases]
    holds = [(h.gang.key, h.reason, h.message, h.held_nodes, h.held_message) for h in plan.holds]
    return (releases, sorted(holds))


def make_gang(i: int, size: int, gpus: int, mixed: bool, held_since: float | None) -> Gang:
    pods = []
    for j in range(size):
        want = gpus if not (mixed and j % 2) else max(1, gpus // 2)
        pods.append(Pod(f"g{i}p{j}", f"g{i}p{j}", resources({GPU: str(want), "cpu": "1", "pods": "1"})))
    topology = RACK if i % 5 == 4 else None  # some gangs must fit in one rack
    return Gang(
        "ns",
        f"g{i}",
        size,
        tuple(pods),
        members=size,
        created=float(i),
        held_since=held_since,
        topology_key=topology,
    )


operations = st.lists(
    st.one_of(
        st.tuples(st.just("finish"), st.integers(0, 5)),  # a pod on node k finishes
        st.tuples(st.just("cordon"), st.integers(0, 5)),  # node k (un)cordoned
        st.tuples(st.just("remove"), st.integers(0, 5)),  # node k goes (or comes back)
        st.tuples(st.just("arrive"), st.integers(1, 4), st.integers(1, 8), st.booleans()),
        st.tuples(st.just("release"), st.just(0)),  # the last plan's releases become usage
        st.tuples(st.just("gone"), st.integers(0, 20)),  # a pending gang deleted
        st.tuples(st.just("time"), st.integers(10, 40)),  # time passes (starvation guard)
    ),
    max_size=14,
)


@settings(max_examples=150, deadline=None)
@given(
    gpus=st.lists(st.sampled_from([4, 8]), min_size=6, max_size=6),
    busy=st.lists(st.integers(0, 8), min_size=6, max_size=6),
    ops=operations,
)
def test_incremental_passes_decide_what_a_fresh_pass_decides(
    gpus: list[int], busy: list[int], ops: list[tuple[object, ...]]
) -> None:
    all_nodes = {f"n{k}": racked(f"n{k}", "ab"[k // 3], gpus=gpus[k]) for k in range(6)}
    nodes = dict(all_nodes)
    used: dict[str, dict[str, int]] = {
        f"n{k}": resources({GPU: str(min(busy[k], gpus[k])), "pods": "1"}) for k in range(6)
    }
    queue = [make_gang(i, 2 + i % 3, 1 + 3 * (i % 3), i % 4 == 3, 0.0 if i % 2 else None) for i in range(6)]
    planner, now, arrived = Planner(SETTINGS), 0.0, 100
    last = planner.plan(nodes, used, queue, now)
    assert outcome(last) == outcome(plan_gangs(list(nodes.values()), used, queue, SETTINGS, now))
    for op in ops:
        changed: set[str] = set()
        kind = op[0]
        if kind == "finish":
            name = f"n{op[1]}"
            if used[name].get(GPU, 0) >= 1000:
                used[name] = subtract(used[name], {GPU: 1000})
                changed.add(name)
        elif kind == "cordon":
            name = f"n{op[1]}"
            if name in nodes:
                nodes[name] = replace(nodes[name], unschedulable=not nodes[name].unschedulable)
                changed.add(name)
        elif kind == "remove":
            name = f"n{op[1]}"
            if name in nodes:
                del nodes[name]
            else:
                nodes[name] = all_nodes[name]
            changed.add(name)
        elif kind == "arrive":
            _, size, want, mixed = op
            assert isinstance(size, int) and isinstance(want, int) and isinstance(mixed, bool)
            queue.append(make_gang(arrived, size, want, mixed, None))
            arrived += 1
        elif kind == "release":
            done = {r.gang.key for r in last.releases}
            for release in last.releases:
                for pod, placed in release.placement:
                    used[placed.name] = add(used.get(placed.name, {}), pod.requests)
                    changed.add(placed.name)
            queue = [g for g in queue if g.key not in done]
        elif kind == "gone" and queue:
            index = op[1]
            assert isinstance(index, int)
            queue.pop(index % len(queue))
        elif kind == "time":
            step = op[1]
            assert isinstance(step, int)
            now += step
        last = planner.plan(nodes, used, queue, now, changed=changed)
        fresh = plan_gangs(list(nodes.values()), used, queue, SETTINGS, now)
        assert outcome(last) == outcome(fresh), f"after {op}"


def test_a_pass_with_nothing_changed_reuses_every_hold() -> None:
    nodes = {n.name: n for n in (node("a"), node("b"))}
    used = {"a": resources({GPU: "8"}), "b": resources({GPU: "8"})}
    queue = [make_gang(i, 2, 8, False, None) for i in range(3)]
    planner = Planner()
    first = planner.plan(nodes, used, queue)
    second = planner.plan(nodes, used, queue, changed=())
    assert all(a is b for a, b in zip(first.holds, second.holds, strict=True)), "same Hold objects"
    used["a"] = {}
    third = planner.plan(nodes, used, queue, changed=("a",))
    assert third.holds[0] is not first.holds[0], "a node it could use changed: planned again"
