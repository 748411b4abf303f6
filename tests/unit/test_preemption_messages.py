"""What each side of a preemption is told (quorum/core/preemption.py, `Preemption`), on plain
data: whatever is written into a namespace names only that namespace's objects and no node
(docs/threat-model.md, "What a tenant can read"); the platform's record names everything."""

from __future__ import annotations

import json
from dataclasses import dataclass

from hypothesis import given, settings
from hypothesis import strategies as st

from quorum.core.model import Gang, Node, Pod, resources
from quorum.core.preemption import PastBudget, Preemption, RunningPod, Work

GPU = "nvidia.com/gpu"

# Every name is a marker no other name contains ("qn1z" is not in "qn11z") and no message word
# contains, so "names X" is "X is a substring".


def marker(kind: str, *numbers: int) -> str:
    return f"q{kind}{'k'.join(str(n) for n in numbers)}z"


@dataclass(frozen=True)
class Case:
    preemption: Preemption
    namespaces: tuple[str, ...]
    owner: dict[str, str]  # every name of an object -> its namespace ("" for a node)


@st.composite
def cases(draw: st.DrawFn) -> Case:
    namespaces = tuple(marker("n", i) for i in range(draw(st.integers(1, 4))))
    owner: dict[str, str] = {ns: ns for ns in namespaces}
    nodes = [
        Node(marker("h", i), {"rack": "r1"}, resources({GPU: 8})) for i in range(draw(st.integers(1, 6)))
    ]
    owner.update({n.name: "" for n in nodes})
    home = namespaces[0]
    gang_name = marker("a", 0)
    owner[gang_name] = home
    size = draw(st.integers(1, 4))
    pods = tuple(Pod(marker("u", i), marker("s", i), resources({GPU: 8})) for i in range(size))
    owner.update({p.name: home for p in pods})
    gang = Gang(home, gang_name, size, pods, members=size, priority=draw(st.integers(0, 10**9)))
    placement = tuple((p, draw(st.sampled_from(nodes))) for p in pods)
    victims = []
    for j in range(draw(st.integers(1, 9))):
        namespace = draw(st.sampled_from(namespaces))
        kind = draw(st.sampled_from(["gang", "pod"]))
        count = draw(st.integers(1, 3)) if kind == "gang" else 1
        running = tuple(
            RunningPod(
                marker("v", j, k),
                namespace,
                marker("p", j, k),
                draw(st.sampled_from(nodes)).name,
                resources({GPU: 8}),
                priority=draw(st.integers(0, 10**9)),
            )
            for k in range(count)
        )
        owner.update({p.name: namespace for p in running})
        name = marker("g", j) if kind == "gang" else running[0].name
        in_gang = marker("g", j) if kind == "pod" and draw(st.booleans()) else None  # disruptionMode Pod
        owner[marker("g", j)] = namespace
        priority = max(p.priority for p in running)
        interruptable = draw(st.booleans())
        victims.append(Work(kind, namespace, name, running, priority, 0.0, interruptable, gang=in_gang))
    budgets = []
    for b in range(draw(st.integers(0, 4))):
        namespace = draw(st.sampled_from(namespaces))
        budgets.append(
            PastBudget(namespace, marker("b", b), draw(st.integers(-1, 3)), draw(st.integers(1, 9)))
        )
        owner[marker("b", b)] = namespace
    need = draw(st.sampled_from(["16 nvidia.com/gpu", "8 nvidia.com/gpu in rack r1", "3 pods"]))
    preemption = Preemption(gang, tuple(victims), placement, need, past_budgets=tuple(budgets))
    return Case(preemption, namespaces, owner)


def tenant_texts(preemption: Preemption, reader: str) -> list[str]:
    """Everything the operator writes into namespace `reader` about the preemption: on the
    preemptor's side its record and Event, on a victim's side its pods' condition, its Gang's
    record and Event."""
    texts = []
    if reader == preemption.gang.namespace:
        record = {
            "message": preemption.summary(reader),
            "victims": [v.entry(reader) for v in preemption.victims],
        }
        texts += [json.dumps(record), preemption.announced(reader)]
    if any(v.namespace == reader for v in preemption.victims):
        texts += [preemption.told(reader), preemption.preempted_by(reader) or ""]
    return texts


@settings(max_examples=400, deadline=None)
@given(cases())
def test_a_namespace_is_told_no_name_of_another_namespace_and_no_node(case: Case) -> None:
    p = case.preemption
    for reader in case.namespaces:
        texts = tenant_texts(p, reader)
        for name, namespace in case.owner.items():
            if namespace != reader:  # another namespace's object, or a node
                for text in texts:
                    assert name not in text, (reader, name, text)


@settings(max_examples=200, deadline=None)
@given(cases())
def test_each_side_is_still_told_what_it_may_know(case: Case) -> None:
    """Not silence: the preemptor learns how much of what it takes, its own namespace's work by
    name; a victim learns the priority and need, the preemptor's name when it is a neighbour;
    the platform's record names every victim, budget and node."""
    p = case.preemption
    home = p.gang.namespace
    summary = p.summary(home, named=None)
    assert summary.startswith(f"needed {p.need}: preempting ")
    for victim in p.victims:
        if victim.namespace == home:
            assert f"{victim.namespace}/{victim.name} " in summary
    others = [v for v in p.victims if v.namespace != home]
    if others:
        pods = sum(len(v.pods) for v in others)
        assert f"{pods} pod{'s' * (pods != 1)} of other namespaces" in summary
    assert p.announced(home).endswith(f"reserved {len(p.nodes)} node{'s' * (len(p.nodes) != 1)}")
    for victim in p.victims:
        told = p.told(victim.namespace)
        assert f"(priority {p.gang.priority}): needed {p.need}" in told
        assert (f"preempted by {home}/{p.gang.name} " in told) == (victim.namespace == home)
        for budget in p.past_budgets:
            assert (str(budget) in told) == (budget.namespace == victim.namespace)
    platform = p.announced(None, named=None)
    assert platform.startswith(f"gang {home}/{p.gang.name} (priority {p.gang.priority}) needed ")
    assert all(f"{v.namespace}/{v.name} " in platform for v in p.victims)
    assert all(str(b) in platform for b in p.past_budgets)
    assert platform.endswith(f"reserved nodes {', '.join(p.nodes)}")


def test_the_messages_by_example() -> None:
    gang = Gang("ml", "pg-big", 1, (Pod("u", "big-0", resources({GPU: 8})),), members=1, priority=1000)
    node = Node("gpu-007", {}, resources({GPU: 8}))
    low = RunningPod("a", "team-b", "train-0", "gpu-007", resources({GPU: 8}), priority=10, gang="pg-train")
    mine = RunningPod("b", "ml", "etl-0", "gpu-007", resources({GPU: 8}), priority=5)
    victims = (
        Work("gang", "team-b", "pg-train", (low,), 10, 0.0),
        Work("pod", "ml", "etl-0", (mine,), 5, 0.0),
    )
    budgets = (PastBudget("team-b", "keep", 0, 1),)
    p = Preemption(gang, victims, ((gang.pods[0], node),), "8 nvidia.com/gpu", past_budgets=budgets)
    assert p.announced("ml") == (
        "needed 8 nvidia.com/gpu: preempting 1 gang and 1 pod: pod ml/etl-0 (priority 5, 1 pod); "
        "1 pod of other namespaces (1 gang whole; priority ≤ 10); past 1 PodDisruptionBudget of other "
        "namespaces; reserved 1 node"
    )
    assert p.told("team-b") == (
        "preempted by a gang of another namespace (priority 1000): needed 8 nvidia.com/gpu; "
        "past PodDisruptionBudget team-b/keep (allows 0, takes 1)"
    )
    assert p.told("ml") == "preempted by ml/pg-big (priority 1000): needed 8 nvidia.com/gpu"
    assert [v.entry("ml") for v in victims] == [
        {"kind": "gang", "pods": 1, "priority": 10},
        {"kind": "pod", "namespace": "ml", "name": "etl-0", "pods": 1, "priority": 5},
    ]
    assert p.announced() == (
        "gang ml/pg-big (priority 1000) needed 8 nvidia.com/gpu: preempting 1 gang and 1 pod: gang "
        "team-b/pg-train (priority 10, 1 pod); pod ml/etl-0 (priority 5, 1 pod); past "
        "PodDisruptionBudget team-b/keep (allows 0, takes 1); reserved nodes gpu-007"
    )
