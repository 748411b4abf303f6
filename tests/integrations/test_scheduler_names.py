"""The one list of scheduler names, on the real control plane: this instance takes `volcano`
beside the defaults (chart value schedulers.volcano), so the apiserver's CEL, quorum-webhooks
and quorum-operator must all honour a name the defaults do not have. A Volcano gang whose name
quorum uses as written is admitted by the CEL; one whose name quorum must hash goes to the
webhook; the operator releases both; and a gang pod asking for a scheduler quorum does not take
is told so in an Event."""

from __future__ import annotations

from typing import Any

import pytest
from kubernetes_asyncio import client

from devcluster.cluster import Instance
from quorum.core.gangs import GangSource, gang_name
from tests.integration.test_gangs import get
from tests.integrations.helpers import apply, released
from tests.kube import eventually

pytestmark = pytest.mark.cluster
JSON = dict[str, Any]


def volcano_pod(name: str, group: str, scheduler: str = "volcano") -> JSON:
    return {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": name, "annotations": {"scheduling.k8s.io/group-name": group}},
        "spec": {
            "schedulerName": scheduler,
            "containers": [
                {
                    "name": "c",
                    "image": "registry.k8s.io/pause:3.10",
                    "resources": {"requests": {"cpu": "100m"}},
                }
            ],
        },
    }


def volcano_group(name: str, members: int) -> JSON:
    return {
        "apiVersion": "scheduling.volcano.sh/v1beta1",
        "kind": "PodGroup",
        "metadata": {"name": name},
        "spec": {"minMember": members, "queue": "research"},
    }


@pytest.mark.parametrize("group", ["plain", "odd.group"])  # CEL's gang name; one only the webhook hashes
async def test_a_name_beyond_the_defaults_is_taken_by_the_cel_the_webhook_and_the_operator(
    cluster: Instance, api: client.ApiClient, namespace: str, group: str
) -> None:
    apply(cluster, namespace, volcano_group(group, 2), volcano_pod("a", group), volcano_pod("b", group))
    gang = gang_name(GangSource.VOLCANO_POD_GROUP, group)
    assert (gang == f"vpg-{group}") == (group == "plain")
    found = await released(api, namespace, gang)
    assert len(found["status"]["admission"]["placement"]) == 2
    for name in ("a", "b"):
        pod = await client.CoreV1Api(api).read_namespaced_pod(name, namespace)
        assert pod.spec.scheduler_name == "default-scheduler"
        assert pod.metadata.annotations["quorum.dev/requested-scheduler"] == "volcano"
        assert pod.metadata.labels["quorum.dev/gang"] == gang

    async def phase() -> str | None:
        written = await get(api, ("scheduling.volcano.sh", "v1beta1", "podgroups"), namespace, group)
        value = ((written or {}).get("status") or {}).get("phase")
        return value if value in ("Inqueue", "Running") else None

    await eventually(phase, timeout=30, what="the Volcano PodGroup's phase as Volcano names it")

    async def not_enforced() -> list[Any] | None:
        listed = await client.CoreV1Api(api).list_namespaced_event(namespace)
        told = [e for e in listed.items if e.reason == "NotEnforced" and "queue 'research'" in e.message]
        return told or None

    await eventually(not_enforced, timeout=30, what="the NotEnforced Event naming the queue")


async def test_a_gang_pod_of_a_scheduler_quorum_does_not_take_is_told_so(
    cluster: Instance, api: client.ApiClient, namespace: str
) -> None:
    pod = volcano_pod("elsewhere", "g", scheduler="kai-scheduler")
    apply(cluster, namespace, pod)

    async def told() -> list[Any] | None:
        listed = await client.CoreV1Api(api).list_namespaced_event(
            namespace, field_selector="involvedObject.name=elsewhere"
        )
        return [e for e in listed.items if e.reason == "SchedulerNotQuorums"] or None

    (event, *_) = await eventually(told, timeout=60, what="the SchedulerNotQuorums Event on the pod")
    assert "'kai-scheduler'" in event.message and "schedulers.coschedulerNames" in event.message
    left = await client.CoreV1Api(api).read_namespaced_pod("elsewhere", namespace)
    assert not left.spec.scheduling_gates and left.spec.scheduler_name == "kai-scheduler", "left alone"
