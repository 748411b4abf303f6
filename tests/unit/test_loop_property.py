"""Property: whatever tenants write — malformed, huge, mixed, impossible gangs — a scheduling
pass never raises, and every gang ends the pass either released or with a status that says
why not (or, for a gang with no group object yet, an Event on its pods)."""

from __future__ import annotations

from typing import Any

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from quorum.k8s.usage import BoundPods
from quorum.operator.gangs import Store
from quorum.operator.loop import GangLoop
from tests.unit.fake_api import FakeApi
from tests.unit.test_loop import NS, node, pod, podgroup, settle
from tests.unit.test_loop import settings as loop_settings

JSON = dict[str, Any]
GARBAGE = st.one_of(
    st.none(),
    st.integers(min_value=-(10**20), max_value=10**20),
    st.text(max_size=8),
    st.lists(st.integers(), max_size=2),
    st.dictionaries(st.text(max_size=3), st.integers(), max_size=2),
    st.booleans(),
)
QUANTITY = st.one_of(
    st.sampled_from(
        ["1", "8", "0", "500m", "1e3", "1Ei", "100000000000000", "-1", "abc", "1e999999999", "", "9" * 80]
    ),
    st.integers(min_value=0, max_value=16).map(str),
)


@st.composite
def gang(draw: st.DrawFn, name: str) -> tuple[JSON | None, list[JSON]]:
    size = draw(st.integers(min_value=0, max_value=12))
    group = None
    if draw(st.booleans()):
        group = podgroup(name, 1)
        group["spec"] = {
            "minMember": draw(st.one_of(st.integers(min_value=-2, max_value=40), GARBAGE)),
            "minResources": draw(
                st.one_of(st.dictionaries(st.sampled_from(["nvidia.com/gpu", "cpu"]), QUANTITY), GARBAGE)
            ),
            "scheduleTimeoutSeconds": draw(st.one_of(st.integers(min_value=-5, max_value=100), GARBAGE)),
        }
        if draw(st.booleans()):
            group["metadata"]["annotations"] = {
                "quorum.dev/topology-key": draw(st.sampled_from(["rack", "nope", ""]))
            }
    pods = []
    for i in range(size):
        p = pod(name, i)
        p["spec"]["containers"][0]["resources"]["requests"] = {
            "nvidia.com/gpu": draw(QUANTITY),
            "cpu": draw(QUANTITY),
        }
        if draw(st.integers(0, 5)) == 0:
            p["spec"]["schedulingGates"] = []  # released before
        pods.append(p)
    return group, pods


async def two_passes(store: Store) -> FakeApi:
    """Two passes of the loop over what the store holds (the second sees what the first wrote);
    a pass that raises fails the test."""
    bound = BoundPods()
    bound.replace_all(list(store.pods.values()))
    api = FakeApi(store)
    loop = GangLoop(api, store, bound, loop_settings())
    for _ in range(2):
        await loop.step()
        await settle(loop)
    return api


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(
    nodes=st.integers(min_value=0, max_value=6),
    racks=st.booleans(),
    gangs=st.lists(st.integers(0, 10**6), min_size=1, max_size=5, unique=True).flatmap(
        lambda ids: st.tuples(*(gang(f"g{i}") for i in ids))
    ),
)
async def test_a_pass_never_raises_and_every_gang_is_accounted_for(
    nodes: int, racks: bool, gangs: tuple[tuple[JSON | None, list[JSON]], ...]
) -> None:
    store = Store()
    for i in range(nodes):
        n = node(f"n{i}")
        if racks:
            n["metadata"]["labels"]["rack"] = f"r{i % 2}"
        store.nodes[n["metadata"]["name"]] = n
    for group, pods in gangs:
        if group is not None:
            store.groups[("scheduling.sigs.k8s.io", NS, group["metadata"]["name"])] = group
        for p in pods:
            store.pods[p["metadata"]["uid"]] = p
    api = await two_passes(store)
    told = {name for name, reason, _, _ in api.events if reason == "WaitingForGroup"}
    for group, pods in gangs:
        if not pods:
            continue
        key = (NS, pods[0]["metadata"]["labels"]["quorum.dev/gang"])
        if group is None:
            assert {p["metadata"]["name"] for p in pods} <= told, "pods told which group they wait for"
            continue
        status = (store.gangs.get(key) or {}).get("status") or {}
        admitted = next(c for c in status["conditions"] if c["type"] == "Admitted")
        if admitted["status"] == "False":
            assert admitted["reason"] and admitted["message"], admitted
        failed = next(c for c in status["conditions"] if c["type"] == "PlanningFailed")
        if failed["status"] == "True":
            assert "failed" in failed["message"]


@st.composite
def huge_gang(draw: st.DrawFn) -> tuple[JSON, list[JSON]]:
    """One gang of 1,000-1,600 pods: a launcher and workers, every worker of its own shape (a
    distinct CPU request) or all alike, its minMember anywhere from 1 to above its pod count."""
    size = draw(st.integers(min_value=1_000, max_value=1_600))
    distinct = draw(st.booleans())
    gpus = draw(st.sampled_from(["1", "8", "9"]))  # 9: no node has room for one pod
    group = podgroup("huge", 1)
    group["spec"]["minMember"] = draw(st.integers(min_value=1, max_value=size + 5))
    pods = []
    for i in range(size):
        p = pod("huge", i)
        requests = {"cpu": "1"} if i == 0 else {"nvidia.com/gpu": gpus, "cpu": f"{i if distinct else 1}m"}
        p["spec"]["containers"][0]["resources"]["requests"] = requests
        pods.append(p)
    return group, pods


@settings(
    max_examples=12, deadline=None, suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large]
)
@given(nodes=st.integers(min_value=1, max_value=200), gang=huge_gang())
async def test_a_huge_gang_of_a_thousand_shapes_neither_raises_nor_keeps_a_small_gang_waiting(
    nodes: int, gang: tuple[JSON, list[JSON]]
) -> None:
    store = Store()
    for i in range(nodes):
        n = node(f"n{i}")
        store.nodes[n["metadata"]["name"]] = n
    spare = node("spare")
    store.nodes["spare"] = spare
    group, pods = gang
    store.groups[("scheduling.sigs.k8s.io", NS, "huge")] = group
    small = podgroup("small", 1)
    store.groups[("scheduling.sigs.k8s.io", NS, "small")] = small
    for p in [*pods, pod("small", 0, gpus=1)]:
        store.pods[p["metadata"]["uid"]] = p
    await two_passes(store)
    status = store.gangs[(NS, "pg-huge")]["status"]
    admitted = next(c for c in status["conditions"] if c["type"] == "Admitted")
    if admitted["status"] != "True":  # held, with words; its room was not taken: the small gang goes
        assert admitted["reason"] and admitted["message"], admitted
        assert not store.pods["small-0"]["spec"]["schedulingGates"], "the small gang released beside it"
