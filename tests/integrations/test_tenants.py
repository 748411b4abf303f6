"""Tenants on the real control plane (docs/lifecycle.md, "Between tenants"), on an instance of its
own with short starvation settings (guard after 3 s, turns of 10 s, idle bound 40 s) and the
tenant label `example.com/team`: the attacker is the namespace-scoped tenant, with `edit` in two
namespaces the platform labelled as one team."""

from __future__ import annotations

import json
import secrets
from collections.abc import AsyncIterator, Iterator
from typing import Any

import pytest
from kubernetes_asyncio import client

from devcluster.cluster import Instance
from devcluster.nodes import TestPool
from tests.integration.test_gangs import GANGS, admitted, get
from tests.integrations.helpers import whole_node_spec
from tests.kube import (
    api_client,
    assert_no_overcommit,
    create_namespace,
    create_pool_nodes,
    eventually,
    operator_instance,
)

pytestmark = pytest.mark.cluster
JSON = dict[str, Any]
TENANT_LABEL = "example.com/team"
IDLE_SECONDS = 40


@pytest.fixture(scope="module")
def tenants() -> Iterator[Instance]:
    with operator_instance(
        "t-tenants",
        {
            "STARVATION_SECONDS": "3",
            "STARVATION_HOLD_SECONDS": "10",
            "STARVATION_IDLE_SECONDS": str(IDLE_SECONDS),
            "TENANT_LABEL": TENANT_LABEL,
        },
    ) as instance:
        yield instance


@pytest.fixture
async def admin(tenants: Instance) -> AsyncIterator[client.ApiClient]:
    api = await api_client(tenants.kubeconfig("admin"))
    async with api:
        yield api


def gpu_pod(pool: TestPool, name: str, labels: dict[str, str]) -> JSON:
    return {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": name, "labels": labels},
        "spec": whole_node_spec(pool),
    }


def label_gang(pool: TestPool, group: str, size: int) -> list[JSON]:
    labels = {
        "pod-group.scheduling.sigs.k8s.io/name": group,
        "pod-group.scheduling.sigs.k8s.io/min-available": str(size),
    }
    return [gpu_pod(pool, f"{group}-{i}", labels) for i in range(size)]


def create(instance: Instance, who: str, namespace: str, *objs: JSON) -> None:
    listed = json.dumps({"apiVersion": "v1", "kind": "List", "items": list(objs)})
    instance.kubectl("-n", namespace, "create", "-f", "-", input_text=listed, who=who)


async def says(api: client.ApiClient, namespace: str, gang: str, text: str) -> JSON:
    async def probe() -> JSON | None:
        found = await get(api, GANGS, namespace, gang)
        return found if text in str(admitted(found).get("message") or "") else None

    return await eventually(probe, timeout=90, what=f"gang {namespace}/{gang} saying {text!r}")


async def test_a_team_whose_gangs_never_fit_cannot_keep_anothers_gang_out_and_rests_as_one_tenant(
    tenants: Instance, admin: client.ApiClient
) -> None:
    """Two nodes of 8 GPUs. The tenant keeps a pod on one of them for ever and, in two
    namespaces the platform labelled `example.com/team=attacker`, makes a gang of both nodes
    whole in each: they never fit, starve and hold the other node. Another team's gang of one
    node starves, has the next turn and is placed, before the attacker rests. The room held for
    the attacker does not grow: after 40 s of holding its gangs in both namespaces rest
    together, named as one tenant."""
    suffix = secrets.token_hex(3)
    pool = TestPool(f"tp-{suffix}", 2)
    async with await api_client(tenants.kubeconfig("platform")) as platform:
        await create_pool_nodes(platform, pool)
    attacker = [f"a1-{suffix}", f"a2-{suffix}"]
    bystander = f"b-{suffix}"
    for name in attacker:
        await create_namespace(admin, name, {TENANT_LABEL: "attacker"})
        tenants.kubectl(
            "-n",
            name,
            "create",
            "rolebinding",
            "tenant-edit",
            "--clusterrole=edit",
            "--user=tenant@example.com",
        )
    await create_namespace(admin, bystander, {TENANT_LABEL: "bystander"})
    core = client.CoreV1Api(admin)

    create(tenants, "tenant", attacker[0], gpu_pod(pool, "forever", {}))

    async def forever_bound() -> bool:
        return bool((await core.read_namespaced_pod("forever", attacker[0])).spec.node_name)

    await eventually(forever_bound, timeout=60, what="the attacker's pod that never ends bound")
    for name in attacker:
        create(tenants, "tenant", name, *label_gang(pool, "all", 2))

    async def attacker_holds() -> bool:
        for name in attacker:
            found = await get(admin, GANGS, name, "lbl-all")
            conditions = ((found or {}).get("status") or {}).get("conditions") or []
            if any(c.get("type") == "CapacityHeld" and c.get("status") == "True" for c in conditions):
                return True
        return False

    await eventually(
        attacker_holds, timeout=60, what="the starvation guard holding the free node for the attacker"
    )

    create(tenants, "customer", bystander, *label_gang(pool, "small", 1))

    async def small_bound() -> bool:
        return bool((await core.read_namespaced_pod("small-0", bystander)).spec.node_name)

    await eventually(small_bound, timeout=90, what="the other team's gang placed in its turn")
    rest = f"holds nothing for its tenant's gangs ({TENANT_LABEL}=attacker)"
    for name in attacker:  # placed in its turn, not because the attacker had begun to rest
        message = str(admitted(await get(admin, GANGS, name, "lbl-all")).get("message") or "")
        assert rest not in message, message
    await core.delete_namespaced_pod("small-0", bystander, grace_period_seconds=0)

    for name in attacker:
        resting = await says(admin, name, "lbl-all", rest)
        assert f"did not grow for {IDLE_SECONDS}s" in str(admitted(resting).get("message")), resting
    for name in attacker:
        for i in range(2):
            pod = await core.read_namespaced_pod(f"all-{i}", name)
            assert not pod.spec.node_name, f"{name}/all-{i} bound: a gang that cannot fit was placed"
    await assert_no_overcommit(admin)
