"""Kubeflow Trainer v2 (with JobSet) on the local control plane with quorum. Its runtime
`torch-distributed` (manifests/base/runtimes/torch_distributed.yaml of its module) with a gang
policy, as Trainer's job-scheduling guides write it: `podGroupPolicy.coscheduling` and the pods'
schedulerName scheduler-plugins-scheduler (a scheduling.x-k8s.io PodGroup), or
`podGroupPolicy.volcano` and schedulerName volcano (a Volcano PodGroup and the group annotation).
A TrainJob of 2 nodes, as the CKS customer applies it, is released whole and runs to Complete."""

from __future__ import annotations

from typing import Any

import pytest
import yaml
from kubernetes_asyncio import client

from devcluster.cluster import Instance
from devcluster.controllers import TRAINER
from quorum.core.gangs import GangSource, gang_name
from tests.integration.test_gangs import admitted, get, pods
from tests.integrations.helpers import apply, condition_true, held_for_room, nothing_left, released
from tests.kube import assert_no_overcommit, eventually

pytestmark = pytest.mark.cluster
JSON = dict[str, Any]
TRAIN_JOBS = ("trainer.kubeflow.org", "v1alpha1", "trainjobs")
RUNTIMES = ("trainer.kubeflow.org", "v1alpha1", "clustertrainingruntimes")
POLICIES = {
    "coscheduling": ({"coscheduling": {"scheduleTimeoutSeconds": 30}}, "scheduler-plugins-scheduler"),
    "volcano": ({"volcano": {}}, "volcano"),
}


def runtime(instance: Instance, way: str) -> JSON:
    """Trainer's torch-distributed runtime with the gang policy of `way` (a runtime of its own name)."""
    path = TRAINER.source(instance.binaries) / "manifests/base/runtimes/torch_distributed.yaml"
    doc: JSON = yaml.safe_load(path.read_text())
    policy, scheduler = POLICIES[way]
    doc["metadata"]["name"] = f"torch-distributed-{way}"
    doc["spec"]["podGroupPolicy"] = policy
    for job in doc["spec"]["template"]["spec"]["replicatedJobs"]:
        job["template"]["spec"]["template"]["spec"]["schedulerName"] = scheduler
    return doc


def train_job(name: str, runtime_name: str, nodes: int, gpus: int) -> JSON:
    return {
        "apiVersion": "trainer.kubeflow.org/v1alpha1",
        "kind": "TrainJob",
        "metadata": {"name": name},
        "spec": {
            "runtimeRef": {"name": runtime_name},
            "trainer": {"numNodes": nodes, "resourcesPerNode": {"limits": {"nvidia.com/gpu": gpus}}},
        },
    }


@pytest.mark.parametrize("way", list(POLICIES))
async def test_a_trainjob_is_released_whole(
    cluster: Instance, api: client.ApiClient, namespace: str, way: str
) -> None:
    made = runtime(cluster, way)
    apply(cluster, None, made)
    name = f"gang-{way}"
    apply(cluster, namespace, train_job(name, made["metadata"]["name"], 2, 1))
    source = GangSource.X_POD_GROUP if way == "coscheduling" else GangSource.VOLCANO_POD_GROUP

    gang = await released(api, namespace, gang_name(source, name), timeout=150)
    assert len(gang["status"]["admission"]["placement"]) == 2, "both nodes in one decision"
    members = await pods(api, namespace, "")
    assert {p["metadata"]["annotations"]["quorum.dev/requested-scheduler"] for p in members} == {
        POLICIES[way][1]
    }

    # kwok runs a Job's pods to completion at once (the runtime's CRD keeps no pod annotations to
    # say otherwise): the TrainJob completes only if its pods were bound and ran.
    async def complete() -> bool:
        return condition_true(await get(api, TRAIN_JOBS, namespace, name), "Complete")

    await eventually(complete, timeout=120, what="the TrainJob Complete")
    await assert_no_overcommit(api)
    await client.CustomObjectsApi(api).delete_namespaced_custom_object(
        *TRAIN_JOBS[:2], namespace, TRAIN_JOBS[2], name
    )

    await nothing_left(api, namespace)


async def test_a_trainjob_too_big_for_the_cluster_is_held(
    cluster: Instance, api: client.ApiClient, namespace: str
) -> None:
    made = runtime(cluster, "coscheduling")
    apply(cluster, None, made)
    apply(cluster, namespace, train_job("too-big", made["metadata"]["name"], 64, 8))

    gang = await held_for_room(api, namespace, "xpg-too-big", timeout=150)
    assert "nvidia.com/gpu" in admitted(gang)["message"]
