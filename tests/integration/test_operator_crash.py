"""kill -9 of the operator in the middle of a gang's release: the restarted operator finishes the
gang on the plan it recorded; no pod is left gated and none is released twice."""

from __future__ import annotations

import random
from collections.abc import Callable
from typing import Any

import pytest
from kubernetes_asyncio import client

from devcluster.cluster import Instance
from tests.kube import (
    api_client,
    assert_no_overcommit,
    create_namespace,
    create_podgroup,
    eventually,
    kill_after,
)

pytestmark = pytest.mark.cluster

PODS = 8
ROUNDS = 10


async def make_gang(api: client.ApiClient, namespace: str, name: str) -> None:
    await create_podgroup(api, namespace, name, PODS)
    await client.AppsV1Api(api).create_namespaced_deployment(
        namespace,
        {
            "metadata": {"name": name},
            "spec": {
                "replicas": PODS,
                "selector": {"matchLabels": {"app": name}},
                "template": {
                    "metadata": {"labels": {"app": name, "pod-group.scheduling.sigs.k8s.io": name}},
                    "spec": {
                        "containers": [
                            {
                                "name": "c",
                                "image": "registry.k8s.io/pause:3.10",
                                "resources": {"requests": {"cpu": "1"}},
                            }
                        ]
                    },
                },
            },
        },
    )


def gated(pod: Any) -> bool:
    return any(g.name == "quorum.dev/gang" for g in pod.spec.scheduling_gates or [])


async def test_a_killed_operator_finishes_the_gang_on_its_recorded_plan(
    start_instance: Callable[..., Instance], monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("QUORUM_OPERATOR_RELEASE_CONCURRENCY", "1")  # releases one by one
    monkeypatch.setenv("QUORUM_OPERATOR_LEASE_SECONDS", "3")  # a restart waits out the dead one's Lease
    instance = start_instance("t-crash")
    rng = random.Random(20261122)
    api = await api_client(instance.kubeconfig("admin"))
    async with api:
        core = client.CoreV1Api(api)
        await create_namespace(api, "crash")
        for round_ in range(ROUNDS):
            k = rng.randint(1, PODS - 3)
            name = f"g{round_}"
            await make_gang(api, "crash", name)

            async def released(name: str = name) -> int:
                found = (await core.list_namespaced_pod("crash", label_selector=f"app={name}")).items
                return sum(1 for p in found if not gated(p))

            at_kill = await kill_after(instance, "quorum-operator", released, k, timeout=90)
            pods = (await core.list_namespaced_pod("crash", label_selector=f"app={name}")).items
            assert sum(1 for p in pods if not gated(p)) == at_kill, "nothing released after the kill"
            assert 0 < at_kill < PODS, f"killed after {at_kill} of {PODS} releases, not in the middle"

            instance.start_component("quorum-operator")

            async def all_running(name: str = name) -> list[Any] | None:
                found = (await core.list_namespaced_pod("crash", label_selector=f"app={name}")).items
                ok = len(found) == PODS and all(p.status.phase == "Running" and not gated(p) for p in found)
                return found if ok else None

            running = await eventually(all_running, timeout=60, what=f"gang {name} Running after the restart")
            gang = await client.CustomObjectsApi(api).get_namespaced_custom_object(
                "quorum.dev", "v1alpha1", "crash", "gangs", f"pg-{name}"
            )
            admission = gang["status"]["admission"]
            assert admission["attempt"] == 1, "released twice: a second decision was made"
            planned = {e["uid"]: e["node"] for e in admission["placement"]}
            assert {p.metadata.uid: p.spec.node_name for p in running} == planned, "not on the recorded plan"
        await assert_no_overcommit(api)
