"""quorum installed into another namespace (`quorum manifests --namespace gpu-admission`) works
as in quorum-system: the webhooks gate a gang, the operator (its identity now
system:serviceaccount:gpu-admission:quorum-operator) releases it past the gate protection, and
nothing lands in quorum-system."""

from __future__ import annotations

from collections.abc import Callable

import pytest
from kubernetes_asyncio import client
from kubernetes_asyncio.client.exceptions import ApiException

from devcluster.cluster import Instance
from quorum.install import DEFAULT_NAMESPACE
from tests.integration.test_gangs import deployment, gated, pods
from tests.integration.test_webhooks import _remove_gate as remove_gate
from tests.kube import api_client, create_namespace, create_podgroup, eventually

pytestmark = pytest.mark.cluster

NAMESPACE = "gpu-admission"


async def test_a_gang_runs_with_quorum_installed_in_another_namespace(
    start_instance: Callable[..., Instance],
) -> None:
    instance = start_instance("t-elsewhere", namespace=NAMESPACE)
    api = await api_client(instance.kubeconfig("admin"))
    async with api:
        core = client.CoreV1Api(api)
        await create_namespace(api, "team")
        await create_podgroup(api, "team", "held", 3)
        await client.AppsV1Api(api).create_namespaced_deployment(
            "team", deployment("held", 2, 0, None, "held")
        )
        await create_podgroup(api, "team", "train", 2)
        await client.AppsV1Api(api).create_namespaced_deployment(
            "team", deployment("train", 2, 1, None, "train")
        )

        async def running() -> bool:
            found = await pods(api, "team", "app=train")
            return len(found) == 2 and all(p["status"].get("phase") == "Running" for p in found)

        await eventually(running, timeout=90, what="the gang released and Running")
        lease = await client.CoordinationV1Api(api).read_namespaced_lease("quorum-operator", NAMESPACE)
        assert lease.spec.holder_identity
        with pytest.raises(ApiException) as missing:
            await core.read_namespace(DEFAULT_NAMESPACE)
        assert missing.value.status == 404

        async def held_gated() -> bool:
            found = await pods(api, "team", "app=held")
            return len(found) == 2 and all(gated(p) for p in found)

        await eventually(held_gated, timeout=30, what="the short gang gated")
        refused = await remove_gate(
            instance, api, "customer", "team", (await pods(api, "team", "app=held"))[0]["metadata"]["name"]
        )
        assert refused.returncode != 0 and "quorum-gate-protection" in refused.stderr
        assert f"system:serviceaccount:{NAMESPACE}:quorum-operator" in refused.stderr

        # The fence knows the operator by this namespace's identity: its token may not delete
        # a pod that is not a gang member.
        await core.create_namespaced_pod(
            "team", {"metadata": {"name": "plain"}, "spec": {"containers": [{"name": "c", "image": "pause"}]}}
        )
        operator = await api_client(instance.kubeconfig("quorum-operator"))
        async with operator:
            with pytest.raises(ApiException) as fenced:
                await client.CoreV1Api(operator).delete_namespaced_pod("plain", "team")
        assert fenced.value.status == 403 and "quorum-operator-fence" in str(fenced.value.body)
