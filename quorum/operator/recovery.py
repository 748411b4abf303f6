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

Under placement kube-scheduler (`quorum.operator.delegation`) a gang admitted so has no decision
of quorum's, so nothing here acts on it; of a gang quorum placed before the switch, only the pods
quorum released are recovered or restarted, never one kube-scheduler places
(`GangView.kube_scheduler_places`).
"""

from __future__ import annotations

import asyncio
import json
import logging
import math
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, replace

from quorum.core.conditions import iso, iso_deadline
from quorum.core.gangs import Placer
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
from quorum.core.record import Disruption, GangRecord, Recovery, Target
from quorum.core.times import timestamp
from quorum.core.workloads import InvalidWorkloadObject, composite_facts
from quorum.k8s.api import KubeApi
from quorum.operator import clock, metrics
from quorum.operator.gangs import JSON, GangView, phase_of
from quorum.operator.ledger import Ledger
from quorum.operator.status import GangRecords
from quorum.operator.work import GangWork, describe

log = logging.getLogger("quorum.operator.recovery")
GangKey = tuple[str, str]


PARTIALLY_PLACED = "PartiallyPlaced"  # status.recovery.reason and status.disruption.reason
# status.disruption.reason of a gang recovered with its CompositePodGroup: it runs whole, but the
# composite has fewer than minGroupCount of its gangs whole and one of them was recovered.
COMPOSITE = "CompositePartiallyPlaced"
MEMBER_LOST = "MemberLost"  # ... of a restart (RestartGang)
STUCK_POD = "StuckPod"  # status.disruption.reason of replacing a running gang's pods that never bound
EVENTS = {  # the Event that tells a disruption done: (reason, warning)
    PARTIALLY_PLACED: ("PartiallyPlaced", True),
    MEMBER_LOST: ("GangRestarted", True),
    STUCK_POD: ("StuckPodReplaced", False),
    COMPOSITE: ("PartiallyPlaced", True),
}


# A leader knows of a recovery its predecessor made only from the Gang's record, in that leader's
# wall clock; it takes a sibling along only if the sibling's decision is on record at least this
# much earlier. Leaders' clocks differ by far less, and a gang is recovered a whole
# scheduleTimeout after its decision, so a sibling admitted with it is well inside.
RECORDED_ORDER_MARGIN_SECONDS = 5.0


@dataclass(frozen=True)
class PartialSibling:
    """A gang of a composite found partially placed under its current decision: due for recovery
    now (neither time), recovered by this process (`at`, monotonic), or recovered by an earlier
    leader, as its record says (`recorded_at`, epoch seconds)."""

    name: str
    at: float | None = None
    recorded_at: float | None = None

    def takes(self, decided_at: float, decided_on_record: float | None) -> bool:
        """Whether it takes along a sibling whose decision this process first saw at
        `decided_at` (monotonic), recorded at `decided_on_record` (epoch seconds)."""
        if self.at is not None:
            return decided_at <= self.at
        if self.recorded_at is not None:
            return decided_on_record is not None and (
                decided_on_record <= self.recorded_at - RECORDED_ORDER_MARGIN_SECONDS
            )
        return True


@dataclass(frozen=True)
class CompositeState:
    """A CompositePodGroup of gangs, as one pass sees it: its gangs (key -> minMember), how many
    run whole, and which were found partially placed under their current decision."""

    name: str
    min_group_count: int
    gangs: Mapping[GangKey, int]
    whole: int
    partial: tuple[PartialSibling, ...]

    def recovers(self, decided_at: float, decided_on_record: float | None = None) -> tuple[str, ...]:
        """The partially placed gangs that take a sibling with them, while fewer than
        minGroupCount run whole: one due now, or one recovered after the sibling's decision
        (`PartialSibling.takes`). A sibling admitted after the recovery (the composite planned
        again) is a new try, never taken for the old one."""
        if self.whole >= self.min_group_count:
            return ()
        return tuple(p.name for p in self.partial if p.takes(decided_at, decided_on_record))


def disruption(
    reason: str,
    attempt: int,
    now: float,
    message: str,
    pods: list[Target],
    jobs: list[Target],
    composite: str | None = None,
) -> Disruption:
    """The record of a decision to delete pods or suspend Jobs (`status.disruption`)."""
    return Disruption(reason, attempt, iso(now), message, tuple(pods), tuple(jobs), composite)


# A disruption's record names each pod (name and uid) up to this size; beyond it, by uid only
# (`Disruption.compact`): etcd takes at most 1.5 MiB per object, the Gang's other records included.
NAMED_BYTES = 256 * 1024
RECORD_BYTES = 1024 * 1024


def recordable(decision: Disruption) -> Disruption | None:
    """The decision as it fits in its Gang: whole, compact, or None if not even its pods' uids
    fit (a gang of some 20,000 pods or more to delete at once)."""
    if record_size(decision) <= NAMED_BYTES:
        return decision
    compact = decision.compact()
    return compact if record_size(compact) <= RECORD_BYTES else None


def record_size(decision: Disruption) -> int:
    return len(json.dumps(decision.to_json(), separators=(",", ":")))


def is_active(pod: JSON) -> bool:
    return phase_of(pod) not in ("Succeeded", "Failed") and not pod["metadata"].get("deletionTimestamp")


def controller_of(pod: JSON) -> Owner | None:
    for ref in pod["metadata"].get("ownerReferences") or []:
        if ref.get("controller"):
            # The apiserver requires apiVersion on every ownerReference; the group ("" for v1).
            version = ref.get("apiVersion")
            group = str(version).rpartition("/")[0] if version else None
            return Owner(ref["kind"], ref["name"], ref.get("uid", ""), group)
    return None


class Recoverer:
    """Applies the lifecycle rules. `due` (pure, cheap) says whether a gang has anything to be
    done this pass; `check` does it, in the gang's own task."""

    def __init__(
        self,
        api: KubeApi,
        records: GangRecords,
        backoff: BackoffPolicy,
        ledger: Ledger,
        policy: MemberLossPolicy = MemberLossPolicy.REPLACE,
        placement: Placer = Placer.QUORUM,
    ) -> None:
        self.api = api
        self.placement = placement  # gangs kube-scheduler places are not recovered
        self.records = records
        self.memory = records.memory  # what this term knows of each gang: recovered, backoff, ...
        self.backoff = backoff
        self.ledger = ledger
        self.policy = policy  # for gangs whose annotation does not say
        # The decision recovered per gang, also before the watch shows our own status write.
        self.stuck: set[str] = set()  # pods of running gangs already replaced or reported
        self.composites: dict[GangKey, CompositeState] = {}  # this pass's, by composite
        self.composite_of: dict[GangKey, GangKey] = {}  # gang -> its composite
        # Backoffs this process recorded, also before the watch shows the write (the store's
        # Gang may be an older version meanwhile): epoch seconds, per gang.
        # Gangs seen whole by this process: the admission attempt then, and its bound pods
        # (uid -> (name, node)), which name the members lost.

    def may_poll(self, key: tuple[str, str], every: float = 2.0) -> bool:
        """Whether a suspended Job of the gang may be looked at again (not every pass: its
        pods can take minutes to go)."""
        polled = self.memory[key].polled
        return polled is None or clock.monotonic() - polled >= every

    def recovered_already(self, key: tuple[str, str], record: GangRecord) -> bool:
        """The gang's recorded decision has been recovered (by this process or on record)."""
        on_record = record.recovery is not None and record.recovery.recovered(record.attempt)
        return on_record or record.attempt == self.memory[key].recovered

    def backoff_until(self, key: tuple[str, str], record: GangRecord) -> float:
        """Epoch seconds before which the gang is not planned (0: no backoff)."""
        on_record = record.recovery.backoff_until if record.recovery else 0.0
        return max(on_record, self.memory[key].backoff_until)

    def prune(self, pods: dict[str, JSON]) -> None:
        """Forget the pods already replaced or reported once they are gone."""
        self.stuck = {uid for uid in self.stuck if uid in pods}

    def due(self, view: GangView, gang: JSON | None, now: float) -> str | None:
        """What recovery has to do for this gang now, if anything: `resume-jobs`,
        `clean-slate`, `replace-stuck`, `recover`, `recover-composite`, `restart-gang` or
        `warn-policy`. (It notes, in memory only, the gangs it sees whole.)"""
        if gang is None:
            return None
        record = GangRecord.of(gang)
        if record.disruption is not None:
            return "finish-disruption"  # recorded and not done (a leader died in between, a write failed)
        if view.min_member is None or view.basic or view.merged:
            return None
        admission, recovery = record.admission, record.recovery or Recovery()
        if (
            record.manual_release
            and record.manual_release.overrides(admission)
            and not recovery.suspended_jobs
        ):
            return None  # a person released the gang by hand after quorum's decision: theirs now
        if growing(view.min_member, gang, view.bound_and_unbound[0]):
            # Its group's minCount grew: the new size is planned first, never a loss; a pod
            # released before and never bound is still made again (or reported), as below.
            return "replace-stuck" if self.stuck_since_decision(view, record) else None
        if recovery.suspended_jobs:
            return "resume-jobs" if self.may_poll(view.key) else None
        if admission is None:
            return None
        policy, problem = self.policy_of(view)
        if problem and not self.memory[view.key].warned_policy:
            return "warn-policy"
        bound, unbound = self.bound_and_unbound(view)
        attempt = admission.attempt
        recovered = recovery.recovered(attempt) or attempt == self.memory[view.key].recovered
        if bound >= view.min_member:
            if policy is MemberLossPolicy.RESTART_GANG:
                self.memory[view.key].whole = (attempt, self.bound_members(view))
            self.records.since_decision(view.key, attempt)  # its first sight counts from now, if not yet
            composite = self.composites.get(self.composite_of.get(view.key, ("", "")))
            withdrawn = recovery.withdrawn and recovery.attempt == attempt
            if withdrawn and self.since_withdrawal(view.key, attempt) < view.schedule_timeout:
                recovered = True  # found running at its last look: not taken again at once
            if composite is not None and self.taken_with(view, record, composite) and not recovered:
                return "recover-composite"
            if recovery.failures:
                return "clean-slate"
            return "replace-stuck" if self.stuck_since_decision(view, record) else None
        if recovered:
            return None
        if policy is MemberLossPolicy.RESTART_GANG and self.loss(view, gang) is not None:
            return "restart-gang"
        elapsed = self.records.since_decision(view.key, attempt)
        if recovery.withdrawn and recovery.attempt == attempt:
            elapsed = min(elapsed, self.since_withdrawal(view.key, attempt))
        if is_partially_placed(
            elapsed=elapsed,
            timeout_seconds=view.schedule_timeout,
            min_member=view.min_member,
            bound=bound,
            unbound_released=len(unbound),
        ):
            return "recover"
        return None

    def taken_with(self, view: GangView, record: GangRecord, composite: CompositeState) -> tuple[str, ...]:
        """The partially placed siblings that take this gang with them (`CompositeState.recovers`),
        by when this process first saw its decision and when the decision is on record."""
        decided_at = clock.monotonic() - self.records.since_decision(view.key, record.attempt)
        on_record = timestamp(record.admission.time) if record.admission is not None else 0.0
        return composite.recovers(decided_at, on_record or None)

    def since_withdrawal(self, key: GangKey, attempt: int) -> float:
        """Seconds since this process first knew the recovery of `attempt` withdrawn (monotonic):
        it is not recovered again sooner than a timeout after that."""
        entry = self.memory[key]
        if entry.withdrawal_seen is None or entry.withdrawal_seen[0] != attempt:
            entry.withdrawal_seen = (attempt, clock.monotonic())
        return clock.monotonic() - entry.withdrawal_seen[1]

    def stuck_since_decision(self, view: GangView, record: GangRecord) -> bool:
        """A released pod not yet replaced or reported is still unbound a timeout after the
        gang's last decision."""
        if record.admission is None:
            return False
        if self.records.since_decision(view.key, record.attempt) <= view.schedule_timeout:
            return False
        return any(p["metadata"]["uid"] not in self.stuck for p in self.bound_and_unbound(view)[1])

    def start_due(
        self,
        views: Mapping[tuple[str, str], GangView],
        work: GangWork,
        fail: Callable[[tuple[str, str], str, str], None],
        now: float,
    ) -> None:
        """Start, as each gang's task, what recovery has to do this pass: for gangs with pods,
        what `due` says; for Gangs without pods, a recorded disruption to finish, Jobs to resume,
        or the status of a recovery that waits for a Job's pods to go."""
        try:
            self.see_composites(views, now)
        except Exception:  # a shape nobody foresaw: no composite is recovered whole this pass
            log.exception("reading the CompositePodGroups failed")
            self.composites, self.composite_of = {}, {}
        for key, view in views.items():
            gang = self.records.gang(key)
            if gang is None or work.blocks_planning(key) or work.backing_off(key):
                continue
            try:
                if self.due(view, gang, now):
                    work.start(key, "recover", self.check(view, gang, now))
            except Exception as err:
                fail(key, "recover", describe(err))
        for key in list(self.records.store.gangs):
            if key in views or work.blocks_planning(key) or work.backing_off(key):
                continue
            gang = self.records.gang(key) or {}
            try:
                record = GangRecord.of(gang)
                recovery = record.recovery or Recovery()
                if record.disruption is not None:  # recorded, not finished; no pod left to show
                    min_member = int((gang.get("spec") or {}).get("minMember") or 1)
                    work.start(key, "recover", self.finish(key, min_member, record.disruption, None))
                elif recovery.suspended_jobs and self.may_poll(key):  # its pods are all gone
                    work.start(key, "recover", self.resume_jobs(key[0], key[1], [], gang))
                elif (recovery.failures or recovery.suspended_jobs) and (
                    write := self.records.recovering_due(key, gang, None)
                ):  # no pods: a recovery, or a preemption, that waits for a Job's pods to go
                    work.start(key, "status", self.records.write_recovering(key, write))
            except Exception as err:
                fail(key, "recover", describe(err))

    def see_composites(self, views: Mapping[GangKey, GangView], now: float) -> None:
        """Each CompositePodGroup of gangs as this pass sees it (`CompositeState`): a composite
        is admitted whole and recovered whole, so once one of its gangs is partially placed and
        fewer than minGroupCount run whole, the others are recovered too (`recover-composite`),
        those that run whole included."""
        members: dict[GangKey, list[GangView]] = {}
        for view in views.values():
            if view.parent is not None and view.min_member is not None and not view.basic:
                members.setdefault((view.namespace, view.parent), []).append(view)
        self.composites, self.composite_of = {}, {}
        for key, children in members.items():
            obj = self.records.store.composites.get(key)
            try:
                facts = composite_facts(obj) if obj is not None else None
            except InvalidWorkloadObject:
                facts = None
            if facts is None:
                continue
            whole, partial = 0, list[PartialSibling]()
            for view in children:
                gang = self.records.gang(view.key)
                record = GangRecord.of(gang)
                if gang is None or record.admission is None:
                    continue
                assert view.min_member is not None
                entry = self.memory[view.key]
                if view.bound_and_unbound[0] >= view.min_member:
                    whole += 1
                elif entry.recovered == record.attempt and entry.recovered_at is not None:
                    partial.append(PartialSibling(view.name, at=entry.recovered_at))
                elif record.recovery is not None and record.recovery.recovered(record.attempt):
                    # recovered by an earlier leader (its siblings may not have been, yet); a
                    # record without a readable time takes no sibling along
                    if recorded_at := timestamp(record.recovery.time):
                        partial.append(PartialSibling(view.name, recorded_at=recorded_at))
                elif self.due(view, gang, now) == "recover":
                    partial.append(PartialSibling(view.name))
            gangs = {v.key: v.min_member or 1 for v in children}
            self.composites[key] = CompositeState(key[1], facts.min_group_count, gangs, whole, tuple(partial))
            for view in children:
                self.composite_of[view.key] = key

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
        record = GangRecord.of(gang)
        attempt = record.attempt
        recorded = (gang.get("status") or {}).get("bound")  # a counter, not a decision
        seen = self.memory[view.key].whole
        was_whole = (seen is not None and seen[0] == attempt) or (
            isinstance(recorded, int) and recorded >= view.min_member
        )
        by_quorum = record.preempted is not None and record.preempted.under(record.admission)
        bound = seen[1] if seen is not None and seen[0] == attempt else {}
        return member_loss(
            members_of(view, bound, self.placement),
            min_member=view.min_member,
            was_whole=was_whole,
            preempted=by_quorum,
        )

    def bound_and_unbound(self, view: GangView) -> tuple[int, list[JSON]]:
        """Bound pods; released pods not bound yet, but those kube-scheduler places (a gang's
        pods admitted under placement kube-scheduler: never quorum's to recover)."""
        bound, unbound = view.bound_and_unbound  # computed once per view
        return bound, self.quorums(view, unbound)

    def quorums(self, view: GangView, pods: Iterable[JSON]) -> list[JSON]:
        """The pods quorum may recover: not those kube-scheduler places."""
        return [p for p in pods if not view.kube_scheduler_places(p, self.placement)]

    async def check(self, view: GangView, gang: JSON, now: float) -> None:
        """Do what `due` says (it is asked again: the gang may have moved on meanwhile)."""
        what = self.due(view, gang, now)
        record = GangRecord.of(gang)
        recovery = record.recovery or Recovery()
        if what == "finish-disruption" and record.disruption is not None:
            await self.finish(view.key, view.min_member or 1, record.disruption, view.group)
        elif what == "resume-jobs":
            await self.resume_jobs(view.namespace, view.name, view.pods, gang)
        elif what == "clean-slate":
            await self.record(view.key, replace(recovery, failures=0))
        elif what == "replace-stuck":
            await self.replace_stuck(view, gang, self.bound_and_unbound(view)[1], now)
        elif what == "recover":
            bound, unbound = self.bound_and_unbound(view)
            await self.recover(view, gang, recovery, record.attempt, bound, unbound, now)
        elif what == "recover-composite":
            composite = self.composites[self.composite_of[view.key]]
            taken_with = self.taken_with(view, record, composite)
            await self.recover(view, gang, recovery, record.attempt, 0, [], now, (composite, taken_with))
        elif what == "restart-gang" and (loss := self.loss(view, gang)) is not None:
            await self.restart(view, gang, recovery, record.attempt, loss, now)
        elif what == "warn-policy" and (problem := self.policy_of(view)[1]):
            self.memory[view.key].warned_policy = True
            log.warning("%s/%s: %s", view.namespace, view.name, problem)
            await self.records.events.post_all(
                [gang, view.group], "InvalidMemberLossPolicy", problem, warning=True
            )

    async def recover(
        self,
        view: GangView,
        gang: JSON,
        recovery: Recovery,
        attempt: int,
        bound: int,
        unbound: list[JSON],
        now: float,
        composite: tuple[CompositeState, tuple[str, ...]] | None = None,
    ) -> None:
        """A partially placed gang (or, `composite`, a gang whose CompositePodGroup is): all its
        pods recovered by owner kind, then a backoff."""
        metrics.PARTIAL_PLACEMENTS.inc()
        plan, pods, jobs = await self.plan(view, self.quorums(view, view.active))
        failures = recovery.failures + 1
        delay = self.backoff.delay(failures)
        names = ", ".join(sorted(p["metadata"]["name"] for p in unbound)[:5])
        if composite is None:
            what = (
                f"{bound} of {view.min_member} pods bound {view.schedule_timeout}s after the release "
                f"({len(unbound)} released pods never bound: {names})"
            )
        else:
            state, partial = composite
            what = (
                f"CompositePodGroup {state.name} has {state.whole} of minGroupCount "
                f"{state.min_group_count} gangs bound whole ({', '.join(partial)} partially "
                f"placed): recovered with it, although this gang runs"
            )
        message = f"{what}; {plan.summary()}; next try after {delay:.0f}s backoff ({failures} in a row)"
        record = Recovery(
            PARTIALLY_PLACED,
            attempt,
            failures,
            iso(now),
            iso_deadline(now + delay),
            message,
            tuple(sorted({*recovery.suspended_jobs, *(j.name for j in jobs)})),
        )
        reason = PARTIALLY_PLACED if composite is None else COMPOSITE
        decision = disruption(
            reason, attempt, now, message, pods, jobs, composite[0].name if composite else None
        )
        await self.disrupt(view, decision, record, backoff_until=float(math.ceil(now + delay)))

    async def plan(
        self, view: GangView, members: list[JSON]
    ) -> tuple[RecoveryPlan, list[Target], list[Target]]:
        """What recovering `members` by owner kind takes: the plan, the pods it deletes and the
        Jobs it suspends (name and uid each, for the decision's record)."""
        owners = [(p["metadata"]["name"], controller_of(p)) for p in members]
        jobs, job_uids, _ = await self.read_jobs(view.namespace, owners)
        plan = plan_recovery(owners, jobs)
        by_name = {p["metadata"]["name"]: p for p in members}
        pods = [Target(s.target, by_name[s.target]["metadata"]["uid"]) for s in plan.of(Action.DELETE_POD)]
        suspend = [Target(s.target, job_uids[s.target]) for s in plan.of(Action.SUSPEND_JOB)]
        for step in plan.steps:
            metrics.RECOVERIES.labels(action=step.action.value).inc()
        return plan, pods, suspend

    async def disrupt(
        self,
        view: GangView,
        decision: Disruption,
        recovery: Recovery | None = None,
        backoff_until: float = 0.0,
    ) -> None:
        """The one place quorum deletes a gang's pods or suspends its Jobs (docs/lifecycle.md,
        "When quorum removes a pod"): the decision is recorded on the Gang first
        (`status.disruption`, with the `recovery` it belongs to), so that a leader killed at any
        point leaves its reason behind and the next one finishes it; then `finish` acts on a
        fresh read of the gang's pods."""
        fitting = recordable(decision)
        if fitting is None:
            # Nothing is deleted that cannot be recorded first: the gang is left as it is, and a
            # person is told what to do.
            message = (
                f"{decision.reason}: quorum would delete {len(decision.pods)} pods of gang {view.name}, "
                f"too many to record on its Gang first (etcd's limit per object); it deletes none. "
                f"Delete the gang's pods by hand (their controllers make them again) or make the gang smaller"
            )
            log.warning("%s/%s: %s", view.namespace, view.name, message)
            self.memory[view.key].recovered = decision.attempt  # given up on, and told, once per decision
            holders = [self.records.gang(view.key), view.group]
            await self.records.events.post_all(holders, "RecoveryTooLarge", message, warning=True)
            return
        decision = fitting
        fields: JSON = {"disruption": decision.to_json()}
        # Recorded only if the Gang still holds the decision this one follows and no other
        # disruption: a later release, or a leader's disruption, that the watch has not shown
        # refuses it (a read-then-write would not: the old leader's writes may land in between).
        expect = {"admission/attempt": decision.attempt, "disruption": None}
        if not await self.records.patch_recovery(view.key, fields, recovery, expect=expect):
            return  # gone, or superseded: nothing is done without its record
        if backoff_until:
            self.memory[view.key].backoff_until = backoff_until  # as written (whole seconds)
        if decision.reason != STUCK_POD:
            self.memory[view.key].recovered = decision.attempt
            self.memory[view.key].recovered_at = clock.monotonic()
        await self.finish(view.key, view.min_member or 1, decision, view.group)

    async def finish(
        self, key: tuple[str, str], min_member: int, decision: Disruption, group: JSON | None
    ) -> None:
        """Carry out a recorded decision: read the gang's pods afresh; if minMember of them are
        bound the gang runs, and the decision is withdrawn with nothing deleted; else delete
        the named pods (uid precondition) and suspend the named Jobs, tell it in an Event, and
        clear the record. A new leader may repeat any step; none does harm twice."""
        if decision.attempt != self.records.record(key).attempt:
            # Made for a decision the gang has moved past: obsolete, nothing is done by it.
            log.info("%s/%s: a disruption recorded for an earlier decision cleared unused", *key)
            await self.records.record_if(key, {"disruption/attempt": decision.attempt}, {"disruption": None})
            return
        # Still the Gang's decision and still recorded, as the apiserver has it now (a test-only
        # JSON Patch): the watch's copy may show one that another leader finished and cleared.
        if not await self.records.record_if(key, decision.still_recorded(), {}):
            return
        gang = self.records.gang(key)
        # A group shrunk since the decision (1.37's mutable minCount) counts at the last look.
        resized = ((gang or {}).get("spec") or {}).get("minMember")
        if isinstance(resized, int) and 0 < resized < min_member:
            min_member = resized
        names = self.records.store.labels_of(key)
        fresh = [p for p in await self.api.read_gang_pods(key[0], *names) if is_active(p)]
        by_uid = {p["metadata"]["uid"]: p for p in fresh}
        bound = sum(1 for p in fresh if (p.get("spec") or {}).get("nodeName"))
        reason = decision.reason
        targets = [by_uid[t.uid] for t in decision.pods if t.uid in by_uid]
        if reason == STUCK_POD:  # only pods that still never bound; the gang runs on
            targets = [p for p in targets if not (p.get("spec") or {}).get("nodeName")]
        elif reason == COMPOSITE:
            whole, need = await self.composite_whole(key, decision.composite or "")
            if whole >= need:
                name = decision.composite
                why = f"{whole} of minGroupCount {need} gangs of CompositePodGroup {name} run whole"
                await self.withdraw(key, gang, group, why, decision)
                return
        elif bound >= min_member:
            why = f"{bound} of minMember {min_member} pods are bound"
            await self.withdraw(key, gang, group, why, decision)
            return
        limit = asyncio.Semaphore(16)

        async def delete(pod: JSON) -> None:
            async with limit:
                deleted = await self.api.delete_pod(pod)
            if deleted:  # not one that is gone, or changed (bound) since the read
                self.going(pod["metadata"]["uid"])

        await asyncio.gather(*(delete(p) for p in targets))
        for job in decision.jobs:
            if await self.api.set_job_suspend(key[0], job.name, job.uid, True):
                for pod in fresh:  # the Job controller deletes them
                    owner = controller_of(pod)
                    if owner is not None and owner.kind == "Job" and owner.uid == job.uid:
                        self.going(pod["metadata"]["uid"], keeps_room=True)
        message = decision.message
        log.warning("%s/%s: %s", *key, message)
        event, warning = EVENTS.get(reason, ("PartiallyPlaced", True))
        # Required: the record is cleared only once the act is told (a new leader tells it else).
        await self.records.events.post_all([gang, group], event, message, warning=warning, required=True)
        await self.records.record_if(key, decision.still_recorded(), {"disruption": None})

    async def composite_whole(self, key: GangKey, name: str) -> tuple[int, int]:
        """How many gangs of the CompositePodGroup run whole, by a fresh read of their pods, and
        its minGroupCount as the pass last saw it. A composite no pass saw (gone, or a new
        leader's first look) is (0, 0): the decision is withdrawn, nothing deleted."""
        composite = self.composites.get((key[0], name))
        if composite is None:
            return 0, 0
        whole = 0
        for gang_key, min_member in composite.gangs.items():
            names = self.records.store.labels_of(gang_key)
            pods = [p for p in await self.api.read_gang_pods(gang_key[0], *names) if is_active(p)]
            whole += sum(1 for p in pods if (p.get("spec") or {}).get("nodeName")) >= min_member
        return whole, composite.min_group_count

    def going(self, uid: str, keeps_room: bool = False) -> None:
        """A pod quorum deleted (or whose Job it suspended): assumed terminating in the store
        (`Store.assume_deleting`). A deleted pod's room is no longer promised; a suspended
        Job's released pod `keeps_room` until it is gone, since kube-scheduler may still bind
        it until the Job controller deletes it."""
        if not keeps_room:
            self.ledger.drop(uid)
        self.records.store.assume_deleting(uid, iso(clock.time()))

    async def withdraw(
        self, key: tuple[str, str], gang: JSON | None, group: JSON | None, why: str, decision: Disruption
    ) -> None:
        """A recorded recovery found the gang running after all: nothing deleted, no backoff. A
        Job it suspended already (its leader cut off before it could tell it) is resumed, before
        its controller takes the running pods."""
        resumed = []
        for job in decision.jobs:
            if job.name in self.memory[key].suspending:
                continue  # a preemption of this process suspends it now, for its own reason
            current = await self.api.read_job(key[0], job.name)
            meta = (current or {}).get("metadata") or {}
            suspended = meta.get("uid") == job.uid and ((current or {}).get("spec") or {}).get("suspend")
            if suspended and await self.api.set_job_suspend(key[0], job.name, job.uid, False):
                resumed.append(job.name)
        recovery = GangRecord.of(gang).recovery or Recovery()
        message = f"recovery withdrawn: {why} at the last look; nothing was deleted"
        if resumed:
            message += f"; Job {', '.join(resumed)}, suspended for it already, resumed"
        written: Recovery | None = None
        if recovery.attempt == decision.attempt:
            written = replace(recovery, failures=0, next_attempt_time=None, message=message, withdrawn=True)
        elif resumed:
            written = recovery
        entry = self.memory[key]
        entry.backoff_until = 0.0
        if entry.recovered == decision.attempt:  # not recovered after all: a timeout from now, again
            entry.recovered = entry.recovered_at = None
            entry.withdrawal_seen = (decision.attempt, clock.monotonic())
        cleared = {"disruption": None}  # only while it is still the record (a test of it)
        await self.records.patch_recovery(key, cleared, written, resumed, expect=decision.still_recorded())
        log.info("%s/%s: %s", *key, message)
        await self.records.events.post_all([gang, group], "RecoveryWithdrawn", message)

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

    async def restart(
        self, view: GangView, gang: JSON, recovery: Recovery, attempt: int, loss: MemberLoss, now: float
    ) -> None:
        """RestartGang: the members that still hold their place are recovered by owner kind, so
        that the gang is admitted again whole; once per decision, recorded, told."""
        held = self.quorums(view, [p for p in view.active if not view.is_gated(p)])
        owners = [(p["metadata"]["name"], controller_of(p)) for p in held]
        _, _, already = await self.read_jobs(view.namespace, owners)
        if already:  # someone else suspended its Job: every pod of it goes, the gang re-forms whole
            self.memory[view.key].recovered = attempt
            log.info("%s/%s lost members while Job %s is suspended: left as it is", *view.key, already[0])
            return
        plan, pods, jobs = await self.plan(view, held)
        message = (
            f"{loss.describe()}; RestartGang: {plan.summary()}; the gang is admitted again once it is whole"
        )
        record = replace(
            recovery,
            reason=MEMBER_LOST,
            attempt=attempt,
            withdrawn=False,
            failures=0,  # it ran whole: no partial placement in a row
            time=iso(now),
            message=message,
            suspended_jobs=tuple(sorted({*recovery.suspended_jobs, *(j.name for j in jobs)})),
        )
        self.memory[view.key].whole = None
        metrics.GANG_RESTARTS.inc()
        await self.disrupt(view, disruption(MEMBER_LOST, attempt, now, message, pods, jobs), record)

    async def replace_stuck(self, view: GangView, gang: JSON, unbound: list[JSON], now: float) -> None:
        """A running gang's pod beyond minMember (or a replacement) released but never bound —
        its planned node was taken: the gang is whole without it, so only that pod is made again
        (an owner that makes pods again, `RECREATING_OWNERS`: recorded, then deleted) or reported
        (anything else), once."""
        replaced: list[JSON] = []
        attempt = GangRecord.of(gang).attempt
        for pod in unbound:
            uid = pod["metadata"]["uid"]
            if uid in self.stuck:
                continue
            self.stuck.add(uid)
            owner, name = controller_of(pod), pod["metadata"]["name"]
            if owner is not None and owner.recreates_pods:
                replaced.append(pod)
                continue
            message = (
                f"pod {name} was released {view.schedule_timeout}s ago and never bound (its planned node "
                f"was taken); quorum does not delete pods of {owner.kind if owner else 'no owner'}: "
                f"delete it yourself to retry"
            )
            log.warning("%s/%s: %s", view.namespace, view.name, message)
            await self.records.events.post(gang, "StuckPod", message, warning=True)
        if not replaced:
            return
        names = ", ".join(p["metadata"]["name"] for p in replaced)
        message = (
            f"pods {names} were released {view.schedule_timeout}s ago and never bound (their planned nodes "
            f"were taken): deleted them for their controllers to make again; the rest of the gang runs on"
        )
        pods = [Target(p["metadata"]["name"], p["metadata"]["uid"]) for p in replaced]
        await self.disrupt(view, disruption(STUCK_POD, attempt, now, message, pods, []))

    async def resume_jobs(self, namespace: str, name: str, pods: list[JSON], gang: JSON) -> None:
        """Resume the Jobs a recovery suspended, each once none of its pods is left. Called also
        for gangs that have no pod at all (a suspended Job's pods are all gone)."""
        self.memory[(namespace, name)].polled = clock.monotonic()
        recovery = GangRecord.of(gang).recovery or Recovery()
        left: list[str] = []
        suspending = self.memory[(namespace, name)].suspending
        for job_name in recovery.suspended_jobs:
            before = job_name in suspending  # it may be suspended, and let go, while this reads
            job = await self.api.read_job(namespace, job_name)
            if job is not None and (before or job_name in suspending):
                left.append(job_name)  # recorded by a preemption of this process that may still suspend it
                continue
            if job is None or not (job.get("spec") or {}).get("suspend"):
                continue  # gone, or resumed by someone else
            status, uid = job.get("status") or {}, job["metadata"]["uid"]
            left_behind = [p for p in pods if phase_of(p) not in ("Succeeded", "Failed")]
            mine = sum(1 for o in map(controller_of, left_behind) if o is not None and o.uid == uid)
            if not job_may_resume(status.get("active"), status.get("terminating"), mine):
                left.append(job_name)
                continue
            if await self.api.set_job_suspend(namespace, job_name, uid, False):
                metrics.RECOVERIES.labels(action="ResumeJob").inc()
                message = f"resumed Job {job_name}: none of its old pods is left"
                await self.records.events.post(gang, "JobResumed", message)
        if tuple(left) != recovery.suspended_jobs:
            dropped = set(recovery.suspended_jobs) - set(left)
            await self.record((namespace, name), replace(recovery, suspended_jobs=tuple(left)), dropped)

    async def record(self, key: tuple[str, str], recovery: Recovery, dropped: Iterable[str] = ()) -> None:
        await self.records.patch_recovery(key, {}, recovery, dropped)


def members_of(
    view: GangView, bound: dict[str, tuple[str, str]], placement: Placer = Placer.QUORUM
) -> list[Member]:
    """The gang's members as the member-loss rule sees them. `bound`: the pods bound when this
    process last saw the gang whole (uid -> (name, node)); those now gone are lost members, and
    then pods that failed or went before that are not counted as lost. A pod kube-scheduler has
    yet to place (placement kube-scheduler) waits as a gated one does."""
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
        elif view.is_gated(pod) or (not spec.get("nodeName") and view.kube_scheduler_places(pod, placement)):
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


def growing(min_member: int, gang: JSON, bound: int) -> bool:
    """Whether the gang's group grew (1.37's mutable `gang.minCount`) and no decision at the new
    size has been made yet: before quorum recorded the new size (the Gang's `spec.minMember` is
    smaller), or since (its `status.resized` names the decision it was made under, and that is
    still the last one). Meanwhile fewer than minMember bound is the old size still running, not
    a loss or a partial placement — as long as at least the old size is bound: below it, the
    gang lost members whatever its new size, and recovery acts on it."""
    recorded = (gang.get("spec") or {}).get("minMember")
    if isinstance(recorded, int) and not isinstance(recorded, bool) and min_member > recorded:
        return bound >= recorded
    record = GangRecord.of(gang)
    resized = record.resized
    if resized is None or record.admission is None or resized.new <= resized.old:
        return False
    return resized.attempt == record.attempt and bound >= resized.old
