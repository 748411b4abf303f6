"""A leader killed in the middle of a release of a gang with placement above minMember, and a
node of its unreleased pods cordoned before the next leader starts: the pods already running
stay, the rest are planned anew (docs/lifecycle.md, "When quorum removes a pod")."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import pytest
from kubernetes_asyncio import client

from devcluster.cluster import Instance
from tests.integration.test_operator_crash import gated
from tests.kube import (
    api_client,
    assert_no_overcommit,
    create_namespace,
    create_podgroup,
    eventually,
    kill_after,
)

pytestmark = pytest.mark.cluster

PODS = 6  # a kill a release or two late still cuts the release off
MIN_MEMBER = 2


async def test_a_new_leader_keeps_the_running_pods_and_plans_the_cut_off_rest_anew(
    start_instance: Callable[..., Instance], monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("QUORUM_OPERATOR_RELEASE_CONCURRENCY", "1")  # one by one
    monkeypatch.setenv("QUORUM_OPERATOR_LEASE_SECONDS", "3")
    instance = start_instance("t-failover")
    api = await api_client(instance.kubeconfig("admin"))
    async with api:
        core, custom = client.CoreV1Api(api), client.CustomObjectsApi(api)
        await create_namespace(api, "failover")
        await client.AppsV1Api(api).create_namespaced_deployment(
            "failover",
            {
                "metadata": {"name": "train"},
                "spec": {
                    "replicas": PODS,
                    "selector": {"matchLabels": {"app": "train"}},
                    "template": {
                        "metadata": {"labels": {"app": "train", "pod-group.scheduling.sigs.k8s.io": "train"}},
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

        async def all_there() -> bool:  # the group comes last: one plan places all its pods
            found = (await core.list_namespaced_pod("failover", label_selector="app=train")).items
            return len(found) == PODS

        await eventually(all_there, timeout=60, what="the pods, waiting for their PodGroup")
        await create_podgroup(api, "failover", "train", MIN_MEMBER)

        async def released() -> int:
            found = (await core.list_namespaced_pod("failover", label_selector="app=train")).items
            return sum(1 for p in found if not gated(p))

        at_kill = await kill_after(instance, "quorum-operator", released, MIN_MEMBER, timeout=90)
        assert at_kill < PODS, "killed in the middle of the release"

        async def released_running() -> list[Any] | None:
            found = (await core.list_namespaced_pod("failover", label_selector="app=train")).items
            running = [p for p in found if p.status.phase == "Running"]
            return running if len(running) == at_kill else None

        running = await eventually(released_running, timeout=60, what="the released pods running")
        gang = await custom.get_namespaced_custom_object(
            "quorum.dev", "v1alpha1", "failover", "gangs", "pg-train"
        )
        recorded = {e["uid"]: e["node"] for e in gang["status"]["admission"]["placement"]}
        pods = (await core.list_namespaced_pod("failover", label_selector="app=train")).items
        cut_off = [p for p in pods if gated(p) and p.metadata.uid in recorded]
        assert cut_off, "some recorded pods were never released"
        cordoned = recorded[cut_off[0].metadata.uid]
        await core.patch_node(cordoned, {"spec": {"unschedulable": True}})
        try:
            instance.start_component("quorum-operator")

            async def all_running() -> list[Any] | None:
                found = (await core.list_namespaced_pod("failover", label_selector="app=train")).items
                ok = len(found) == PODS and all(p.status.phase == "Running" and not gated(p) for p in found)
                return found if ok else None

            done = await eventually(all_running, timeout=90, what="the whole gang Running after the failover")
            uids = {p.metadata.uid for p in done}
            assert {p.metadata.uid for p in running} <= uids, "the running pods were kept"
            assert all(
                p.spec.node_name != cordoned for p in done if p.metadata.uid == cut_off[0].metadata.uid
            )
            reasons = {
                e.reason
                for e in (await core.list_namespaced_event("failover")).items
                if e.involved_object.name == "pg-train"
            }
            assert not reasons & {"PartiallyPlaced", "GangRestarted"}, reasons
            await assert_no_overcommit(api)
        finally:
            await core.patch_node(cordoned, {"spec": {"unschedulable": False}})
