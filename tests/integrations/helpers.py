"""What every controller's test does: apply its objects as the CKS customer, wait for its gang to
be released whole or held, and see that nothing of quorum's is left once it is deleted."""

from __future__ import annotations

import json
from typing import Any

from kubernetes_asyncio import client

from devcluster.cluster import Instance
from devcluster.nodes import TestPool
from tests.integration.test_gangs import GANGS, admitted, get, pods
from tests.kube import eventually

JSON = dict[str, Any]
X_POD_GROUPS = ("scheduling.x-k8s.io", "v1alpha1", "podgroups")
VOLCANO_POD_GROUPS = ("scheduling.volcano.sh", "v1beta1", "podgroups")


# kwok runs a Job's pod to completion as soon as it runs, unless this annotation (a Go duration)
# says how long it runs first (devcluster/data/stages/pod-complete.yaml).
KWOK_RUNS_FOR = "pod-complete.stage.kwok.x-k8s.io/delay"


def whole_node_spec(pool: TestPool, **extra: Any) -> JSON:
    """The spec of a pod that takes one whole node of `pool` (8 GPUs), and `extra` fields."""
    container = {
        "name": "c",
        "image": "registry.k8s.io/pause:3.10",
        "resources": {"limits": {"nvidia.com/gpu": "8"}, "requests": {"cpu": "1", "memory": "1Gi"}},
    }
    return {**extra, "containers": [container], **pool.pod_spec()}


def apply(instance: Instance, namespace: str | None, *objs: JSON) -> None:
    """`kubectl apply` as the CKS customer (cluster-admin by RBAC, not system:masters)."""
    where = ("-n", namespace) if namespace else ()
    listed = {"apiVersion": "v1", "kind": "List", "items": list(objs)}
    instance.kubectl(*where, "apply", "-f", "-", input_text=json.dumps(listed), who="customer")


def condition_true(obj: JSON | None, kind: str) -> bool:
    conditions = ((obj or {}).get("status") or {}).get("conditions") or []
    return any(c.get("type") == kind and c.get("status") == "True" for c in conditions)


async def list_objects(api: client.ApiClient, kind: tuple[str, str, str], namespace: str) -> list[JSON]:
    listed = await client.CustomObjectsApi(api).list_namespaced_custom_object(
        kind[0], kind[1], namespace, kind[2]
    )
    items: list[JSON] = listed["items"]
    return items


async def released(api: client.ApiClient, namespace: str, gang: str, timeout: float = 120) -> JSON:
    """The Gang once quorum has released it (its Admitted condition True)."""

    async def probe() -> JSON | None:
        found = await get(api, GANGS, namespace, gang)
        return found if admitted(found).get("status") == "True" else None

    return await eventually(probe, timeout=timeout, what=f"gang {gang} released")


async def held_for_room(api: client.ApiClient, namespace: str, gang: str, timeout: float = 120) -> JSON:
    """The Gang once quorum holds it for lack of room (Admitted False, reason Unschedulable),
    with no pod of the namespace bound."""

    async def probe() -> JSON | None:
        found = await get(api, GANGS, namespace, gang)
        return found if admitted(found).get("reason") == "Unschedulable" else None

    found = await eventually(probe, timeout=timeout, what=f"gang {gang} held for lack of room")
    assert not [p for p in await pods(api, namespace, "") if p["spec"].get("nodeName")], "nothing bound"
    return found


async def nothing_left(api: client.ApiClient, namespace: str, *groups: tuple[str, str, str, str]) -> None:
    """No pod, no Gang and none of `groups` ((group, version, plural, name)) left in the namespace."""

    async def probe() -> bool:
        if await list_objects(api, GANGS, namespace) or await pods(api, namespace, ""):
            return False
        return all([await get(api, (g, v, p), namespace, name) is None for g, v, p, name in groups])

    await eventually(probe, timeout=120, what="its pods, group objects and Gangs gone")
