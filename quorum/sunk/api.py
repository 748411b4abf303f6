"""What quorum-sunk-scheduler asks of the apiserver beyond its two watches, as one interface:
`SunkApi`. `LiveSunkApi` is the real one (a kubernetes-asyncio client; Gang, Event, pod
deletion and node patch calls shared with the operator through `quorum.k8s.writes`); unit
tests pass a stateful fake that can fail any call. Its rights
(manifests/optional/sunk-scheduler.yaml) cover exactly these; tests/unit/sunk/test_rbac.py
checks that."""

from __future__ import annotations

from typing import Any, Protocol

from kubernetes_asyncio import client
from kubernetes_asyncio.client.exceptions import ApiException

from quorum.core.gangs import PLACED_BY_LABEL, PLACED_BY_SLURM
from quorum.k8s import writes
from quorum.k8s.reads import json_unless_gone
from quorum.k8s.writes import discard, unless_gone
from quorum.sunk.model import JOB_ID

JSON = dict[str, Any]
COMPONENT = "quorum-sunk-scheduler"


class SunkApi(Protocol):
    async def read_group(self, group: str, version: str, namespace: str, name: str) -> JSON | None:
        """A PodGroup of any of the three APIs, with apiVersion and kind; None if it is not
        there or cannot be read."""
        ...

    async def create_gang(self, namespace: str, name: str, spec: JSON, owner: JSON | None) -> JSON:
        """Create the Gang of a gang Slurm places (labelled so); the existing one if it is
        there (which may be quorum-operator's)."""
        ...

    async def delete_gang(self, namespace: str, name: str) -> None: ...

    async def patch_gang_status(self, namespace: str, name: str, status: JSON) -> str | None: ...

    async def post_event(self, obj: JSON, reason: str, message: str, warning: bool = False) -> None: ...

    async def delete_pod(self, pod: JSON) -> bool:
        """Delete exactly this pod (uid precondition); False if it is gone or was replaced."""
        ...

    async def bind_pod(self, pod: JSON, node: str, job_id: int) -> bool:
        """Bind the pod to `node` for Slurm job `job_id` (recorded on the pod, annotation
        `sunk.coreweave.com/job-id`); False if it is gone, bound already or replaced."""
        ...

    async def add_toleration(self, pod: JSON, toleration: JSON) -> bool:
        """The pod tolerates `toleration` (added if it does not); False if it is gone or was
        replaced."""
        ...

    async def read_node(self, name: str) -> JSON | None: ...

    async def patch_node(self, node: JSON, ops: list[JSON]) -> bool: ...

    async def set_node_condition(self, name: str, condition: JSON) -> bool: ...


class LiveSunkApi:
    """`SunkApi` on a kubernetes-asyncio client."""

    def __init__(self, api: client.ApiClient) -> None:
        self.api = api

    async def read_group(self, group: str, version: str, namespace: str, name: str) -> JSON | None:
        try:
            obj: JSON = await client.CustomObjectsApi(self.api).get_namespaced_custom_object(
                group, version, namespace, "podgroups", name
            )
        except ApiException:
            return None
        obj.setdefault("apiVersion", f"{group}/{version}")
        obj.setdefault("kind", "PodGroup")
        return obj

    async def create_gang(self, namespace: str, name: str, spec: JSON, owner: JSON | None) -> JSON:
        labels = {PLACED_BY_LABEL: PLACED_BY_SLURM}
        return await writes.create_gang(self.api, namespace, name, spec, owner, labels=labels)

    async def delete_gang(self, namespace: str, name: str) -> None:
        await writes.delete_gang(self.api, namespace, name)

    async def patch_gang_status(self, namespace: str, name: str, status: JSON) -> str | None:
        return await writes.patch_gang_status(self.api, namespace, name, status)

    async def post_event(self, obj: JSON, reason: str, message: str, warning: bool = False) -> None:
        await writes.post_event(self.api, obj, reason, message, warning, component=COMPONENT)

    async def delete_pod(self, pod: JSON) -> bool:
        return await writes.delete_pod(self.api, pod)

    async def bind_pod(self, pod: JSON, node: str, job_id: int) -> bool:
        return await bind_pod(self.api, pod, node, job_id)

    async def add_toleration(self, pod: JSON, toleration: JSON) -> bool:
        ops = toleration_patch(pod, toleration)
        return ops is None or await patch_pod(self.api, pod, ops)

    async def read_node(self, name: str) -> JSON | None:
        return await node(self.api, name)

    async def patch_node(self, node: JSON, ops: list[JSON]) -> bool:
        return await writes.patch_node(self.api, node, ops)

    async def set_node_condition(self, name: str, condition: JSON) -> bool:
        return await set_node_condition(self.api, name, condition)


def binding(pod: dict[str, Any], node: str, job_id: int) -> dict[str, Any]:
    """The Binding of a pod to a node (uid-checked). The apiserver copies a Binding's annotations
    onto the pod as it sets nodeName, so the job is recorded in the same write: `/hooks/stop`
    deletes only pods bound to the job it names."""
    meta = pod["metadata"]
    return {
        "apiVersion": "v1",
        "kind": "Binding",
        "metadata": {
            "name": meta["name"],
            "namespace": meta["namespace"],
            "uid": meta["uid"],
            "annotations": {JOB_ID: str(job_id)},
        },
        "target": {"apiVersion": "v1", "kind": "Node", "name": node},
    }


async def bind_pod(api: client.ApiClient, pod: dict[str, Any], node: str, job_id: int) -> bool:
    """Bind a pod to a node for a Slurm job (`binding`); False if it is gone, bound already or
    replaced."""
    meta = pod["metadata"]
    body = binding(pod, node, job_id)
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
    return await unless_gone(client.CoreV1Api(api).patch_node_status(name, body, _preload_content=False))


async def node(api: client.ApiClient, name: str) -> dict[str, Any] | None:
    """One node as plain JSON, None if it is gone."""
    return await json_unless_gone(client.CoreV1Api(api).read_node(name, _preload_content=False))
