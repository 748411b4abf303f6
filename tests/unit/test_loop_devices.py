"""DRA in the scheduling loop, against the stateful fake API: a gang's claims are allocated to
the planned devices before its pods are released, a failed allocation releases nothing it
promised, and a new leader whose claim watch lags plans no device an earlier leader allocated."""

from __future__ import annotations

import asyncio
import copy
import time
from typing import Any

from quorum.core.devices import DeviceMatcher
from quorum.k8s.usage import BoundPods
from quorum.operator.gangs import Store
from quorum.operator.loop import GangLoop
from quorum.operator.snapshot import DeviceNodes
from tests.unit.fake_api import FakeApi
from tests.unit.test_loop import NS, cluster, released, settings, step
from tests.unit.test_loop_preemption import held, running

JSON = dict[str, Any]
DRIVER = "gpu.example.com"


def device_slice(node: str, count: int = 8) -> JSON:
    return {
        "metadata": {"name": f"{node}-gpus", "uid": f"slice-{node}", "resourceVersion": "1"},
        "spec": {
            "driver": DRIVER,
            "nodeName": node,
            "pool": {"name": node, "generation": 1, "resourceSliceCount": 1},
            "devices": [
                {"name": f"gpu-{i}", "attributes": {"model": {"string": "H100"}}} for i in range(count)
            ],
        },
    }


def device_class() -> JSON:
    return {
        "metadata": {"name": "gpu", "uid": "class-gpu", "resourceVersion": "1"},
        "spec": {"selectors": [{"cel": {"expression": f'device.driver == "{DRIVER}"'}}]},
    }


def claim_of(uid: str, count: int = 8) -> JSON:
    request = {"name": "gpus", "exactly": {"deviceClassName": "gpu", "count": count}}
    return {
        "metadata": {
            "name": f"{uid}-gpus",
            "namespace": NS,
            "uid": f"claim-{uid}",
            "resourceVersion": "10",
            "ownerReferences": [{"kind": "Pod", "name": uid, "uid": uid, "controller": True}],
        },
        "spec": {"devices": {"requests": [request]}},
        "status": {},
    }


def with_devices(store: Store, api: FakeApi, loop: GangLoop, nodes: list[str], gangs: list[str]) -> None:
    """The gang pods of `gangs` ask 8 devices each through a template claim (no nvidia.com/gpu);
    `nodes` publish 8 devices each. Claims go to the fake apiserver and the loop's watch. The
    loop's selector matching never runs out of time, however slow the machine."""
    loop.device_nodes = DeviceNodes(DeviceMatcher(clock=lambda: 0.0))
    loop.devices.classes.upsert(device_class())
    for name in nodes:
        loop.devices.slices.upsert(device_slice(name))
    for uid, pod in store.pods.items():
        if pod["metadata"]["labels"]["pod-group.scheduling.sigs.k8s.io"] not in gangs:
            continue
        pod["spec"]["containers"][0]["resources"] = {"requests": {"cpu": "1"}}
        pod["spec"]["resourceClaims"] = [{"name": "gpus", "resourceClaimTemplateName": "eight"}]
        pod["status"]["resourceClaimStatuses"] = [{"name": "gpus", "resourceClaimName": f"{uid}-gpus"}]
        claim = claim_of(uid)
        api.claims[(NS, f"{uid}-gpus")] = claim
        loop.devices.claims.upsert(copy.deepcopy(claim))
    api.claim_watch = loop.devices.claims


def allocations(api: FakeApi) -> dict[str, tuple[str, list[str]]]:
    """pod uid -> (node, devices) of each allocated claim, as the apiserver holds it."""
    out = {}
    for (_, name), claim in api.claims.items():
        allocation = (claim.get("status") or {}).get("allocation")
        if allocation is not None:
            (term,) = allocation["nodeSelector"]["nodeSelectorTerms"]
            node = term["matchFields"][0]["values"][0]
            out[name.removesuffix("-gpus")] = (node, [r["device"] for r in allocation["devices"]["results"]])
    return out


def assert_released_only_with_claims_allocated(store: Store, api: FakeApi) -> None:
    allocated = allocations(api)
    for uid, pod in store.pods.items():
        if pod["spec"].get("resourceClaims") and not pod["spec"]["schedulingGates"]:
            assert uid in allocated and allocated[uid][0] == api.pinned[uid], (
                f"{uid} released without its devices"
            )
    per_device = [(node, d) for node, devices in allocated.values() for d in devices]
    assert len(per_device) == len(set(per_device)), "a device in two claims"


async def test_claims_are_allocated_to_the_planned_devices_before_the_pods_are_released() -> None:
    store, bound = cluster(3, {"a": 2})
    api = FakeApi(store)
    loop = GangLoop(api, store, bound, settings())
    with_devices(store, api, loop, ["n0", "n1"], ["a"])  # n2 has no devices
    await step(loop)
    assert released(store, "a") == ["a-0", "a-1"]
    allocated = allocations(api)
    assert {allocated[u][0] for u in ("a-0", "a-1")} == {"n0", "n1"}, "one pod per node with devices"
    assert all(len(devices) == 8 for _, devices in allocated.values())
    order = [
        (name, args[0]["metadata"]["name"])
        for name, args in api.calls
        if name in ("allocate_claim", "release_pod")
    ]
    for uid in ("a-0", "a-1"):
        assert order.index(("allocate_claim", f"{uid}-gpus")) < order.index(("release_pod", uid))
    assert_released_only_with_claims_allocated(store, api)


async def test_a_gang_bigger_than_the_devices_is_held_in_devices() -> None:
    store, bound = cluster(3, {"a": 3})
    api = FakeApi(store)
    loop = GangLoop(api, store, bound, settings())
    with_devices(store, api, loop, ["n0", "n1"], ["a"])
    await step(loop)
    assert released(store, "a") == [] and api.called("allocate_claim") == []
    message = store.gangs[(NS, "pg-a")]["status"]["conditions"][0]["message"]
    assert "devices of class gpu" in message and "short by 1" in message


async def test_a_failed_allocation_releases_no_pod_of_the_gang_until_all_its_devices_are_allocated() -> None:
    store, bound = cluster(2, {"a": 2})
    api = FakeApi(store)
    loop = GangLoop(api, store, bound, settings())
    with_devices(store, api, loop, ["n0", "n1"], ["a"])
    api.fail("allocate_claim", times=1, when=lambda claim, status: claim["metadata"]["name"] == "a-1-gpus")
    await step(loop)
    assert released(store, "a") == [], "a-1's claim was not allocated: no pod of the gang goes"
    assert set(allocations(api)) == {"a-0"}, "a-0's claim stays allocated, pinning a-0 to its node"
    deadline = time.monotonic() + 5
    while released(store, "a") != ["a-0", "a-1"] and time.monotonic() < deadline:
        await asyncio.sleep(0.05)  # the gang's failure backoff; then both are planned anew
        await step(loop)
        assert released(store, "a") in ([], ["a-0", "a-1"]), "a-0 never goes alone"
    assert released(store, "a") == ["a-0", "a-1"]
    assert_released_only_with_claims_allocated(store, api)


async def test_a_new_leader_whose_claim_watch_lags_plans_no_device_allocated_before() -> None:
    """The old leader allocated gang a's claims and released it; b waits for devices. A new
    leader's claim watch still shows a's claims unallocated: it plans nothing until the watch
    has caught up, then holds b (a's devices are taken), never allocating a device twice."""
    store, bound = cluster(2, {"a": 2, "b": 2})
    store.groups[("scheduling.sigs.k8s.io", NS, "b")]["metadata"]["creationTimestamp"] = (
        "2026-11-23T00:00:00Z"
    )
    api = FakeApi(store)
    first = GangLoop(api, store, bound, settings())
    with_devices(store, api, first, ["n0", "n1"], ["a", "b"])
    await step(first)
    assert released(store, "a") == ["a-0", "a-1"] and released(store, "b") == []
    assert_released_only_with_claims_allocated(store, api)

    second = GangLoop(api, store, BoundPods(), settings())
    with_devices(store, FakeApi(store), second, ["n0", "n1"], ["a", "b"])  # a's claims as before
    api.claim_watch = None  # the new leader's claim watch delivers nothing yet
    await second.take_over()
    assert second.catch_up is not None and second.catch_up.behind(store, second.devices) == 2
    await step(second)
    assert api.called("allocate_claim")[2:] == [] and released(store, "b") == [], "nothing planned"
    for claim in api.claims.values():  # the watch delivers
        second.devices.claims.upsert(copy.deepcopy(claim))
    assert second.catch_up.behind(store, second.devices) == 0
    await step(second)
    assert released(store, "b") == []
    assert_released_only_with_claims_allocated(store, api)


async def test_preemption_counts_the_devices_its_victims_free() -> None:
    """A low-priority gang holds every device through its claims (no GPU in its requests); a
    high-priority gang that needs them preempts it whole, counting the devices it frees."""
    store, bound = cluster(2, {})
    running(store, bound, "low", 2, 10, ["n0", "n1"])
    held(store, "high", 2, 1000)
    api = FakeApi(store)
    loop = GangLoop(api, store, bound, settings())
    with_devices(store, api, loop, ["n0", "n1"], ["low", "high"])
    for i, node in enumerate(["n0", "n1"]):  # low's claims hold its node's 8 devices
        uid = f"low-{i}"
        bound.upsert(store.pods[uid])
        claim = api.claims[(NS, f"{uid}-gpus")]
        claim["status"] = {
            "allocation": {
                "devices": {
                    "results": [
                        {"request": "gpus", "driver": DRIVER, "pool": node, "device": f"gpu-{d}"}
                        for d in range(8)
                    ]
                },
                "nodeSelector": {
                    "nodeSelectorTerms": [
                        {"matchFields": [{"key": "metadata.name", "operator": "In", "values": [node]}]}
                    ]
                },
            },
            "reservedFor": [{"resource": "pods", "name": uid, "uid": uid}],
        }
        claim["metadata"]["resourceVersion"] = "11"
        loop.devices.claims.upsert(copy.deepcopy(claim))
    await step(loop)
    assert sorted(api.victims_deleted) == ["low-0", "low-1"], "the whole gang, for its devices"
    _, told = api.disruption_targets["low-0"]
    assert "devices of class gpu" in told, told
    assert released(store, "high") == []


async def test_first_available_alternatives_are_tried_in_order_and_the_one_that_fits_is_allocated() -> None:
    """Claims of 8 H100s, or else 8 A100s; the nodes have A100s only. The first pass tries the
    H100s and says so; the next tries the A100s, releases the gang whole and allocates that
    alternative, as kube-scheduler names it ("gpus/a100")."""
    store, bound = cluster(2, {"a": 2})
    api = FakeApi(store)
    loop = GangLoop(api, store, bound, settings())
    with_devices(store, api, loop, ["n0", "n1"], ["a"])  # the devices' model is H100: made A100 below
    for name in ("n0", "n1"):
        found = device_slice(name)
        for d in found["spec"]["devices"]:
            d["attributes"]["model"] = {"string": "A100"}
        found["metadata"]["resourceVersion"] = "2"
        loop.devices.slices.upsert(found)
    model = f'device.attributes["{DRIVER}"].model'
    alternatives = [
        {
            "name": m.lower(),
            "deviceClassName": "gpu",
            "count": 8,
            "selectors": [{"cel": {"expression": f'{model} == "{m}"'}}],
        }
        for m in ("H100", "A100")
    ]
    for uid in ("a-0", "a-1"):
        claim = api.claims[(NS, f"{uid}-gpus")]
        claim["spec"]["devices"]["requests"] = [{"name": "gpus", "firstAvailable": alternatives}]
        claim["metadata"]["resourceVersion"] = "12"
        loop.devices.claims.upsert(copy.deepcopy(claim))
    await step(loop)
    assert released(store, "a") == []
    message = store.gangs[(NS, "pg-a")]["status"]["conditions"][0]["message"]
    assert "tried alternative 1 of 2; the next pass tries alternative 2" in message, message
    await step(loop)
    assert released(store, "a") == ["a-0", "a-1"]
    for uid in ("a-0", "a-1"):
        allocation = api.claims[(NS, f"{uid}-gpus")]["status"]["allocation"]
        assert {r["request"] for r in allocation["devices"]["results"]} == {"gpus/a100"}
    assert_released_only_with_claims_allocated(store, api)


async def test_a_claim_someone_allocated_on_another_node_is_not_taken_for_done() -> None:
    """Between the plan and the release, kube-scheduler (for a pod outside gangs that shares the
    claim, say) allocated it on n1: the release onto n0 does not count it as allocated."""
    store, bound = cluster(2, {"a": 1})
    api = FakeApi(store)
    loop = GangLoop(api, store, bound, settings())
    with_devices(store, api, loop, ["n0", "n1"], ["a"])
    claim = copy.deepcopy(api.claims[(NS, "a-0-gpus")])
    claim["status"] = {
        "allocation": {
            "devices": {"results": [{"request": "gpus", "driver": DRIVER, "pool": "n1", "device": "gpu-0"}]},
            "nodeSelector": {
                "nodeSelectorTerms": [
                    {"matchFields": [{"key": "metadata.name", "operator": "In", "values": ["n1"]}]}
                ]
            },
        }
    }
    claim["metadata"]["resourceVersion"] = "13"
    loop.devices.claims.upsert(claim)
    chosen = {("gpus", "gpus"): tuple((DRIVER, "n0", f"gpu-{i}") for i in range(8))}
    assert not await loop.releaser.allocate_claims(store.pods["a-0"], "n0", chosen, set())
    assert await loop.releaser.allocate_claims(store.pods["a-0"], "n1", chosen, set()), "its own node: done"
    assert api.called("allocate_claim") == []


async def test_a_device_two_claims_hold_is_counted_and_told_once_on_each_claim() -> None:
    """kube-scheduler allocated a device to a pod outside gangs while quorum did for a gang:
    the metric counts it, a Warning Event goes to each claim, once; freed, it counts no more."""
    from quorum.operator import metrics

    store, bound = cluster(2, {})
    api = FakeApi(store)
    loop = GangLoop(api, store, bound, settings())
    with_devices(store, api, loop, ["n0"], [])

    def allocated(name: str, version: str) -> JSON:
        claim = claim_of(name)
        claim["metadata"]["resourceVersion"] = version
        result = {"request": "gpus", "driver": DRIVER, "pool": "n0", "device": "gpu-3"}
        claim["status"] = {"allocation": {"devices": {"results": [result]}}}
        return claim

    loop.devices.claims.upsert(allocated("mine", "11"))
    loop.devices.claims.upsert(allocated("theirs", "12"))
    await step(loop)
    await asyncio.gather(*loop.reports)
    assert metrics.REGISTRY.get_sample_value("quorum_operator_dra_devices_allocated_twice") == 1
    told = sorted((name, reason) for name, reason, _, warning in api.events if warning)
    assert told == [("mine-gpus", "DeviceAllocatedTwice"), ("theirs-gpus", "DeviceAllocatedTwice")]
    await step(loop)
    await asyncio.gather(*loop.reports)
    assert len(api.events) == 2, "told once"
    loop.devices.claims.delete(allocated("theirs", "13"))
    await step(loop)
    assert metrics.REGISTRY.get_sample_value("quorum_operator_dra_devices_allocated_twice") == 0
