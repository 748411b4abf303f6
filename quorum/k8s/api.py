"""What the operator asks of the apiserver, as one interface: every write it makes and the two
reads beyond its watches. The scheduling loop takes a `KubeApi`; `LiveApi` is the real one
(`quorum.k8s.writes` and `quorum.k8s.reads` over a kubernetes-asyncio client), and unit tests
pass a stateful fake that can fail or hang any call.
"""

from __future__ import annotations

from typing import Any, Protocol

from kubernetes_asyncio import client

from quorum.k8s import reads, writes

JSON = dict[str, Any]


class KubeApi(Protocol):
    async def release_pod(self, pod: JSON, node: str | None, tolerate: str | None = None) -> bool:
        """Remove quorum's gate (conditionally) and pin the pod to `node` (a preemptor's pod also
        tolerates its reservation `tolerate`); False if the pod is gone, changed or released
        already."""
        ...

    async def create_gang(self, namespace: str, name: str, spec: JSON, owner: JSON | None) -> JSON: ...

    async def delete_gang(self, namespace: str, name: str) -> None: ...

    async def patch_gang(self, namespace: str, name: str, patch: JSON) -> bool:
        """A merge patch of a Gang's metadata and spec (its source, owner, minMember); False if
        it is gone."""
        ...

    async def patch_gang_status(self, namespace: str, name: str, status: JSON) -> str | None:
        """The Gang's resourceVersion after the write; None if it is gone."""
        ...

    async def patch_gang_status_if(self, namespace: str, name: str, expect: JSON, fields: JSON) -> str | None:
        """Write `fields` of the Gang's status only if it holds `expect` (paths under status ->
        values), in one request: the resourceVersion, None if it is gone; raises
        `writes.Superseded` if it holds something else."""
        ...

    async def read_gang(self, namespace: str, name: str) -> JSON | None:
        """The Gang as the apiserver has it now (not as the watch last showed it)."""
        ...

    async def list_gangs(self) -> list[JSON]:
        """Every Gang as the apiserver has it now (a preemption's record the watch may lag on)."""
        ...

    async def gang_pod_versions(self) -> dict[str, str]:
        """uid -> resourceVersion of every pod with quorum's gang label, as the apiserver has it
        now (listed in pages, no pod held)."""
        ...

    async def resource_claim_versions(self) -> dict[str, str]:
        """uid -> resourceVersion of every DRA ResourceClaim, as the apiserver has it now."""
        ...

    async def patch_group_status(
        self, group: str, version: str, plural: str, namespace: str, name: str, status: JSON
    ) -> bool: ...

    async def apply_group_status(
        self, group: str, version: str, kind: str, plural: str, namespace: str, name: str, status: JSON
    ) -> bool: ...

    async def post_event(self, obj: JSON, reason: str, message: str, warning: bool = False) -> None: ...

    async def ensure_pod_group(
        self, namespace: str, name: str, version: str, min_count: int, owner: JSON
    ) -> JSON:
        """Kubernetes' PodGroup `name` (scheduling.k8s.io/`version`), made as quorum's for a gang
        kube-scheduler places (gang policy of `min_count`, owned by its Gang), or its minCount set
        where one of quorum's differs; the object as the apiserver has it then (another's is
        returned untouched)."""
        ...

    async def delete_pod(self, pod: JSON) -> bool:
        """Delete exactly this version of the pod (uid and resourceVersion preconditions): False
        if it is gone or changed since it was read."""
        ...

    async def set_job_suspend(self, namespace: str, name: str, uid: str, suspend: bool) -> bool: ...

    async def read_job(self, namespace: str, name: str) -> JSON | None: ...

    async def read_gang_pods(self, namespace: str, gang: str, *also: str) -> list[JSON]:
        """The gang's pods as the apiserver has them now (not as the watch last showed them):
        those labelled `gang`, or any of `also` (the names its pods carry: `Store.labels_of`)."""
        ...

    async def statefulset_pod_management(self, namespace: str, name: str) -> str | None: ...

    async def leases_named(self, name: str) -> list[JSON]:
        """Every Lease of that name in any namespace (another scheduler's leader election)."""
        ...

    async def taint_node(self, node: JSON, token: str, add: bool) -> bool:
        """Add (or remove) the reservation taint quorum.dev/reserved=<token>; False if the node
        is gone or its taints changed meanwhile. Removing with token "" removes any token."""
        ...

    async def mark_disruption_target(self, pod: JSON, reason: str, message: str) -> bool: ...

    async def clear_disruption_target(self, pod: JSON, reason: str, message: str) -> bool:
        """The pod's `DisruptionTarget` condition set False: it is no longer to be taken."""
        ...

    async def delete_victim(self, pod: JSON) -> bool:
        """Delete a preemption's victim, as kube-scheduler's preemption does (uid precondition:
        its DisruptionTarget condition changed its resourceVersion); False if it is gone."""
        ...

    async def allocate_claim(self, claim: JSON, status: JSON) -> bool:
        """Allocate a DRA claim as kube-scheduler would (`quorum.k8s.devices.allocation_status`):
        its deletion protection first, then the status, on the version the watch showed; False
        if the claim is gone, changed or allocated already."""
        ...


class LiveApi:
    """`KubeApi` on a kubernetes-asyncio client."""

    def __init__(self, api: client.ApiClient) -> None:
        self.api = api

    async def release_pod(self, pod: JSON, node: str | None, tolerate: str | None = None) -> bool:
        return await writes.release_pod(self.api, pod, node, tolerate)

    async def create_gang(self, namespace: str, name: str, spec: JSON, owner: JSON | None) -> JSON:
        return await writes.create_gang(self.api, namespace, name, spec, owner)

    async def ensure_pod_group(
        self, namespace: str, name: str, version: str, min_count: int, owner: JSON
    ) -> JSON:
        return await writes.ensure_pod_group(self.api, namespace, name, version, min_count, owner)

    async def delete_gang(self, namespace: str, name: str) -> None:
        await writes.delete_gang(self.api, namespace, name)

    async def patch_gang(self, namespace: str, name: str, patch: JSON) -> bool:
        return await writes.patch_gang(self.api, namespace, name, patch)

    async def patch_gang_status(self, namespace: str, name: str, status: JSON) -> str | None:
        return await writes.patch_gang_status(self.api, namespace, name, status)

    async def patch_gang_status_if(self, namespace: str, name: str, expect: JSON, fields: JSON) -> str | None:
        return await writes.patch_gang_status_if(self.api, namespace, name, expect, fields)

    async def read_gang(self, namespace: str, name: str) -> JSON | None:
        return await writes.get_gang(self.api, namespace, name)

    async def list_gangs(self) -> list[JSON]:
        return await reads.gangs(self.api)

    async def gang_pod_versions(self) -> dict[str, str]:
        return await reads.gang_pod_versions(self.api)

    async def resource_claim_versions(self) -> dict[str, str]:
        return await reads.resource_claim_versions(self.api)

    async def patch_group_status(
        self, group: str, version: str, plural: str, namespace: str, name: str, status: JSON
    ) -> bool:
        return await writes.patch_status(self.api, group, version, plural, namespace, name, status)

    async def apply_group_status(
        self, group: str, version: str, kind: str, plural: str, namespace: str, name: str, status: JSON
    ) -> bool:
        return await writes.apply_status(self.api, group, version, kind, plural, namespace, name, status)

    async def post_event(self, obj: JSON, reason: str, message: str, warning: bool = False) -> None:
        await writes.post_event(self.api, obj, reason, message, warning)

    async def delete_pod(self, pod: JSON) -> bool:
        return await writes.delete_pod(self.api, pod, unchanged=True)

    async def set_job_suspend(self, namespace: str, name: str, uid: str, suspend: bool) -> bool:
        return await writes.set_job_suspend(self.api, namespace, name, uid, suspend)

    async def read_job(self, namespace: str, name: str) -> JSON | None:
        return await reads.job(self.api, namespace, name)

    async def read_gang_pods(self, namespace: str, gang: str, *also: str) -> list[JSON]:
        return await reads.gang_pods(self.api, namespace, gang, *also)

    async def statefulset_pod_management(self, namespace: str, name: str) -> str | None:
        return await reads.statefulset_pod_management(self.api, namespace, name)

    async def leases_named(self, name: str) -> list[JSON]:
        return await reads.leases_named(self.api, name)

    async def taint_node(self, node: JSON, token: str, add: bool) -> bool:
        ops = writes.taint_patch(node, token) if add else writes.untaint_patch(node, token or None)
        return True if ops is None else await writes.patch_node(self.api, node, ops)

    async def mark_disruption_target(self, pod: JSON, reason: str, message: str) -> bool:
        return await writes.mark_disruption_target(self.api, pod, reason, message)

    async def clear_disruption_target(self, pod: JSON, reason: str, message: str) -> bool:
        return await writes.mark_disruption_target(self.api, pod, reason, message, marked=False)

    async def delete_victim(self, pod: JSON) -> bool:
        return await writes.delete_pod(self.api, pod)

    async def allocate_claim(self, claim: JSON, status: JSON) -> bool:
        return await writes.allocate_claim(self.api, claim, status)
