"""Recovery of partially placed gangs: the rules of `quorum.core.lifecycle`, applied.

Each pass, for every gang with a recorded decision: a gang that bound whole clears its run of
failures; a gang whose time ran out short of minMember bound is recovered by owner kind, once
per decision, and waits a backoff before it is planned again; Jobs suspended by a recovery are
resumed once none of their pods is left. What was done is recorded on the Gang
(`status.recovery`), so a new leader continues it; a person sees it as the `PartiallyPlaced`
and `Backoff` conditions and a warning Event.

A gang that ran whole and lost members below minMember is restarted if its policy is
`RestartGang` (annotation `quorum.dev/member-loss-policy`, else the operator's setting): the
rest is recovered by owner kind as above, once per decision, recorded in `status.recovery`
with reason `MemberLost` (no failure counted, no backoff), a `Restarted` condition and a
`GangRestarted` warning Event.
"""

from __future__ import annotations

import asyncio
import logging
import math
import time

from quorum.core.lifecycle import (
    MEMBER_LOSS_ANNOTATION,
    Action,
    BackoffPolicy,
    JobFacts,
    Member,
    MemberLoss,
    MemberLossPolicy,
    MemberState,
    Owner,
    RecoveryPlan,
    is_partially_placed,
    job_may_resume,
    member_loss,
    member_loss_policy,
    plan_recovery,
)
from quorum.k8s.api import KubeApi
from quorum.operator import metrics
from quorum.operator.conditions import backoff_until, iso, iso_deadline, recovery_of, timestamp
from quorum.operator.gangs import JSON, GangView, phase_of
from quorum.operator.ledger import Ledger

log = logging.getLogger("quorum.operator.recovery")


MEMBER_LOST = "MemberLost"  # status.recovery.reason of a restart (a partial placement's: PartiallyPlaced)


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
        # Gangs seen whole by this process: the admission attempt then, and its bound pods
        # (uid -> (name, node)), which name the members lost.
        self.whole: dict[tuple[str, str], tuple[int, dict[str, tuple[str, str]]]] = {}
        self.warned: set[tuple[str, str]] = set()  # gangs told their member-loss annotation is wrong

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
        for table in (self.recovered, self.backoffs, self.polled, self.whole):
            for key in [k for k in table if k not in live]:
                del table[key]
        self.stuck = {uid for uid in self.stuck if uid in pods}
        self.warned &= live

    def due(self, view: GangView, gang: JSON | None, now: float) -> str | None:
        """What recovery has to do for this gang now, if anything: `resume-jobs`,
        `clean-slate`, `replace-stuck`, `recover`, `restart-gang` or `warn-policy`. (It notes,
        in memory only, the gangs it sees whole.)"""
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
        policy, problem = self.policy_of(view)
        if problem and view.key not in self.warned:
            return "warn-policy"
        bound, unbound = self.bound_and_unbound(view)
        attempt = attempt_of(admission)
        if bound >= view.min_member:
            if policy is MemberLossPolicy.RESTART_GANG:
                self.whole[view.key] = (attempt, self.bound_members(view))
            if recovery.get("failures"):
                return "clean-slate"
            timed_out = now - timestamp(admission.get("time")) > view.schedule_timeout
            if timed_out and any(p["metadata"]["uid"] not in self.stuck for p in unbound):
                return "replace-stuck"
            return None
        if attempt in (recovery.get("attempt"), self.recovered.get(view.key)):
            return None
        if policy is MemberLossPolicy.RESTART_GANG and self.loss(view, gang) is not None:
            return "restart-gang"
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

    def policy_of(self, view: GangView) -> tuple[MemberLossPolicy, str | None]:
        """The gang's member-loss policy: its group object's annotation, or (a label-only gang)
        its pods'; else the operator's setting. And what is wrong with the annotation, if
        anything."""
        holders = [view.group] if view.group is not None else view.pods
        values = [
            ((o.get("metadata") or {}).get("annotations") or {}).get(MEMBER_LOSS_ANNOTATION) for o in holders
        ]
        return member_loss_policy(values, self.policy)

    @staticmethod
    def bound_members(view: GangView) -> dict[str, tuple[str, str]]:
        return {
            p["metadata"]["uid"]: (p["metadata"]["name"], node)
            for p in view.active
            if (node := (p.get("spec") or {}).get("nodeName"))
        }

    def loss(self, view: GangView, gang: JSON) -> MemberLoss | None:
        """The gang's member loss, if it has lost members (`quorum.core.lifecycle.member_loss`).
        It ran whole under its recorded decision if this process saw it so, or if the status on
        record says minMember pods bound (each decision's record resets that counter)."""
        assert view.min_member is not None
        status = gang.get("status") or {}
        admission = status.get("admission") or {}
        attempt = attempt_of(admission)
        recorded = status.get("bound")
        seen = self.whole.get(view.key)
        was_whole = (seen is not None and seen[0] == attempt) or (
            isinstance(recorded, int) and recorded >= view.min_member
        )
        preempted = status.get("preempted")
        since = timestamp(admission.get("time"))
        by_quorum = isinstance(preempted, dict) and timestamp(preempted.get("time")) >= since > 0
        bound = seen[1] if seen is not None and seen[0] == attempt else {}
        return member_loss(
            members_of(view, bound), min_member=view.min_member, was_whole=was_whole, preempted=by_quorum
        )

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
        elif what == "restart-gang" and (loss := self.loss(view, gang)) is not None:
            admission = (gang.get("status") or {}).get("admission") or {}
            await self.restart(view, gang, recovery, attempt_of(admission), loss, now)
        elif what == "warn-policy" and (problem := self.policy_of(view)[1]):
            self.warned.add(view.key)
            log.warning("%s/%s: %s", view.namespace, view.name, problem)
            for obj in (gang, view.group):
                if obj is not None:
                    await self.api.post_event(obj, "InvalidMemberLossPolicy", problem, warning=True)

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
        jobs, job_uids, _ = await self.read_jobs(view.namespace, members)
        plan = plan_recovery(members, jobs)
        suspended = await self.carry_out(view, plan, view.active, job_uids, recovery)
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
                "reason": "PartiallyPlaced",
            },
        )
        self.recovered[view.key] = attempt  # only once recorded: a recovery that failed is tried again
        log.warning("%s/%s partially placed: %s", view.namespace, view.name, message)
        for obj in (gang, view.group):
            if obj is not None:
                await self.api.post_event(obj, "PartiallyPlaced", message, warning=True)

    async def read_jobs(
        self, namespace: str, members: list[tuple[str, Owner | None]]
    ) -> tuple[dict[str, JobFacts], dict[str, str], list[str]]:
        """The facts and uids of the Jobs that own members (a Job that is gone is left out),
        and the names of those already suspended."""
        jobs: dict[str, JobFacts] = {}
        job_uids: dict[str, str] = {}
        suspended: list[str] = []
        for name in sorted({o.name for _, o in members if o is not None and o.kind == "Job"}):
            job = await self.api.read_job(namespace, name)
            if job is None:
                continue
            meta, spec = job["metadata"], job.get("spec") or {}
            owners = tuple(r["kind"] for r in meta.get("ownerReferences") or [] if r.get("controller"))
            jobs[name] = JobFacts(name, spec.get("managedBy"), meta.get("labels") or {}, owners)
            job_uids[name] = meta["uid"]
            if spec.get("suspend"):
                suspended.append(name)
        return jobs, job_uids, suspended

    async def carry_out(
        self,
        view: GangView,
        plan: RecoveryPlan,
        members: list[JSON],
        job_uids: dict[str, str],
        recovery: JSON,
    ) -> list[str]:
        """Delete the plan's pods and suspend its Jobs; the suspended Jobs on record, with those
        suspended now."""
        pods = {p["metadata"]["name"]: p for p in members}
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
        return suspended

    async def restart(
        self, view: GangView, gang: JSON, recovery: JSON, attempt: int, loss: MemberLoss, now: float
    ) -> None:
        """RestartGang: the members that still hold their place are recovered by owner kind, so
        that the gang is admitted again whole; once per decision, recorded, told."""
        held = [p for p in view.active if not view.is_gated(p)]
        members = [(p["metadata"]["name"], controller_of(p)) for p in held]
        jobs, job_uids, already = await self.read_jobs(view.namespace, members)
        if already:  # someone else suspended its Job: every pod of it goes, the gang re-forms whole
            self.recovered[view.key] = attempt
            log.info("%s/%s lost members while Job %s is suspended: left as it is", *view.key, already[0])
            return
        plan = plan_recovery(members, jobs)
        suspended = await self.carry_out(view, plan, held, job_uids, recovery)
        going = {s.target for s in plan.of(Action.DELETE_POD)}
        jobs_going = set(suspended) - set(recovery.get("suspendedJobs") or [])
        for pod in view.active:
            owner = controller_of(pod)
            if pod["metadata"]["name"] in going or (
                owner is not None and owner.kind == "Job" and owner.name in jobs_going
            ):
                # The store's copy too, until the watch shows it: the next pass must not take
                # the pods on their way out for a gang still admitted and release a replacement alone.
                pod["metadata"]["deletionTimestamp"] = iso(now)
        message = (
            f"{loss.describe()}; RestartGang: {plan.summary()}; the gang is admitted again once it is whole"
        )
        await self.record(
            view.namespace,
            view.name,
            gang,
            {
                **recovery,
                "attempt": attempt,
                "failures": 0,  # it ran whole: no partial placement in a row
                "time": iso(now),
                "message": message,
                "suspendedJobs": sorted(set(suspended)),
                "reason": MEMBER_LOST,
            },
        )
        self.recovered[view.key] = attempt
        self.whole.pop(view.key, None)
        metrics.GANG_RESTARTS.inc()
        log.warning("%s/%s restarted: %s", view.namespace, view.name, message)
        for obj in (gang, view.group):
            if obj is not None:
                await self.api.post_event(obj, "GangRestarted", message, warning=True)

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


def members_of(view: GangView, bound: dict[str, tuple[str, str]]) -> list[Member]:
    """The gang's members as the member-loss rule sees them. `bound`: the pods bound when this
    process last saw the gang whole (uid -> (name, node)); those now gone are lost members, and
    then pods that failed or went before that are not counted as lost."""
    members = []
    for pod in view.pods:
        meta, spec = pod["metadata"], pod.get("spec") or {}
        phase = phase_of(pod)
        if phase == "Succeeded":
            state = MemberState.SUCCEEDED
        elif phase == "Failed":
            state = MemberState.FAILED
        elif meta.get("deletionTimestamp"):
            state = MemberState.DELETED
        elif view.is_gated(pod):
            state = MemberState.GATED
        else:
            state = MemberState.HELD
        if bound and state in (MemberState.FAILED, MemberState.DELETED) and meta["uid"] not in bound:
            continue
        disrupted = any(
            c.get("type") == "DisruptionTarget" and c.get("status") == "True"
            for c in (pod.get("status") or {}).get("conditions") or []
        )
        members.append(Member(meta["name"], state, spec.get("nodeName"), disrupted))
    present = {p["metadata"]["uid"] for p in view.pods}
    members += [
        Member(name, MemberState.DELETED, node) for uid, (name, node) in bound.items() if uid not in present
    ]
    return members


def attempt_of(admission: JSON) -> int:
    try:
        return int(admission.get("attempt") or 0)
    except (TypeError, ValueError):
        return 0
