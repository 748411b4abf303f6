"""A stateful fake of the operator's `KubeApi` for unit tests of the loop: it keeps pods, Gang
objects, nodes, group statuses, Jobs and Events, and any call can be made to fail or to hang.

    api = FakeApi(store)
    api.fail("patch_gang_status", when=lambda ns, name, status: name == "pg-a")  # 500, always
    api.fail("release_pod", times=1)                                             # once
    gate = api.hang("create_gang")                                               # until gate.set()

By default its writes land in the operator's `Store` at once, as if the watches delivered every
write immediately. With `lag=True` the apiserver's objects (`server`) are apart from what the
operator's watches have shown (`store`, `bound`): each write is queued as a watch event of its
kind, and `deliver(kind, n)` hands the next `n` to the operator. Each kind's events arrive in
order (as a watch's do), the kinds independently of each other: a Gang write can be seen before
or after the pod writes that came before it. `relist()` is what a new leader lists.
"""

from __future__ import annotations

import asyncio
import copy
import itertools
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from kubernetes_asyncio.client.exceptions import ApiException

from quorum.core.workloads import WAS_GROUP
from quorum.k8s.convert import pod_group_seen
from quorum.k8s.usage import BoundPods
from quorum.k8s.writes import (
    RESERVED_TAINT,
    Superseded,
    conditional_status_patch,
    delegated_pod_group,
    release_patch,
    taint_patch,
    untaint_patch,
)
from quorum.operator.gangs import GANG_LABEL, Store

JSON = dict[str, Any]


def merge_patch(target: JSON, patch: JSON) -> None:
    """RFC 7386, as the apiserver applies a merge patch: null removes, objects merge."""
    for key, value in patch.items():
        if value is None:
            target.pop(key, None)
        elif isinstance(value, dict) and isinstance(target.get(key), dict):
            merge_patch(target[key], value)
        else:
            target[key] = copy.deepcopy(value)


def server_error(status: int = 500, message: str = "etcdserver: request timed out") -> ApiException:
    err = ApiException(status=status, reason="Internal Server Error" if status == 500 else "Invalid")
    err.body = f'{{"kind":"Status","message":"{message}"}}'.encode()
    return err


def version_of(obj: JSON) -> str:
    return str((obj.get("metadata") or {}).get("resourceVersion") or "")


@dataclass
class Fault:
    when: Callable[..., bool]
    error: BaseException | None  # None: hang until `gate` is set
    times: int | None  # None: always
    gate: asyncio.Event = field(default_factory=asyncio.Event)

    def due(self, *args: Any) -> bool:
        """Whether it strikes a call with `args` (it has strikes left and its condition holds)."""
        return self.times != 0 and self.when(*args)


KINDS = ("pods", "gangs", "nodes", "groups")


class FakeApi:
    def __init__(self, store: Store, bound: BoundPods | None = None, lag: bool = False) -> None:
        self.store = store  # what the operator's watches have delivered
        self.server = copy.deepcopy(store) if lag else store  # what the apiserver holds
        self.bound = bound
        self.lag = lag
        self.queues: dict[str, deque[tuple[Any, JSON | None, str]]] = {kind: deque() for kind in KINDS}
        self.versions = itertools.count(100)
        self.latest = "99"  # the last resourceVersion written
        self.calls: list[tuple[str, tuple[Any, ...]]] = []
        self.events: list[tuple[str, str, str, bool]] = []  # (object name, reason, message, warning)
        self.group_statuses: dict[tuple[str, str, str], JSON] = {}  # (api group, ns, name) -> status
        self.jobs: dict[tuple[str, str], JSON] = {}
        self.statefulsets: dict[tuple[str, str], str] = {}
        self.faults: dict[str, list[Fault]] = {}
        self.uids = itertools.count(1)
        self.pinned: dict[str, str | None] = {}  # pod uid -> the node its release pinned it to
        self.leases: list[JSON] = []  # other processes' Leases (`leases_named`)
        self.disruption_targets: dict[str, tuple[str, str]] = {}  # pod uid -> (reason, message)
        self.victims_deleted: list[str] = []  # uids of preemption's victims, in order
        self.tolerated: dict[str, str | None] = {}  # pod uid -> the reservation its release tolerates
        self.claims: dict[tuple[str, str], JSON] = {}  # DRA claims allocated: (ns, name) -> claim
        self.claim_watch: Any = None  # an index the claims' writes are delivered to at once

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

    # -- the watches (lag=True) -------------------------------------------------------------------

    def changed(self, kind: str, key: Any, obj: JSON | None) -> None:
        """An object of the apiserver was written (None: deleted): its watch event is queued."""
        version = self.latest = str(next(self.versions))
        if obj is not None:
            obj.setdefault("metadata", {})["resourceVersion"] = version
        if self.lag:
            self.queues[kind].append((key, copy.deepcopy(obj), version))
        else:
            self.store.progress[kind] = version

    def deliver(self, kind: str, n: int | None = None) -> int:
        """Hand the next `n` (default: all) queued events of `kind` to the operator's store."""
        queue = self.queues[kind]
        count = len(queue) if n is None else min(n, len(queue))
        for _ in range(count):
            key, obj, version = queue.popleft()
            self.store.progress[kind] = version
            if kind == "pods":
                if obj is None:
                    self.store.pods.pop(key, None)
                    if self.bound is not None:
                        self.bound.remove(key)
                    continue
                if GANG_LABEL in (obj["metadata"].get("labels") or {}):
                    self.store.pods[key] = obj
                if self.bound is not None:
                    self.bound.upsert(obj)
            else:
                table: dict[Any, JSON] = getattr(self.store, kind)
                if obj is None:
                    table.pop(key, None)
                else:
                    table[key] = obj
        return count

    def deliver_all(self) -> None:
        for kind in KINDS:
            self.deliver(kind)

    def relist(self) -> tuple[Store, BoundPods]:
        """What a new leader's watches list: the apiserver's objects now (queues emptied)."""
        for queue in self.queues.values():
            queue.clear()
        synced, self.server.synced = self.server.synced, {}
        store = copy.deepcopy(self.server)
        self.server.synced = synced
        store.pods = {
            uid: p for uid, p in store.pods.items() if GANG_LABEL in (p["metadata"].get("labels") or {})
        }
        bound = BoundPods()
        bound.replace_all(copy.deepcopy(list(self.server.pods.values())))
        store.progress = dict.fromkeys(KINDS, self.latest)
        self.store, self.bound = store, bound
        return store, bound

    def standby(self, relisted: frozenset[str] = frozenset()) -> tuple[Store, BoundPods]:
        """What a standby that becomes leader has: the store its own watches kept, which show
        what the current watches have shown (each kind as far behind), but for the `relisted`
        kinds, which it lists afresh (a watch that broke and relisted as it took over). The
        queued events of the other kinds are still to come, to it."""
        synced, self.store.synced = self.store.synced, {}
        store = copy.deepcopy(self.store)
        self.store.synced = synced
        for pod in store.pods.values():
            # The leader's own assumption (`Store.assume_deleting`), which no watch delivered:
            # this fake's pods are removed at once and never carry one.
            pod["metadata"].pop("deletionTimestamp", None)
        bound = copy.deepcopy(self.bound) if self.bound is not None else BoundPods()
        for kind in relisted:
            self.queues[kind].clear()
            store.progress[kind] = self.latest
            if kind == "pods":
                store.pods = {
                    uid: copy.deepcopy(p)
                    for uid, p in self.server.pods.items()
                    if GANG_LABEL in (p["metadata"].get("labels") or {})
                }
                bound = BoundPods()
                bound.replace_all(copy.deepcopy(list(self.server.pods.values())))
            else:
                setattr(store, kind, copy.deepcopy(getattr(self.server, kind)))
        self.store, self.bound = store, bound
        return store, bound

    async def _call(self, method: str, *args: Any) -> None:
        self.calls.append((method, args))
        for fault in self.faults.get(method, []):
            if not fault.due(*args):
                continue
            if fault.times is not None:
                fault.times -= 1
            if fault.error is None:
                await fault.gate.wait()
            else:
                raise fault.error
        await asyncio.sleep(0)  # a real call always yields to the loop

    def will_fail(self, method: str, *args: Any) -> bool:
        """Whether the next call of `method` with `args` meets a fault."""
        return any(fault.due(*args) for fault in self.faults.get(method, []))

    def called(self, method: str) -> list[tuple[Any, ...]]:
        return [args for name, args in self.calls if name == method]

    # -- KubeApi --------------------------------------------------------------------------------

    async def release_pod(self, pod: JSON, node: str | None, tolerate: str | None = None) -> bool:
        await self._call("release_pod", pod, node)
        self.tolerated[pod["metadata"]["uid"]] = tolerate
        current = self.server.pods.get(pod["metadata"]["uid"])
        ops = release_patch(current or pod, node, tolerate)
        if current is None or ops is None:
            return False
        updated = apply_json_patch(current, ops)  # the gate gone, the pin and toleration added
        self.pinned[pod["metadata"]["uid"]] = node
        self.server.pods[pod["metadata"]["uid"]] = updated
        self.changed("pods", pod["metadata"]["uid"], updated)
        return True

    async def create_gang(self, namespace: str, name: str, spec: JSON, owner: JSON | None) -> JSON:
        await self._call("create_gang", namespace, name, spec, owner)
        existing = self.server.gangs.get((namespace, name))
        if existing is not None:
            return existing
        meta: JSON = {"name": name, "namespace": namespace, "uid": f"gang-{next(self.uids)}"}
        if owner is not None:
            meta["ownerReferences"] = [owner]
        gang = {"apiVersion": "quorum.dev/v1alpha1", "kind": "Gang", "metadata": meta, "spec": spec}
        self.server.gangs[(namespace, name)] = gang
        self.changed("gangs", (namespace, name), gang)
        return copy.deepcopy(gang)

    async def ensure_pod_group(
        self, namespace: str, name: str, version: str, min_count: int, owner: JSON
    ) -> JSON:
        await self._call("ensure_pod_group", namespace, name, version, min_count, owner)
        key = (WAS_GROUP, namespace, name)
        existing = self.server.groups.get(key)
        if existing is not None and pod_group_seen(existing).left_as_is(min_count):
            return copy.deepcopy(existing)
        group = delegated_pod_group(namespace, name, version, min_count, owner)
        group["metadata"]["uid"] = f"pg-{next(self.uids)}"
        self.server.groups[key] = group
        self.changed("groups", key, group)
        return copy.deepcopy(group)

    async def delete_gang(self, namespace: str, name: str) -> None:
        await self._call("delete_gang", namespace, name)
        if self.server.gangs.pop((namespace, name), None) is not None:
            self.changed("gangs", (namespace, name), None)

    async def patch_gang(self, namespace: str, name: str, patch: JSON) -> bool:
        await self._call("patch_gang", namespace, name, patch)
        gang = self.server.gangs.get((namespace, name))
        if gang is None:
            return False
        updated = copy.deepcopy(gang)
        merge_patch(updated, patch)
        self.server.gangs[(namespace, name)] = updated
        self.changed("gangs", (namespace, name), updated)
        return True

    async def patch_gang_status(self, namespace: str, name: str, status: JSON) -> str | None:
        await self._call("patch_gang_status", namespace, name, status)
        gang = self.server.gangs.get((namespace, name))
        if gang is None:
            return None
        updated = copy.deepcopy(gang)
        merge_patch(updated.setdefault("status", {}), status)
        self.server.gangs[(namespace, name)] = updated
        self.changed("gangs", (namespace, name), updated)
        return str(updated["metadata"]["resourceVersion"])

    async def patch_gang_status_if(self, namespace: str, name: str, expect: JSON, fields: JSON) -> str | None:
        await self._call("patch_gang_status_if", namespace, name, expect, fields)
        gang = self.server.gangs.get((namespace, name))
        if gang is None:
            return None
        ops = conditional_status_patch(expect, fields)
        try:
            updated = apply_json_patch(gang, ops)
        except (AssertionError, KeyError, IndexError, TypeError) as err:
            raise Superseded(f"the Gang holds another decision: {err!r}") from None
        self.server.gangs[(namespace, name)] = updated
        self.changed("gangs", (namespace, name), updated)
        return str(updated["metadata"]["resourceVersion"])

    async def read_gang(self, namespace: str, name: str) -> JSON | None:
        await self._call("read_gang", namespace, name)
        return copy.deepcopy(self.server.gangs.get((namespace, name)))

    async def list_gangs(self) -> list[JSON]:
        await self._call("list_gangs")
        return [copy.deepcopy(g) for g in self.server.gangs.values()]

    async def resource_claim_versions(self) -> dict[str, str]:
        await self._call("resource_claim_versions")
        return {str(c["metadata"]["uid"]): version_of(c) for c in self.claims.values()}

    async def gang_pod_versions(self) -> dict[str, str]:
        await self._call("gang_pod_versions")
        return {
            str(p["metadata"]["uid"]): version_of(p)
            for p in self.server.pods.values()
            if GANG_LABEL in (p["metadata"].get("labels") or {})
        }

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
        uid = pod["metadata"]["uid"]
        current = self.server.pods.get(uid)
        version = pod["metadata"].get("resourceVersion")
        if current is None or (version and version != current["metadata"].get("resourceVersion")):
            return False  # gone, or changed since it was read (409)
        del self.server.pods[uid]
        self.changed("pods", uid, None)
        return True

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

    async def read_gang_pods(self, namespace: str, gang: str, *also: str) -> list[JSON]:
        await self._call("read_gang_pods", namespace, gang)
        return [
            copy.deepcopy(p)
            for p in self.server.pods.values()
            if p["metadata"].get("namespace") == namespace
            and (p["metadata"].get("labels") or {}).get(GANG_LABEL) in (gang, *also)
        ]

    async def leases_named(self, name: str) -> list[JSON]:
        await self._call("leases_named", name)
        return [copy.deepcopy(lease) for lease in self.leases if lease["metadata"]["name"] == name]

    async def statefulset_pod_management(self, namespace: str, name: str) -> str | None:
        await self._call("statefulset_pod_management", namespace, name)
        return self.statefulsets.get((namespace, name))

    async def taint_node(self, node: JSON, token: str, add: bool) -> bool:
        await self._call("taint_node", node, token, add)
        current = self.server.nodes.get(node["metadata"]["name"])
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
        self.server.nodes[node["metadata"]["name"]] = updated
        self.changed("nodes", node["metadata"]["name"], updated)
        return True

    async def mark_disruption_target(self, pod: JSON, reason: str, message: str) -> bool:
        await self._call("mark_disruption_target", pod, reason, message)
        self.disruption_targets[pod["metadata"]["uid"]] = (reason, message)
        return self.set_condition(pod, "True", reason, message)

    async def clear_disruption_target(self, pod: JSON, reason: str, message: str) -> bool:
        await self._call("clear_disruption_target", pod, reason, message)
        self.disruption_targets.pop(pod["metadata"]["uid"], None)
        return self.set_condition(pod, "False", reason, message)

    def set_condition(self, pod: JSON, status: str, reason: str, message: str) -> bool:
        """The pod's DisruptionTarget condition on the apiserver's pod (a strategic merge by
        type); False if the pod is gone."""
        uid = pod["metadata"]["uid"]
        current = self.server.pods.get(uid)
        if current is None:
            return False
        updated = copy.deepcopy(current)
        conditions = [
            c
            for c in (updated.setdefault("status", {}).get("conditions") or [])
            if c.get("type") != "DisruptionTarget"
        ]
        conditions.append(
            {"type": "DisruptionTarget", "status": status, "reason": reason, "message": message}
        )
        updated["status"]["conditions"] = conditions
        self.server.pods[uid] = updated
        self.changed("pods", uid, updated)
        return True

    async def delete_victim(self, pod: JSON) -> bool:
        await self._call("delete_victim", pod)
        uid = pod["metadata"]["uid"]
        if self.server.pods.pop(uid, None) is None:
            return False
        self.victims_deleted.append(uid)
        self.changed("pods", uid, None)
        return True

    async def allocate_claim(self, claim: JSON, status: JSON) -> bool:
        await self._call("allocate_claim", claim, status)
        meta = claim["metadata"]
        key = (meta["namespace"], meta["name"])
        held = self.claims.get(key, claim)
        if held["metadata"].get("resourceVersion") != meta.get("resourceVersion"):
            return False  # changed since: a conflict
        if (held.get("status") or {}).get("allocation") is not None:
            return False
        updated = copy.deepcopy(held)
        updated["status"] = copy.deepcopy(status)
        updated["metadata"]["finalizers"] = ["resource.kubernetes.io/delete-protection"]
        updated["metadata"]["resourceVersion"] = self.latest = str(next(self.versions))
        self.claims[key] = updated
        if self.claim_watch is not None:
            self.claim_watch.upsert(copy.deepcopy(updated))
        return True

    def reasons(self, name: str) -> list[str]:
        return [reason for obj, reason, _, _ in self.events if obj == name]


def apply_json_patch(doc: Any, ops: list[dict[str, Any]]) -> Any:
    """RFC 6902 add, remove and test (what the release patch uses), on a copy."""
    doc = copy.deepcopy(doc)
    for op in ops:
        *parents, last = [t.replace("~1", "/").replace("~0", "~") for t in op["path"].split("/")[1:]]
        target = doc
        for token in parents:
            target = target[int(token)] if isinstance(target, list) else target[token]
        if op["op"] == "test":  # as the apiserver's json-patch (v4): a missing member tests as null
            found = target.get(last) if isinstance(target, dict) else target[int(last)]
            if found != op["value"]:
                raise AssertionError(f"test of {op['path']} failed")
        elif op["op"] == "remove":
            del target[int(last) if isinstance(target, list) else last]
        elif isinstance(target, list):
            target.insert(len(target) if last == "-" else int(last), copy.deepcopy(op["value"]))
        else:
            target[last] = copy.deepcopy(op["value"])
    return doc
