"""Kueue in front of quorum (docs/integrations.md, "Kueue for quota"): Kueue admits a gang within
its ClusterQueue's quota by removing its own gate; quorum then places it all or nothing. Real
Kueue (devcluster/kueue.py builds it from its Go module), its pod integration, plain-pod groups
as its documentation writes them: the label `kueue.x-k8s.io/queue-name`, the label
`kueue.x-k8s.io/pod-group-name` and the annotation `kueue.x-k8s.io/pod-group-total-count`, and
nothing of quorum's: quorum reads Kueue's group as gang `kpg-<name>`, sized by the annotation."""

from __future__ import annotations

import json
from collections.abc import Callable, Iterator
from typing import Any

import pytest
from kubernetes_asyncio import client

from devcluster.cluster import Instance
from devcluster.kueue import (
    ADMISSION_GATE,
    POD_GROUP_COUNT,
    POD_GROUP_LABEL,
    QUEUE,
    QUEUE_LABEL,
    ensure_kueue,
    local_queue,
    start_kueue,
    stop_kueue,
)
from devcluster.nodes import TestPool
from tests.integration.test_gangs import GANGS, admitted, get, pods
from tests.integrations.helpers import apply, whole_node_spec
from tests.kube import assert_no_overcommit, eventually

pytestmark = pytest.mark.cluster
JSON = dict[str, Any]
POOL = 3  # nodes of 8 GPUs; the ClusterQueue's GPU quota is all of them, 24


@pytest.fixture(scope="module")
def kueue(cluster: Instance) -> Iterator[None]:
    quota = {"cpu": "1000", "memory": "10Ti", "nvidia.com/gpu": str(8 * POOL)}
    record = start_kueue(cluster, ensure_kueue(cluster.binaries), quota)
    try:
        yield
    finally:
        stop_kueue(cluster, record)


def member(pool: TestPool, group: str, i: int, size: int) -> JSON:
    """A pod of a Kueue plain-pod group of `size`, as Kueue's documentation writes it."""
    return {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {
            "name": f"{group}-{i}",
            "labels": {
                QUEUE_LABEL: QUEUE,
                POD_GROUP_LABEL: group,
            },
            "annotations": {POD_GROUP_COUNT: str(size)},
        },
        "spec": whole_node_spec(pool),
    }


async def gang_says(api: client.ApiClient, namespace: str, gang: str, reason: str, text: str) -> JSON:
    async def probe() -> JSON | None:
        found = await get(api, GANGS, namespace, gang)
        condition = admitted(found)
        return found if condition.get("reason") == reason and text in condition.get("message", "") else None

    return await eventually(probe, timeout=90, what=f"gang {gang}: {reason}, saying {text!r}")


async def test_kueue_admits_within_quota_and_quorum_places_whole_or_holds_with_the_reason(
    cluster: Instance, kueue: None, api: client.ApiClient, namespace: str, test_pool: Callable[..., Any]
) -> None:
    """A pool of 3 nodes, one taken by a pod outside Kueue; a GPU quota of 24. Gang a (2 pods)
    is admitted by Kueue and placed whole by quorum. Gang b (1 pod) is admitted by Kueue (quota
    left: 8) but has no room: quorum holds it, saying so. Gang c (1 pod) is over the quota: it
    waits in Kueue, and quorum's Gang says it waits for Kueue, not for room."""
    pool: TestPool = await test_pool(count=POOL)
    apply(cluster, namespace, local_queue(namespace))
    blocker = member(pool, "blocker", 0, 1)
    for key in (QUEUE_LABEL, POD_GROUP_LABEL):
        blocker["metadata"]["labels"].pop(key)
    blocker["metadata"]["annotations"] = {}
    apply(cluster, namespace, blocker)
    core = client.CoreV1Api(api)

    async def blocker_bound() -> bool:
        return bool((await core.read_namespaced_pod("blocker-0", namespace)).spec.node_name)

    await eventually(blocker_bound, timeout=60, what="the pod outside Kueue bound")

    apply(cluster, namespace, *(member(pool, "a", i, 2) for i in range(2)))

    async def a_running() -> list[JSON] | None:
        found = await pods(api, namespace, f"{POD_GROUP_LABEL}=a")
        return found if len(found) == 2 and all(p["spec"].get("nodeName") for p in found) else None

    placed = await eventually(a_running, timeout=90, what="gang a admitted by Kueue and placed whole")
    assert len({p["spec"]["nodeName"] for p in placed}) == 2
    record = await get(api, GANGS, namespace, "kpg-a")
    assert record is not None, "no Gang kpg-a"
    assert record["spec"]["source"] == {"kind": "KueuePodGroup", "name": "a"}, record["spec"]
    assert record["spec"]["minMember"] == 2, "sized by Kueue's total-count annotation"

    apply(cluster, namespace, member(pool, "b", 0, 1))
    held = await gang_says(api, namespace, "kpg-b", "Unschedulable", "needs 1 pods placed together")
    (b,) = await pods(api, namespace, f"{POD_GROUP_LABEL}=b")
    gates = [g["name"] for g in b["spec"].get("schedulingGates") or []]
    assert ADMISSION_GATE not in gates and "quorum.dev/gang" in gates, gates
    assert "Kueue" not in admitted(held)["message"], "admitted by Kueue: it waits for room"

    apply(cluster, namespace, member(pool, "c", 0, 1))
    waiting = await gang_says(
        api, namespace, "kpg-c", "WaitingForOtherGates", "waiting for Kueue to admit it"
    )
    assert "quota, not room" in admitted(waiting)["message"]
    (c,) = await pods(api, namespace, f"{POD_GROUP_LABEL}=c")
    assert {ADMISSION_GATE, "quorum.dev/gang"} <= {g["name"] for g in c["spec"]["schedulingGates"]}
    await assert_no_overcommit(api)

    # Room returns: gang b is placed; c still waits for Kueue (its quota is b's and a's).
    await core.delete_namespaced_pod("blocker-0", namespace, grace_period_seconds=0)

    async def b_bound() -> bool:
        (found,) = await pods(api, namespace, f"{POD_GROUP_LABEL}=b")
        return bool(found["spec"].get("nodeName"))

    await eventually(b_bound, timeout=90, what="gang b placed once room returned")
    (c,) = await pods(api, namespace, f"{POD_GROUP_LABEL}=c")
    assert ADMISSION_GATE in {g["name"] for g in c["spec"]["schedulingGates"]}, "still over the quota"


async def test_a_kueue_pod_group_whose_total_count_is_not_a_size_is_refused_with_the_reason(
    cluster: Instance, kueue: None, namespace: str, test_pool: Callable[..., Any]
) -> None:
    """A tenant's pod of a Kueue group whose total-count annotation says "two": refused at
    creation by quorum's policies, saying what to write (its gang could never form)."""
    pool: TestPool = await test_pool(count=1)
    apply(cluster, namespace, local_queue(namespace))
    bad = member(pool, "bad", 0, 2)
    bad["metadata"]["annotations"][POD_GROUP_COUNT] = "two"
    listed = json.dumps({"apiVersion": "v1", "kind": "List", "items": [bad]})
    refused = cluster.kubectl(
        "-n", namespace, "apply", "-f", "-", input_text=listed, who="customer", check=False
    )
    assert refused.returncode != 0, "created"
    assert "Kueue pod group bad (gang kpg-bad)" in refused.stderr, refused.stderr
    assert f"annotation {POD_GROUP_COUNT} is 'two'" in refused.stderr, refused.stderr
    assert 'write "4" for a gang of four pods' in refused.stderr, refused.stderr
