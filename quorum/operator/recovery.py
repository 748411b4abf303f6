"""Recovery of partially placed gangs: the rules of `quorum.core.lifecycle`, applied.

Each pass, for every gang with a recorded decision: a gang that bound whole clears its run of
failures; a gang whose time ran out short of minMember bound is recovered by owner kind, once
per decision, and waits a backoff before it is planned again; Jobs suspended by a recovery are
resumed once none of their pods is left. What was done is recorded on the Gang
(`status.recovery`), so a new leader continues it; a person sees it as the `PartiallyPlaced`
and `Backoff` conditions and a warning Event.
"""

from __future__ import annotations

import datetime
import logging
from typing import Any

from kubernetes_asyncio import client

from quorum.core.lifecycle import (
    Action,
    BackoffPolicy,
    JobFacts,
    Owner,
    is_partially_placed,
    job_may_resume,
    plan_recovery,
)
from quorum.k8s import reads, writes
from quorum.operator.gangs import JSON, GangView, phase_of, timestamp

log = logging.getLogger("quorum.operator.recovery")


def iso(epoch: float) -> str:
    return datetime.datetime.fromtimestamp(epoch, datetime.UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


def controller_of(pod: JSON) -> Owner | None:
    for ref in pod["metadata"].get("ownerReferences") or []:
        if ref.get("controller"):
            return Owner(ref["kind"], ref["name"], ref.get("uid", ""))
    return None


def recovery_of(gang: JSON | None) -> JSON:
    return dict(((gang or {}).get("status") or {}).get("recovery") or {})


def backoff_until(gang: JSON | None) -> float:
    """Epoch seconds before which the gang is not planned (0: no backoff)."""
    return timestamp(recovery_of(gang).get("nextAttemptTime"))


class Recoverer:
    def __init__(self, api: client.ApiClient, backoff: BackoffPolicy) -> None:
        self.api = api
        self.backoff = backoff
        # The decision recovered per gang, also before the watch shows our own status write.
        self.recovered: dict[tuple[str, str], int] = {}
        self.stuck: set[str] = set()  # pods of running gangs already replaced or reported

    async def check(self, view: GangView, gang: JSON | None, now: float) -> None:
        if gang is None or view.min_member is None or view.basic:
            return
        recovery = recovery_of(gang)
        if recovery.get("suspendedJobs"):
            await self.resume_jobs(view.namespace, view.name, view.pods, gang)
        admission = (gang.get("status") or {}).get("admission") or {}
        if not admission:
            return
        manual = (gang.get("status") or {}).get("manualRelease") or {}
        if timestamp(manual.get("time")) >= timestamp(admission.get("time")):
            return  # a person released the gang by hand after quorum's decision: theirs now
        active = view.active
        bound = sum(1 for p in active if (p.get("spec") or {}).get("nodeName"))
        unbound = [p for p in active if not view.is_gated(p) and not (p.get("spec") or {}).get("nodeName")]
        if bound >= view.min_member:
            if recovery.get("failures"):
                await self.record(
                    view.namespace, view.name, gang, {**recovery, "failures": 0}
                )  # bound whole: a clean slate
            if unbound and now - timestamp(admission.get("time")) > view.schedule_timeout:
                await self.replace_stuck(view, gang, unbound)
            return
        attempt = int(admission.get("attempt") or 0)
        if attempt in (recovery.get("attempt"), self.recovered.get(view.key)):
            return
        if is_partially_placed(
            released_at=timestamp(admission.get("time")),
            timeout_seconds=view.schedule_timeout,
            min_member=view.min_member,
            bound=bound,
            unbound_released=len(unbound),
            now=now,
        ):
            await self.recover(view, gang, recovery, attempt, bound, unbound, now)

    async def recover(
        self,
        view: GangView,
        gang: JSON,
        recovery: JSON,
        attempt: int,
        bound: int,
        unbound: list[JSON],
        now: float,
    ) -> None:
        self.recovered[view.key] = attempt
        members = [(p["metadata"]["name"], controller_of(p)) for p in view.active]
        jobs: dict[str, JobFacts] = {}
        job_uids: dict[str, str] = {}
        for name in sorted({o.name for _, o in members if o is not None and o.kind == "Job"}):
            job = await reads.job(self.api, view.namespace, name)
            if job is None:
                continue
            meta, spec = job["metadata"], job.get("spec") or {}
            owners = tuple(r["kind"] for r in meta.get("ownerReferences") or [] if r.get("controller"))
            jobs[name] = JobFacts(name, spec.get("managedBy"), meta.get("labels") or {}, owners)
            job_uids[name] = meta["uid"]
        plan = plan_recovery(members, jobs)
        pods = {p["metadata"]["name"]: p for p in view.active}
        for step in plan.of(Action.DELETE_POD):
            await writes.delete_pod(self.api, pods[step.target])
        suspended = list(recovery.get("suspendedJobs") or [])
        for step in plan.of(Action.SUSPEND_JOB):
            if await writes.set_job_suspend(
                self.api, view.namespace, step.target, job_uids[step.target], True
            ):
                suspended.append(step.target)
        failures = int(recovery.get("failures") or 0) + 1
        delay = self.backoff.delay(failures)
        names = ", ".join(sorted(p["metadata"]["name"] for p in unbound)[:5])
        message = (
            f"{bound} of {view.min_member} pods bound {view.schedule_timeout}s after the release "
            f"({len(unbound)} released pods never bound: {names}); {plan.summary()}; next try after "
            f"{delay:.0f}s backoff ({failures} in a row)"
        )
        await self.record(
            view.namespace,
            view.name,
            gang,
            {
                "attempt": attempt,
                "failures": failures,
                "time": iso(now),
                "nextAttemptTime": iso(now + delay),
                "message": message,
                "suspendedJobs": sorted(set(suspended)),
            },
        )
        log.warning("%s/%s partially placed: %s", view.namespace, view.name, message)
        for obj in (gang, view.group):
            if obj is not None:
                await writes.post_event(self.api, obj, "PartiallyPlaced", message, warning=True)

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
                await writes.delete_pod(self.api, pod)
                message = (
                    f"pod {name} was released {view.schedule_timeout}s ago and never bound (its planned node "
                    f"was taken): deleted it for its {owner.kind} to make again; the rest of the gang runs on"
                )
                await writes.post_event(self.api, gang, "StuckPodReplaced", message)
            else:
                message = (
                    f"pod {name} was released {view.schedule_timeout}s ago and never bound (its planned node "
                    f"was taken); quorum does not delete pods of {owner.kind if owner else 'no owner'}: "
                    f"delete it yourself to retry"
                )
                await writes.post_event(self.api, gang, "StuckPod", message, warning=True)
            log.warning("%s/%s: %s", view.namespace, view.name, message)

    async def resume_jobs(self, namespace: str, name: str, pods: list[JSON], gang: JSON) -> None:
        """Resume the Jobs a recovery suspended, each once none of its pods is left. Called also
        for gangs that have no pod at all (a suspended Job's pods are all gone)."""
        recovery = recovery_of(gang)
        left = []
        for job_name in recovery.get("suspendedJobs") or []:
            job = await reads.job(self.api, namespace, job_name)
            if job is None or not (job.get("spec") or {}).get("suspend"):
                continue  # gone, or resumed by someone else
            status, uid = job.get("status") or {}, job["metadata"]["uid"]
            left_behind = [p for p in pods if phase_of(p) not in ("Succeeded", "Failed")]
            mine = any(o is not None and o.uid == uid for o in map(controller_of, left_behind))
            if mine or not job_may_resume(status.get("active"), status.get("terminating")):
                left.append(job_name)
                continue
            if await writes.set_job_suspend(self.api, namespace, job_name, uid, False):
                await writes.post_event(
                    self.api, gang, "JobResumed", f"resumed Job {job_name}: none of its old pods is left"
                )
        if left != recovery.get("suspendedJobs"):
            await self.record(namespace, name, gang, {**recovery, "suspendedJobs": left})

    async def record(self, namespace: str, name: str, gang: JSON, recovery: JSON) -> None:
        await writes.patch_gang_status(self.api, namespace, name, {"recovery": recovery})
        # The store's copy too: the next pass must not act on what the watch has not shown yet.
        gang.setdefault("status", {})["recovery"] = recovery


def backoff_message(gang: JSON | None, now: float) -> str:
    recovery = recovery_of(gang)
    return (
        f"backing off after a partial placement ({recovery.get('failures', 1)} in a row): next try at "
        f"{recovery.get('nextAttemptTime')} (in {max(0.0, backoff_until(gang) - now):.0f}s)"
    )


def partial_condition(gang: JSON | None) -> dict[str, Any]:
    recovery = recovery_of(gang)
    if recovery.get("failures"):
        return {
            "type": "PartiallyPlaced",
            "status": "True",
            "reason": "TimedOut",
            "message": recovery["message"],
        }
    return {"type": "PartiallyPlaced", "status": "False", "reason": "NotPartial", "message": ""}
