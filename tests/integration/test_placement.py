"""`placement: kube-scheduler` on the real control plane (Kubernetes 1.37, Workload Aware Scheduling
served; docs/placement.md): gang pods are created naming a Kubernetes PodGroup instead of held at
quorum's gate, quorum's operator makes that PodGroup for a gang of another dialect, and
kube-scheduler's gang cycle places the gang whole or not at all, while quorum's Gang says why it
waits in kube-scheduler's words. Each way of admitting pods is an instance of its own."""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import Any

import pytest
from kubernetes_asyncio import client
from kubernetes_asyncio.client.exceptions import ApiException

from devcluster.cluster import Instance
from devcluster.nodes import TestPool
from quorum.commands.explain import diagnose
from quorum.core.gangs import GATE
from tests.kube import WorkloadApi, api_client, create_namespace, create_pool_nodes, eventually

pytestmark = pytest.mark.cluster

NAMESPACE = "work"
JSON = dict[str, Any]


def label_gang_pod(
    name: str, gang: str, size: int, pool: TestPool, extra: dict[str, Any] | None = None
) -> JSON:
    return {
        "metadata": {
            "name": name,
            "labels": {
                "pod-group.scheduling.sigs.k8s.io/name": gang,
                "pod-group.scheduling.sigs.k8s.io/min-available": str(size),
            },
        },
        "spec": {
            "containers": [
                {
                    "name": "c",
                    "image": "registry.k8s.io/pause:3.10",
                    "resources": {"limits": {"nvidia.com/gpu": "8"}},
                }
            ],
            **pool.pod_spec(),
            **(extra or {}),
        },
    }


async def gang_pods(api: client.ApiClient, gang: str) -> list[JSON]:
    listed = await client.CoreV1Api(api).list_namespaced_pod(
        NAMESPACE, label_selector=f"quorum.dev/gang={gang}"
    )
    return [api.sanitize_for_serialization(p) for p in listed.items]


async def gang_condition(custom: client.CustomObjectsApi, gang: str, kind: str) -> JSON:
    try:
        found = await custom.get_namespaced_custom_object("quorum.dev", "v1alpha1", NAMESPACE, "gangs", gang)
    except ApiException as err:
        if err.status == 404:
            return {}
        raise
    conditions = (found.get("status") or {}).get("conditions") or []
    return next((c for c in conditions if c["type"] == kind), {})


@pytest.mark.parametrize("pod_admission", ["policies", "webhooks"])
async def test_kube_scheduler_places_a_label_gang_whole_as_the_pod_group_quorum_makes(
    start_instance: Callable[..., Instance], pod_admission: str
) -> None:
    instance = start_instance(
        f"t-placed-{pod_admission}", placement="kube-scheduler", pod_admission=pod_admission
    )
    api = await api_client(instance.kubeconfig("admin"))
    platform = await api_client(instance.kubeconfig("platform"))
    customer = await api_client(instance.kubeconfig("customer"))
    async with api, platform, customer:
        pool = TestPool("tp-placed", 3)
        await create_pool_nodes(platform, pool)
        await create_namespace(api, NAMESPACE)
        core, custom = client.CoreV1Api(customer), client.CustomObjectsApi(customer)

        # The platform's own policies are the same in this way: a CPU pod gets the CPU toleration.
        cpu = await core.create_namespaced_pod(
            NAMESPACE,
            {
                "metadata": {"name": "cpu"},
                "spec": {"containers": [{"name": "c", "image": "registry.k8s.io/pause:3.10"}]},
            },
            dry_run="All",
        )
        assert any(t.key == "is_cpu_compute" and t.effect == "NoSchedule" for t in cpu.spec.tolerations or [])

        # Three pods of 8 GPUs on three 8-GPU nodes: created without quorum's gate, naming the
        # PodGroup lbl-fits, which the operator makes; kube-scheduler binds all three.
        for i in range(3):
            made = await core.create_namespaced_pod(NAMESPACE, label_gang_pod(f"fits-{i}", "fits", 3, pool))
            assert GATE not in [g.name for g in made.spec.scheduling_gates or []]
            assert made.spec.scheduling_group.pod_group_name == "lbl-fits"
            assert made.metadata.labels["quorum.dev/gang"] == "lbl-fits"

        async def pod_group() -> JSON | None:
            try:
                found: JSON = await custom.get_namespaced_custom_object(
                    "scheduling.k8s.io", "v1beta1", NAMESPACE, "podgroups", "lbl-fits"
                )
            except ApiException as err:
                if err.status == 404:
                    return None
                raise
            return found

        group = await eventually(pod_group, timeout=30, what="the PodGroup quorum makes for gang lbl-fits")
        assert group["spec"]["schedulingPolicy"] == {"gang": {"minCount": 3}}
        assert group["metadata"]["labels"]["app.kubernetes.io/managed-by"] == "quorum"
        (owner,) = group["metadata"]["ownerReferences"]
        assert (owner["kind"], owner["name"]) == ("Gang", "lbl-fits")
        # The tenant lowers its minCount (a gang of one, placed pod by pod): quorum sets it back.
        await custom.patch_namespaced_custom_object(
            "scheduling.k8s.io",
            "v1beta1",
            NAMESPACE,
            "podgroups",
            "lbl-fits",
            {"spec": {"schedulingPolicy": {"gang": {"minCount": 1}}}},
            _content_type="application/merge-patch+json",  # type: ignore[call-arg]
        )

        async def restored() -> bool:
            found = await pod_group()
            return found is not None and found["spec"]["schedulingPolicy"] == {"gang": {"minCount": 3}}

        await eventually(restored, timeout=30, what="the PodGroup's minCount set back to the gang's")

        async def all_bound(gang: str, count: int) -> list[JSON] | None:
            pods = await gang_pods(customer, gang)
            return pods if len(pods) == count and all(p["spec"].get("nodeName") for p in pods) else None

        bound = await eventually(lambda: all_bound("lbl-fits", 3), timeout=60, what="gang lbl-fits bound")
        assert len({p["spec"]["nodeName"] for p in bound}) == 3

        async def admitted(gang: str) -> JSON | None:
            condition = await gang_condition(custom, gang, "Admitted")
            return condition if condition.get("status") == "True" else None

        await eventually(lambda: admitted("lbl-fits"), timeout=30, what="Gang lbl-fits Admitted")

        # Two more while the pool is full: kube-scheduler binds neither, and the Gang says why
        # in kube-scheduler's words once kube-scheduler has tried them.
        for i in range(2):
            await core.create_namespaced_pod(NAMESPACE, label_gang_pod(f"waits-{i}", "waits", 2, pool))

        async def held() -> JSON | None:
            condition = await gang_condition(custom, "lbl-waits", "Unschedulable")
            return condition if condition.get("status") == "True" else None

        told = await eventually(held, timeout=60, what="Gang lbl-waits Unschedulable, from kube-scheduler")
        assert told["message"].startswith("kube-scheduler: "), told
        assert not [p for p in await gang_pods(customer, "lbl-waits") if p["spec"].get("nodeName")]
        admission = await gang_condition(custom, "lbl-waits", "Admitted")
        assert admission["status"] == "False", admission
        # `quorum explain` replays the pass: the same hold, in kube-scheduler's words.
        diagnosis = await diagnose(customer, NAMESPACE, "lbl-waits", time.time())
        assert diagnosis.reason == "Unschedulable" and diagnosis.message.startswith("kube-scheduler: "), (
            diagnosis
        )

        # Room for both: they bind together.
        for i in range(3):
            await core.delete_namespaced_pod(f"fits-{i}", NAMESPACE, grace_period_seconds=0)
        await eventually(
            lambda: all_bound("lbl-waits", 2), timeout=90, what="gang lbl-waits bound once room frees"
        )
        await eventually(lambda: admitted("lbl-waits"), timeout=30, what="Gang lbl-waits Admitted")

        # A member lost and made again (member-loss policy Replace): kube-scheduler places the
        # replacement alone, the bound member counting toward minCount; quorum deletes nothing.
        await core.delete_namespaced_pod("waits-0", NAMESPACE, grace_period_seconds=0)
        await core.create_namespaced_pod(NAMESPACE, label_gang_pod("waits-2", "waits", 2, pool))
        bound = await eventually(lambda: all_bound("lbl-waits", 2), timeout=60, what="the replacement bound")
        assert sorted(p["metadata"]["name"] for p in bound) == ["waits-1", "waits-2"]

        # A Workload Aware Scheduling gang names its own PodGroup: no gate, kube-scheduler binds it.
        was = await WorkloadApi.of(customer)
        await was.create(customer, NAMESPACE, "podgroups", was.podgroup("native", {"gang": {"minCount": 1}}))
        native = label_gang_pod("native-0", "x", 1, pool, {"schedulingGroup": {"podGroupName": "native"}})
        native["metadata"]["labels"] = {}
        made = await core.create_namespaced_pod(NAMESPACE, native)
        assert GATE not in [g.name for g in made.spec.scheduling_gates or []]
        assert made.metadata.labels["quorum.dev/gang"] == "wpg-native"
        await eventually(lambda: all_bound("wpg-native", 1), timeout=60, what="gang wpg-native bound")
        await eventually(lambda: admitted("wpg-native"), timeout=30, what="Gang wpg-native Admitted")

        # A gang pod may name no other scheduling group: kube-scheduler would place it as that one.
        with pytest.raises(ApiException) as refused:
            await core.create_namespaced_pod(
                NAMESPACE,
                label_gang_pod("elsewhere", "fits", 3, pool, {"schedulingGroup": {"podGroupName": "other"}}),
                dry_run="All",
            )
        assert refused.value.status in (400, 403, 422)
        assert "sets spec.schedulingGroup.podGroupName='other'" in str(refused.value.body)
