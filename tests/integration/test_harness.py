"""The test harness itself: per-test node pools and the over-commit check can fail."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import pytest
from kubernetes_asyncio import client

from devcluster.nodes import TestPool
from tests.kube import eventually, overcommitted_nodes

pytestmark = pytest.mark.cluster


def pause_pod(name: str, pool: TestPool, gpus: int, node_name: str | None = None) -> dict[str, Any]:
    spec: dict[str, Any] = {
        **pool.pod_spec(),
        "containers": [
            {
                "name": "c",
                "image": "registry.k8s.io/pause:3.10",
                "resources": {"limits": {"nvidia.com/gpu": str(gpus)}},
            }
        ],
    }
    if node_name:
        spec["nodeName"] = node_name  # bypasses the scheduler, as a kubelet-bound pod would
    return {"metadata": {"name": name}, "spec": spec}


async def test_pool_nodes_take_only_pods_that_select_them(
    api: client.ApiClient, namespace: str, test_pool: Callable[..., Any]
) -> None:
    pool: TestPool = await test_pool(
        count=2, capacity={"cpu": "8", "memory": "64Gi", "nvidia.com/gpu": "4", "pods": "20"}
    )
    core = client.CoreV1Api(api)
    for i in range(2):
        await core.create_namespaced_pod(namespace, pause_pod(f"p{i}", pool, 4))

    async def bound() -> list[str] | None:
        pods = (await core.list_namespaced_pod(namespace)).items
        nodes = [p.spec.node_name for p in pods if p.spec.node_name]
        return nodes if len(nodes) == 2 else None

    assert sorted(await eventually(bound, timeout=30, what="pool pods bound")) == pool.names
    # The pool is full: a third pod stays Pending rather than landing on a shared node.
    await core.create_namespaced_pod(namespace, pause_pod("p2", pool, 1))

    async def unschedulable() -> bool:
        pod = await core.read_namespaced_pod("p2", namespace)
        return any(
            c.type == "PodScheduled" and c.reason == "Unschedulable" for c in pod.status.conditions or []
        )

    await eventually(unschedulable, timeout=30, what="third pod Unschedulable")
    assert await overcommitted_nodes(api) == []


async def test_overcommit_check_reports_a_node_kwok_let_overfill(
    api: client.ApiClient, namespace: str, test_pool: Callable[..., Any]
) -> None:
    """kwok runs whatever is bound to it; the check must notice."""
    pool: TestPool = await test_pool(
        count=1, capacity={"cpu": "8", "memory": "64Gi", "nvidia.com/gpu": "2", "pods": "20"}
    )
    core = client.CoreV1Api(api)
    node = pool.names[0]
    await core.create_namespaced_pod(namespace, pause_pod("a", pool, 2, node_name=node))
    await core.create_namespaced_pod(namespace, pause_pod("b", pool, 1, node_name=node))

    async def reported() -> list[str] | None:
        problems = [p for p in await overcommitted_nodes(api) if p.startswith(node)]
        return problems or None

    problems = await eventually(reported, timeout=10, what="over-commit reported")
    assert problems == [f"{node}: nvidia.com/gpu 3 > 2"]
    await core.delete_collection_namespaced_pod(namespace, grace_period_seconds=0)
