"""A stateful fake of the apiserver as `quorum uninstall` (`UninstallApi`) and `quorum certs
ensure` (`CertsApi`) see it: quorum's objects by kind and name with resourceVersions (the
operator's Lease among them, which the operator may read and write while its Role's binding is
there), gated gang pods (quorum's, created before the mutating webhook's drop, and those their
creator gated after it), Jobs quorum suspended, the taints of nodes, the backstop and the
mutating webhook as the apiserver applies them (either can lag behind its deletion, leave the
probe namespace out, or fail open), and a log of every write. Any call can be made to fail:

    cluster.fail("delete", when=lambda ref, *_: ref.name == "quorum-webhooks", times=1)
"""

from __future__ import annotations

import copy
import itertools
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from kubernetes_asyncio.client.exceptions import ApiException

from quorum.commands.uninstall import GatedPod, SuspendedJob
from quorum.core import removal
from quorum.core.gangs import RESERVED_TAINT
from quorum.core.removal import Kind, Ref

JSON = dict[str, Any]
OPERATOR = "system:serviceaccount:quorum-system:quorum-operator"
LEADER = "quorum-operator-7d9f-x2b4_1"  # the operator replica that holds the Lease
LEADER_ELECTION = "quorum-operator-leader-election"  # the operator's Role (and binding) for its Lease


def refused(status: int = 500, message: str = "etcdserver: request timed out") -> ApiException:
    err = ApiException(status=status, reason="Forbidden" if status == 403 else "Internal Server Error")
    err.body = f'{{"kind":"Status","message":"{message}"}}'.encode()
    return err


@dataclass
class Fault:
    method: str
    when: Callable[..., bool]
    times: int | None  # None: always
    error: ApiException


@dataclass
class FakeCluster:
    objects: dict[Ref, JSON] = field(default_factory=dict)
    custom_objects: dict[str, int] = field(default_factory=dict)  # CRD name -> objects of it
    gated: dict[str, int] = field(default_factory=dict)  # "namespace/gang" -> pods quorum gated
    # "namespace/gang" -> gated pods their creator made with quorum's gate after the webhook was
    # gone (created `now` + 60 s)
    self_gated: dict[str, int] = field(default_factory=dict)
    on_release: Callable[[FakeCluster], None] = lambda _: None  # after each release
    now: float = 1_800_000_000.0  # the apiserver's clock (the probes' creationTimestamp)
    taints: dict[str, list[JSON]] = field(default_factory=dict)  # node -> its taints
    # "namespace/name" -> {"gang", "uid", "suspended", "pods"}: Jobs recorded on Gangs as
    # suspended by quorum (the records go with the Gang CRD).
    jobs: dict[str, JSON] = field(default_factory=dict)
    job_lists: int = 0
    on_jobs: Callable[[FakeCluster], None] = lambda _: None  # after each list (pods go)
    # Called after each look at the nodes (an operator still running puts a taint back).
    on_look: Callable[[FakeCluster], None] = lambda _: None
    looks: int = 0
    # Probes the apiserver still refuses after the backstop's binding is gone (its informer lags).
    backstop_lag: int = 0
    mutating_lag: int = 0  # the same for the mutating webhook
    mutating_probes: int = 0
    backstop_static: bool = False
    backstop_covers: bool = True  # False: the backstop leaves the probe's namespace out
    webhook_down: bool = False  # the mutating webhook's server does not answer: it fails open
    writes: list[tuple[str, str]] = field(default_factory=list)  # (verb, object)
    released: list[tuple[str, str]] = field(default_factory=list)  # (reason, by)
    probes: int = 0
    faults: list[Fault] = field(default_factory=list)
    versions: itertools.count[int] = field(default_factory=lambda: itertools.count(100))

    # -- set-up -----------------------------------------------------------------------------

    def add(self, ref: Ref, body: JSON | None = None) -> JSON:
        obj = copy.deepcopy(body) if body is not None else {}
        meta = obj.setdefault("metadata", {})
        meta.setdefault("name", ref.name)
        if ref.namespace:
            meta.setdefault("namespace", ref.namespace)
        meta["resourceVersion"] = str(next(self.versions))
        self.objects[ref] = obj
        return obj

    def install(self, namespace: str = "quorum-system", crds: dict[str, JSON] | None = None) -> None:
        """Every object the full uninstall removes, as quorum's manifests install them: the
        namespace labelled quorum's, the Lease held by an operator replica (15 s)."""
        for step in removal.removal_plan(namespace):
            if step.target is not None and step.target.kind is not removal.CRD:
                self.add(step.target)
        self.add(
            Ref(removal.NAMESPACE, namespace),
            {"metadata": {"labels": {removal.PART_OF_LABEL: removal.PART_OF_VALUE}}},
        )
        lease = {"spec": {"holderIdentity": LEADER, "leaseDurationSeconds": 15, "leaseTransitions": 3}}
        self.add(Ref(removal.LEASE, removal.OPERATOR_LEASE, namespace), lease)
        labels = {removal.PART_OF_LABEL: removal.PART_OF_VALUE}
        for name in removal.CRDS:
            group, _ = removal.crd_resource(name)
            kind = "Gang" if group == "quorum.dev" else "PodGroup"
            crd = {
                "metadata": {"labels": labels},
                "spec": {"names": {"kind": kind}, "versions": [{"name": "v1alpha1", "served": True}]},
            }
            self.add(Ref(removal.CRD, name), (crds or {}).get(name, crd))

    def fail(
        self,
        method: str,
        when: Callable[..., bool] = lambda *_: True,
        times: int | None = None,
        error: ApiException | None = None,
    ) -> None:
        self.faults.append(Fault(method, when, times, error or refused()))

    def _check(self, method: str, *args: Any) -> None:
        for fault in self.faults:
            if fault.method == method and fault.times != 0 and fault.when(*args):
                if fault.times is not None:
                    fault.times -= 1
                raise fault.error

    def has(self, kind: Kind, name: str) -> bool:
        return any(r.kind == kind and r.name == name for r in self.objects)

    # -- UninstallApi -----------------------------------------------------------------------

    async def delete(self, ref: Ref, dry_run: bool) -> bool:
        self._check("delete", ref, dry_run)
        if ref not in self.objects:
            return False
        if not dry_run:
            del self.objects[ref]
            self.writes.append(("delete", str(ref)))
        return True

    async def read(self, ref: Ref) -> JSON | None:
        self._check("read", ref)
        found = self.objects.get(ref)
        return copy.deepcopy(found) if found is not None else None

    async def count(self, kind: Kind) -> int:
        self._check("count", kind)
        return self.custom_objects.get(f"{kind.plural}.{kind.group}", 0)

    def _operator_may(self, ref: Ref) -> None:
        """quorum's operator may read and write Leases of its namespace while its Role is bound."""
        if Ref(removal.ROLE_BINDING, LEADER_ELECTION, ref.namespace) not in self.objects:
            raise refused(403, f"cannot get resource leases in the namespace {ref.namespace}")

    async def lease(self, ref: Ref) -> JSON | None:
        self._check("lease", ref)
        self._operator_may(ref)
        found = self.objects.get(ref)
        return copy.deepcopy(found) if found is not None else None

    async def write_lease(self, ref: Ref, body: JSON, create: bool, dry_run: bool) -> None:
        self._check("write_lease", ref, body)
        self._operator_may(ref)
        if create:
            if Ref(removal.NAMESPACE, str(ref.namespace)) not in self.objects:
                raise refused(404, f'namespaces "{ref.namespace}" not found')
            if ref in self.objects:
                raise refused(409, "already exists")
        else:
            stored = self.objects.get(ref)
            if stored is None:
                raise refused(404, "not found")
            if body["metadata"].get("resourceVersion") != stored["metadata"]["resourceVersion"]:
                raise refused(409, "the object has been modified")
        if not dry_run:
            self.add(ref, body)
            self.writes.append(("lease", str(body["spec"]["holderIdentity"])))

    def holder(self, namespace: str = "quorum-system") -> str | None:
        found = self.objects.get(Ref(removal.LEASE, removal.OPERATOR_LEASE, namespace))
        return None if found is None else str(found["spec"].get("holderIdentity"))

    async def probe_backstop(self, namespace: str) -> str | None:
        self._check("probe_backstop", namespace)
        self.probes += 1
        name = removal.BACKSTOP + (".static.k8s.io" if self.backstop_static else "")
        refusal = f"ValidatingAdmissionPolicy '{name}' with binding '{name}' denied request"
        if not self.backstop_covers:
            return None
        if self.backstop_static or self.has(removal.POLICY_BINDING, removal.BACKSTOP):
            return refusal
        if self.backstop_lag > 0:
            self.backstop_lag -= 1
            return refusal
        return None

    async def probe_mutating(self, namespace: str) -> tuple[bool, float | None]:
        self._check("probe_mutating", namespace)
        self.mutating_probes += 1
        if self.webhook_down:
            return False, self.now
        if self.has(removal.MUTATING_WEBHOOKS, removal.WEBHOOKS):
            return True, self.now
        if self.mutating_lag > 0:
            self.mutating_lag -= 1
            return True, self.now
        return False, self.now

    async def gated_pods(self) -> tuple[str, list[GatedPod]]:
        self._check("gated_pods")
        pods = []
        for gated, created in ((self.gated, self.now - 60), (self.self_gated, self.now + 60)):
            for key, n in sorted(gated.items()):
                namespace, gang = key.split("/")
                pods += [GatedPod(namespace, f"{gang}-{i}", gang, created) for i in range(n)]
        return OPERATOR, pods

    async def release_gated(
        self, reason: str, by: str, created_before: float | None
    ) -> tuple[str, list[str]]:
        self._check("release_gated", reason, by)
        releasing = dict(self.gated)
        if created_before is None or self.now + 60 <= created_before:
            for gang, n in self.self_gated.items():
                releasing[gang] = releasing.get(gang, 0) + n
            self.self_gated.clear()
        lines = [
            f"{gang}: {n} of {n} gated pods released by hand by {by}" for gang, n in sorted(releasing.items())
        ]
        self.writes += [("release", gang) for gang in sorted(releasing)]
        self.released.append((reason, by))
        self.gated.clear()
        self.on_release(self)
        return OPERATOR, lines

    def suspend(self, job: str, gang: str, pods: int = 0, listed: int = 0) -> None:
        """A Job quorum suspended: `pods` active by its status, `listed` pods of it listed."""
        self.jobs[job] = {
            "gang": gang,
            "uid": f"uid-{job}",
            "suspended": True,
            "pods": pods,
            "listed": listed,
        }

    async def suspended_jobs(self) -> tuple[str, list[SuspendedJob]]:
        self._check("suspended_jobs")
        self.job_lists += 1
        found = []
        if self.has(removal.CRD, "gangs.quorum.dev"):
            for key, job in sorted(self.jobs.items()):
                namespace, name = key.split("/")
                if job["suspended"]:
                    found.append(
                        SuspendedJob(namespace, name, job["uid"], job["gang"], job["pods"], 0, job["listed"])
                    )
        self.on_jobs(self)
        return OPERATOR, found

    async def resume_job(self, job: SuspendedJob, dry_run: bool) -> tuple[str, bool]:
        self._check("resume_job", job, dry_run)
        found = self.jobs.get(f"{job.namespace}/{job.name}")
        if found is None or found["uid"] != job.uid:
            return OPERATOR, False
        if not dry_run:
            found["suspended"] = False
            self.writes.append(("resume", f"{job.namespace}/{job.name}"))
        return OPERATOR, True

    async def reserved_nodes(self) -> tuple[str, dict[str, list[str]]]:
        self._check("reserved_nodes")
        self.looks += 1
        found = {
            node: [str(t["value"]) for t in taints if t["key"] == RESERVED_TAINT]
            for node, taints in self.taints.items()
        }
        self.on_look(self)
        return OPERATOR, {node: values for node, values in found.items() if values}

    async def unreserve(self, node: str, dry_run: bool) -> tuple[str, list[str]]:
        self._check("unreserve", node, dry_run)
        taints = self.taints.get(node, [])
        values = [str(t["value"]) for t in taints if t["key"] == RESERVED_TAINT]
        if values and not dry_run:
            self.taints[node] = [t for t in taints if t["key"] != RESERVED_TAINT]
            self.writes.append(("untaint", node))
        return OPERATOR, values

    async def caller(self) -> str:
        return "admin"

    # -- CertsApi ---------------------------------------------------------------------------

    async def create(self, kind: Kind, namespace: str | None, body: JSON) -> None:
        ref = Ref(kind, body["metadata"]["name"], namespace)
        self._check("create", ref, body)
        if ref in self.objects:
            raise refused(409, "already exists")
        self.add(ref, body)
        self.writes.append(("create", str(ref)))

    async def replace(self, ref: Ref, body: JSON) -> None:
        self._check("replace", ref, body)
        stored = self.objects.get(ref)
        if stored is None:
            raise refused(404, "not found")
        if body["metadata"].get("resourceVersion") != stored["metadata"]["resourceVersion"]:
            raise refused(409, "the object has been modified")
        self.add(ref, body)
        self.writes.append(("replace", str(ref)))

    async def patch(self, ref: Ref, ops: list[JSON]) -> None:
        self._check("patch", ref, ops)
        stored = self.objects.get(ref)
        if stored is None:
            raise refused(404, "not found")
        obj = copy.deepcopy(stored)
        for op in ops:
            *parents, last = [p.replace("~1", "/").replace("~0", "~") for p in op["path"].split("/")[1:]]
            target: Any = obj
            for part in parents:
                target = target[int(part)] if isinstance(target, list) else target.setdefault(part, {})
            if op["op"] == "test" and target.get(last) != op["value"]:
                raise refused(422, f"test failed at {op['path']}")
            if op["op"] == "add":
                target[last] = op["value"]
            elif op["op"] == "remove":
                del target[last]
        self.add(ref, obj)
        self.writes.append(("patch", str(ref)))
