"""Recovery of partially placed gangs: the rules of `quorum.core.lifecycle`, applied.

Each pass, for every gang with a recorded decision: a gang that bound whole clears its run of
failures; a gang whose time ran out short of minMember bound is recovered by owner kind, once
per decision, and waits a backoff before it is planned again; Jobs suspended by a recovery are
resumed once none of their pods is left. What was done is recorded on the Gang
(`status.recovery`), so a new leader continues it; a person sees it as the `PartiallyPlaced`
and `Backoff` conditions and a warning Event.
"""

from __future__ import annotations

import asyncio
import logging
import math
import time

from quorum.core.lifecycle import (
    Action,
    BackoffPolicy,
    JobFacts,
    MemberLossPolicy,
    Owner,
    is_partially_placed,
    job_may_resume,
    plan_recovery,
)
from quorum.k8s.api import KubeApi
from quorum.operator import metrics
from quorum.operator.conditions import backoff_until, iso, iso_deadline, recovery_of, timestamp
from quorum.operator.gangs import JSON, GangView, phase_of
from quorum.operator.ledger import Ledger

log = logging.getLogger("quorum.operator.recovery")


def controller_of(pod: JSON) -> Owner | None:
    for ref in pod["metadata"].get("ownerReferences") or []:
        if ref.get("controller"):
            return Owner(ref["kind"], ref["name"], ref.get("uid", ""))
    return None


class Recoverer:
    """Applies the lifecycle rules. `due` (pure, cheap) says whether a gang has anything to be
    done this pass; `check` does it, in the gang's own task."""

    def __init__(
        self,
        api: KubeApi,
        backoff: BackoffPolicy,
        ledger: Ledger,
        policy: MemberLossPolicy = MemberLossPolicy.REPLACE,
    ) -> None:
        self.api = api
        self.backoff = backoff
        self.ledger = ledger
        self.policy = policy  # for gangs whose annotation does not say
        # The decision recovered per gang, also before the watch shows our own status write.
        self.recovered: dict[tuple[str, str], int] = {}
        self.stuck: set[str] = set()  # pods of running gangs already replaced or reported
        # Backoffs this process recorded, also before the watch shows the write (the store's
        # Gang may be an older version meanwhile): epoch seconds, per gang.
        self.backoffs: dict[tuple[str, str], float] = {}
        self.polled: dict[tuple[str, str], float] = {}  # when a suspended Job was last looked at

    def may_poll(self, key: tuple[str, str], every: float = 2.0) -> bool:
        """Whether a suspended Job of the gang may be looked at again (not every pass: its
        pods can take minutes to go)."""
        return time.monotonic() - self.polled.get(key, -every) >= every

    def recovered_already(self, key: tuple[str, str], gang: JSON) -> bool:
        """The gang's recorded decision has been recovered (by this process or on record)."""
        attempt = attempt_of((gang.get("status") or {}).get("admission") or {})
        return attempt in (recovery_of(gang).get("attempt"), self.recovered.get(key))

    def backoff_until(self, key: tuple[str, str], gang: JSON | None) -> float:
        """Epoch seconds before which the gang is not planned (0: no backoff)."""
        return max(backoff_until(recovery_of(gang)), self.backoffs.get(key, 0.0))

    def prune(self, live: set[tuple[str, str]], pods: dict[str, JSON]) -> None:
        for table in (self.recovered, self.backoffs, self.polled):
            for key in [k for k in table if k not in live]:
                del table[key]
        self.stuck = {uid for uid in self.stuck if uid in pods}

    def due(self, view: GangView, gang: JSON | None, now: float) -> str | None:
        """What recovery has to do for this gang now, if anything: `resume-jobs`,
        `clean-slate`, `replace-stuck` or `recover`."""
        if gang is None or view.min_member is None or view.basic:
            return None
        recovery = recovery_of(gang)
        if recovery.get("suspendedJobs"):
            return "resume-jobs" if self.may_poll(view.key) else None
        admission = (gang.get("status") or {}).get("admission") or {}
        if not isinstance(admission, dict) or not admission:
            return None
        manual = (gang.get("status") or {}).get("manualRelease") or {}
        if isinstance(manual, dict) and timestamp(manual.get("time")) >= timestamp(admission.get("time")):
            return None  # a person released the gang by hand after quorum's decision: theirs now
        bound, unbound = self.bound_and_unbound(view)
        if bound >= view.min_member:
            if recovery.get("failures"):
                return "clean-slate"
            timed_out = now - timestamp(admission.get("time")) > view.schedule_timeout
            if timed_out and any(p["metadata"]["uid"] not in self.stuck for p in unbound):
                return "replace-stuck"
            return None
        attempt = attempt_of(admission)
        if attempt in (recovery.get("attempt"), self.recovered.get(view.key)):
            return None
        if is_partially_placed(
            released_at=timestamp(admission.get("time")),
            timeout_seconds=view.schedule_timeout,
            min_member=view.min_member,
            bound=bound,
            unbound_released=len(unbound),
            now=now,
        ):
            return "recover"
        return None

    @staticmethod
    def bound_and_unbound(view: GangView) -> tuple[int, list[JSON]]:
        active = view.active
        bound = sum(1 for p in active if (p.get("spec") or {}).get("nodeName"))
        unbound = [p for p in active if not view.is_gated(p) and not (p.get("spec") or {}).get("nodeName")]
        return bound, unbound

    async def check(self, view: GangView, gang: JSON, now: float) -> None:
        """Do what `due` says (it is asked again: the gang may have moved on meanwhile)."""
        what = self.due(view, gang, now)
        recovery = recovery_of(gang)
        if what == "resume-jobs":
            await self.resume_jobs(view.namespace, view.name, view.pods, gang)
        elif what == "clean-slate":
            await self.record(view.namespace, view.name, gang, {**recovery, "failures": 0})
        elif what == "replace-stuck":
            await self.replace_stuck(view, gang, self.bound_and_unbound(view)[1])
        elif what == "recover":
            bound, unbound = self.bound_and_unbound(view)
            admission = (gang.get("status") or {}).get("admission") or {}
            await self.recover(view, gang, recovery, attempt_of(admission), bound, unbound, now)

    async def recover(
        self,
        view: GangView,
        gang: JSON,
        recovery: JSON,
        attempt: int,
        bound: int,
        unbound: list[JSON],
        now: float,
        why: str | None = None,
    ) -> None:
        metrics.PARTIAL_PLACEMENTS.inc()
        members = [(p["metadata"]["name"], controller_of(p)) for p in view.active]
        jobs: dict[str, JobFacts] = {}
        job_uids: dict[str, str] = {}
        for name in sorted({o.name for _, o in members if o is not None and o.kind == "Job"}):
            job = await self.api.read_job(view.namespace, name)
            if job is None:
                continue
            meta, spec = job["metadata"], job.get("spec") or {}
            owners = tuple(r["kind"] for r in meta.get("ownerReferences") or [] if r.get("controller"))
            jobs[name] = JobFacts(name, spec.get("managedBy"), meta.get("labels") or {}, owners)
            job_uids[name] = meta["uid"]
        plan = plan_recovery(members, jobs)
        pods = {p["metadata"]["name"]: p for p in view.active}
        for step in plan.steps:
            metrics.RECOVERIES.labels(action=step.action.value).inc()
        deletes = asyncio.Semaphore(16)

        async def delete(pod: JSON) -> None:
            async with deletes:
                await self.api.delete_pod(pod)
            self.ledger.drop(pod["metadata"]["uid"])  # deleted: its room is no longer promised

        await asyncio.gather(*(delete(pods[step.target]) for step in plan.of(Action.DELETE_POD)))
        suspended = list(recovery.get("suspendedJobs") or [])
        for step in plan.of(Action.SUSPEND_JOB):
            if await self.api.set_job_suspend(view.namespace, step.target, job_uids[step.target], True):
                suspended.append(step.target)
                for pod in view.active:  # the Job controller deletes them
                    owner = controller_of(pod)
                    if owner is not None and owner.kind == "Job" and owner.name == step.target:
                        self.ledger.drop(pod["metadata"]["uid"])
        failures = int(recovery.get("failures") or 0) + 1
        delay = self.backoff.delay(failures)
        self.backoffs[view.key] = float(math.ceil(now + delay))  # as written (whole seconds)
        names = ", ".join(sorted(p["metadata"]["name"] for p in unbound)[:5])
        what = why or (
            f"{bound} of {view.min_member} pods bound {view.schedule_timeout}s after the release "
            f"({len(unbound)} released pods never bound: {names})"
        )
        message = f"{what}; {plan.summary()}; next try after {delay:.0f}s backoff ({failures} in a row)"
        await self.record(
            view.namespace,
            view.name,
            gang,
            {
                "attempt": attempt,
                "failures": failures,
                "time": iso(now),
                "nextAttemptTime": iso_deadline(now + delay),
                "message": message,
                "suspendedJobs": sorted(set(suspended)),
            },
        )
        self.recovered[view.key] = attempt  # only once recorded: a recovery that failed is tried again
        log.warning("%s/%s partially placed: %s", view.namespace, view.name, message)
        for obj in (gang, view.group):
            if obj is not None:
                await self.api.post_event(obj, "PartiallyPlaced", message, warning=True)

    async def replace_stuck(self, view: GangView, gang: JSON, unbound: list[JSON]) -> None:
        """A running gang's pod beyond minMember (or a replacement) released but never bound —
        its planned node was taken: the gang is whole without it, so only that pod is made again
        (ReplicaSet, StatefulSet) or reported (anything else), once."""
        for pod in unbound:
            uid = pod["metadata"]["uid"]
            if uid in self.stuck:
                continue
            self.stuck.add(uid)
            owner, name = controller_of(pod), pod["metadata"]["name"]
            if owner is not None and owner.kind in ("ReplicaSet", "StatefulSet"):
                await self.api.delete_pod(pod)
                message = (
                    f"pod {name} was released {view.schedule_timeout}s ago and never bound (its planned node "
                    f"was taken): deleted it for its {owner.kind} to make again; the rest of the gang runs on"
                )
                await self.api.post_event(gang, "StuckPodReplaced", message)
            else:
                message = (
                    f"pod {name} was released {view.schedule_timeout}s ago and never bound (its planned node "
                    f"was taken); quorum does not delete pods of {owner.kind if owner else 'no owner'}: "
                    f"delete it yourself to retry"
                )
                await self.api.post_event(gang, "StuckPod", message, warning=True)
            log.warning("%s/%s: %s", view.namespace, view.name, message)

    async def resume_jobs(self, namespace: str, name: str, pods: list[JSON], gang: JSON) -> None:
        """Resume the Jobs a recovery suspended, each once none of its pods is left. Called also
        for gangs that have no pod at all (a suspended Job's pods are all gone)."""
        self.polled[(namespace, name)] = time.monotonic()
        recovery = recovery_of(gang)
        left = []
        for job_name in recovery.get("suspendedJobs") or []:
            job = await self.api.read_job(namespace, job_name)
            if job is None or not (job.get("spec") or {}).get("suspend"):
                continue  # gone, or resumed by someone else
            status, uid = job.get("status") or {}, job["metadata"]["uid"]
            left_behind = [p for p in pods if phase_of(p) not in ("Succeeded", "Failed")]
            mine = any(o is not None and o.uid == uid for o in map(controller_of, left_behind))
            if mine or not job_may_resume(status.get("active"), status.get("terminating")):
                left.append(job_name)
                continue
            if await self.api.set_job_suspend(namespace, job_name, uid, False):
                metrics.RECOVERIES.labels(action="ResumeJob").inc()
                await self.api.post_event(
                    gang, "JobResumed", f"resumed Job {job_name}: none of its old pods is left"
                )
        if left != recovery.get("suspendedJobs"):
            await self.record(namespace, name, gang, {**recovery, "suspendedJobs": left})

    async def record(self, namespace: str, name: str, gang: JSON, recovery: JSON) -> None:
        await self.api.patch_gang_status(namespace, name, {"recovery": recovery})
        # The store's copy too: the next pass must not act on what the watch has not shown yet.
        gang.setdefault("status", {})["recovery"] = recovery


def attempt_of(admission: JSON) -> int:
    try:
        return int(admission.get("attempt") or 0)
    except (TypeError, ValueError):
        return 0
