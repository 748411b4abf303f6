"""Smoke tests of the local control plane: real controllers, scheduler, kwok and the 1.36 API."""

from __future__ import annotations

import asyncio
import time
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import pytest
import yaml
from kubernetes_asyncio import client
from kubernetes_asyncio.client.exceptions import ApiException

from devcluster.cluster import Instance
from devcluster.nodes import STATE_LABEL
from tests.kube import WorkloadApi, assert_no_overcommit, eventually, raw_json

pytestmark = pytest.mark.cluster

EXAMPLES = Path(__file__).resolve().parents[2] / "examples"


def seed_pause_deployment() -> dict[str, Any]:
    """Seed 001's pause Deployment with the pod-group label and schedulerName removed."""
    docs = list(yaml.safe_load_all((EXAMPLES / "seed-001-coscheduler/podgroup-pause.yaml").read_text()))
    deployment: dict[str, Any] = next(d for d in docs if d["kind"] == "Deployment")
    template = deployment["spec"]["template"]
    del template["metadata"]["labels"]["pod-group.scheduling.sigs.k8s.io"]
    del template["spec"]["schedulerName"]
    return deployment


async def pods_of(api: client.ApiClient, namespace: str, selector: str = "") -> list[dict[str, Any]]:
    core = client.CoreV1Api(api)
    data = await raw_json(
        core.list_namespaced_pod(namespace, label_selector=selector, _preload_content=False)
    )
    items: list[dict[str, Any]] = data["items"]
    return items


async def test_seed_pause_deployment_runs(
    customer_api: client.ApiClient, api: client.ApiClient, namespace: str
) -> None:
    """(a) controller-manager creates the pods, kube-scheduler binds them, kwok runs them."""
    apps = client.AppsV1Api(customer_api)
    await apps.create_namespaced_deployment(namespace, seed_pause_deployment())

    async def two_running() -> list[dict[str, Any]] | None:
        pods = await pods_of(api, namespace, "app=pause")
        running = [p for p in pods if p["status"].get("phase") == "Running" and p["spec"].get("nodeName")]
        return running if len(running) == 2 else None

    running = await eventually(two_running, timeout=60, what="2 pause pods Running")
    for pod in running:
        ready = {c["type"]: c["status"] for c in pod["status"]["conditions"]}
        assert ready.get("Ready") == "True", pod["status"]
    await assert_no_overcommit(api)


async def test_gpu_pods_land_only_on_production_nodes(api: client.ApiClient, namespace: str) -> None:
    """(b) never on the triage node (tainted reserved=<hash>) or the cordoned one."""
    core = client.CoreV1Api(api)
    nodes = {
        n["metadata"]["name"]: n for n in (await raw_json(core.list_node(_preload_content=False)))["items"]
    }
    for i in range(6):
        await core.create_namespaced_pod(
            namespace,
            {
                "metadata": {"name": f"gpu-{i}"},
                "spec": {
                    "containers": [
                        {
                            "name": "c",
                            "image": "registry.k8s.io/pause:3.10",
                            "resources": {"limits": {"nvidia.com/gpu": "1"}},
                        }
                    ]
                },
            },
        )

    async def all_bound() -> list[dict[str, Any]] | None:
        pods = await pods_of(api, namespace)
        return pods if len(pods) == 6 and all(p["spec"].get("nodeName") for p in pods) else None

    for pod in await eventually(all_bound, timeout=60, what="6 GPU pods bound"):
        node = nodes[pod["spec"]["nodeName"]]
        assert node["metadata"]["labels"][STATE_LABEL] == "production", node["metadata"]["name"]
        assert not node["spec"].get("unschedulable"), node["metadata"]["name"]
        assert "nvidia.com/gpu" in node["status"]["allocatable"]
    await assert_no_overcommit(api)


async def test_scheduling_gate_holds_until_removed_with_node_selector(
    api: client.ApiClient, namespace: str
) -> None:
    """(c) a gated pod waits; one patch removes the gate and pins it with a new nodeSelector."""
    core = client.CoreV1Api(api)
    gate = [{"name": "example.com/hold"}]
    await core.create_namespaced_pod(
        namespace,
        {
            "metadata": {"name": "gated"},
            "spec": {
                "schedulingGates": gate,
                "containers": [
                    {
                        "name": "c",
                        "image": "registry.k8s.io/pause:3.10",
                        "resources": {"limits": {"nvidia.com/gpu": "1"}},
                    }
                ],
            },
        },
    )

    async def scheduling_gated() -> bool:
        pod = await core.read_namespaced_pod("gated", namespace)
        conditions = {c.type: c for c in pod.status.conditions or []}
        cond = conditions.get("PodScheduled")
        return bool(cond and cond.status == "False" and cond.reason == "SchedulingGated")

    await eventually(scheduling_gated, timeout=30, what="PodScheduled=False/SchedulingGated")
    await asyncio.sleep(2)
    pod = await core.read_namespaced_pod("gated", namespace)
    assert pod.spec.node_name is None

    # Gates are set only at creation: adding one later is refused by the apiserver.
    with pytest.raises(ApiException) as refused:
        await core.patch_namespaced_pod(
            "gated",
            namespace,
            [
                {
                    "op": "add",
                    "path": "/spec/schedulingGates/-",
                    "value": {"name": "example.com/more"},
                },
            ],
        )
    assert refused.value.status == 422
    assert "only deletion is allowed" in refused.value.body

    target = "gpu-h100-013"
    await core.patch_namespaced_pod(
        "gated",
        namespace,
        [
            {"op": "test", "path": "/metadata/uid", "value": pod.metadata.uid},
            {"op": "test", "path": "/spec/schedulingGates", "value": gate},
            {"op": "remove", "path": "/spec/schedulingGates"},
            {
                "op": "add",
                "path": "/spec/nodeSelector",
                "value": {"kubernetes.io/hostname": target},
            },
        ],
    )

    async def bound() -> str | None:
        pod = await core.read_namespaced_pod("gated", namespace)
        return str(pod.spec.node_name) if pod.spec.node_name else None

    assert await eventually(bound, timeout=30, what="the ungated pod bound") == target
    pod = await core.read_namespaced_pod("gated", namespace)
    assert pod.spec.node_selector == {"kubernetes.io/hostname": target}


@pytest.mark.kubernetes_1_36
async def test_workload_and_podgroup_of_kubernetes(api: client.ApiClient, namespace: str) -> None:
    """(d) scheduling.k8s.io Workload and PodGroup are served (1.37: v1beta1; 1.36: v1alpha2),
    and pods keep spec.schedulingGroup (GenericWorkload is on)."""
    was = await WorkloadApi.of(api)
    rack = {"topology": [{"key": "network.topology.kubernetes.io/rack"}]}
    templates = [
        {"name": "driver", "schedulingPolicy": {"basic": {}}},
        {"name": "workers", "schedulingPolicy": {"gang": {"minCount": 4}}, "schedulingConstraints": rack},
    ]
    await was.create(api, namespace, "workloads", was.workload("training", templates))
    workload = await was.get(api, namespace, "workloads", "training")
    assert [t["name"] for t in workload["spec"]["podGroupTemplates"]] == ["driver", "workers"]
    group = was.podgroup(
        "training-workers", {"gang": {"minCount": 4}}, ("training", "workers"), schedulingConstraints=rack
    )
    await was.create(api, namespace, "podgroups", group)
    from_template = await was.get(api, namespace, "podgroups", "training-workers")
    assert from_template["spec"]["schedulingPolicy"]["gang"]["minCount"] == 4
    # TopologyAwareWorkloadScheduling is on, so the constraint is kept, not silently dropped.
    assert from_template["spec"]["schedulingConstraints"] == rack
    await was.create(api, namespace, "podgroups", was.podgroup("standalone", {"basic": {}}))
    core = client.CoreV1Api(api)
    pod = await core.create_namespaced_pod(
        namespace,
        {
            "metadata": {"name": "worker-0"},
            "spec": {
                "schedulingGroup": {"podGroupName": "training-workers"},
                "schedulingGates": [{"name": "example.com/hold"}],
                "containers": [{"name": "c", "image": "registry.k8s.io/pause:3.10"}],
            },
        },
    )
    assert pod.spec.scheduling_group.pod_group_name == "training-workers"
    with pytest.raises(ApiException) as invalid:
        await was.create(api, namespace, "podgroups", was.podgroup("bad", {"gang": {"minCount": 0}}))
    assert invalid.value.status == 422


@pytest.mark.late
async def test_nodes_stay_ready_90s_after_start(cluster: Instance, api: client.ApiClient) -> None:
    """(e) kwok's heartbeats (node Leases) keep every node Ready; no NotReady taints appear."""
    state = cluster.state()
    assert state is not None
    remaining = state.started_at + 95 - time.time()
    if remaining > 0:
        await asyncio.sleep(remaining)
    core = client.CoreV1Api(api)
    nodes = (await raw_json(core.list_node(_preload_content=False)))["items"]
    assert len(nodes) >= 22
    for node in nodes:
        name = node["metadata"]["name"]
        conditions = {c["type"]: c["status"] for c in node["status"]["conditions"]}
        assert conditions.get("Ready") == "True", (name, conditions)
        taints = {t["key"] for t in node["spec"].get("taints") or []}
        assert not taints & {"node.kubernetes.io/not-ready", "node.kubernetes.io/unreachable"}, name
    leases = client.CoordinationV1Api(api)
    now = datetime.now(UTC)
    for node in nodes:
        lease = await leases.read_namespaced_lease(node["metadata"]["name"], "kube-node-lease")
        age = (now - lease.spec.renew_time).total_seconds()
        assert age < lease.spec.lease_duration_seconds, (node["metadata"]["name"], age)
