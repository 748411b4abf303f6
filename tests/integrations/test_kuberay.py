"""KubeRay (ray-operator, its scheduler-plugins integration) on the local control plane with
quorum: the RayCluster of KubeRay's own sample, `config/samples/ray-cluster.scheduler-plugins.yaml`,
as the CKS customer applies it. KubeRay makes a scheduling.x-k8s.io PodGroup named after the
RayCluster (minMember: workers + head) and pods labelled with it that ask for
scheduler-plugins-scheduler; quorum takes that name, holds the pods and releases them whole."""

from __future__ import annotations

import copy
from typing import Any

import pytest
import yaml
from kubernetes_asyncio import client

from devcluster.cluster import Instance
from devcluster.controllers import KUBERAY
from tests.integration.test_explain import quorum
from tests.integration.test_gangs import admitted, get, pods
from tests.integrations.helpers import X_POD_GROUPS, apply, held_for_room, nothing_left, released
from tests.kube import assert_no_overcommit, eventually

pytestmark = pytest.mark.cluster
JSON = dict[str, Any]
RAY = ("ray.io", "v1", "rayclusters")


def sample(instance: Instance) -> JSON:
    """The RayCluster of KubeRay's sample, exactly as its repository writes it."""
    path = KUBERAY.source(instance.binaries) / "config/samples/ray-cluster.scheduler-plugins.yaml"
    doc: JSON = yaml.safe_load(path.read_text())
    return doc


async def ready(api: client.ApiClient, namespace: str, name: str) -> bool:
    cluster = await get(api, RAY, namespace, name)
    return bool(((cluster or {}).get("status") or {}).get("state") == "ready")


async def test_a_raycluster_is_released_whole_and_gets_ready(
    cluster: Instance, api: client.ApiClient, namespace: str
) -> None:
    raycluster = sample(cluster)
    name = raycluster["metadata"]["name"]
    apply(cluster, namespace, raycluster)

    gang = await released(api, namespace, f"xpg-{name}")
    assert len(gang["status"]["admission"]["placement"]) == 3, "head and both workers in one decision"
    await eventually(lambda: ready(api, namespace, name), timeout=120, what="the RayCluster's state ready")
    members = await pods(api, namespace, "")
    assert len(members) == 3
    for pod in members:
        assert pod["spec"]["schedulerName"] == "default-scheduler"
        assert (
            pod["metadata"]["annotations"]["quorum.dev/requested-scheduler"] == "scheduler-plugins-scheduler"
        )
        assert pod["metadata"]["labels"]["quorum.dev/gang"] == f"xpg-{name}"

    async def group_running() -> JSON | None:
        group = await get(api, X_POD_GROUPS, namespace, name)
        return group if ((group or {}).get("status") or {}).get("phase") == "Running" else None

    group = await eventually(group_running, timeout=30, what="the PodGroup's phase Running")
    assert group["spec"]["minMember"] == 3 and group["status"]["running"] == 3
    await assert_no_overcommit(api)

    # A member lost: KubeRay makes the worker again, and quorum releases the replacement alone.
    worker = next(p for p in members if p["metadata"]["labels"].get("ray.io/node-type") == "worker")
    await client.CoreV1Api(api).delete_namespaced_pod(worker["metadata"]["name"], namespace)

    async def replaced() -> bool:
        now = [p for p in await pods(api, namespace, "") if not p["metadata"].get("deletionTimestamp")]
        running = [p for p in now if p["status"].get("phase") == "Running"]
        return worker["metadata"]["uid"] not in {p["metadata"]["uid"] for p in now} and len(running) == 3

    await eventually(replaced, timeout=120, what="KubeRay's new worker released and running")
    await eventually(lambda: ready(api, namespace, name), timeout=120, what="the RayCluster ready again")

    await client.CustomObjectsApi(api).delete_namespaced_custom_object(*RAY[:2], namespace, RAY[2], name)
    await nothing_left(api, namespace, (*X_POD_GROUPS, name))


async def test_a_raycluster_too_big_for_the_cluster_is_held_with_the_reason(
    cluster: Instance, api: client.ApiClient, namespace: str
) -> None:
    """The sample with 200 workers of 8 GPUs each: more than the cluster has. Nothing binds, and
    the Gang and `quorum explain` (as the customer runs it) say why."""
    raycluster = copy.deepcopy(sample(cluster))
    raycluster["metadata"]["name"] = "too-big"
    workers = raycluster["spec"]["workerGroupSpecs"][0]
    workers["replicas"] = workers["minReplicas"] = workers["maxReplicas"] = 200
    workers["template"]["spec"]["containers"][0]["resources"]["limits"]["nvidia.com/gpu"] = "8"
    apply(cluster, namespace, raycluster)

    gang = await held_for_room(api, namespace, "xpg-too-big")
    # KubeRay writes the PodGroup's minResources: 200 workers x 8 GPUs (the head asks for none).
    assert "minResources not free: needs 1600 nvidia.com/gpu" in admitted(gang)["message"]
    explained = quorum("explain", "-n", namespace, "xpg-too-big", kubeconfig=cluster.kubeconfig("customer"))
    assert "1600 nvidia.com/gpu" in explained.stdout, explained.stdout + explained.stderr
