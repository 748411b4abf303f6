"""`quorum uninstall`: remove quorum so that no pod is left gated and no pod creation is refused
on the way (docs/lifecycle.md, "Uninstall without stranding pods"). The order and the objects:
`quorum.core.removal`. It first stops quorum's operator from acting (it takes its leader Lease),
never deletes a tenant's pod, removes quorum's gate from the gang pods quorum gated (as quorum's
operator, recorded on each Gang with the reason), resumes the Jobs quorum suspended (a
recovery's or a preemption's, each once its pods are gone, as quorum would), removes the
reservation taint `quorum.dev/reserved` a preemption in flight holds nodes with
(docs/preemption.md; nothing else of a node), and deletes quorum's objects — its namespace only
if quorum made it (labelled app.kubernetes.io/part-of=quorum).

    quorum uninstall [--quorum-namespace NS] [--dry-run] [--admission-only] [--reason TEXT]
                     [--kubeconfig K] [--probe-namespace default] [--timeout 60]

`--quorum-namespace` is where quorum is installed (`--namespace` is the same, as the chart's
hook passes it; in `get` and `explain` it names a tenant's namespace). Each step prints one line:
what it deleted, what was already gone, what it left and why. Run it again after a failure:
what is done is skipped. `--dry-run` changes nothing: it asks the apiserver whether each
deletion would be allowed (server-side dry runs) and says what it would do. `--admission-only`
is what a Helm pre-delete hook runs: steps 0-3 without the Deployments, then the reservation
taints, then the Lease left held for `removal.LEASE_LEFT_SECONDS` (60 s) more; after it nothing
of quorum gates a pod, refuses a pod creation, keeps a Job suspended, keeps a node reserved or
acts, whatever order the rest is deleted in.

quorum-operator (step 0): as the operator (impersonated: its Role lets it read and update its
Lease), the command writes the Lease `quorum-operator` of quorum's namespace with the holder
`quorum-uninstall` for `removal.lease_hold_seconds` (120 s, or twice `--timeout` if longer),
then waits until the replica that held it can no longer act:
`quorum.operator.leader.LeaseSettings.acts_at_most` for the lease duration that replica recorded
(12 s for the default 15 s: its renewals fail from the next round on, and it stops within the
renew deadline, one bounded Lease read and two retry periods) plus `removal.LEASE_MARGIN`. Every
replica then sees another holder and leaves it for the duration the uninstall recorded (quorum's
election honours a holder's leaseDurationSeconds), so none suspends a Job, reserves a node or
releases a pod behind the command (replicas honour at most `removal.MAX_UNINSTALL_HOLD`, 600 s,
to which the hold is clamped; an absent Lease is waited out the same if quorum-operator's
Deployment has ready replicas). The run renews the Lease (same holder, renewTime now), quietly,
whenever a quarter of that duration has passed since it last wrote it: before each step, between
the looks of a step that waits, and from a background task while a step runs long. A renewal refused
for a conflict reads the Lease again; one forbidden (403: quorum-operator's RBAC is gone) or
whose namespace is gone (404) ends the renewals, as then no replica can lead; a Lease found
held by another (the hold ran out) stops the run, and a re-run takes it again. A run cut off
leaves it held at most that duration. The full run deletes the Lease at the end, after the
operator's Role; `--admission-only` ends by leaving it held `removal.LEASE_LEFT_SECONDS` (60 s)
more: past the operator pods' termination (30 s, the default) as Helm deletes them after the
hook; a quorum installed again into the namespace acts after that. A re-run finds the Lease
held already, renews it, and waits only what a cut-off run had left to wait. `--dry-run` takes,
renews and leaves nothing.

Probes (step 1): each deletion needs positive evidence first: a probe pod only the backstop
refuses is refused while its binding is there (else `--probe-namespace` is not covered by the
backstop, and the run stops before deleting anything), and a probe gang pod comes back gated
while the mutating webhook is there (else its server is down and it fails open: its deletion
changes nothing for pods, which the line says). After each deletion the probe is made until it
is admitted (or left ungated) 3 times in a row, each on a connection of its own (behind a load
balancer, each may reach another apiserver). `--probe-namespace` may not be one quorum's
admission leaves out (`removal.probe_namespace_problem`, the chart's rule too).

Gated pods (steps 2, 3): every gated gang pod is released, whenever it was created; only those
created (by the apiserver's clock) before the mutating webhook's drop was seen, plus
`removal.GATED_MARGIN`, can fail the run. One created later (an apiserver late to drop the
webhook, a skewed clock, or its creator) is named and released too; if a tenant keeps making
them, the bounded rounds end and the last ones are named, left gated.
After gate protection goes the command looks again, half a second apart, until no pod
gated by quorum is seen 5 times in a row, releasing any that an apiserver late to drop the
webhook gated meanwhile.

Suspended Jobs: quorum suspends a Job (recovery of a partial placement; a preemption's victim)
so that its pods go, records it on the gang's Gang, and resumes it once none of its pods is left;
once quorum is gone nothing would. Step 2 resumes each, as the operator, once none of its pods
is left (`quorum.core.lifecycle.job_may_resume`, quorum's recovery's rule: its status counts
none and none is listed), waiting at most `--timeout`; a run that stops there is finished by the
next.

Reservation taints: once quorum is gone nothing removes them, and a node left with one takes no
pod again. The full run removes them after the operator's Deployment and its ClusterRoleBinding
are deleted, as the caller. `--admission-only` removes them as the operator (impersonated, as the
release), whose replicas no longer act (step 0). Both runs look at the nodes again, half a second
apart, until none has one 5 times in a row (`removal.RESERVATION_QUIET`), removing again any put
back (said so), at most `--timeout` seconds. One line per node; a re-run removes any left (e.g.
by a version of quorum without this step): the full run as a cluster-admin after `helm
uninstall` finds everything else gone and does just that.

Left on purpose: quorum-sunk-scheduler's node lock (taint and annotation
`sunk.coreweave.com/lock`), drain annotation and `SlurmCordon` condition are Slurm's state,
set by its prolog and lifted by its epilog or by Slurm (docs/sunk.md); see docs/lifecycle.md.

Identity and rights. The release removes quorum's gate, which only quorum's operator may do
(policy quorum-gate-protection), so the command impersonates
system:serviceaccount:NS:quorum-operator for it: `impersonate` on exactly that ServiceAccount.
That is safer than giving the caller `patch pods` itself: the operator's pod writes are fenced
(quorum-operator-fence: gate removals, recoveries and marked victims only), a caller's would not
be. A token of the hook's identity is then worth the operator's token, which is why it must live
where the operator's does: a ServiceAccount of quorum's namespace, where on Kubernetes 1.37
quorum's self-protection keeps customers from minting tokens, creating pods or Secrets
(docs/threat-model.md); a chart should create it as a hook resource that is deleted after the
hook. The exact rules of `--admission-only` for quorum in quorum-system, the probe in `default`
(ServiceAccount quorum-lifecycle; tests/unit/test_uninstall.py checks this text against
`removal.rights`, tests/integration/test_uninstall.py runs the command with exactly these; the
Lease, the suspended Jobs and the reservation taints need no right of their own: it acts on them
as the operator, whose RBAC lets it read and update its Lease, list Gangs and pods, read and
patch Jobs, list and patch nodes, and whose fence lets it change only a Job's spec.suspend and a
node's quorum.dev/reserved taints; whether the backstop's binding and the mutating webhook are
there it asks with a dry-run deletion):

    apiVersion: rbac.authorization.k8s.io/v1
    kind: ClusterRole
    metadata: {name: quorum-lifecycle}
    rules:
    - apiGroups: [admissionregistration.k8s.io]
      resources: [validatingadmissionpolicybindings]
      verbs: [delete]
      resourceNames: [quorum-gang-backstop, quorum-gate-protection, quorum-gang-pods,
        quorum-gang-pods-warnings, quorum-interruptable-pods, quorum-interruptable-gang-pods]
    - apiGroups: [admissionregistration.k8s.io]
      resources: [mutatingwebhookconfigurations]
      verbs: [delete]
      resourceNames: [quorum-webhooks]
    - apiGroups: [admissionregistration.k8s.io]
      resources: [mutatingadmissionpolicybindings]
      verbs: [delete]
      resourceNames: [quorum-pod-defaults]
    - apiGroups: [admissionregistration.k8s.io]
      resources: [mutatingadmissionpolicies]
      verbs: [delete]
      resourceNames: [quorum-pod-defaults]
    - apiGroups: [admissionregistration.k8s.io]
      resources: [validatingadmissionpolicies]
      verbs: [delete]
      resourceNames: [quorum-gate-protection, quorum-gang-pods, quorum-gang-pods-warnings,
        quorum-interruptable-pods, quorum-interruptable-gang-pods, quorum-gang-backstop]
    - apiGroups: [admissionregistration.k8s.io]
      resources: [validatingwebhookconfigurations]
      verbs: [delete]
      resourceNames: [quorum-webhooks]
    ---
    apiVersion: rbac.authorization.k8s.io/v1
    kind: Role
    metadata: {name: quorum-lifecycle, namespace: default}
    rules:
    - apiGroups: ['']
      resources: [pods]
      verbs: [create]
    ---
    apiVersion: rbac.authorization.k8s.io/v1
    kind: Role
    metadata: {name: quorum-lifecycle, namespace: quorum-system}
    rules:
    - apiGroups: ['']
      resources: [serviceaccounts]
      verbs: [impersonate]
      resourceNames: [quorum-operator]

(`create pods` in the probe's namespace is for the server-side dry run of the probe alone; RBAC
cannot grant dry runs only.) The full uninstall also deletes, by name, the Deployments in NS,
the fences (policies and bindings), quorum's ClusterRoles and ClusterRoleBindings (the chart's
hook identities' too), quorum's objects in NS (`removal.NAMESPACED`) and the hook's Role in the
probe namespace, and the namespace if it is quorum's (read first: its label, is it terminating
already); reads and deletes quorum's CRDs and lists their objects (the count it reports), and
lists and patches nodes (the reservation taints, once the operator's RBAC is gone):
`removal.rights(removal_plan(NS), NS, PROBE)` lists it; it is meant for a person with
cluster-admin rights.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import sys
import time
from collections import Counter
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass, field
from typing import Any, Protocol, TypeVar

from kubernetes_asyncio import client
from kubernetes_asyncio.client.exceptions import ApiException

from quorum import install
from quorum.core import lifecycle, removal
from quorum.core.gangs import GANG_LABEL, RESERVED_TAINT, is_gated
from quorum.core.record import GangRecord
from quorum.core.removal import Action, Kind, Ref, Step
from quorum.core.times import micro_time, timestamp
from quorum.k8s import objects, reads, writes
from quorum.k8s.client import KubeconfigError, command_client
from quorum.operator import manual
from quorum.operator.leader import LeaseSettings

JSON = dict[str, Any]
T = TypeVar("T")
POD = Kind("", "v1", "pods", "Pod", namespaced=True)
GANG = Kind("quorum.dev", "v1alpha1", "gangs", "Gang", namespaced=True)
JOB = Kind("batch", "v1", "jobs", "Job", namespaced=True)
DEFAULT_REASON = "uninstalling quorum"
DEFAULT_PROBE_NAMESPACE = removal.DEFAULT_PROBE_NAMESPACE
ACCEPTED_IN_A_ROW = 3  # several apiservers each drop the binding on their own
RELEASE_ROUNDS = 3
DEFAULT_LEASE_SECONDS = 15  # a Lease that records no duration: quorum-operator's default
# On the Lease while the uninstall holds it: whom it was taken from, and until when that holder
# may still act (a re-run of a run cut off while it waited waits the rest).
PREVIOUS_HOLDER = "quorum.dev/uninstall-previous-holder"
WAITS_UNTIL = "quorum.dev/uninstall-waits-until"
JOB_POD_LABEL = "batch.kubernetes.io/controller-uid"  # the Job controller's label on its pods


class UninstallError(RuntimeError):
    """A step failed; the message says which, why and what to do."""


class LeaseLost(UninstallError):
    """The Lease the run holds is held by another now: a replica may act; the run stops."""


@dataclass(frozen=True)
class SuspendedJob:
    """A Job quorum suspended (recorded on its gang's Gang, `status.recovery.suspendedJobs`) that
    still is: its status's counts of active and terminating pods, and how many pods it controls
    were listed neither Succeeded nor Failed."""

    namespace: str
    name: str
    uid: str
    gang: str
    active: int = 0
    terminating: int = 0
    listed: int = 0

    @property
    def pods(self) -> int:
        """Its pods left, as far as anything says."""
        return max(self.active + self.terminating, self.listed)

    @property
    def may_resume(self) -> bool:
        return lifecycle.job_may_resume(self.active, self.terminating, self.listed)

    def __str__(self) -> str:
        return f"Job {self.namespace}/{self.name} (suspended by quorum, gang {self.namespace}/{self.gang})"


@dataclass(frozen=True)
class GatedPod:
    """A pod that carries quorum's gate; `created`: its creationTimestamp (the apiserver's
    clock), epoch seconds."""

    namespace: str
    name: str
    gang: str
    created: float

    def __str__(self) -> str:
        return f"{self.namespace}/{self.name}"


class UninstallApi(Protocol):
    async def delete(self, ref: Ref, dry_run: bool) -> bool:
        """Delete (or, with dry_run, ask whether it would be allowed); False if it is gone."""
        ...

    async def read(self, ref: Ref) -> JSON | None: ...

    async def count(self, kind: Kind) -> int: ...

    async def lease(self, ref: Ref) -> JSON | None:
        """The Lease, read as quorum's operator; None if there is none."""
        ...

    async def write_lease(self, ref: Ref, body: JSON, create: bool, dry_run: bool) -> None:
        """Create or replace (resourceVersion-tested: 409 if it changed) the Lease, as quorum's
        operator; with dry_run, ask the apiserver whether it would allow it."""
        ...

    async def probe_backstop(self, namespace: str) -> str | None:
        """None if a pod only the backstop refuses is admitted (server-side dry run, on a
        connection of its own); the backstop's refusal otherwise. Any other refusal raises
        ApiException."""
        ...

    async def probe_mutating(self, namespace: str) -> tuple[bool, float | None]:
        """Whether the mutating webhook still gates a gang pod (server-side dry run, on a
        connection of its own), and when (the probe's creationTimestamp: the apiserver's
        clock, epoch seconds; None if it gave none)."""
        ...

    async def gated_pods(self) -> tuple[str, list[GatedPod]]:
        """(acting identity, every pod that carries quorum's gate and gang label)."""
        ...

    async def release_gated(
        self, reason: str, by: str, created_before: float | None
    ) -> tuple[str, list[str]]:
        """Release every gated gang pod created no later than `created_before` (None: all):
        (acting identity, one line per gang)."""
        ...

    async def suspended_jobs(self) -> tuple[str, list[SuspendedJob]]:
        """(acting identity, the Jobs quorum suspended that still are; none once the Gang CRD is
        gone)."""
        ...

    async def resume_job(self, job: SuspendedJob, dry_run: bool) -> tuple[str, bool]:
        """Resume it, uid-tested (with dry_run: ask the apiserver whether it would allow it):
        (acting identity, False if it is gone or was replaced)."""
        ...

    async def reserved_nodes(self) -> tuple[str, dict[str, list[str]]]:
        """(acting identity, the values of the reservation taints of each node that has one)."""
        ...

    async def unreserve(self, node: str, dry_run: bool) -> tuple[str, list[str]]:
        """Remove every reservation taint from `node` and nothing else of it (with dry_run: ask
        the apiserver whether it would allow it): (acting identity, the values removed, or that
        would be; [] if it has none or is gone)."""
        ...

    async def caller(self) -> str: ...


class LiveUninstallApi:
    """`UninstallApi` on two clients: the caller's, and the caller impersonating quorum's
    operator (for its Lease, the release, the Jobs quorum suspended and the reservation taints).
    When the operator's identity may not list pods, Gangs or nodes any more (its RBAC is gone:
    later in step 4, a re-run, or after Helm deleted it), these act as the caller: then the
    gate protection is gone too (it goes before the RBAC). Its Lease never: as the caller the
    command would make one in a namespace quorum's operator has no rights in."""

    def __init__(self, api: client.ApiClient, operator: client.ApiClient, operator_name: str) -> None:
        self.api, self.operator, self.operator_name = api, operator, operator_name

    async def delete(self, ref: Ref, dry_run: bool) -> bool:
        return await objects.delete(self.api, ref, dry_run)

    async def read(self, ref: Ref) -> JSON | None:
        return await objects.read(self.api, ref)

    async def count(self, kind: Kind) -> int:
        return await objects.count(self.api, kind)

    async def lease(self, ref: Ref) -> JSON | None:
        return await objects.read(self.operator, ref)

    async def write_lease(self, ref: Ref, body: JSON, create: bool, dry_run: bool) -> None:
        if create:
            await objects.create(self.operator, ref.kind, ref.namespace, body, dry_run)
        else:
            await objects.replace(self.operator, ref, body, dry_run)

    async def probe_backstop(self, namespace: str) -> str | None:
        try:
            await objects.dry_run_create(
                self.api, POD, namespace, removal.BACKSTOP_PROBE, fresh_connection=True
            )
        except ApiException as err:
            message = refusal(err)
            if removal.BACKSTOP in message:
                return message
            raise
        return None

    async def probe_mutating(self, namespace: str) -> tuple[bool, float | None]:
        admitted = await objects.dry_run_create(
            self.api, POD, namespace, removal.MUTATING_PROBE, fresh_connection=True
        )
        at = timestamp((admitted.get("metadata") or {}).get("creationTimestamp"))
        return is_gated(admitted), at or None

    async def _acting(self, call: Callable[[client.ApiClient], Awaitable[T]]) -> tuple[str, T]:
        try:
            return self.operator_name, await call(self.operator)
        except ApiException as as_operator:
            if as_operator.status != 403:
                raise
            try:
                return await self.caller() or "you", await call(self.api)
            except ApiException as as_caller:
                both = f"as {self.operator_name}: {refusal(as_operator)}; as yourself: {refusal(as_caller)}"
                as_caller.body = both.encode()
                raise as_caller from as_operator

    async def gated_pods(self) -> tuple[str, list[GatedPod]]:
        async def gated(api: client.ApiClient) -> list[GatedPod]:
            pods = await reads.gang_pods(api, None, None)
            return [
                GatedPod(
                    p["metadata"]["namespace"],
                    p["metadata"]["name"],
                    p["metadata"]["labels"][GANG_LABEL],
                    manual.created(p),
                )
                for p in pods
                if is_gated(p)
            ]

        return await self._acting(gated)

    async def release_gated(
        self, reason: str, by: str, created_before: float | None
    ) -> tuple[str, list[str]]:
        return await self._acting(lambda api: manual.release_gangs(api, None, reason, by, created_before))

    async def suspended_jobs(self) -> tuple[str, list[SuspendedJob]]:
        return await self._acting(suspended_jobs)

    async def resume_job(self, job: SuspendedJob, dry_run: bool) -> tuple[str, bool]:
        async def resume(api: client.ApiClient) -> bool:
            if dry_run:
                ref = Ref(JOB, job.name, job.namespace)
                return await objects.patch_would_apply(api, ref, writes.job_suspend_patch(job.uid, False))
            return await writes.set_job_suspend(api, job.namespace, job.name, job.uid, False)

        return await self._acting(resume)

    async def reserved_nodes(self) -> tuple[str, dict[str, list[str]]]:
        async def listed(api: client.ApiClient) -> dict[str, list[str]]:
            nodes = await objects.items(api, removal.NODE)
            return {n["metadata"]["name"]: reservations(n) for n in nodes if reservations(n)}

        return await self._acting(listed)

    async def unreserve(self, node: str, dry_run: bool) -> tuple[str, list[str]]:
        return await self._acting(lambda api: unreserve(api, node, dry_run))

    async def caller(self) -> str:
        return await objects.caller_name(self.api)  # "": the record says "someone"


async def suspended_jobs(api: client.ApiClient) -> list[SuspendedJob]:
    """The Jobs the Gangs record as suspended by quorum (a recovery's or a preemption's) and
    that still are suspended, as quorum's recovery reads them: with their status's counts and
    their pods listed (by the Job controller's label with the Job's uid)."""
    try:
        gangs = await objects.items(api, GANG)
    except ApiException as err:
        if err.status == 404:  # the CRD is gone, and the records with it
            return []
        raise
    out = []
    for gang in gangs:
        meta = gang["metadata"]
        recovery = GangRecord.of(gang).recovery
        for name in recovery.suspended_jobs if recovery is not None else ():
            job = await reads.job(api, meta["namespace"], str(name))
            if job is None or not (job.get("spec") or {}).get("suspend"):
                continue  # gone, or resumed (by quorum's recovery, or someone)
            status, uid = job.get("status") or {}, job["metadata"]["uid"]
            pods = await objects.items(
                api, POD, label_selector=f"{JOB_POD_LABEL}={uid}", namespace=meta["namespace"]
            )
            listed = sum(
                1 for p in pods if (p.get("status") or {}).get("phase") not in ("Succeeded", "Failed")
            )
            out.append(
                SuspendedJob(
                    meta["namespace"],
                    str(name),
                    uid,
                    meta["name"],
                    int(status.get("active") or 0),
                    int(status.get("terminating") or 0),
                    listed,
                )
            )
    return out


def reservations(node: JSON) -> list[str]:
    """The values (preemption tokens) of the node's reservation taints."""
    taints = (node.get("spec") or {}).get("taints") or []
    return [str(t.get("value") or "") for t in taints if t.get("key") == RESERVED_TAINT]


async def unreserve(api: client.ApiClient, name: str, dry_run: bool, misses: int = 10) -> list[str]:
    """Remove the node's reservation taints one by one, as quorum's operator removes a stray one
    (`writes.untaint_patch`, `writes.patch_node`): each by a JSON patch that tests the taint is
    still at its place, so nothing else of the node changes; a node changed meanwhile is read
    again. Read by a list (quorum's operator may list nodes, not get them)."""
    removed: list[str] = []
    for _ in range(misses):
        found = await objects.items(api, removal.NODE, f"metadata.name={name}")
        ops = writes.untaint_patch(found[0], None) if found else None
        if ops is None:
            return removed
        if dry_run:
            if await objects.patch_would_apply(api, Ref(removal.NODE, name), ops):
                return reservations(found[0])
        elif await writes.patch_node(api, found[0], ops):
            removed.append(str(ops[0]["value"].get("value") or ""))
    raise UninstallError(
        f"node {name} changed {misses} times while its reservation taint was being removed; run "
        "quorum uninstall again"
    )


@dataclass
class Report:
    """What a run printed, whether anything was (or would be) changed or refused, and what the
    steps tell the ones after them: until when a gated pod was gated by quorum (`gated_before`,
    the apiserver's clock: set once the mutating webhook's drop is seen) and which pods gated by
    their creator were named already."""

    say: Callable[[str], None]
    lines: list[str] = field(default_factory=list)
    changed: bool = False
    refused: bool = False
    gated_before: float | None = None
    told: set[str] = field(default_factory=set)

    def line(self, step: Step, text: str, changed: bool = False) -> None:
        self.changed = self.changed or changed
        self.lines.append(f"{step.number}. {text}")
        self.say(self.lines[-1])

    def more(self, text: str) -> None:
        self.lines.append(f"   {text}")
        self.say(self.lines[-1])


refusal = objects.refusal  # an apiserver's refusal in a line


async def uninstall(
    api: UninstallApi,
    steps: Sequence[Step],
    *,
    dry_run: bool = False,
    reason: str = DEFAULT_REASON,
    probe_namespace: str = DEFAULT_PROBE_NAMESPACE,
    timeout: float = 60.0,
    interval: float = 0.5,
    delete_tenant_objects: bool = False,
    say: Callable[[str], None] = print,
    sleep: Callable[[float], Awaitable[None]] = asyncio.sleep,
    now: Callable[[], float] = time.time,
    background_sleep: Callable[[float], Awaitable[None]] = asyncio.sleep,
) -> Report:
    """Carry out `steps` in order (see the module docstring). Raises UninstallError at the first
    step that fails (with --dry-run: reports every refusal and goes on)."""
    report = Report(say)
    run = Run(
        api, report, dry_run, reason, probe_namespace, timeout, interval, sleep, now, delete_tenant_objects
    )
    run.background_sleep = background_sleep

    async def all_steps() -> None:
        for step in steps:
            run.step = step
            try:
                await run.renew_if_due(step)
                await run.one(step)
            except ApiException as err:
                what = f"{step.action} {step.target or ''}".strip()
                if dry_run:
                    report.refused = True
                    report.line(step, f"{what}: would be refused: {refusal(err)}")
                    continue
                raise UninstallError(
                    f"step {step.number}, {what}: the apiserver refused: {refusal(err)}"
                ) from err

    main = asyncio.create_task(all_steps())
    renewer = asyncio.create_task(run.keep_renewed(main))
    try:
        await main
    except asyncio.CancelledError:
        if run.lost is None or not main.cancelled():
            raise
        raise run.lost from None
    finally:
        renewer.cancel()
        await asyncio.gather(renewer, return_exceptions=True)
    return report


@dataclass
class Run:
    """One run's settings, and each step's doing."""

    api: UninstallApi
    report: Report
    dry_run: bool
    reason: str
    probe_namespace: str
    timeout: float
    interval: float
    sleep: Callable[[float], Awaitable[None]]
    now: Callable[[], float]
    delete_tenant_objects: bool
    held: Ref | None = None  # the Lease step 0 took, while this run renews it
    renewed_at: float = 0.0  # when it was last written (`now`)
    step: Step | None = None  # the step running now
    lost: UninstallError | None = None  # why the background renewal stopped the run
    background_sleep: Callable[[float], Awaitable[None]] = asyncio.sleep
    lease_lock: asyncio.Lock = field(default_factory=asyncio.Lock)

    async def one(self, step: Step) -> None:
        target = step.target
        if step.action is Action.HOLD_LEASE:
            assert target is not None
            await self.hold_lease(step, target)
        elif step.action is Action.DELETE:
            assert target is not None
            await self.delete(step, target)
        elif step.action is Action.DELETE_IF_QUORUMS:
            assert target is not None
            if target.kind is removal.NAMESPACE:
                await self.delete_namespace(step, target)
            else:
                await self.delete_crd(step, target)
        elif step.action is Action.CHECK_BACKSTOP_APPLIES:
            assert target is not None
            await self.check_backstop(step, target)
        elif step.action is Action.CHECK_MUTATING_APPLIES:
            assert target is not None
            await self.check_mutating(step, target)
        elif step.action in (Action.WAIT_BACKSTOP_DROPPED, Action.WAIT_MUTATING_DROPPED):
            await self.wait_dropped(step)
        elif step.action is Action.RELEASE_GATED:
            await self.release(step)
        elif step.action is Action.RESUME_JOBS:
            await self.resume_jobs(step)
        elif step.action is Action.SWEEP_GATED:
            await self.sweep(step)
        elif step.action is Action.REMOVE_RESERVATIONS:
            await self.remove_reservations(step)
        elif step.action is Action.LEAVE_LEASE:
            assert target is not None
            await self.leave_lease(step, target)

    # -- step 0: quorum-operator stops acting ------------------------------------------------

    async def hold_lease(self, step: Step, ref: Ref, attempts: int = 5) -> None:
        """Take quorum-operator's leader Lease for `removal.UNINSTALL_HOLDER` (as the operator)
        and wait until the replica that held it can no longer act: the `acts_at_most` of the
        lease duration it recorded, plus `removal.LEASE_MARGIN`. Held already (a run before
        took it): renewed, and only what that run had left to wait is waited. Taken (not in a
        dry run), it is held `hold` seconds at a time and renewed while the run goes on
        (`renew_if_due`)."""
        report, hold = self.report, self.hold
        for _ in range(attempts):  # a renewal between the read and the write: read again
            try:
                lease = await self.api.lease(ref)
            except ApiException as err:
                if err.status != 403:
                    raise
                report.line(
                    step,
                    f"{ref}: quorum-operator may not read it (its RBAC is gone): none of its replicas can "
                    "lead, nothing to take",
                )
                return
            spec = (lease or {}).get("spec") or {}
            holder = str(spec.get("holderIdentity") or "")
            annotations = ((lease or {}).get("metadata") or {}).get("annotations") or {}
            written = self.now()
            stamp = micro_time(written)
            ours = {
                "holderIdentity": removal.UNINSTALL_HOLDER,
                "leaseDurationSeconds": hold,
                "renewTime": stamp,
            }
            recorded = int(spec.get("leaseDurationSeconds") or DEFAULT_LEASE_SECONDS)
            acts = LeaseSettings.for_duration(ref.namespace or "", recorded).acts_at_most()
            wait = 0.0
            if lease is None:
                if await self.operator_may_run(ref):
                    wait = acts + removal.LEASE_MARGIN
                body: JSON = {
                    "apiVersion": "coordination.k8s.io/v1",
                    "kind": "Lease",
                    "metadata": {
                        "name": ref.name,
                        "namespace": ref.namespace,
                        "annotations": {WAITS_UNTIL: micro_time(self.now() + wait)},
                    },
                    "spec": {**ours, "acquireTime": stamp, "leaseTransitions": 0},
                }
            elif holder == removal.UNINSTALL_HOLDER:
                body = {**lease, "spec": {**spec, **ours}}
                wait = max(0.0, timestamp(annotations.get(WAITS_UNTIL)) - self.now())
            else:
                if holder:
                    wait = acts + removal.LEASE_MARGIN
                meta = dict(lease.get("metadata") or {})
                meta["annotations"] = {
                    **annotations,
                    PREVIOUS_HOLDER: holder,
                    WAITS_UNTIL: micro_time(self.now() + wait),
                }
                transitions = int(spec.get("leaseTransitions") or 0) + 1
                body = {
                    **lease,
                    "metadata": meta,
                    "spec": {**spec, **ours, "acquireTime": stamp, "leaseTransitions": transitions},
                }
            try:
                await self.api.write_lease(ref, body, create=lease is None, dry_run=self.dry_run)
            except ApiException as err:
                if err.status == 409:
                    continue  # renewed, or made, meanwhile
                if lease is None and err.status == 404:
                    report.line(step, f"{ref}: none, and namespace {ref.namespace} is gone: nothing to take")
                    return
                if lease is None and err.status == 403:
                    report.line(
                        step,
                        f"{ref}: none, and quorum-operator may not make it (its RBAC is gone, or quorum "
                        f"is not installed in {ref.namespace}): none of its replicas can lead, nothing to "
                        "take",
                    )
                    return
                raise
            self.told_lease(step, ref, lease, holder, recorded, acts, wait, hold)
            if not self.dry_run:
                self.held, self.renewed_at = ref, written
            if wait > 0 and not self.dry_run:
                await self.pause(step, wait)
                report.line(
                    step,
                    f"{ref}: held by {removal.UNINSTALL_HOLDER}: no replica of quorum-operator acts now "
                    f"(each sees another holder, for {hold} s at a time: renewed while the run goes on)",
                )
            return
        raise UninstallError(
            f"step {step.number}: {ref} changed {attempts} times while it was being taken: is "
            "quorum-operator starting up? Run quorum uninstall again"
        )

    async def operator_may_run(self, ref: Ref) -> bool:
        """Whether a replica of quorum-operator may lead although its Lease is absent (someone
        deleted it while a leader acted): its Deployment has ready replicas, or cannot be read."""
        deployment = Ref(removal.DEPLOYMENT, removal.OPERATOR_SERVICE_ACCOUNT, ref.namespace)
        try:
            found = await self.api.read(deployment)
        except ApiException:
            return True
        return found is not None and int(((found.get("status") or {}).get("readyReplicas")) or 0) > 0

    def told_lease(
        self,
        step: Step,
        ref: Ref,
        lease: JSON | None,
        holder: str,
        recorded: int,
        acts: float,
        wait: float,
        hold: int,
    ) -> None:
        report, uninstall = self.report, removal.UNINSTALL_HOLDER
        if self.dry_run:
            if holder == uninstall:
                report.line(
                    step, f"{ref}: held by {uninstall} already (a run before took it): would renew it"
                )
            elif holder:
                report.line(
                    step,
                    f"{ref}: would take it from {holder} (its lease {recorded} s) and wait {wait:.0f} s "
                    "until it can no longer act",
                    changed=True,
                )
            else:
                report.line(step, f"{ref}: no replica holds it: would take it", changed=True)
            return
        if holder == uninstall:
            more = (
                f"; waiting {wait:.0f} s more, until the replica it was taken from can no longer act"
                if wait
                else ""
            )
            report.line(
                step, f"{ref}: held by {uninstall} already (a run before took it): renewed for {hold} s{more}"
            )
        elif holder:
            report.line(
                step,
                f"{ref}: taken from {holder} (its lease {recorded} s) for {uninstall}, held {hold} s; "
                f"waiting {wait:.0f} s: a leader acts at most {acts:.0f} s after its last renewal "
                f"(quorum/operator/leader.py), plus {removal.LEASE_MARGIN:.0f} s",
                changed=True,
            )
        elif wait:
            report.line(
                step,
                f"{ref}: made it, held by {uninstall} for {hold} s; quorum-operator's Deployment has ready "
                f"replicas, so one may have led without it: waiting {wait:.0f} s ({acts:.0f} s a leader acts "
                f"at most, plus {removal.LEASE_MARGIN:.0f} s)",
                changed=True,
            )
        else:
            made = "made it" if lease is None else "no replica held it"
            report.line(
                step,
                f"{ref}: {made}; held by {uninstall} for {hold} s: no replica of quorum-operator acts",
                changed=True,
            )

    # -- the Lease, held while the run goes on ----------------------------------------------------

    @property
    def hold(self) -> int:
        return removal.lease_hold_seconds(self.timeout)

    async def renew_if_due(self, step: Step) -> None:
        """Renew the Lease step 0 took, quietly, once a quarter of the hold has passed since it
        was last written: before each step, between the looks of a step that waits (`pause`),
        and from `keep_renewed` while a step runs. Nothing in a dry run (nothing was taken)."""
        async with self.lease_lock:
            if self.held is not None and self.now() - self.renewed_at >= self.hold / 4:
                await self.renew_lease(step, self.hold)

    async def keep_renewed(self, main: asyncio.Task[Any]) -> None:
        """In the background while the run goes on (cancelled at its end): every quarter of the
        hold, renew the Lease if due, so that a step that runs long (a release of many pods, one
        call each) never lets it run out. A Lease found held by another stops the run at once (the
        running step is cancelled); a renewal that fails otherwise is tried again until half the
        hold has passed since the last one, then stops the run too."""
        while True:
            await self.background_sleep(self.hold / 4)
            step = self.step
            if self.held is None or step is None:
                continue
            try:
                await self.renew_if_due(step)
            except LeaseLost as err:
                self.lost = err
            except (UninstallError, ApiException, OSError, TimeoutError) as err:
                if self.now() - self.renewed_at < self.hold / 2:
                    continue
                self.lost = UninstallError(
                    f"step {step.number}: the Lease {self.held} could not be renewed for "
                    f"{self.now() - self.renewed_at:.0f} s (held {self.hold} s at a time): {err}. The run "
                    "stopped before a replica of quorum-operator could take it back; run quorum uninstall "
                    "again"
                )
            if self.lost is not None:
                main.cancel()
                return

    async def pause(self, step: Step, seconds: float) -> None:
        """Sleep `seconds`; while the Lease is held, in pieces of at most a quarter of the hold,
        renewing it when due before each."""
        while True:
            await self.renew_if_due(step)
            piece = seconds if self.held is None else min(seconds, self.hold / 4)
            await self.sleep(piece)
            seconds -= piece
            if seconds <= 0:
                return

    async def renew_lease(self, step: Step, seconds: int, attempts: int = 5) -> bool:
        """Write the held Lease again as quorum's operator: `removal.UNINSTALL_HOLDER`, renewTime
        now, for `seconds`; resourceVersion-tested (a 409: read again). One gone meanwhile
        (deleted) is made again, held. False, and no longer renewed, if quorum-operator may no
        longer read or write it (403: its RBAC is gone) or its namespace is gone (404): then none
        of its replicas can lead either. Held by another (the hold ran out and a replica took
        it): the run stops."""
        ref = self.held
        assert ref is not None
        for _ in range(attempts):
            try:
                lease = await self.api.lease(ref)
                spec = (lease or {}).get("spec") or {}
                holder = str(spec.get("holderIdentity") or "")
                if lease is not None and holder != removal.UNINSTALL_HOLDER:
                    raise LeaseLost(
                        f"step {step.number}: {ref} is held by {holder or 'nobody'} now, "
                        f"{self.now() - self.renewed_at:.0f} s after the uninstall last renewed it (for "
                        f"{self.hold} s): a replica of quorum-operator may have acted since. Run quorum "
                        "uninstall again: it takes the Lease again and waits until that replica can no "
                        "longer act"
                    )
                written = self.now()
                stamp = micro_time(written)
                ours = {
                    "holderIdentity": removal.UNINSTALL_HOLDER,
                    "leaseDurationSeconds": seconds,
                    "renewTime": stamp,
                }
                if lease is None:
                    body: JSON = {
                        "apiVersion": "coordination.k8s.io/v1",
                        "kind": "Lease",
                        "metadata": {"name": ref.name, "namespace": ref.namespace},
                        "spec": {**ours, "acquireTime": stamp, "leaseTransitions": 0},
                    }
                else:
                    body = {**lease, "spec": {**spec, **ours}}
                await self.api.write_lease(ref, body, create=lease is None, dry_run=False)
            except ApiException as err:
                if err.status == 409:
                    continue  # changed, or made, meanwhile: read again
                if err.status in (403, 404):
                    self.held = None
                    return False
                raise UninstallError(
                    f"step {step.number}: renewing {ref} (held by {removal.UNINSTALL_HOLDER}): the apiserver "
                    f"refused: {refusal(err)}. Run quorum uninstall again"
                ) from err
            self.renewed_at = written
            return True
        raise UninstallError(
            f"step {step.number}: {ref} changed {attempts} times while it was being renewed: is "
            "quorum-operator starting up? Run quorum uninstall again"
        )

    async def leave_lease(self, step: Step, ref: Ref) -> None:
        """The end of `--admission-only`: the Lease held `removal.LEASE_LEFT_SECONDS` more, past
        the operator pods' termination as Helm deletes them after the hook; not renewed again.
        Not a change: a re-run that finds nothing else to do has changed nothing."""
        left = removal.LEASE_LEFT_SECONDS
        why = (
            "past the operator pods' termination as Helm deletes them; an operator installed again acts "
            "after that"
        )
        if self.dry_run:
            self.report.line(step, f"{ref}: would be held for {left} s more: {why}")
            return
        async with self.lease_lock:  # not renewed for the hold by the background meanwhile
            renewed = self.held is not None and await self.renew_lease(step, left)
            self.held = None
        if not renewed:
            self.report.line(
                step,
                f"{ref}: not held by {removal.UNINSTALL_HOLDER}: quorum-operator may not write it (its RBAC "
                "or namespace is gone), so none of its replicas can lead: nothing to leave held",
            )
            return
        self.report.line(step, f"{ref}: held for {left} s more: {why}")

    # -- deletions -------------------------------------------------------------------------------

    async def delete(self, step: Step, target: Ref) -> None:
        if target == self.held:
            async with self.lease_lock:  # no renewal in flight makes it again
                self.held = None  # the full run's last objects: the Lease goes, no longer renewed
        if await self.api.delete(target, self.dry_run):
            self.report.line(step, f"{target}: {'would delete' if self.dry_run else 'deleted'}", changed=True)
        else:
            self.report.line(step, f"{target}: already gone")

    async def delete_namespace(self, step: Step, target: Ref) -> None:
        """quorum's namespace goes only if quorum made it (labelled quorum's): one it was
        installed into (a shared one, Helm's --create-namespace) stays with all else in it."""
        found = await self.api.read(target)
        if found is None:
            self.report.line(step, f"{target}: already gone")
            return
        if found["metadata"].get("deletionTimestamp"):  # deleting it again answers "deleted" again
            self.report.line(step, f"{target}: being deleted already (what is in it goes first)")
            return
        if not removal.is_quorums(found["metadata"].get("labels")):
            label = f"{removal.PART_OF_LABEL}={removal.PART_OF_VALUE}"
            self.report.line(
                step,
                f"{target}: left: not labelled {label}, so quorum did not make it (it was installed into it: "
                "Helm's --create-namespace, or a namespace shared with others); quorum's objects in it were "
                "deleted by name above, everything else in it stays",
            )
            return
        await self.delete(step, target)

    async def delete_crd(self, step: Step, crd: Ref) -> None:
        """A CRD of quorum's goes with its objects only if they are quorum's own (Gangs), there
        are none, or the caller said so: deleting a PodGroup CRD deletes every tenant's
        PodGroups."""
        api, report = self.api, self.report
        found = await api.read(crd)
        if found is None:
            report.line(step, f"{crd}: already gone")
            return
        if not removal.is_quorums(found["metadata"].get("labels")):
            label = f"{removal.PART_OF_LABEL}={removal.PART_OF_VALUE}"
            report.line(step, f"{crd}: left: not labelled {label}, so someone else installed it")
            return
        names = found["spec"]["names"]
        served = [v["name"] for v in found["spec"].get("versions") or [] if v.get("served")]
        group, plural = removal.crd_resource(crd.name)
        existing = (
            await api.count(Kind(group, served[0], plural, names["kind"], namespaced=True)) if served else 0
        )
        if existing and crd.name not in removal.QUORUMS_OWN_CRDS and not self.delete_tenant_objects:
            report.line(
                step,
                f"{crd}: left: it holds {existing} {names['kind']} object(s) of tenants, which would go with "
                "it (--delete-crds deletes them too)",
            )
            return
        with_objects = f", and with it {existing} {names['kind']} object(s)"
        if await api.delete(crd, self.dry_run):
            report.line(
                step, f"{crd}: {'would delete' if self.dry_run else 'deleted'}{with_objects}", changed=True
            )
        else:
            report.line(step, f"{crd}: already gone")

    # -- step 1: the probes ----------------------------------------------------------------------

    def where(self) -> str:
        return f"(server-side dry run in namespace {self.probe_namespace})"

    async def backstop_refusal(self) -> str | None:
        refused = await self.api.probe_backstop(self.probe_namespace)
        if refused is not None and install.STATIC_SUFFIX in refused:
            raise UninstallError(
                f"step 1: the backstop is loaded from the apiserver's disk ({removal.BACKSTOP}"
                f"{install.STATIC_SUFFIX}), which no API call removes: take quorum's files out of the "
                "kube-apiserver's staticManifestsDir (docs/threat-model.md), then run quorum uninstall again"
            )
        return refused

    async def check_backstop(self, step: Step, binding: Ref) -> None:
        """Positive evidence before the binding goes: while it is there, the apiserver refuses the
        probe. Else the probe namespace is not one the backstop covers, and the probe's acceptance
        after the deletion would prove nothing: the run stops before deleting anything."""
        if not await self.api.delete(binding, dry_run=True):
            self.report.line(step, f"{binding}: already gone: nothing to check")
            return
        if await self.backstop_refusal() is not None:
            self.report.line(
                step, f"{binding}: the apiserver refuses a probe pod only the backstop refuses {self.where()}"
            )
            return
        excluded = ", ".join(removal.admission_excluded("<quorum's namespace>"))
        problem = (
            f"step 1: {binding} is there, yet the apiserver admits a probe pod only the backstop refuses "
            f"{self.where()}: the backstop does not cover namespace {self.probe_namespace}, so the probe "
            "cannot show when it is no longer enforced. Nothing was deleted; pass --probe-namespace a "
            f"namespace it covers (any but {excluded}, and any its namespaceSelector was changed to leave "
            f"out), or put back its policy {removal.BACKSTOP} if it was deleted or changed"
        )
        if not self.dry_run:
            raise UninstallError(problem)
        self.report.refused = True
        self.report.line(step, f"would fail: {problem}")

    async def check_mutating(self, step: Step, webhook: Ref) -> None:
        """Positive evidence before the webhook goes: while it is there, the probe gang pod comes
        back gated. Ungated, its server does not answer and it fails open (failurePolicy Ignore):
        its deletion changes nothing for pods, which is said, and the run goes on."""
        if not await self.api.delete(webhook, dry_run=True):
            self.report.line(step, f"{webhook}: already gone: nothing to check")
            return
        gated, _ = await self.api.probe_mutating(self.probe_namespace)
        if gated:
            self.report.line(step, f"{webhook}: a probe gang pod comes back gated {self.where()}")
        else:
            self.report.line(
                step,
                f"{webhook}: a probe gang pod comes back ungated while it is there {self.where()}: its "
                "server does not answer and it fails open (failurePolicy Ignore), so deleting it changes "
                "nothing for pods; going on",
            )

    async def wait_dropped(self, step: Step) -> None:
        """Wait until the apiserver no longer applies the admission object just deleted (its
        informer drops it a moment later): the step's probe pod, created with a server-side dry
        run on a connection of its own, is admitted (the backstop) or left ungated (the mutating
        webhook) `ACCEPTED_IN_A_ROW` times in a row, `interval` apart. The mutating webhook's
        drop, seen, sets until when a gated pod was gated by quorum (`Report.gated_before`)."""
        api, report, timeout = self.api, self.report, self.timeout
        backstop = step.action is Action.WAIT_BACKSTOP_DROPPED
        if backstop:
            what = f"the apiserver admits a probe pod only the backstop refuses {self.where()}"
            done = "the backstop is no longer enforced"
        else:
            what = f"the apiserver no longer gates a probe gang pod {self.where()}"
            done = "the mutating webhook is no longer called"
        seen: list[float | None] = [None]

        async def still_applied() -> str | None:
            if backstop:
                return await self.backstop_refusal()
            gated, seen[0] = await api.probe_mutating(self.probe_namespace)
            return "the probe gang pod came back gated" if gated else None

        if self.dry_run:
            await still_applied()  # raises if the probe itself would be refused
            report.line(step, f"would wait (at most {timeout:.0f} s) until {what}")
            return
        deadline = time.monotonic() + timeout
        in_a_row = 0
        while True:
            applied = await still_applied()
            in_a_row = 0 if applied is not None else in_a_row + 1
            if in_a_row >= ACCEPTED_IN_A_ROW:
                if not backstop:
                    report.gated_before = (seen[0] or self.now()) + removal.GATED_MARGIN
                report.line(step, f"{what}: {done}")
                return
            if time.monotonic() > deadline:
                if backstop:
                    left = (
                        "The mutating webhook was left in place (removing it now would make every gang "
                        "pod's creation fail)"
                    )
                else:
                    left = "No pod was released yet (a pod gated after the release would stay gated)"
                last = (applied or "").rstrip(".")
                raise UninstallError(
                    f"step 1: {timeout:.0f} s after the deletion, not yet: {what}: {last}. {left}; "
                    "run quorum uninstall again, or with a longer --timeout"
                )
            await self.pause(step, self.interval)

    # -- steps 2 and 3: gated pods ---------------------------------------------------------------

    async def gated(self, step: Step) -> tuple[str, dict[str, int], dict[str, int]]:
        """(acting identity, gated pods by "namespace/gang" created before `gated_before`, those
        created after it). The later ones were gated by their creator, or by an apiserver late
        to drop the webhook, or their time is skewed: they are released too, named once, and
        never fail the run."""
        who, pods = await self.api.gated_pods()
        before = self.report.gated_before
        mine = [p for p in pods if before is None or p.created <= before]
        later = [p for p in pods if before is not None and p.created > before]
        new = sorted(str(p) for p in later if str(p) not in self.report.told)
        if new:
            self.report.told.update(new)
            shown = ", ".join(new[:10]) + (f" and {len(new) - 10} more" if len(new) > 10 else "")
            self.report.line(
                step,
                f"{len(new)} pods gated after quorum's mutating webhook was seen no longer called (by their "
                f"creator, or an apiserver late to drop it): {shown}: released too; they fail nothing",
            )

        def by_gang(found: list[GatedPod]) -> dict[str, int]:
            return dict(Counter(f"{p.namespace}/{p.gang}" for p in found))

        return who, by_gang(mine), by_gang(later)

    async def release_round(self, step: Step, gated: dict[str, int], what: str) -> None:
        """Release every gated gang pod, whenever it was created (one that its creator gated with
        quorum's gate loses nothing by it)."""
        by = f"{await self.api.caller() or 'someone'} (quorum uninstall)"
        who, lines = await self.api.release_gated(self.reason, by, None)
        total = sum(gated.values())
        self.report.line(
            step, f"released the gated pods of {len(gated)} gangs ({total} pods){what} as {who}:", True
        )
        for line in lines:
            self.report.more(line)

    def left_later(self, step: Step, later: dict[str, int]) -> None:
        if later:
            left = ", ".join(f"{gang} ({n})" for gang, n in sorted(later.items()))
            self.report.line(
                step,
                f"gated pods created after quorum's mutating webhook was no longer called keep coming "
                f"(their creator gates them): {left}: left gated",
            )

    async def release(self, step: Step) -> None:
        report = self.report
        who, gated, later = await self.gated(step)
        if not gated and not later:
            report.line(step, f"no gang pod gated by quorum anywhere (as {who}): nothing to release")
            return
        every = dict(Counter(gated) + Counter(later))
        if self.dry_run:
            listed = ", ".join(f"{gang} ({n})" for gang, n in sorted(every.items()))
            summary = f"{sum(every.values())} gated pods of {len(every)} gangs"
            report.line(step, f"would release {summary} as {who}: {listed}", changed=True)
            return
        for _ in range(RELEASE_ROUNDS):
            await self.release_round(step, every, "")
            who, gated, later = await self.gated(step)
            every = dict(Counter(gated) + Counter(later))
            if not gated:  # only pods created since the webhook's drop: they fail nothing
                self.left_later(step, later)
                return
        left = ", ".join(f"{gang} ({n})" for gang, n in sorted(gated.items()))
        raise UninstallError(
            f"step 2: gang pods quorum gated still gated after {RELEASE_ROUNDS} rounds of release: {left}. "
            "Something keeps them gated (a release refused?); run quorum uninstall again"
        )

    async def sweep(self, step: Step) -> None:
        """Gate protection is gone: look again, `interval` apart, until no pod gated by quorum
        is seen `removal.QUIET_LOOKS` times in a row, releasing any (an apiserver late to drop
        the mutating webhook gated it after the release), at most `timeout` seconds."""
        report, quiet_looks = self.report, removal.QUIET_LOOKS
        if self.dry_run:
            report.line(
                step,
                f"would look for gang pods gated by quorum again until none is seen {quiet_looks} looks in "
                "a row",
            )
            return
        deadline = time.monotonic() + self.timeout
        quiet = found = 0
        while True:
            who, gated, later = await self.gated(step)
            if gated and time.monotonic() > deadline:
                left = ", ".join(f"{gang} ({n})" for gang, n in sorted(gated.items()))
                raise UninstallError(
                    f"step {step.number}: {self.timeout:.0f} s on, gang pods are still being gated: "
                    f"{left}; is quorum's mutating webhook back? Run quorum uninstall again"
                )
            if gated or later:  # all released; only pods quorum gated keep the sweep looking
                found += sum(gated.values()) + sum(later.values())
                what = (
                    " gated since the release (an apiserver still called the webhook)"
                    if gated
                    else " gated after the webhook's drop was seen"
                )
                await self.release_round(step, dict(Counter(gated) + Counter(later)), what)
            quiet = 0 if gated else quiet + 1
            if quiet >= quiet_looks:
                break
            await self.pause(step, self.interval)
        looked = f"none seen in {quiet_looks} looks in a row, as {who}"
        if found:
            report.line(step, f"{found} pods gated since the release were released: {looked}")
        else:
            report.line(step, f"no gang pod gated by quorum seen again ({looked}): nothing to release")

    # -- step 2: suspended Jobs ------------------------------------------------------------------

    async def resume_jobs(self, step: Step) -> None:
        """Resume each Job quorum suspended once none of its pods is left, by quorum's recovery's
        rule (`lifecycle.job_may_resume`; an old pod that failed after the resume would count
        against the Job's backoffLimit); one line per Job; at most `timeout` seconds waiting for
        pods to go."""
        api, report = self.api, self.report
        who, jobs = await api.suspended_jobs()
        if not jobs:
            report.line(step, f"no Job suspended by quorum (as {who}): nothing to resume")
            return
        if self.dry_run:
            for job in jobs:
                who, _ = await api.resume_job(job, dry_run=True)
                when = "now" if job.may_resume else f"once its {job.pods} pods are gone"
                report.line(step, f"{job}: would resume {when} (as {who})", changed=True)
            return
        deadline = time.monotonic() + self.timeout
        told: set[str] = set()
        while True:
            waiting = [job for job in jobs if not job.may_resume]
            for job in jobs:
                if not job.may_resume:
                    if str(job) not in told:
                        told.add(str(job))
                        report.line(step, f"{job}: {job.pods} pods left; resumed once they are gone")
                    continue
                who, resumed = await api.resume_job(job, dry_run=False)
                done = "resumed" if resumed else "gone or replaced meanwhile: left"
                report.line(step, f"{job}: {done} (as {who})", changed=resumed)
            if not waiting:
                return
            if time.monotonic() > deadline:
                left = ", ".join(f"{job.namespace}/{job.name} ({job.pods} pods)" for job in waiting)
                raise UninstallError(
                    f"step {step.number}: {self.timeout:.0f} s on, Jobs quorum suspended still have pods: "
                    f"{left}. Run quorum uninstall again once they are gone (or with a longer --timeout); "
                    "resuming one now, an old pod that fails would count against its backoffLimit"
                )
            await self.pause(step, self.interval)
            who, jobs = await api.suspended_jobs()  # those resumed meanwhile drop out

    # -- the reservation taints ------------------------------------------------------------------

    async def remove_reservations(self, step: Step) -> None:
        """Remove the reservation taint from every node that has one, one line per node; then
        look again, `interval` apart, until no node has one `removal.RESERVATION_QUIET` times in
        a row (one put back meanwhile, by an operator still running, is removed again and said
        so), at most `timeout` seconds."""
        api, report, taint = self.api, self.report, RESERVED_TAINT
        who, reserved = await api.reserved_nodes()
        if self.dry_run:
            for node, values in sorted(reserved.items()):
                who, would = await api.unreserve(node, dry_run=True)
                if would:
                    shown = ", ".join(f"{taint}={v}" for v in values)
                    report.line(step, f"node {node}: would remove {shown} (as {who})", changed=True)
            if not any(reserved.values()):
                report.line(
                    step, f"no node has quorum's reservation taint {taint} (as {who}): nothing to remove"
                )
            return
        deadline = time.monotonic() + self.timeout
        done: set[str] = set()
        quiet = looks = 0
        while True:
            looks += 1
            for node in sorted(reserved):
                who, removed = await api.unreserve(node, dry_run=False)
                if not removed:
                    continue
                shown = ", ".join(f"{taint}={v}" for v in removed)
                again = " again: it was put back (quorum's operator still ran)" if node in done else ""
                report.line(step, f"node {node}: removed {shown}{again} (as {who})", changed=True)
                done.add(node)
            if reserved and looks > 1 and time.monotonic() > deadline:
                raise UninstallError(
                    f"step {step.number}: {self.timeout:.0f} s on, reservation taints are still being put "
                    f"back (nodes {', '.join(sorted(reserved))}): quorum's operator still runs; scale its "
                    "Deployment to 0, then run quorum uninstall again"
                )
            quiet = 0 if reserved else quiet + 1
            if quiet >= removal.RESERVATION_QUIET:
                break
            await self.pause(step, self.interval)
            who, reserved = await api.reserved_nodes()
        looked = f"none seen in {removal.RESERVATION_QUIET} looks in a row"
        if done:
            report.line(step, f"{len(done)} nodes no longer reserved by quorum: {looked} (as {who})")
        else:
            report.line(
                step,
                f"no node has quorum's reservation taint {taint} ({looked}, as {who}): nothing to remove",
            )


# -- the command --------------------------------------------------------------------------------


def add_parser(subparsers: Any) -> None:
    parser = subparsers.add_parser(
        "uninstall",
        help="remove quorum in the order that leaves no pod gated and refuses no pod creation",
        description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    parser.add_argument(
        "--quorum-namespace",
        default=None,
        help=f"where quorum is installed (default $QUORUM_NAMESPACE, else {install.DEFAULT_NAMESPACE})",
    )
    parser.add_argument(
        "--namespace",
        dest="namespace_alias",
        default=None,
        help="the same as --quorum-namespace (what the chart's hook passes)",
    )
    parser.add_argument("--dry-run", action="store_true", help="change nothing; say what would be done")
    parser.add_argument(
        "--admission-only",
        action="store_true",
        help="only what gates pods or takes part in admission, and the release (a Helm pre-delete hook)",
    )
    parser.add_argument("--reason", default=DEFAULT_REASON, help="recorded on each Gang released")
    parser.add_argument(
        "--kubeconfig", default=None, help="default: $KUBECONFIG, else ~/.kube/config, else in-cluster"
    )
    parser.add_argument(
        "--delete-crds",
        action="store_true",
        help="also delete a PodGroup CRD of quorum's that still holds PodGroups (they are deleted with it); "
        "without it such a CRD stays (Gangs, quorum's own records, always go)",
    )
    parser.add_argument(
        "--probe-namespace",
        default=DEFAULT_PROBE_NAMESPACE,
        help="a namespace where quorum's backstop applies, for step 1's dry-run probe pod (default: default)",
    )
    parser.add_argument(
        "--timeout",
        type=float,
        default=60.0,
        help=(
            "seconds to wait for the apiserver to drop each admission object, for the pods of Jobs "
            "quorum suspended to go, and for gated pods and reservation taints to stop coming back "
            "(default 60)"
        ),
    )
    parser.set_defaults(func=run)


def quorum_namespace(args: argparse.Namespace) -> str:
    """--quorum-namespace, else --namespace (the same), else $QUORUM_NAMESPACE, else the default."""
    given = [n for n in (args.quorum_namespace, args.namespace_alias) if n is not None]
    if len(set(given)) > 1:
        raise install.InvalidNamespace(
            f"--quorum-namespace {args.quorum_namespace} and --namespace {args.namespace_alias} differ: both "
            "name where quorum is installed; pass one"
        )
    return given[0] if given else os.environ.get("QUORUM_NAMESPACE", install.DEFAULT_NAMESPACE)


def run(args: argparse.Namespace) -> int:
    try:
        namespace = install.check_namespace(quorum_namespace(args))
        install.check_namespace(args.probe_namespace)
    except install.InvalidNamespace as err:
        print(f"quorum uninstall: {err}", file=sys.stderr)
        return 2
    problem = removal.probe_namespace_problem(args.probe_namespace, namespace)
    if problem is not None:
        print(f"quorum uninstall: --probe-namespace {problem}", file=sys.stderr)
        return 2
    steps = removal.removal_plan(namespace, args.admission_only, args.probe_namespace)
    try:
        report = asyncio.run(_main(args, namespace, steps))
    except (UninstallError, KubeconfigError) as err:
        print(f"quorum uninstall: {err}", file=sys.stderr)
        return 1
    except ApiException as err:
        print(f"quorum uninstall: the apiserver refused: {refusal(err)}", file=sys.stderr)
        return 1
    print(summary(report, args.dry_run, args.admission_only))
    return 1 if report.refused else 0


def summary(report: Report, dry_run: bool, admission_only: bool) -> str:
    if dry_run:
        if report.refused:
            return "dry run: some steps would be refused (above); nothing was changed"
        return "dry run: nothing was changed" + (
            "" if report.changed else "; nothing of quorum is left to remove"
        )
    if not report.changed:
        return "nothing of quorum was left to remove"
    if admission_only:
        return (
            "quorum no longer gates pods, takes part in their admission, holds a Job suspended, "
            "reserves nodes or acts (its Lease is held); its Deployments, fences, RBAC, CRDs and "
            "namespace are left to whoever deletes them (any order is safe)"
        )
    return "quorum is uninstalled"


async def _main(args: argparse.Namespace, namespace: str, steps: Sequence[Step]) -> Report:
    operator_name = install.operator_username(namespace)
    api = (await command_client(args.kubeconfig)).api
    operator = (await command_client(args.kubeconfig)).api
    operator.set_default_header("Impersonate-User", operator_name)
    async with api, operator:
        return await uninstall(
            LiveUninstallApi(api, operator, operator_name),
            steps,
            dry_run=args.dry_run,
            reason=args.reason,
            probe_namespace=args.probe_namespace,
            timeout=args.timeout,
            delete_tenant_objects=args.delete_crds,
            say=lambda line: print(line, flush=True),
        )
