"""Whole-gang preemption on the real control plane (docs/preemption.md), on an instance of its
own; each test in its own pool of 8-GPU nodes. At the end of every scenario: no node is
over-committed and no victim gang is partly running."""

from __future__ import annotations

import secrets
from collections.abc import AsyncIterator, Iterator
from typing import Any

import pytest
from kubernetes_asyncio import client

from devcluster.cluster import Instance
from devcluster.nodes import TestPool
from tests.integration.test_gangs import GANGS, deployment, gated, get, pods
from tests.kube import (
    api_client,
    assert_no_overcommit,
    create_namespace,
    create_podgroup,
    create_pool_nodes,
    eventually,
    operator_instance,
)

pytestmark = pytest.mark.cluster

HIGH, LOW = "quorum-test-high", "quorum-test-low"


@pytest.fixture(scope="module")
def preempting() -> Iterator[Instance]:
    with operator_instance("t-preempt", {"PREEMPTION_RETRY_SECONDS": "2"}) as instance:
        yield instance


@pytest.fixture
async def api(preempting: Instance) -> AsyncIterator[client.ApiClient]:
    api = await api_client(preempting.kubeconfig("admin"))
    async with api:
        for name, value in ((HIGH, 1000), (LOW, 10)):
            body = {"apiVersion": "scheduling.k8s.io/v1", "kind": "PriorityClass", "metadata": {"name": name}}
            try:
                await client.SchedulingV1Api(api).create_priority_class({**body, "value": value})
            except client.ApiException as err:
                if err.status != 409:
                    raise
        yield api


@pytest.fixture
async def ns(api: client.ApiClient) -> AsyncIterator[str]:
    name = f"pre-{secrets.token_hex(3)}"
    await create_namespace(api, name)
    yield name
    await client.CoreV1Api(api).delete_namespace(name, propagation_policy="Background")


async def make_pool(preempting: Instance, count: int) -> TestPool:
    pool = TestPool(f"tp-{secrets.token_hex(3)}", count)
    platform = await api_client(preempting.kubeconfig("platform"))
    async with platform:
        await create_pool_nodes(platform, pool)
    return pool


def gang_deployment(
    name: str, replicas: int, pool: TestPool, priority: str, labels: dict[str, str] | None = None
) -> dict[str, Any]:
    body = deployment(name, replicas, 8, pool, name)
    template = body["spec"]["template"]
    template["spec"]["priorityClassName"] = priority
    template["metadata"]["labels"].update(labels or {})
    return body


async def apply_gang(
    api: client.ApiClient, ns: str, name: str, replicas: int, pool: TestPool, priority: str, **kw: Any
) -> None:
    await create_podgroup(api, ns, name, replicas)
    await client.AppsV1Api(api).create_namespaced_deployment(
        ns, gang_deployment(name, replicas, pool, priority, **kw)
    )


async def running(api: client.ApiClient, ns: str, app: str, count: int) -> list[dict[str, Any]]:
    async def probe() -> list[dict[str, Any]] | None:
        found = [p for p in await pods(api, ns, f"app={app}") if not p["metadata"].get("deletionTimestamp")]
        ok = len(found) == count and all(p["status"].get("phase") == "Running" for p in found)
        return found if ok else None

    return await eventually(probe, timeout=90, what=f"{count} pods of {app} Running")


async def waiting_gated(api: client.ApiClient, ns: str, app: str, count: int) -> list[dict[str, Any]]:
    async def probe() -> list[dict[str, Any]] | None:
        found = [p for p in await pods(api, ns, f"app={app}") if not p["metadata"].get("deletionTimestamp")]
        return found if len(found) == count and all(gated(p) for p in found) else None

    return await eventually(probe, timeout=90, what=f"{count} pods of {app} back and gated")


async def events(api: client.ApiClient, ns: str, reason: str) -> list[dict[str, Any]]:
    listed = await client.CoreV1Api(api).list_namespaced_event(ns, field_selector=f"reason={reason}")
    return [e.to_dict() for e in listed.items]


async def assert_no_victim_partly_running(api: client.ApiClient, ns: str, app: str, size: int) -> None:
    """A gang's pods are all running, or none is bound."""
    found = [p for p in await pods(api, ns, f"app={app}") if not p["metadata"].get("deletionTimestamp")]
    bound = [p for p in found if p["spec"].get("nodeName")]
    assert len(bound) in (0, size), f"{app}: {len(bound)} of {size} pods bound"


async def test_a_low_priority_gang_is_preempted_whole_and_runs_again_when_room_returns(
    preempting: Instance, api: client.ApiClient, ns: str
) -> None:
    pool = await make_pool(preempting, 2)
    await apply_gang(api, ns, "low", 2, pool, LOW)
    before = {p["metadata"]["uid"] for p in await running(api, ns, "low", 2)}

    await apply_gang(api, ns, "high", 2, pool, HIGH)
    await running(api, ns, "high", 2)
    await waiting_gated(api, ns, "low", 2)  # made again by the ReplicaSet, held as a gang
    await assert_no_victim_partly_running(api, ns, "low", 2)
    await assert_no_overcommit(api)

    preempted = await eventually(lambda: events(api, ns, "Preempted"), timeout=10, what="Preempted Event")
    message = preempted[0]["message"]
    assert f"preempted by {ns}/pg-high (priority 1000): needed 16 nvidia.com/gpu" in message, message

    async def told() -> dict[str, Any] | None:
        low = await get(api, GANGS, ns, "pg-low")
        conditions = ((low or {}).get("status") or {}).get("conditions") or []
        found = next((c for c in conditions if c["type"] == "Preempted"), None)
        return found if found and found["status"] == "True" else None

    condition = await eventually(told, timeout=30, what="the victim's Preempted condition")
    assert condition["reason"] == "PreemptionByQuorum" and "pg-high" in condition["message"], condition
    preempting_events = await events(api, ns, "Preempting")
    assert "preempting 1 gang" in preempting_events[0]["message"], preempting_events

    async def ended() -> dict[str, Any] | None:
        gang = await get(api, GANGS, ns, "pg-high")
        return gang if gang and not (gang.get("status") or {}).get("preemption") else None

    await eventually(ended, timeout=60, what="the preemption ended (the preemptor bound)")

    async def untainted() -> bool:
        nodes = [await client.CoreV1Api(api).read_node(n) for n in pool.names]
        return all(not any(t.key == "quorum.dev/reserved" for t in n.spec.taints or []) for n in nodes)

    await eventually(untainted, timeout=30, what="reservation taints removed")

    await client.AppsV1Api(api).delete_namespaced_deployment("high", ns)
    after = {p["metadata"]["uid"] for p in await running(api, ns, "low", 2)}
    assert not after & before, "the victim runs again as new pods, admitted whole"
    await assert_no_overcommit(api)


async def test_no_work_is_taken_for_a_gang_that_must_sit_beside_a_pod_that_does_not_exist(
    preempting: Instance, api: client.ApiClient, ns: str
) -> None:
    """A high-priority gang whose pods require pod affinity to a pod that does not exist could
    never bind, however much room is made: quorum deletes nothing for it and says why."""
    pool = await make_pool(preempting, 2)
    await apply_gang(api, ns, "low", 2, pool, LOW)
    before = {p["metadata"]["uid"] for p in await running(api, ns, "low", 2)}
    body = gang_deployment("high", 2, pool, HIGH)
    term = {
        "labelSelector": {"matchLabels": {"app": "does-not-exist"}},
        "topologyKey": "kubernetes.io/hostname",
    }
    body["spec"]["template"]["spec"]["affinity"] = {
        "podAffinity": {"requiredDuringSchedulingIgnoredDuringExecution": [term]}
    }
    await create_podgroup(api, ns, "high", 2)
    await client.AppsV1Api(api).create_namespaced_deployment(ns, body)

    async def said() -> str | None:
        gang = await get(api, GANGS, ns, "pg-high")
        conditions = ((gang or {}).get("status") or {}).get("conditions") or []
        message = next((c["message"] for c in conditions if c["type"] == "Unschedulable"), "")
        return message if "no preemption (Unproven)" in message else None

    message = await eventually(
        said, timeout=60, what="the gang's Unschedulable saying no preemption (Unproven)"
    )
    assert "required pod affinity, which quorum does not model" in message, message
    after = {p["metadata"]["uid"] for p in await running(api, ns, "low", 2)}
    assert after == before, "the lower-priority gang was not touched"
    assert not await events(api, ns, "Preempted")
