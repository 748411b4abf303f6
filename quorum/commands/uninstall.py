"""`quorum uninstall`: remove quorum so that no pod is left gated and no pod creation is refused
on the way (docs/lifecycle.md, "Uninstall without stranding pods"). The order and the objects:
`quorum.core.removal`. It never deletes a tenant's pod; it removes quorum's gate from gated gang
pods (as quorum's operator, recorded on each Gang with the reason), resumes the Jobs quorum
suspended (a recovery's or a preemption's, each once its pods are gone, as quorum would), removes
the reservation taint `quorum.dev/reserved` a preemption in flight holds nodes with
(docs/preemption.md; nothing else of a node), and deletes quorum's objects.

    quorum uninstall [--namespace NS] [--dry-run] [--admission-only] [--reason TEXT]
                     [--kubeconfig K] [--probe-namespace default] [--timeout 60]

Each step prints one line: what it deleted, what was already gone, what it left and why. Run it
again after a failure: what is done is skipped. `--dry-run` changes nothing: it asks the
apiserver whether each deletion would be allowed (server-side dry runs) and says what it would
do. `--admission-only` is what a Helm pre-delete hook runs: steps 1-3 without the Deployments,
then the reservation taints; after it nothing of quorum gates a pod, refuses a pod creation,
keeps a Job suspended or keeps a node reserved, whatever order the rest is deleted in.

Suspended Jobs: quorum suspends a Job (recovery of a partial placement; a preemption's victim)
so that its pods go, records it on the gang's Gang, and resumes it once none of its pods is left;
once quorum is gone nothing would. Step 2 resumes each, as the operator, once none of its pods
is left (waiting at most `--timeout`; a run that stops there is finished by the next).

Reservation taints: once quorum is gone nothing removes them, and a node left with one takes no
pod again. The full run removes them after the operator's Deployment and its ClusterRoleBinding
are deleted (an operator still running may no longer write a node, so cannot put one back), as
the caller. `--admission-only` removes them as the operator (impersonated, as the release), which
still runs until Helm deletes it: it reserves nodes only for a preemption of a gated gang, none is
gated after step 2, so only a preemption it decided just before the release could put one back.
Both runs therefore look at the nodes again, half a second apart, until none has one 5 times in
a row (`removal.RESERVATION_QUIET`), removing again any put back (said so), at most `--timeout`
seconds. One line per node; a re-run removes any left (e.g. by a version of quorum
without this step): the full run as a cluster-admin after `helm uninstall` finds everything
else gone and does just that.

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
suspended Jobs and the reservation taints need no right of their own: it acts on them as the
operator, whose RBAC lets it list Gangs, read and patch Jobs, list and patch nodes, and whose
fence lets it change only a Job's spec.suspend and a node's quorum.dev/reserved taints):

    apiVersion: rbac.authorization.k8s.io/v1
    kind: ClusterRole
    metadata: {name: quorum-lifecycle}
    rules:
    - apiGroups: [admissionregistration.k8s.io]
      resources: [validatingadmissionpolicybindings]
      verbs: [delete]
      resourceNames: [quorum-gang-backstop, quorum-gate-protection]
    - apiGroups: [admissionregistration.k8s.io]
      resources: [mutatingwebhookconfigurations]
      verbs: [delete]
      resourceNames: [quorum-webhooks]
    - apiGroups: [admissionregistration.k8s.io]
      resources: [validatingadmissionpolicies]
      verbs: [delete]
      resourceNames: [quorum-gate-protection, quorum-gang-backstop]
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
the fences (policies and bindings), quorum's ClusterRoles and ClusterRoleBindings and the
namespace (read first: is it terminating already), reads and deletes quorum's CRDs and lists
their objects (the count it reports), and lists and patches nodes (the reservation taints, once
the operator's RBAC is gone): `removal.rights(removal_plan(NS), NS, PROBE)` lists it; it is meant
for a person with cluster-admin rights.
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
from quorum.core import removal
from quorum.core.conditions import recovery_of
from quorum.core.removal import Action, Kind, Ref, Step
from quorum.k8s import objects, reads, writes
from quorum.k8s.client import KubeconfigError, command_client
from quorum.operator import manual
from quorum.operator.gangs import GANG_LABEL, is_gated

JSON = dict[str, Any]
T = TypeVar("T")
POD = Kind("", "v1", "pods", "Pod", namespaced=True)
GANG = Kind("quorum.dev", "v1alpha1", "gangs", "Gang", namespaced=True)
JOB = Kind("batch", "v1", "jobs", "Job", namespaced=True)
DEFAULT_REASON = "uninstalling quorum"
DEFAULT_PROBE_NAMESPACE = "default"
ACCEPTED_IN_A_ROW = 3  # several apiservers each drop the binding on their own
RELEASE_ROUNDS = 3


class UninstallError(RuntimeError):
    """A step failed; the message says which, why and what to do."""


@dataclass(frozen=True)
class SuspendedJob:
    """A Job quorum suspended (recorded on its gang's Gang, `status.recovery.suspendedJobs`) that
    still is; `pods`: how many of its pods are left (active or terminating)."""

    namespace: str
    name: str
    uid: str
    gang: str
    pods: int

    def __str__(self) -> str:
        return f"Job {self.namespace}/{self.name} (suspended by quorum, gang {self.namespace}/{self.gang})"


class UninstallApi(Protocol):
    async def delete(self, ref: Ref, dry_run: bool) -> bool:
        """Delete (or, with dry_run, ask whether it would be allowed); False if it is gone."""
        ...

    async def read(self, ref: Ref) -> JSON | None: ...

    async def count(self, kind: Kind) -> int: ...

    async def probe_backstop(self, namespace: str) -> str | None:
        """None if a pod only the backstop refuses is admitted (server-side dry run); the
        backstop's refusal otherwise. Any other refusal raises ApiException."""
        ...

    async def probe_mutating(self, namespace: str) -> bool:
        """Whether the mutating webhook still gates a gang pod (server-side dry run)."""
        ...

    async def gated_gangs(self) -> tuple[str, dict[str, int]]:
        """(acting identity, gated pods by "namespace/gang")."""
        ...

    async def release_gated(self, reason: str, by: str) -> tuple[str, list[str]]:
        """Release every gated gang pod: (acting identity, one line per gang)."""
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
    operator (for the release, the Jobs quorum suspended and the reservation taints). When the
    operator's identity may not list pods, Gangs or nodes any more (its RBAC is gone: later in
    step 4, a re-run, or after Helm deleted it), these act as the caller: then the gate
    protection is gone too (it goes before the RBAC)."""

    def __init__(self, api: client.ApiClient, operator: client.ApiClient, operator_name: str) -> None:
        self.api, self.operator, self.operator_name = api, operator, operator_name

    async def delete(self, ref: Ref, dry_run: bool) -> bool:
        return await objects.delete(self.api, ref, dry_run)

    async def read(self, ref: Ref) -> JSON | None:
        return await objects.read(self.api, ref)

    async def count(self, kind: Kind) -> int:
        return await objects.count(self.api, kind)

    async def probe_backstop(self, namespace: str) -> str | None:
        try:
            await objects.dry_run_create(self.api, POD, namespace, removal.BACKSTOP_PROBE)
        except ApiException as err:
            message = refusal(err)
            if removal.BACKSTOP in message:
                return message
            raise
        return None

    async def probe_mutating(self, namespace: str) -> bool:
        admitted = await objects.dry_run_create(self.api, POD, namespace, removal.MUTATING_PROBE)
        return removal.is_gated(admitted)

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

    async def gated_gangs(self) -> tuple[str, dict[str, int]]:
        async def gated(api: client.ApiClient) -> dict[str, int]:
            pods = await reads.gang_pods(api, None, None)
            return dict(
                Counter(
                    f"{p['metadata']['namespace']}/{p['metadata']['labels'][GANG_LABEL]}"
                    for p in pods
                    if is_gated(p)
                )
            )

        return await self._acting(gated)

    async def release_gated(self, reason: str, by: str) -> tuple[str, list[str]]:
        return await self._acting(lambda api: manual.release_gangs(api, None, reason, by))

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
        try:
            return await objects.whoami(self.api)
        except ApiException:  # a cluster that refuses SelfSubjectReviews: the record says "someone"
            return ""


async def suspended_jobs(api: client.ApiClient) -> list[SuspendedJob]:
    """The Jobs the Gangs record as suspended by quorum (a recovery's or a preemption's) and
    that still are suspended, as quorum's recovery reads them."""
    try:
        gangs = await objects.items(api, GANG)
    except ApiException as err:
        if err.status == 404:  # the CRD is gone, and the records with it
            return []
        raise
    out = []
    for gang in gangs:
        meta = gang["metadata"]
        for name in recovery_of(gang).get("suspendedJobs") or []:
            job = await reads.job(api, meta["namespace"], str(name))
            if job is None or not (job.get("spec") or {}).get("suspend"):
                continue  # gone, or resumed (by quorum's recovery, or someone)
            status = job.get("status") or {}
            left = int(status.get("active") or 0) + int(status.get("terminating") or 0)
            out.append(SuspendedJob(meta["namespace"], str(name), job["metadata"]["uid"], meta["name"], left))
    return out


def reservations(node: JSON) -> list[str]:
    """The values (preemption tokens) of the node's reservation taints."""
    taints = (node.get("spec") or {}).get("taints") or []
    return [str(t.get("value") or "") for t in taints if t.get("key") == writes.RESERVED_TAINT]


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
    """What a run printed, and whether anything was (or would be) changed or refused."""

    say: Callable[[str], None]
    lines: list[str] = field(default_factory=list)
    changed: bool = False
    refused: bool = False

    def line(self, step: Step, text: str, changed: bool = False) -> None:
        self.changed = self.changed or changed
        self.lines.append(f"{step.number}. {text}")
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
) -> Report:
    """Carry out `steps` in order (see the module docstring). Raises UninstallError at the first
    step that fails (with --dry-run: reports every refusal and goes on)."""
    report = Report(say)
    for step in steps:
        try:
            await _one(
                api,
                step,
                report,
                dry_run,
                reason,
                probe_namespace,
                timeout,
                interval,
                sleep,
                delete_tenant_objects,
            )
        except ApiException as err:
            what = f"{step.action} {step.target or ''}".strip()
            if dry_run:
                report.refused = True
                report.line(step, f"{what}: would be refused: {refusal(err)}")
                continue
            raise UninstallError(
                f"step {step.number}, {what}: the apiserver refused: {refusal(err)}"
            ) from err
    return report


async def _one(
    api: UninstallApi,
    step: Step,
    report: Report,
    dry_run: bool,
    reason: str,
    probe_namespace: str,
    timeout: float,
    interval: float,
    sleep: Callable[[float], Awaitable[None]],
    delete_tenant_objects: bool = False,
) -> None:
    target = step.target
    if step.action is Action.DELETE:
        assert target is not None
        if target.kind is removal.NAMESPACE:  # deleting one that is terminating answers "deleted" again
            found = await api.read(target)
            if found is not None and found["metadata"].get("deletionTimestamp"):
                report.line(step, f"{target}: being deleted already (what is in it goes first)")
                return
        if await api.delete(target, dry_run):
            report.line(step, f"{target}: {'would delete' if dry_run else 'deleted'}", changed=True)
        else:
            report.line(step, f"{target}: already gone")
    elif step.action is Action.DELETE_IF_QUORUMS:
        assert target is not None
        await _delete_crd(api, step, target, report, dry_run, delete_tenant_objects)
    elif step.action in (Action.WAIT_BACKSTOP_DROPPED, Action.WAIT_MUTATING_DROPPED):
        await _wait_dropped(api, step, report, dry_run, probe_namespace, timeout, interval, sleep)
    elif step.action is Action.RELEASE_GATED:
        await _release(api, step, report, dry_run, reason)
    elif step.action is Action.RESUME_JOBS:
        await _resume_jobs(api, step, report, dry_run, timeout, interval, sleep)
    elif step.action is Action.REMOVE_RESERVATIONS:
        await _remove_reservations(api, step, report, dry_run, timeout, interval, sleep)


async def _delete_crd(
    api: UninstallApi, step: Step, crd: Ref, report: Report, dry_run: bool, delete_tenant_objects: bool
) -> None:
    """A CRD of quorum's goes with its objects only if they are quorum's own (Gangs), there are
    none, or the caller said so: deleting a PodGroup CRD deletes every tenant's PodGroups."""
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
    if existing and crd.name not in removal.QUORUMS_OWN_CRDS and not delete_tenant_objects:
        report.line(
            step,
            f"{crd}: left: it holds {existing} {names['kind']} object(s) of tenants, which would go with "
            "it (--delete-crds deletes them too)",
        )
        return
    with_objects = f", and with it {existing} {names['kind']} object(s)"
    if await api.delete(crd, dry_run):
        report.line(step, f"{crd}: {'would delete' if dry_run else 'deleted'}{with_objects}", changed=True)
    else:
        report.line(step, f"{crd}: already gone")


async def _wait_dropped(
    api: UninstallApi,
    step: Step,
    report: Report,
    dry_run: bool,
    namespace: str,
    timeout: float,
    interval: float,
    sleep: Callable[[float], Awaitable[None]],
) -> None:
    """Wait until the apiserver no longer applies the admission object just deleted (its
    informer drops it a moment later): the step's probe pod, created with a server-side dry run,
    is admitted (the backstop) or left ungated (the mutating webhook), several times in a row."""
    backstop = step.action is Action.WAIT_BACKSTOP_DROPPED
    where = f"(server-side dry run in namespace {namespace})"
    if backstop:
        what = f"the apiserver admits a probe pod only the backstop refuses {where}"
        done = "the backstop is no longer enforced"
    else:
        what = f"the apiserver no longer gates a probe gang pod {where}"
        done = "the mutating webhook is no longer called"

    async def still_applied() -> str | None:
        if not backstop:
            return "the probe gang pod came back gated" if await api.probe_mutating(namespace) else None
        refused = await api.probe_backstop(namespace)
        if refused is not None and install.STATIC_SUFFIX in refused:
            raise UninstallError(
                f"step 1: the backstop is loaded from the apiserver's disk ({removal.BACKSTOP}"
                f"{install.STATIC_SUFFIX}), which no API call removes: take quorum's files out of the "
                "kube-apiserver's staticManifestsDir (docs/threat-model.md), then run quorum uninstall again"
            )
        return refused

    if dry_run:
        await still_applied()  # raises if the probe itself would be refused
        report.line(step, f"would wait (at most {timeout:.0f} s) until {what}")
        return
    deadline = time.monotonic() + timeout
    in_a_row = 0
    while True:
        applied = await still_applied()
        in_a_row = 0 if applied is not None else in_a_row + 1
        if in_a_row >= ACCEPTED_IN_A_ROW:
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
        await sleep(interval)


async def _release(api: UninstallApi, step: Step, report: Report, dry_run: bool, reason: str) -> None:
    who, gated = await api.gated_gangs()
    if dry_run:
        if gated:
            listed = ", ".join(f"{gang} ({n})" for gang, n in sorted(gated.items()))
            summary = f"{sum(gated.values())} gated pods of {len(gated)} gangs"
            report.line(step, f"would release {summary} as {who}: {listed}", changed=True)
        else:
            report.line(step, f"no gated gang pods anywhere (as {who}): nothing to release")
        return
    if not gated:
        report.line(step, f"no gated gang pods anywhere (as {who}): nothing to release")
        return
    by = f"{await api.caller() or 'someone'} (quorum uninstall)"
    for _ in range(RELEASE_ROUNDS):
        who, lines = await api.release_gated(reason, by)
        report.changed = True
        total = sum(gated.values())
        report.line(step, f"released the gated pods of {len(gated)} gangs ({total} pods) as {who}:")
        for line in lines:
            report.say(f"   {line}")
            report.lines.append(f"   {line}")
        who, gated = await api.gated_gangs()
        if not gated:
            return
    left = ", ".join(f"{gang} ({n})" for gang, n in sorted(gated.items()))
    raise UninstallError(
        f"step 2: gang pods still gated after {RELEASE_ROUNDS} rounds of release: {left}. Something "
        "gates them again (is quorum's mutating webhook back?); run quorum uninstall again"
    )


async def _resume_jobs(
    api: UninstallApi,
    step: Step,
    report: Report,
    dry_run: bool,
    timeout: float,
    interval: float,
    sleep: Callable[[float], Awaitable[None]],
) -> None:
    """Resume each Job quorum suspended once none of its pods is left, as quorum's recovery
    does (an old pod that failed after the resume would count against the Job's backoffLimit);
    one line per Job; at most `timeout` seconds waiting for pods to go."""
    who, jobs = await api.suspended_jobs()
    if not jobs:
        report.line(step, f"no Job suspended by quorum (as {who}): nothing to resume")
        return
    if dry_run:
        for job in jobs:
            who, _ = await api.resume_job(job, dry_run=True)
            when = f"once its {job.pods} pods are gone" if job.pods else "now"
            report.line(step, f"{job}: would resume {when} (as {who})", changed=True)
        return
    deadline = time.monotonic() + timeout
    told: set[str] = set()
    while True:
        waiting = [job for job in jobs if job.pods]
        for job in jobs:
            if job.pods:
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
                f"step {step.number}: {timeout:.0f} s on, Jobs quorum suspended still have pods: {left}. "
                "Run quorum uninstall again once they are gone (or with a longer --timeout); resuming "
                "one now, an old pod that fails would count against its backoffLimit"
            )
        await sleep(interval)
        who, jobs = await api.suspended_jobs()  # those resumed meanwhile (by quorum) drop out


async def _remove_reservations(
    api: UninstallApi,
    step: Step,
    report: Report,
    dry_run: bool,
    timeout: float,
    interval: float,
    sleep: Callable[[float], Awaitable[None]],
) -> None:
    """Remove the reservation taint from every node that has one, one line per node; then look
    again, `interval` apart, until no node has one `removal.RESERVATION_QUIET` times in a row
    (one put back meanwhile, by an operator still running, is removed again and said so), at
    most `timeout` seconds."""
    taint = removal.RESERVED_TAINT
    who, reserved = await api.reserved_nodes()
    if dry_run:
        for node, values in sorted(reserved.items()):
            who, would = await api.unreserve(node, dry_run=True)
            if would:
                shown = ", ".join(f"{taint}={v}" for v in values)
                report.line(step, f"node {node}: would remove {shown} (as {who})", changed=True)
        if not any(reserved.values()):
            report.line(step, f"no node has quorum's reservation taint {taint} (as {who}): nothing to remove")
        return
    deadline = time.monotonic() + timeout
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
                f"step {step.number}: {timeout:.0f} s on, reservation taints are still being put back "
                f"(nodes {', '.join(sorted(reserved))}): quorum's operator still runs; scale its "
                "Deployment to 0, then run quorum uninstall again"
            )
        quiet = 0 if reserved else quiet + 1
        if quiet >= removal.RESERVATION_QUIET:
            break
        await sleep(interval)
        who, reserved = await api.reserved_nodes()
    looked = f"none seen in {removal.RESERVATION_QUIET} looks in a row"
    if done:
        report.line(step, f"{len(done)} nodes no longer reserved by quorum: {looked} (as {who})")
    else:
        report.line(
            step, f"no node has quorum's reservation taint {taint} ({looked}, as {who}): nothing to remove"
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
        "--namespace",
        default=os.environ.get("QUORUM_NAMESPACE", install.DEFAULT_NAMESPACE),
        help=f"where quorum is installed (default $QUORUM_NAMESPACE, else {install.DEFAULT_NAMESPACE})",
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
            "quorum suspended to go, and for reservation taints to stop being put back (default 60)"
        ),
    )
    parser.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    try:
        install.check_namespace(args.namespace)
        install.check_namespace(args.probe_namespace)
    except install.InvalidNamespace as err:
        print(f"quorum uninstall: {err}", file=sys.stderr)
        return 2
    if args.probe_namespace == args.namespace:
        print(
            "quorum uninstall: --probe-namespace must be a namespace where quorum's backstop applies, "
            "not quorum's own",
            file=sys.stderr,
        )
        return 2
    steps = removal.removal_plan(args.namespace, args.admission_only)
    try:
        report = asyncio.run(_main(args, steps))
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
            "quorum no longer gates pods, takes part in their admission, holds a Job suspended or "
            "reserves nodes; its Deployments, fences, RBAC, CRDs and namespace are left to whoever "
            "deletes them (any order is safe)"
        )
    return "quorum is uninstalled"


async def _main(args: argparse.Namespace, steps: Sequence[Step]) -> Report:
    operator_name = install.operator_username(args.namespace)
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
