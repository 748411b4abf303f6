"""Every call quorum-sunk-scheduler makes to the apiserver beyond its watches: bind, the lock
toleration, one node read, a node's SlurmCordon condition, and from the operator's
`quorum.k8s.writes` pod deletion, Events, node patches and the Gang objects of gangs Slurm
places. Its rights
(manifests/optional/sunk-scheduler.yaml) cover exactly these; tests/unit/sunk/test_rbac.py
checks that."""

from __future__ import annotations

from typing import Any

from kubernetes_asyncio import client
from kubernetes_asyncio.client.exceptions import ApiException

from quorum.k8s.writes import (
    create_gang,
    delete_gang,
    delete_pod,
    discard,
    now,
    patch_gang_status,
    patch_node,
    post_event,
)

__all__ = [
    "bind_pod",
    "create_gang",
    "delete_gang",
    "delete_pod",
    "node",
    "now",
    "patch_gang_status",
    "patch_node",
    "patch_pod",
    "post_event",
    "set_node_condition",
    "toleration_patch",
]


async def bind_pod(api: client.ApiClient, pod: dict[str, Any], node: str) -> bool:
    """Bind a pod to a node (the Binding API, uid-checked); False if it is gone, bound already
    or replaced."""
    meta = pod["metadata"]
    body = {
        "apiVersion": "v1",
        "kind": "Binding",
        "metadata": {"name": meta["name"], "namespace": meta["namespace"], "uid": meta["uid"]},
        "target": {"apiVersion": "v1", "kind": "Node", "name": node},
    }
    try:
        await discard(
            client.CoreV1Api(api).create_namespaced_pod_binding(
                meta["name"],
                meta["namespace"],
                body,  # type: ignore[arg-type]
                _preload_content=False,
            )
        )
    except ApiException as err:
        if err.status in (404, 409):
            return False
        raise
    return True


def toleration_patch(pod: dict[str, Any], toleration: dict[str, Any]) -> list[dict[str, Any]] | None:
    """The JSON patch that adds one toleration to a pending pod (Kubernetes lets tolerations be
    added, never changed or removed); None if the pod has it already."""
    tolerations = (pod.get("spec") or {}).get("tolerations")
    if tolerations and toleration in tolerations:
        return None
    test = {"op": "test", "path": "/metadata/uid", "value": pod["metadata"]["uid"]}
    if not tolerations:
        return [test, {"op": "add", "path": "/spec/tolerations", "value": [toleration]}]
    return [test, {"op": "add", "path": "/spec/tolerations/-", "value": toleration}]


async def patch_pod(api: client.ApiClient, pod: dict[str, Any], ops: list[dict[str, Any]]) -> bool:
    """A JSON patch of a pod; False if it is gone or was replaced."""
    meta = pod["metadata"]
    try:
        await discard(
            client.CoreV1Api(api).patch_namespaced_pod(
                meta["name"], meta["namespace"], ops, _preload_content=False
            )
        )
    except ApiException as err:
        if err.status in (404, 409, 422):
            return False
        raise
    return True


async def set_node_condition(api: client.ApiClient, name: str, condition: dict[str, Any]) -> bool:
    """Set one condition of a node's status (a strategic merge by type: the kubelet's, here
    kwok's, conditions are left as they are); False if the node is gone."""
    body = {"status": {"conditions": [condition]}}
    try:
        await discard(client.CoreV1Api(api).patch_node_status(name, body, _preload_content=False))
    except ApiException as err:
        if err.status == 404:
            return False
        raise
    return True


async def node(api: client.ApiClient, name: str) -> dict[str, Any] | None:
    """One node as plain JSON, None if it is gone."""
    try:
        response: Any = await client.CoreV1Api(api).read_node(name, _preload_content=False)
    except ApiException as err:
        if err.status == 404:
            return None
        raise
    data: dict[str, Any] = await response.json()
    return data
