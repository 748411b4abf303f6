"""LeaderWorkerSet with its Volcano gang provider (`gangSchedulingManagement.schedulerProvider:
volcano`) on the local control plane with quorum taking Volcano's dialect: the LeaderWorkerSet of
LWS's own sample, `docs/examples/sample/gang-scheduling/lws-sample-volcano.yaml`, as the CKS
customer applies it. LWS makes one scheduling.volcano.sh PodGroup per group (minMember: the
group's size) and puts the annotation scheduling.k8s.io/group-name on its pods, which ask for
`volcano`; quorum releases each group whole and keeps the PodGroup's phase as Volcano does."""

from __future__ import annotations

import copy
from typing import Any

import pytest
import yaml
from kubernetes_asyncio import client

from devcluster.cluster import Instance
from devcluster.controllers import LWS
from quorum.core.gangs import GangSource, gang_name
from tests.integration.test_explain import quorum
from tests.integration.test_gangs import GANGS, admitted, get, pods
from tests.integrations.helpers import VOLCANO_POD_GROUPS, apply, held_for_room, list_objects, nothing_left
from tests.kube import assert_no_overcommit, eventually

pytestmark = pytest.mark.cluster
JSON = dict[str, Any]
LEADER_WORKER_SETS = ("leaderworkerset.x-k8s.io", "v1", "leaderworkersets")
GROUP_ANNOTATION = "scheduling.k8s.io/group-name"


def vpg(group: str) -> str:
    return gang_name(GangSource.VOLCANO_POD_GROUP, group)


def sample(instance: Instance) -> JSON:
    """The LeaderWorkerSet of LWS's gang-scheduling sample, exactly as its repository writes it."""
    path = LWS.source(instance.binaries) / "docs/examples/sample/gang-scheduling/lws-sample-volcano.yaml"
    doc: JSON = yaml.safe_load(path.read_text())
    return doc


async def ready_replicas(api: client.ApiClient, namespace: str, name: str) -> int:
    lws = await get(api, LEADER_WORKER_SETS, namespace, name)
    return int(((lws or {}).get("status") or {}).get("readyReplicas") or 0)


async def test_each_group_of_a_leaderworkerset_is_released_whole(
    cluster: Instance, api: client.ApiClient, namespace: str
) -> None:
    lws = sample(cluster)
    name, replicas = str(lws["metadata"]["name"]), int(lws["spec"]["replicas"])
    size = lws["spec"]["leaderWorkerTemplate"]["size"]
    apply(cluster, namespace, lws)

    async def groups_running() -> list[JSON] | None:
        groups = await list_objects(api, VOLCANO_POD_GROUPS, namespace)
        running = [g for g in groups if (g.get("status") or {}).get("phase") == "Running"]
        return groups if len(running) == replicas else None

    groups = await eventually(groups_running, timeout=150, what=f"{replicas} Volcano PodGroups Running")
    for group in groups:
        assert group["spec"]["minMember"] == size
        gang = await get(api, GANGS, namespace, vpg(group["metadata"]["name"]))
        assert gang is not None and admitted(gang).get("status") == "True"
        assert len(gang["status"]["admission"]["placement"]) == size, "leader and workers in one decision"
    members = await pods(api, namespace, "")
    assert len(members) == replicas * size
    for pod in members:
        group_name = pod["metadata"]["annotations"][GROUP_ANNOTATION]
        assert pod["metadata"]["labels"]["quorum.dev/gang"] == vpg(group_name)
        assert pod["spec"]["schedulerName"] == "default-scheduler"
        assert pod["metadata"]["annotations"]["quorum.dev/requested-scheduler"] == "volcano"

    async def all_ready() -> bool:
        return await ready_replicas(api, namespace, name) == replicas

    await eventually(all_ready, timeout=120, what="the LeaderWorkerSet's groups ready")
    await assert_no_overcommit(api)

    # A member lost: LWS recreates its group (RecreateGroupOnPodRestart) and quorum admits it whole.
    worker = next(
        p for p in members if p["metadata"]["labels"].get("leaderworkerset.sigs.k8s.io/worker-index") == "1"
    )
    await client.CoreV1Api(api).delete_namespaced_pod(worker["metadata"]["name"], namespace)

    async def whole_again() -> bool:
        now = [p for p in await pods(api, namespace, "") if not p["metadata"].get("deletionTimestamp")]
        uids = {p["metadata"]["uid"] for p in now}
        running = [p for p in now if p["status"].get("phase") == "Running"]
        return worker["metadata"]["uid"] not in uids and len(running) == replicas * size

    await eventually(whole_again, timeout=150, what="the group made again and running")
    await eventually(all_ready, timeout=120, what="the LeaderWorkerSet ready again")

    await client.CustomObjectsApi(api).delete_namespaced_custom_object(
        *LEADER_WORKER_SETS[:2], namespace, LEADER_WORKER_SETS[2], name
    )
    await nothing_left(api, namespace)

    async def no_groups() -> bool:  # each is owned by its group's leader pod
        return not await list_objects(api, VOLCANO_POD_GROUPS, namespace)

    await eventually(no_groups, timeout=60, what="LWS's PodGroups gone with their leaders")


async def test_a_group_too_big_for_the_cluster_is_held_with_the_reason(
    cluster: Instance, api: client.ApiClient, namespace: str
) -> None:
    lws = copy.deepcopy(sample(cluster))
    lws["metadata"]["name"] = "too-big"
    lws["spec"]["replicas"] = 1
    template = lws["spec"]["leaderWorkerTemplate"]
    template["size"] = 100
    template["workerTemplate"]["spec"]["containers"][0]["resources"]["limits"]["nvidia.com/gpu"] = "8"
    apply(cluster, namespace, lws)

    async def one_group() -> list[JSON]:
        return await list_objects(api, VOLCANO_POD_GROUPS, namespace)

    (group,) = await eventually(one_group, timeout=120, what="LWS's Volcano PodGroup")
    gang = await held_for_room(api, namespace, vpg(group["metadata"]["name"]))
    written = await get(api, VOLCANO_POD_GROUPS, namespace, group["metadata"]["name"])
    assert written is not None and written["status"]["phase"] == "Pending"
    explained = quorum(
        "explain", "-n", namespace, gang["metadata"]["name"], kubeconfig=cluster.kubeconfig("customer")
    )
    assert "short by" in explained.stdout, explained.stdout + explained.stderr
