"""The MPI Operator (v2, `--gang-scheduling=scheduler-plugins-scheduler`) on the local control
plane with quorum: the MPIJob of its own example, `examples/v2beta1/pi/pi.yaml`, as the CKS
customer applies it. The operator makes a scheduling.x-k8s.io PodGroup named after the MPIJob
(minMember: workers + launcher) and sets schedulerName scheduler-plugins-scheduler on the
launcher's and workers' pods; quorum takes that name and releases the three whole."""

from __future__ import annotations

import copy
from typing import Any

import pytest
import yaml
from kubernetes_asyncio import client

from devcluster.cluster import Instance
from devcluster.controllers import MPI_OPERATOR
from tests.integration.test_explain import quorum
from tests.integration.test_gangs import admitted, get, pods
from tests.integrations.helpers import (
    KWOK_RUNS_FOR,
    X_POD_GROUPS,
    apply,
    condition_true,
    held_for_room,
    nothing_left,
    released,
)
from tests.kube import assert_no_overcommit, eventually

pytestmark = pytest.mark.cluster
JSON = dict[str, Any]
MPI_JOBS = ("kubeflow.org", "v2beta1", "mpijobs")


def sample(instance: Instance) -> JSON:
    """The MPIJob of the MPI Operator's pi example, exactly as its repository writes it, but for
    kwok's annotation that keeps the launcher running (kwok ends a Job's pod at once, and the
    MPIJob with it)."""
    path = MPI_OPERATOR.source(instance.binaries) / "examples/v2beta1/pi/pi.yaml"
    doc: JSON = yaml.safe_load(path.read_text())
    launcher = doc["spec"]["mpiReplicaSpecs"]["Launcher"]["template"]
    launcher.setdefault("metadata", {}).setdefault("annotations", {})[KWOK_RUNS_FOR] = "600s"
    return doc


async def test_an_mpijob_is_released_whole_and_runs(
    cluster: Instance, api: client.ApiClient, namespace: str
) -> None:
    mpijob = sample(cluster)
    name = mpijob["metadata"]["name"]
    apply(cluster, namespace, mpijob)

    gang = await released(api, namespace, f"xpg-{name}")
    assert len(gang["status"]["admission"]["placement"]) == 3, "the launcher and both workers in one decision"
    group = await get(api, X_POD_GROUPS, namespace, name)
    assert group is not None and group["spec"]["minMember"] == 3

    async def running() -> bool:
        return condition_true(await get(api, MPI_JOBS, namespace, name), "Running")

    await eventually(running, timeout=120, what="the MPIJob Running")
    members = await pods(api, namespace, "")
    assert len(members) == 3
    for pod in members:
        assert (
            pod["metadata"]["annotations"]["quorum.dev/requested-scheduler"] == "scheduler-plugins-scheduler"
        )
    await assert_no_overcommit(api)

    # A worker lost: the operator makes it again, and quorum releases it alone.
    worker = next(p for p in members if p["metadata"]["name"] == f"{name}-worker-0")
    await client.CoreV1Api(api).delete_namespaced_pod(worker["metadata"]["name"], namespace)

    async def replaced() -> bool:
        now = [p for p in await pods(api, namespace, "") if not p["metadata"].get("deletionTimestamp")]
        running = [p for p in now if p["status"].get("phase") == "Running"]
        return worker["metadata"]["uid"] not in {p["metadata"]["uid"] for p in now} and len(running) == 3

    await eventually(replaced, timeout=120, what="the worker made again and running")

    await client.CustomObjectsApi(api).delete_namespaced_custom_object(
        *MPI_JOBS[:2], namespace, MPI_JOBS[2], name
    )
    await nothing_left(api, namespace, (*X_POD_GROUPS, name))


async def test_an_mpijob_too_big_for_the_cluster_is_held_with_the_reason(
    cluster: Instance, api: client.ApiClient, namespace: str
) -> None:
    mpijob = copy.deepcopy(sample(cluster))
    mpijob["metadata"]["name"] = "too-big"
    workers = mpijob["spec"]["mpiReplicaSpecs"]["Worker"]
    workers["replicas"] = 64
    workers["template"]["spec"]["containers"][0]["resources"]["limits"]["nvidia.com/gpu"] = 8
    apply(cluster, namespace, mpijob)

    gang = await held_for_room(api, namespace, "xpg-too-big")
    assert "nvidia.com/gpu" in admitted(gang)["message"]
    explained = quorum("explain", "-n", namespace, "xpg-too-big", kubeconfig=cluster.kubeconfig("customer"))
    assert "nvidia.com/gpu" in explained.stdout, explained.stdout + explained.stderr
