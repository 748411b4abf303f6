"""A stateful fake of the operator's `KubeApi` for unit tests of the loop: it keeps pods, Gang
objects, group statuses, Jobs and Events in the operator's `Store` (as if the watches delivered
every write at once), and any call can be made to fail or to hang.

    api = FakeApi(store)
    api.fail("patch_gang_status", when=lambda ns, name, status: name == "pg-a")  # 500, always
    api.fail("release_pod", times=1)                                             # once
    gate = api.hang("create_gang")                                               # until gate.set()
"""

from __future__ import annotations

import asyncio
import copy
import itertools
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from kubernetes_asyncio.client.exceptions import ApiException

from quorum.k8s.writes import (
    RESERVED_TAINT,
    EvictionRefused,
    release_patch,
    reserved_toleration,
    taint_patch,
    untaint_patch,
)
from quorum.operator.gangs import Store

JSON = dict[str, Any]


def server_error(status: int = 500, message: str = "etcdserver: request timed out") -> ApiException:
    err = ApiException(status=status, reason="Internal Server Error" if status == 500 else "Invalid")
    err.body = f'{{"kind":"Status","message":"{message}"}}'.encode()
    return err


@dataclass
class Fault:
    when: Callable[..., bool]
    error: BaseException | None  # None: hang until `gate` is set
    times: int | None  # None: always
    gate: asyncio.Event = field(default_factory=asyncio.Event)


class FakeApi:
    def __init__(self, store: Store) -> None:
        self.store = store
        self.calls: list[tuple[str, tuple[Any, ...]]] = []
        self.events: list[tuple[str, str, str, bool]] = []  # (object name, reason, message, warning)
        self.group_statuses: dict[tuple[str, str, str], JSON] = {}  # (api group, ns, name) -> status
        self.jobs: dict[tuple[str, str], JSON] = {}
        self.statefulsets: dict[tuple[str, str], str] = {}
        self.faults: dict[str, list[Fault]] = {}
        self.uids = itertools.count(1)
        self.pinned: dict[str, str | None] = {}  # pod uid -> the node its release pinned it to
        self.disruption_targets: dict[str, tuple[str, str]] = {}  # pod uid -> (reason, message)
        self.evicted: list[str] = []  # uids, in order
        self.tolerated: dict[str, str | None] = {}  # pod uid -> the reservation its release tolerates
        self.refuse_evictions: set[str] = set()  # uids a PodDisruptionBudget protects (429)

    # -- faults ---------------------------------------------------------------------------------

    def fail(
        self,
        method: str,
        error: BaseException | None = None,
        times: int | None = None,
        when: Callable[..., bool] = lambda *args: True,
    ) -> None:
        """Make `method` raise `error` (default: a 500) when `when(*args)`, `times` times."""
        self.faults.setdefault(method, []).append(Fault(when, error or server_error(), times))

    def hang(self, method: str, when: Callable[..., bool] = lambda *args: True) -> asyncio.Event:
        """Make `method` hang (as a wedged connection does) until the returned event is set."""
        fault = Fault(when, None, None)
        self.faults.setdefault(method, []).append(fault)
        return fault.gate

    def heal(self) -> None:
        for faults in self.faults.values():
            for fault in faults:
                fault.gate.set()
        self.faults.clear()

    async def _call(self, method: str, *args: Any) -> None:
        self.calls.append((method, args))
        for fault in self.faults.get(method, []):
            if fault.times == 0 or not fault.when(*args):
                continue
            if fault.times is not None:
                fault.times -= 1
            if fault.error is None:
                await fault.gate.wait()
            else:
                raise fault.error
        await asyncio.sleep(0)  # a real call always yields to the loop

    def called(self, method: str) -> list[tuple[Any, ...]]:
        return [args for name, args in self.calls if name == method]

    # -- KubeApi --------------------------------------------------------------------------------

    async def release_pod(self, pod: JSON, node: str | None, tolerate: str | None = None) -> bool:
        await self._call("release_pod", pod, node)
        self.tolerated[pod["metadata"]["uid"]] = tolerate
        current = self.store.pods.get(pod["metadata"]["uid"])
        ops = release_patch(current or pod, node, tolerate)
        if current is None or ops is None:
            return False
        updated = copy.deepcopy(current)
        updated["spec"]["schedulingGates"] = [
            g for g in updated["spec"].get("schedulingGates") or [] if g.get("name") != "quorum.dev/gang"
        ]
        if tolerate is not None:
            updated["spec"].setdefault("tolerations", []).append(reserved_toleration(tolerate))
        self.pinned[pod["metadata"]["uid"]] = node
        self.store.pods[pod["metadata"]["uid"]] = updated
        return True

    async def create_gang(self, namespace: str, name: str, spec: JSON, owner: JSON | None) -> JSON:
        await self._call("create_gang", namespace, name, spec, owner)
        existing = self.store.gangs.get((namespace, name))
        if existing is not None:
            return existing
        meta: JSON = {"name": name, "namespace": namespace, "uid": f"gang-{next(self.uids)}"}
        if owner is not None:
            meta["ownerReferences"] = [owner]
        gang = {"apiVersion": "quorum.dev/v1alpha1", "kind": "Gang", "metadata": meta, "spec": spec}
        self.store.gangs[(namespace, name)] = gang
        return gang

    async def delete_gang(self, namespace: str, name: str) -> None:
        await self._call("delete_gang", namespace, name)
        self.store.gangs.pop((namespace, name), None)

    async def patch_gang_status(self, namespace: str, name: str, status: JSON) -> bool:
        await self._call("patch_gang_status", namespace, name, status)
        gang = self.store.gangs.get((namespace, name))
        if gang is None:
            return False
        updated = copy.deepcopy(gang)
        updated.setdefault("status", {}).update(copy.deepcopy(status))  # a merge patch, one level
        self.store.gangs[(namespace, name)] = updated
        return True

    async def patch_group_status(
        self, group: str, version: str, plural: str, namespace: str, name: str, status: JSON
    ) -> bool:
        await self._call("patch_group_status", group, namespace, name, status)
        self.group_statuses[(group, namespace, name)] = status
        return True

    async def apply_group_status(
        self, group: str, version: str, kind: str, plural: str, namespace: str, name: str, status: JSON
    ) -> bool:
        await self._call("apply_group_status", group, namespace, name, status)
        self.group_statuses[(group, namespace, name)] = status
        return True

    async def post_event(self, obj: JSON, reason: str, message: str, warning: bool = False) -> None:
        await self._call("post_event", obj, reason, message, warning)
        self.events.append((obj["metadata"]["name"], reason, message, warning))

    async def delete_pod(self, pod: JSON) -> bool:
        await self._call("delete_pod", pod)
        return self.store.pods.pop(pod["metadata"]["uid"], None) is not None

    async def set_job_suspend(self, namespace: str, name: str, uid: str, suspend: bool) -> bool:
        await self._call("set_job_suspend", namespace, name, uid, suspend)
        job = self.jobs.get((namespace, name))
        if job is None:
            return False
        job.setdefault("spec", {})["suspend"] = suspend
        return True

    async def read_job(self, namespace: str, name: str) -> JSON | None:
        await self._call("read_job", namespace, name)
        return copy.deepcopy(self.jobs.get((namespace, name)))

    async def statefulset_pod_management(self, namespace: str, name: str) -> str | None:
        await self._call("statefulset_pod_management", namespace, name)
        return self.statefulsets.get((namespace, name))

    async def taint_node(self, node: JSON, token: str, add: bool) -> bool:
        await self._call("taint_node", node, token, add)
        current = self.store.nodes.get(node["metadata"]["name"])
        if current is None:
            return False
        ops = taint_patch(current, token) if add else untaint_patch(current, token or None)
        if ops is None:
            return True
        updated = copy.deepcopy(current)
        taints = [
            t
            for t in updated.setdefault("spec", {}).get("taints") or []
            if not (t.get("key") == RESERVED_TAINT and (add or not token or t.get("value") == token))
        ]
        if add:
            taints.append({"key": RESERVED_TAINT, "value": token, "effect": "NoSchedule"})
        updated["spec"]["taints"] = taints
        updated["metadata"]["resourceVersion"] = str(next(self.uids))
        self.store.nodes[node["metadata"]["name"]] = updated
        return True

    async def mark_disruption_target(self, pod: JSON, reason: str, message: str) -> bool:
        await self._call("mark_disruption_target", pod, reason, message)
        self.disruption_targets[pod["metadata"]["uid"]] = (reason, message)
        return True

    async def evict_pod(self, pod: JSON, dry_run: bool = False) -> bool:
        await self._call("evict_pod", pod, dry_run)
        uid = pod["metadata"]["uid"]
        if uid in self.refuse_evictions:
            raise EvictionRefused("Cannot evict pod as it would violate the pod's disruption budget.")
        if not dry_run:
            self.evicted.append(uid)
            self.store.pods.pop(uid, None)
        return True

    def reasons(self, name: str) -> list[str]:
        return [reason for obj, reason, _, _ in self.events if obj == name]
