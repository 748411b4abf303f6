"""`quorum explain` and `quorum get` with plain data: the planned view is the operator's own answer
(the hold message its pass records, the planner's per-node tests), the recorded view tells the
same apart, and any diagnosis fits one screen (40 lines of at most 100 columns)."""

from __future__ import annotations

import copy
import time
from collections import Counter
from pathlib import Path
from typing import Any

import pytest
import yaml
from hypothesis import given, settings
from hypothesis import strategies as st

from quorum.commands.explain import target
from quorum.commands.session import CommandError
from quorum.core.diagnosis import (
    MAX_LINE_BYTES,
    MAX_LINES,
    MAX_WIDTH,
    Diagnosis,
    EventLine,
    NodeVerdict,
    clip,
    columns,
    from_status,
    gang_row,
    human_duration,
    node_lines,
    recorded,
    render,
    table,
)
from quorum.core.fit import FitSettings, first_refusal, why_not
from quorum.core.model import Gang, Node, Pod, Taint, fits, insufficient
from quorum.core.planner import Planner, PlannerSettings
from quorum.k8s.client import KubeconfigError, command_client
from quorum.k8s.command_reads import ClusterObjects
from quorum.k8s.convert import node_from_api, pod_from_api
from quorum.k8s.usage import BoundPods
from quorum.operator.gangs import GangPods, Store
from quorum.operator.loop import GangLoop
from quorum.operator.replay import replay
from tests.unit.fake_api import FakeApi
from tests.unit.test_loop import NS, node, pod, podgroup, step
from tests.unit.test_loop import settings as loop_settings

JSON = dict[str, Any]
GIB = 1024**3 * 1000

# -- one definition of "cannot take it" ------------------------------------------------------------

amounts = st.dictionaries(
    st.sampled_from(["cpu", "memory", "nvidia.com/gpu", "pods"]), st.integers(-5, 20_000)
)


@given(amounts, amounts)
def test_insufficient_is_what_fits_finds_short(requests: dict[str, int], free: dict[str, int]) -> None:
    short = insufficient(requests, free)
    assert fits(requests, free) == (short is None)
    if short is not None:
        assert requests[short] > 0 and free.get(short, 0) < requests[short]


@given(amounts, amounts, st.booleans(), st.booleans())
def test_first_refusal_is_the_planners_predicates_then_capacity(
    requests: dict[str, int], free: dict[str, int], cordoned: bool, tainted: bool
) -> None:
    pod = Pod("u", "p", requests)
    taints = (Taint("is_cpu_compute", "NoSchedule"),) if tainted else ()
    node = Node("n", {}, {}, taints, unschedulable=cordoned)
    refusal = first_refusal(pod, node, free, FitSettings())
    assert (refusal is None) == (why_not(pod, node, FitSettings()) is None and fits(requests, free))
    if refusal is not None and refusal.resource is None:
        assert refusal.reason == why_not(pod, node, FitSettings())


# -- the planned view is the operator's answer -------------------------------------------------------


def running(name: str, node_name: str, gpus: int) -> JSON:
    """A bound pod in no gang (another namespace's), using `gpus` GPUs."""
    return {
        "metadata": {
            "name": name,
            "uid": name,
            "namespace": "other",
            "creationTimestamp": "2026-11-22T00:00:00Z",
        },
        "spec": {
            "nodeName": node_name,
            "containers": [
                {"name": "c", "resources": {"requests": {"nvidia.com/gpu": str(gpus), "cpu": "1"}}}
            ],
        },
        "status": {"phase": "Running"},
    }


def cpu_node(name: str) -> JSON:
    cpu = node(name, gpus=0)
    cpu["spec"]["taints"] = [{"key": "is_cpu_compute", "effect": "NoSchedule"}]
    return cpu


async def held_cluster(size: int = 5) -> tuple[Store, list[JSON], list[JSON]]:
    """4 GPU nodes, one of them half used by another namespace's pod, 3 CPU nodes, one cordoned
    node, and gang `big` of `size` pods of 8 GPUs: held for lack of room. Its status is written by a
    real pass of the operator's loop."""
    nodes = [node(f"n{i}") for i in range(4)] + [cpu_node(f"c{i}") for i in range(3)]
    cordoned = node("x0")
    cordoned["spec"]["unschedulable"] = True
    nodes.append(cordoned)
    gang_pods = [pod("big", i) for i in range(size)]
    others = [running("busy", "n1", 4)]
    store = Store()
    store.nodes = {n["metadata"]["name"]: n for n in nodes}
    store.groups[("scheduling.sigs.k8s.io", NS, "big")] = podgroup("big", size)
    GangPods(store).replace_all(copy.deepcopy(gang_pods + others))
    bound = BoundPods()
    bound.replace_all(copy.deepcopy(gang_pods + others))
    loop = GangLoop(FakeApi(store), store, bound, loop_settings())
    await step(loop)
    return store, nodes, gang_pods + others


def objects_of(store: Store, nodes: list[JSON], pods: list[JSON]) -> ClusterObjects:
    return ClusterObjects(
        nodes=copy.deepcopy(nodes),
        pods=copy.deepcopy(pods),
        gangs=copy.deepcopy(list(store.gangs.values())),
        groups={"scheduling.sigs.k8s.io": [copy.deepcopy(g) for g in store.groups.values()]},
    )


async def test_the_planned_view_says_what_the_operator_recorded_and_the_planner_decided() -> None:
    store, nodes, pods = await held_cluster()
    recorded_gang = store.gangs[(NS, "pg-big")]
    admitted = next(c for c in recorded_gang["status"]["conditions"] if c["type"] == "Admitted")
    assert admitted["reason"] == "Unschedulable"

    diagnosis = replay(objects_of(store, nodes, pods), (NS, "pg-big"), loop_settings(), 1e10)
    assert diagnosis is not None
    # The operator's recorded message: the planner's hold, then why preemption could not help.
    assert diagnosis.preemption.startswith("none (NothingToPreempt): no running work on the 4 nodes")
    assert (
        admitted["message"]
        == f"{diagnosis.message}; no preemption{diagnosis.preemption.removeprefix('none')}"
    )
    # The planner's own answer for the gang, planned alone from the same nodes and usage.
    models = {n["metadata"]["name"]: node_from_api(n) for n in nodes}
    gang_models = [pod_from_api(p) for p in pods[:5]]
    used = {"n1": {"nvidia.com/gpu": 4000, "cpu": 1000, "pods": 1000}}
    planner = Planner(PlannerSettings())
    plan = planner.plan(models, used, [Gang(NS, "pg-big", 5, tuple(gang_models), members=5)])
    (hold,) = plan.holds
    assert diagnosis.message == hold.message
    # Per node: the planner's own tests, counted as its index counts them.
    entry = planner.index.shape(gang_models[0])
    refused = Counter(v.reason for v in diagnosis.nodes if v.resource is None and v.reason is not None)
    assert refused == entry.refusals
    assert sum(1 for v in diagnosis.nodes if v.reason is None) == entry.with_room == 3
    assert [(v.node, v.free, v.needed) for v in diagnosis.nodes if v.resource] == [("n1", 4000, 8000)]
    assert diagnosis.shortfall == (("nvidia.com/gpu", 40000, 28000),)


async def test_the_recorded_view_tells_the_same_apart_from_the_record_alone() -> None:
    store, nodes, pods = await held_cluster()
    gang = store.gangs[(NS, "pg-big")]
    planned = replay(objects_of(store, nodes, pods), (NS, "pg-big"), loop_settings(), 1e10)
    assert planned is not None
    seen = recorded(gang, 1e10, "you cannot read nodes")
    assert seen.message == planned.message and seen.preemption.startswith("none (NothingToPreempt)")
    assert seen.view.startswith("as recorded by quorum-operator at ") and "you cannot read nodes" in seen.view
    assert (seen.members, seen.min_member, seen.reason) == (5, 5, "Unschedulable")
    assert not seen.nodes and seen.nodes_note
    lines = render(seen)
    assert any(line.startswith("why: needs 5 pods placed together") for line in lines)
    assert any(line.startswith("held against it: not known in this view") for line in lines)
    slurm = recorded(gang, 1e10, "Slurm places this gang", "quorum-sunk-scheduler")
    assert slurm.view.startswith("as recorded by quorum-sunk-scheduler at ")


async def test_the_nodes_are_as_the_planner_saw_them_before_holding_capacity_for_the_gang() -> None:
    store, nodes, pods = await held_cluster(size=4)
    later = time.time() + 120  # held for two minutes: the starvation guard holds nodes for it
    diagnosis = replay(objects_of(store, nodes, pods), (NS, "pg-big"), loop_settings(), later)
    assert diagnosis is not None and diagnosis.capacity_held.startswith("holding 4 nodes for this gang")
    assert "3 have room for one" in diagnosis.message
    assert sorted(v.node for v in diagnosis.nodes if v.reason is None) == ["n0", "n2", "n3"]
    assert not diagnosis.held_against


async def test_a_gang_that_fits_now_is_said_to_wait_for_the_operator() -> None:
    store, nodes, pods = await held_cluster()
    nodes += [node(f"m{i}") for i in range(2)]  # two more empty GPU nodes: it fits
    diagnosis = replay(objects_of(store, nodes, pods), (NS, "pg-big"), loop_settings(), 1e10)
    assert diagnosis is not None and diagnosis.message.startswith("it fits now: the plan places 5 pods")
    assert not diagnosis.nodes


async def test_a_pod_bigger_than_any_node_is_said_so_not_split_room() -> None:
    """A gang of 2 pods of 200 CPUs on 128-CPU nodes: the free room in all is plenty, but no
    node could hold one pod even empty; the Gang and explain say that, with the numbers."""
    nodes = [node(f"n{i}", gpus=0) for i in range(4)]
    gang_pods = [pod("huge", i, gpus=0) for i in range(2)]
    for one in gang_pods:
        one["spec"]["containers"][0]["resources"] = {"requests": {"cpu": "200"}}
    store = Store()
    store.nodes = {n["metadata"]["name"]: n for n in nodes}
    store.groups[("scheduling.sigs.k8s.io", NS, "huge")] = podgroup("huge", 2)
    GangPods(store).replace_all(copy.deepcopy(gang_pods))
    bound = BoundPods()
    bound.replace_all(copy.deepcopy(gang_pods))
    await step(GangLoop(FakeApi(store), store, bound, loop_settings()))
    admitted = next(
        c for c in store.gangs[(NS, "pg-huge")]["status"]["conditions"] if c["type"] == "Admitted"
    )
    said = "one pod asks more than any of them can hold even empty: 200 cpu (the largest has 128)"
    assert said in admitted["message"], admitted["message"]
    diagnosis = replay(objects_of(store, nodes, gang_pods), (NS, "pg-huge"), loop_settings(), 1e10)
    assert diagnosis is not None and diagnosis.too_big.endswith("200 cpu (the largest has 128)")
    lines = render(diagnosis)
    assert any(line.startswith("too big: one pod asks more than any") for line in lines), lines
    assert not any("split over too many nodes" in line for line in lines), lines


def test_a_gang_without_pods_has_no_planned_view() -> None:
    assert replay(ClusterObjects(), (NS, "pg-none"), loop_settings(), 0.0) is None


# -- one screen ----------------------------------------------------------------------------------

# A tenant's text: any characters, and runs of combining marks (they take no column: a line cut
# to 100 columns is bounded in bytes only if they are bounded too).
MARKS = "\u0301\u0489\u20dd\u0336\u0f7a"
marks = st.tuples(
    st.characters(exclude_categories=["Cs"]), st.sampled_from(MARKS), st.sampled_from([0, 2, 700])
)
marked = st.lists(marks, max_size=12).map(lambda runs: "".join(c + mark * n for c, mark, n in runs))
text = st.text(max_size=400) | marked
verdicts = st.builds(
    NodeVerdict,
    node=st.text(max_size=70),
    reason=st.none()
    | st.sampled_from(["cordoned", "taint is_cpu_compute", "Insufficient nvidia.com/gpu"])
    | text,
    room=st.integers(0, 10**6),
    resource=st.none() | st.sampled_from(["nvidia.com/gpu", "memory"]),
    free=st.integers(0, 10**15),
    needed=st.integers(0, 10**15),
    domain=st.none() | st.text(max_size=80),
)
events = st.builds(
    EventLine,
    age=st.none() | st.floats(0, 1e9),
    type=st.sampled_from(["Normal", "Warning"]) | text,
    reason=text,
    message=text,
    count=st.integers(1, 10**6),
    on=st.sampled_from(["Gang", "PodGroup"]),
)
diagnoses = st.builds(
    Diagnosis,
    namespace=st.text(max_size=80),
    name=st.text(max_size=80),
    view=text,
    phase=text,
    waited=st.none() | st.floats(0, 1e9),
    members=st.integers(0, 10**6),
    min_member=st.integers(0, 10**6),
    released=st.integers(0, 10**6),
    bound=st.integers(0, 10**6),
    reason=st.sampled_from(["Released", "Unschedulable", ""]) | text,
    message=st.text(max_size=3000) | marked,
    shortfall=st.none()
    | st.lists(
        st.tuples(st.sampled_from(["cpu", "nvidia.com/gpu"]), st.integers(0, 10**12), st.integers(0, 10**12))
    ).map(tuple),
    pod=text,
    nodes=st.lists(verdicts, max_size=120).map(tuple),
    topology_key=st.none() | st.text(min_size=1, max_size=60),
    nodes_note=text,
    preemption=st.text(max_size=1500),
    capacity_held=st.text(max_size=1500),
    held_against=st.lists(text, max_size=30).map(tuple),
    backoff=text,
    events=st.lists(events, max_size=40).map(tuple),
    notes=st.lists(text, max_size=5).map(tuple),
)


@settings(max_examples=300, deadline=None)
@given(diagnoses)
def test_any_diagnosis_fits_one_screen(diagnosis: Diagnosis) -> None:
    lines = render(diagnosis)
    assert 1 <= len(lines) <= MAX_LINES
    for line in lines:
        assert columns(line) <= MAX_WIDTH, line
        assert len(line.encode()) <= MAX_LINE_BYTES, (len(line.encode()), line)
        assert "\n" not in line and "\x1b" not in line and "\r" not in line


def test_a_tenants_escape_sequences_and_wide_text_are_cut_to_the_width() -> None:
    assert clip("\x1b[2Jgone") == "?[2Jgone"
    wide = clip("界" * 80)
    assert columns(wide) <= MAX_WIDTH and wide.endswith("…")


def test_combining_marks_are_kept_two_to_a_character() -> None:
    """A mark takes no column: 100 columns of `a` with 1,000 marks each would be 200 KB."""
    assert clip("Vie\u0323\u0302t") == "Vie\u0323\u0302t", "two stacked, as Vietnamese writes them"
    zalgo = clip(("a" + "\u0301" * 1000) * 100)
    assert zalgo.startswith("a\u0301\u0301a") and columns(zalgo) == MAX_WIDTH
    assert len(zalgo.encode()) <= MAX_LINE_BYTES
    assert clip("\u0301" * 50 + "x") == "x", "no mark before the first character"
    assert clip("\ud800") == "?", "a lone surrogate (no UTF-8) is shown as ?"


def test_alike_nodes_are_one_line_the_closest_first() -> None:
    nodes = [
        NodeVerdict(f"gpu-{i:03d}", "Insufficient nvidia.com/gpu", 0, "nvidia.com/gpu", (i % 5) * 1000, 8000)
        for i in range(12)
    ]
    nodes += [NodeVerdict(f"cpu-{i}", "taint is_cpu_compute") for i in range(4)]
    nodes += [NodeVerdict("gpu-100", None, 1)]
    lines = node_lines(nodes)
    assert lines[0] == "  1 node with room (1 pod in all): gpu-100 (1)"
    assert lines[1].startswith(
        "  12 nodes: Insufficient nvidia.com/gpu (a pod needs 8); closest: gpu-004 4 free, gpu-009 4 free"
    )
    assert lines[2] == "  4 nodes: taint is_cpu_compute: cpu-0, cpu-1, cpu-2, cpu-3"
    assert all(columns(line) <= MAX_WIDTH for line in lines)


def test_many_sections_keep_their_first_lines_and_say_what_was_left_out() -> None:
    many = Diagnosis(
        "ml",
        "pg-train",
        "planned now from 500 nodes you can read",
        nodes=tuple(NodeVerdict(f"n{i}", f"taint t{i}") for i in range(300)),
        events=tuple(EventLine(1.0, "Normal", "R", "m") for _ in range(30)),
    )
    lines = render(many)
    assert len(lines) == MAX_LINES
    assert lines[0] == "gang ml/pg-train: Pending"
    assert any(line.startswith("  … ") and "more lines" in line for line in lines)
    assert any(line.startswith("events (8 of 30") for line in lines)


# -- quorum get -----------------------------------------------------------------------------------


def gang(name: str, admitted: str, since: str, members: int = 2, released: int | None = None) -> JSON:
    status: JSON = {
        "phase": "Pending",
        "members": members,
        "conditions": [
            {"type": "Admitted", "status": admitted, "reason": "Unschedulable", "lastTransitionTime": since}
        ],
    }
    if released is not None:
        status.update(released=released, bound=released)
    return {"metadata": {"namespace": "ml", "name": name}, "spec": {"minMember": 4}, "status": status}


def test_get_lists_size_and_how_long_each_has_waited() -> None:
    now = 1_800_000_192.0  # 2027-01-15T08:03:12Z
    rows = [
        gang_row(gang("pg-a", "False", "2027-01-15T08:00:00Z"), now),
        gang_row(gang("pg-bb", "True", "2027-01-15T08:00:00Z", 4, 4), now),
    ]
    assert rows[0].wait == "3m12s" and rows[0].size == "2/4" and rows[0].placed == "-"
    assert rows[1].wait == "-" and rows[1].placed == "4/4"
    lines = table(rows, all_namespaces=True)
    assert lines[0].split() == ["NAMESPACE", "NAME", "PHASE", "SIZE", "RELEASED/BOUND", "WAIT", "REASON"]
    assert lines[1].split() == ["ml", "pg-a", "Pending", "2/4", "-", "3m12s", "Unschedulable"]
    assert lines[1].index("pg-a") == lines[2].index("pg-bb") == lines[0].index(" NAME ") + 1


def test_human_durations() -> None:
    assert [human_duration(s) for s in (0, 45, 192, 3600 * 5 + 180, 86400 * 3 + 7200)] == [
        "0s",
        "45s",
        "3m12s",
        "5h3m",
        "3d2h",
    ]


# -- input -----------------------------------------------------------------------------------------


def test_a_gang_is_named_with_or_without_its_namespace() -> None:
    assert target("ml/pg-train", None, "default") == ("ml", "pg-train")
    assert target("pg-train", "ml", "default") == ("ml", "pg-train")
    assert target("pg-train", None, "team") == ("team", "pg-train")
    with pytest.raises(CommandError, match="names namespace 'ml' but -n says 'other'"):
        target("ml/pg-train", "other", "default")
    with pytest.raises(CommandError, match="not a valid gang name"):
        target("ml/Not A Name", None, "default")


async def test_the_command_finds_its_cluster_as_kubectl_does(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    kubeconfig = tmp_path / "config"
    kubeconfig.write_text(
        yaml.safe_dump(
            {
                "apiVersion": "v1",
                "kind": "Config",
                "clusters": [{"name": "c", "cluster": {"server": "https://127.0.0.1:6443"}}],
                "users": [{"name": "u", "user": {"token": "t"}}],
                "contexts": [
                    {"name": "a", "context": {"cluster": "c", "user": "u", "namespace": "team-a"}},
                    {"name": "b", "context": {"cluster": "c", "user": "u"}},
                ],
                "current-context": "a",
            }
        )
    )
    monkeypatch.setenv("KUBECONFIG", f"{tmp_path / 'missing'}:{kubeconfig}")
    found = await command_client()
    async with found.api:
        assert (found.namespace, found.server) == ("team-a", "https://127.0.0.1:6443")
    other = await command_client(str(kubeconfig), context="b")
    async with other.api:
        assert other.namespace == "default"
    monkeypatch.setenv("KUBECONFIG", str(tmp_path / "missing"))
    monkeypatch.delenv("KUBERNETES_SERVICE_HOST", raising=False)
    with pytest.raises(KubeconfigError, match=r"no kubeconfig at .*missing: pass --kubeconfig"):
        await command_client()


def test_the_status_the_operator_composes_is_read_the_same_way() -> None:
    composed = gang("pg-a", "False", "2027-01-15T08:00:00Z")
    composed["status"]["conditions"][0]["message"] = (
        "needs 2 pods placed together; short by 1; no preemption: off"
    )
    diagnosis = from_status(composed, 1_800_000_192.0, "planned now")
    assert diagnosis.message == "needs 2 pods placed together; short by 1"
    assert diagnosis.preemption == "none: off"


def test_the_planned_view_uses_the_installed_operators_settings(monkeypatch: pytest.MonkeyPatch) -> None:
    """The Deployment's plain QUORUM_OPERATOR_* values win over this shell's; references
    (valueFrom) and the operator's own namespace are not taken; a bad value is named."""
    from quorum.operator.settings import OperatorSettings

    monkeypatch.setenv("QUORUM_OPERATOR_ORG", "shell-org")
    monkeypatch.setenv("QUORUM_OPERATOR_STARVATION_SECONDS", "5")
    env = [
        {"name": "QUORUM_OPERATOR_ORG", "value": "acme"},
        {"name": "QUORUM_OPERATOR_PREEMPTION", "value": "false"},
        {"name": "QUORUM_OPERATOR_NAMESPACE", "valueFrom": {"fieldRef": {"fieldPath": "metadata.namespace"}}},
        {"name": "OTHER", "value": "x"},
    ]
    deployment = {"spec": {"template": {"spec": {"containers": [{"name": "operator", "env": env}]}}}}
    settings = OperatorSettings.from_deployment(deployment)
    assert settings.org == "acme" and settings.preemption is False
    assert settings.starvation_seconds == 5.0, "what the Deployment does not set comes from the shell"
    env.append({"name": "QUORUM_OPERATOR_STARVATION_SECONDS", "value": "soon"})
    with pytest.raises(ValueError, match="starvation_seconds"):
        OperatorSettings.from_deployment(deployment)
