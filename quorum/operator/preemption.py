"""Whole-gang preemption, carried out (docs/preemption.md): what `quorum.core.preemption`
decides, done and seen through to the end.

One preemption at a time in the cluster. It goes:

1. Recorded on the preemptor's Gang (`status.preemption`: a token, a deadline, what it takes)
   before anything else, so a new leader sees it through. The record names no node and no work
   of another namespace (the Gang's tenant reads it): the nodes are found again by their taint's
   token, and the victims, once marked, need nothing more of it.
2. The nodes the gang will use get the taint `quorum.dev/reserved=<token>:NoSchedule`: neither
   other gangs (the planner reads taints) nor the default scheduler's pods take the room that
   frees. The preemptor's pods tolerate it: in the planner's model, and their release adds the
   toleration (a gated pod may gain tolerations).
3. Recorded on each victim gang's Gang before anything is done to any victim: `status.preempted`,
   and the Jobs of it that will be suspended added to `status.recovery.suspendedJobs` (what
   recovery, a new leader's too, and `quorum uninstall` resume). Then the platform's record (the
   log line and an Event in quorum's own namespace that name every victim, budget and node), an
   Event to each victim (required) and the preemptor's Event `Preempting`. A failure up to here
   ends the preemption with nothing taken; a Job recorded but never suspended is dropped from
   the record by recovery.
4. Each victim pod gets the `DisruptionTarget` condition (reason `PreemptionByQuorum`, who and
   why), and then goes: a Job whose `suspend` is quorum's, all of whose running pods are
   victims, and whose gang has a Gang to record it on, is suspended (its pods go without
   counting against its backoffLimit; recovery resumes it once they are gone, and its new pods
   wait gated as a gang); every other victim pod is deleted, as kube-scheduler's preemption
   deletes its victims (the decision kept PodDisruptionBudgets where it could; a budget does not
   veto it).

What each namespace is told names only that namespace's objects (`quorum.core.preemption.Preemption`
composes every message; docs/threat-model.md, "What a tenant can read").

It ends when the preemptor has minMember pods bound, when it is gone, or at its deadline: the
taints are removed and the record cleared. A reservation taint that belongs to no preemption in
flight (a leader died between the taint and the record's end) is removed too.
"""

from __future__ import annotations

import asyncio
import logging
import secrets
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, replace
from typing import Any

from quorum.core.conditions import iso
from quorum.core.lifecycle import JobFacts
from quorum.core.model import Gang, Node, Requirement, Resources, tenant_name
from quorum.core.planner import Plan, PlannerSettings
from quorum.core.preemption import (
    INTERRUPTABLE_LABEL,
    DisruptionBudget,
    GroupFacts,
    NoPreemption,
    Preemption,
    RunningPod,
    Work,
    choose_victims,
    units,
)
from quorum.core.record import GangRecord, Preempted, PreemptionRecord, Recovery
from quorum.k8s.api import KubeApi
from quorum.k8s.usage import BoundPods
from quorum.k8s.writes import RESERVED_TAINT
from quorum.operator import clock, metrics
from quorum.operator.gangs import JSON, GangView, phase_of
from quorum.operator.leader import LeaseSettings
from quorum.operator.ledger import Ledger
from quorum.operator.settings import PreemptionLoopSettings
from quorum.operator.status import GangRecords
from quorum.operator.work import GangWork, describe

log = logging.getLogger("quorum.operator.preemption")
GangKey = tuple[str, str]
WITHDRAWN = "the preemption of this gang was withdrawn before anything was taken; it runs on"
REASON = "PreemptionByQuorum"
WITHDRAWN_REASON = "PreemptionWithdrawn"  # of a DisruptionTarget condition set False
EXPIRED_BACKOFF_CAP = 1800.0  # the longest wait after preemptions that did not bind their gang
STRAY_TAINTS: GangKey = ("", "reservation taints")  # the work key of removing stray ones


@dataclass(frozen=True)
class Candidate:
    """A held gang that may preempt, with what the decision reads (a snapshot)."""

    key: GangKey
    gang: Gang
    interruptable: bool
    nodes: Mapping[str, Node]
    free: Mapping[str, Resources]
    work: Sequence[Work]
    budgets: Sequence[DisruptionBudget]


DONE = "done"  # how the end of a preemption whose gang bound begins


def may_preempt(view: GangView) -> bool:
    """`preemptionPolicy: Never` keeps a gang from preempting: its PodGroup's (Kubernetes 1.37),
    or its PriorityClass's (resolved into each pod)."""
    if view.preemption_policy == "Never":
        return False
    return not any((p.get("spec") or {}).get("preemptionPolicy") == "Never" for p in view.pods)


def is_interruptable(view: GangView) -> bool:
    return bool(view.pods) and all(
        (p["metadata"].get("labels") or {}).get(INTERRUPTABLE_LABEL) == "true" for p in view.pods
    )


def group_facts(view: GangView) -> GroupFacts:
    group = view.group or {}
    spec = group.get("spec") or {}
    annotations = (group.get("metadata") or {}).get("annotations") or {}
    priority = spec.get("priority") if isinstance(spec, dict) else None
    return GroupFacts(
        view.priority() if isinstance(priority, int) and not isinstance(priority, bool) else None,
        view.disruption_mode,
        annotations.get("quorum.dev/preemptible") != "false",
    )


def selects(selector: object, labels: Mapping[str, str]) -> bool:
    """A PodDisruptionBudget's label selector (policy/v1: an empty selector selects every pod of
    its namespace; none selects none)."""
    if not isinstance(selector, dict):
        return False
    for key, value in (selector.get("matchLabels") or {}).items():
        if labels.get(key) != value:
            return False
    for e in selector.get("matchExpressions") or []:
        if not Requirement(e.get("key", ""), e.get("operator", ""), tuple(e.get("values") or ())).matches(
            labels
        ):
            return False
    return True


def budgets_of(pdbs: Mapping[tuple[str, str], JSON], bound: BoundPods) -> list[DisruptionBudget]:
    by_namespace: dict[str, list[tuple[str, Mapping[str, str]]]] = {}
    for uid, facts in bound.facts.items():
        by_namespace.setdefault(facts.running.namespace, []).append((uid, facts.labels))
    out = []
    for (namespace, name), pdb in pdbs.items():
        selector = (pdb.get("spec") or {}).get("selector")
        allowed = (pdb.get("status") or {}).get("disruptionsAllowed")
        uids = frozenset(uid for uid, labels in by_namespace.get(namespace, []) if selects(selector, labels))
        if uids:
            out.append(DisruptionBudget(namespace, name, uids, allowed if isinstance(allowed, int) else 0))
    return out


def excluded(work: Work, gangs: set[GangKey]) -> bool:
    """Work of one of these gangs (the preemptor, gangs being released)."""
    gang_name = work.name if work.kind == "gang" else work.gang
    return gang_name is not None and (work.namespace, gang_name) in gangs


def disruption_target(pod: JSON) -> str | None:
    """The reason of the pod's DisruptionTarget condition if it is True."""
    for c in (pod.get("status") or {}).get("conditions") or []:
        if c.get("type") == "DisruptionTarget" and c.get("status") == "True":
            return str(c.get("reason"))
    return None


def platform_object(namespace: str) -> JSON:
    """What the platform's record of a preemption is posted on: quorum-operator's Lease, in
    quorum's own namespace, which no tenant reads."""
    return {
        "apiVersion": "coordination.k8s.io/v1",
        "kind": "Lease",
        "metadata": {"name": LeaseSettings().name, "namespace": namespace},
    }


def pod_ref(pod: RunningPod) -> JSON:
    return {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": pod.name, "namespace": pod.namespace, "uid": pod.uid},
    }


class Preempter:
    def __init__(
        self,
        api: KubeApi,
        records: GangRecords,
        bound: BoundPods,
        settings: PreemptionLoopSettings,
        planner: PlannerSettings,
    ) -> None:
        self.api = api
        self.statuses = records  # the one writer of a Gang's status
        self.store = records.store
        self.bound = bound
        self.settings = settings
        self.planner = planner
        self.tried: dict[GangKey, float] = {}  # when preemption last found nothing for the gang
        self.why_not: dict[GangKey, str] = {}  # and why, for the gang's status
        # Preemptions in a row that ended without the gang bound: the room they freed went to
        # someone else, so the next waits longer (retry x 2^n), and fewer victims lose their work.
        self.expired: dict[GangKey, int] = {}
        # The same per tenant (`Gang.owner`): a tenant's next gang, under any name, backs off as
        # far as its last one did; and the tenant whose gang preempted last, whose next waits once
        # for another tenant's gang of its priority (the one preemption in flight is the
        # cluster's). Entries go once their backoff has run out (`prune`).
        self.expired_tenant: dict[str, int] = {}
        self.owners: dict[GangKey, str] = {}  # the tenant of each gang that preempted
        self.tenant_expired_at: dict[str, float] = {}  # when a tenant's last preemption expired
        self.last_tenant: str | None = None
        # The nodes this process tainted for each token, before the watch shows the taints.
        self.tainted: dict[str, set[str]] = {}
        # When this process first saw each preemption in flight (monotonic, by token): its
        # deadline counts from there, not from a time another machine wrote.
        self.first_seen: dict[str, float] = {}

    # -- what is in flight -------------------------------------------------------------------

    def in_flight(self) -> dict[GangKey, PreemptionRecord]:
        """The preemptions recorded on the Gangs, as this process knows them (`GangRecords.record`:
        what it wrote or read afresh that the watch has not shown yet included)."""
        out: dict[GangKey, PreemptionRecord] = {}
        memory = self.statuses.memory
        for key, gang in self.store.gangs.items():
            entry = memory.get(key)
            shown = GangRecord.of(gang).preemption  # parses this one field only
            if shown is None and not (entry is not None and "preemption" in entry.unseen):
                continue  # the cheap test first: a pass asks this of every gang, several times
            if (record := self.statuses.record(key).preemption) is not None:
                out[key] = record
        return out

    def tokens(self) -> dict[GangKey, str]:
        return {key: record.token for key, record in self.in_flight().items()}

    def age(self, record: PreemptionRecord) -> float:
        """Seconds since this process first saw the preemption in flight (monotonic)."""
        now = clock.monotonic()
        return now - self.first_seen.setdefault(record.token, now)

    # -- deciding ----------------------------------------------------------------------------

    def candidate(
        self,
        holds: Sequence[tuple[GangView, Gang]],
        nodes: Mapping[str, Node],
        room: Callable[[GangKey], Mapping[str, Resources]],
        views: Mapping[GangKey, GangView],
        busy: set[GangKey],
        now: float,
        counted: Callable[[RunningPod], RunningPod] = lambda pod: pod,
    ) -> Candidate | None:
        """The first gang in queue order that is held for lack of room and may try now, with a
        snapshot of what the decision reads; None when none may (or a preemption is in flight).
        `room`: each node's room after the pass as a gang may count on it (`Planner.room_for`:
        capacity the starvation guard holds for the gang itself is its own, not taken)."""
        if not self.settings.enabled or self.in_flight() or self.unknown_taints():
            # One at a time; and a reservation taint of a preemption this process does not know
            # is one in flight until a fresh list of the Gangs says otherwise (`look_up_taints`).
            return None
        may: list[tuple[GangView, Gang]] = []
        for view, gang in holds:
            key = view.key
            if not may_preempt(view):
                whose = "its PodGroup" if view.preemption_policy == "Never" else "its pods' PriorityClass"
                self.why_not[key] = f"no preemption: {whose} has preemptionPolicy: Never"
                continue
            last = max(self.tried.get(key, -1e18), self.tenant_expired_at.get(gang.owner, -1e18))
            if now - last < self.retry_after(key, gang.owner):
                continue
            may.append((view, gang))
        # The first that may, in queue order; but once, the first of another tenant than the
        # last preemption's, of the same priority, goes before it.
        chosen = may[:1]
        if may and may[0][1].owner == self.last_tenant:
            first = may[0][1]
            others = [(v, g) for v, g in may if g.owner != first.owner and g.priority == first.priority]
            chosen = others[:1] or chosen
            self.last_tenant = None
        for view, gang in chosen:
            key = view.key
            self.owners[key] = gang.owner
            groups = {k: group_facts(v) for k, v in views.items()}
            exclude = busy | {key}  # gangs being released: their room is reserved, not bound
            running = [counted(self.aliased(f.running)) for f in self.bound.facts.values()]
            work = [w for w in units(running, groups) if not excluded(w, exclude)]
            budgets = budgets_of(self.store.pdbs, self.bound)
            return Candidate(key, gang, is_interruptable(view), dict(nodes), dict(room(key)), work, budgets)
        return None

    def aliased(self, pod: RunningPod) -> RunningPod:
        """The pod under the name of its gang: its label's, or its Gang's legacy one."""
        alias = self.store.aliases.get((pod.namespace, pod.gang)) if pod.gang and self.store.aliases else None
        return replace(pod, gang=alias) if alias else pod

    def decide(self, candidate: Candidate) -> Preemption | NoPreemption:
        """In a worker thread: the pure decision."""
        return choose_victims(
            candidate.gang,
            candidate.nodes,
            candidate.free,
            candidate.work,
            candidate.budgets,
            interruptable=candidate.interruptable,
            planner=self.planner,
            settings=self.settings.decision,
        )

    def found_nothing(self, key: GangKey, outcome: NoPreemption, now: float) -> None:
        self.tried[key] = now
        self.why_not[key] = f"no preemption ({outcome.reason}): {outcome.message}"
        metrics.PREEMPTIONS.labels(result=outcome.reason).inc()

    async def run(self, view: GangView, preemption: Preemption, now: float) -> None:
        """The gang's preemption task: its Gang object first (the victims' Events name it)."""
        gang = await self.statuses.ensure_gang(view)
        await self.execute(view, gang, preemption, now)

    def start_upkeep(self, views: Mapping[GangKey, GangView], work: GangWork, now: float) -> None:
        """End the preemptions that are done, gone or late; remove reservation taints of none."""
        for key, record, why, warn in self.due_ends(views, now):
            if not work.busy(key):
                work.start(key, "preempt", self.end(key, record, why, warn, why.startswith(DONE)))
        if (unknown := self.unknown_taints()) and not work.busy(STRAY_TAINTS):
            work.start(STRAY_TAINTS, "preempt", self.look_up_taints(unknown))

    async def start(
        self,
        views: Mapping[GangKey, GangView],
        plannable: Mapping[GangKey, GangView],
        plan: Plan,
        nodes: Mapping[str, Node],
        room: Callable[[GangKey], Mapping[str, Resources]],
        work: GangWork,
        ledger: Ledger,
        fail: Callable[[GangKey, str, str], None],
        now: float,
        counted: Callable[[RunningPod], RunningPod] = lambda pod: pod,
    ) -> None:
        """Ask, for the first gang held for lack of room that may preempt, which lower-priority
        work would make room (in a worker thread: the decision plans the gang a few times), and
        start the preemption it finds. One preemption in flight at a time."""
        held = [
            (plannable[h.gang.key], h.gang)
            for h in plan.holds
            if h.reason == "Unschedulable" and not work.busy(h.gang.key)
        ]
        busy = {key for key in views if work.blocks_planning(key)} | {r.gang for r in ledger.entries.values()}
        candidate = self.candidate(held, nodes, room, views, busy, now, counted)
        if candidate is not None:
            try:
                outcome: Preemption | NoPreemption | None = await asyncio.to_thread(self.decide, candidate)
            except Exception as err:  # that gang's trouble: it backs off, the pass goes on
                fail(candidate.key, "preempt", describe(err))
                outcome = None
            if isinstance(outcome, Preemption):
                view = plannable[candidate.key]
                timeout = work.timeout * (1 + len(outcome.victims) / 16)
                work.start(candidate.key, "preempt", self.run(view, outcome, now), timeout)
                self.last_tenant = candidate.gang.owner
            elif outcome is not None:
                self.found_nothing(candidate.key, outcome, now)

    # -- carrying it out ----------------------------------------------------------------------

    async def execute(self, view: GangView, gang: JSON, preemption: Preemption, now: float) -> None:
        key = view.key
        token = secrets.token_hex(6)
        who = f"{view.namespace}/{view.name}"
        record = PreemptionRecord(
            token,
            iso(now),
            iso(now + self.settings.timeout_seconds),
            preemption.summary(view.namespace),
            tuple(v.entry(view.namespace) for v in preemption.victims),
        )
        # Recorded only while the Gang records no preemption: one another leader recorded, that
        # the watch has not shown, refuses it.
        if not await self.statuses.record_if(key, {"preemption": None}, {"preemption": record.to_json()}):
            log.info("%s: its Gang is gone or records a preemption already; nothing preempted", who)
            return  # not recorded: nothing may be taken
        self.first_seen[token] = clock.monotonic()
        self.why_not.pop(key, None)
        for name in preemption.nodes:
            node = self.store.nodes.get(name)
            if node is None or not await self.api.taint_node(node, token, add=True):
                log.info("%s: node %s changed or went before it could be reserved", who, name)
                await self.end(key, record, "a node changed or went before it could be reserved", warn=True)
                return
            self.tainted.setdefault(token, set()).add(name)
        suspend, to_delete = await self.sort_victims(preemption.victims)
        try:
            await self.carry_out(view, gang, preemption, record, suspend, to_delete, now)
        finally:  # whatever was not suspended by now never will be by this task
            for (namespace, name), (gang_name, _) in suspend.items():
                self.statuses.memory[(namespace, gang_name)].suspending.discard(name)

    async def carry_out(
        self,
        view: GangView,
        gang: JSON,
        preemption: Preemption,
        record: PreemptionRecord,
        suspend: Mapping[tuple[str, str], tuple[str, str]],
        to_delete: Sequence[RunningPod],
        now: float,
    ) -> None:
        """Recorded, told, then done (docs/preemption.md, "How it is carried out"): each victim's Gang
        records it, a Job to suspend included, before anything is done to any victim; then the
        platform's full record, the victims' and the preemptor's Events; then the marks, the
        suspensions and the deletions. A failure before the marks ends the preemption with
        nothing taken; a Job recorded but never suspended is dropped by recovery."""
        key, token = view.key, record.token
        recorded: dict[GangKey, Preempted | None] = {}
        try:
            await self.record_victims(preemption, suspend, now, recorded, token)
            warn = bool(preemption.past_budgets)
            log.info("%s; token %s", preemption.announced(named=None), token)
            platform = platform_object(self.settings.namespace)
            await self.statuses.events.post(
                platform, "Preempting", preemption.announced(), warning=warn, required=True
            )
            await self.tell_victims(preemption, suspend)
            told = preemption.announced(view.namespace)
            await self.statuses.events.post(gang, "Preempting", told, warning=warn)
        except Exception as err:
            log.info(
                "%s/%s: preemption not recorded in full (%s); ended with nothing taken", *key, describe(err)
            )
            await self.unrecord_victims(recorded)
            try:
                await self.end(key, record, "not recorded in full", True)
            except Exception as again:  # its deadline ends it
                log.info("%s/%s: preemption not ended: %s", *key, describe(again))
            # What the preemptor's tenant reads of the failure: not the error, which may name
            # another namespace (the log has it).
            raise RuntimeError("its victims could not all be recorded and told: nothing was taken") from None
        pods = [p for v in preemption.victims for p in v.pods]
        mark = self.api.mark_disruption_target
        try:
            await self.each(pods, lambda pod: mark(pod_ref(pod), REASON, preemption.told(pod.namespace)))
        except Exception as err:
            # Nothing is taken yet: withdrawn whole, so no victim keeps its mark or its record
            # (a running pod marked DisruptionTarget misleads a Job's podFailurePolicy; a gang
            # recorded preempted is not restarted when it loses a member).
            log.info("%s/%s: a victim could not be marked (%s): preemption withdrawn", *key, describe(err))
            await self.unmark(pods, "a victim could not be marked")
            await self.unrecord_victims(recorded)
            await self.end(key, record, "a victim could not be marked", True)
            raise RuntimeError(
                "a victim could not be marked: the preemption was withdrawn, nothing taken"
            ) from None
        for (namespace, name), (gang_name, uid) in suspend.items():
            await self.api.set_job_suspend(namespace, name, uid, True)
            self.statuses.memory[(namespace, gang_name)].suspending.discard(name)
        await self.each(to_delete, lambda pod: self.api.delete_victim(pod_ref(pod)))
        metrics.PREEMPTIONS.labels(result="Started").inc()
        metrics.PREEMPTION_VICTIMS.observe(len(preemption.victims))
        metrics.PREEMPTION_PAST_BUDGETS.inc(len(preemption.past_budgets))

    async def unmark(self, pods: Sequence[RunningPod], why: str) -> None:
        """Best effort: each victim's DisruptionTarget set False (a failure is logged; the end of
        the preemption looks again, `settle_victims`)."""
        clear = self.api.clear_disruption_target
        try:
            await self.each(
                pods, lambda pod: clear(pod_ref(pod), WITHDRAWN_REASON, f"preemption withdrawn: {why}")
            )
        except Exception as err:
            log.info("victims' DisruptionTarget not all cleared: %s", describe(err))

    async def sort_victims(
        self, victims: Sequence[Work]
    ) -> tuple[dict[tuple[str, str], tuple[str, str]], list[RunningPod]]:
        """Which Jobs are suspended ((namespace, name) -> (victim gang, uid)) and which pods
        deleted: a Job is suspended when its suspend is quorum's, every pod of it that runs is a
        victim, and its gang has a Gang to record it on (for recovery, and `quorum uninstall`, to
        resume it)."""
        taken = {p.uid for v in victims for p in v.pods}
        by_job: dict[tuple[str, str], tuple[str, list[RunningPod]]] = {}
        delete: list[RunningPod] = []
        for victim in victims:
            recordable = victim.kind == "gang" and (victim.namespace, victim.name) in self.store.gangs
            for pod in victim.pods:
                owner = self.bound.facts[pod.uid].owner if pod.uid in self.bound.facts else None
                if recordable and owner is not None and owner.kind == "Job":
                    by_job.setdefault((pod.namespace, owner.name), (victim.name, []))[1].append(pod)
                else:
                    delete.append(pod)
        suspend: dict[tuple[str, str], tuple[str, str]] = {}
        for (namespace, name), (gang_name, pods) in by_job.items():
            job = await self.api.read_job(namespace, name)
            mine = job is not None and all(
                f.running.uid in taken
                for f in self.bound.facts.values()
                if f.owner is not None and f.owner.uid == job["metadata"]["uid"]
            )
            if job is not None and mine:
                meta, spec = job["metadata"], job.get("spec") or {}
                owners = tuple(r["kind"] for r in meta.get("ownerReferences") or [] if r.get("controller"))
                facts = JobFacts(name, spec.get("managedBy"), meta.get("labels") or {}, owners)
                if facts.suspend_owner() is None and not spec.get("suspend"):
                    suspend[(namespace, name)] = (gang_name, meta["uid"])
                    continue
            delete += pods
        return suspend, delete

    async def record_victims(
        self,
        preemption: Preemption,
        suspend: Mapping[tuple[str, str], tuple[str, str]],
        now: float,
        recorded: dict[GangKey, Preempted | None],
        token: str,
    ) -> None:
        """`status.preempted` on each victim gang's Gang, as its namespace may read it, and the
        Jobs of it to suspend added to `status.recovery.suspendedJobs` (what recovery and `quorum
        uninstall` resume), before anything is done to any victim. Raises if one cannot be
        recorded: nothing is taken then. `recorded`: each victim's `preempted` before, filled in
        as it goes (`unrecord_victims` puts them back)."""
        for victim in preemption.victims:
            gang_name = victim.name if victim.kind == "gang" else victim.gang
            vkey = (victim.namespace, str(gang_name))
            if gang_name is None or vkey not in self.store.gangs or vkey in recorded:
                continue  # a lone pod, a gang without a Gang, or one recorded already (pod by pod)
            current = self.statuses.record(vkey)
            told = preemption.told(victim.namespace)
            by = preemption.preempted_by(victim.namespace)
            preempted = Preempted(iso(now), told, by, current.attempt, token)
            jobs = sorted(n for (ns, n), (g, _) in suspend.items() if (ns, g) == vkey)
            recovery: Recovery | None = None
            if jobs and victim.kind == "gang":
                message = f"{told}; suspending Job {', '.join(jobs)} until its pods are gone"
                # The Jobs are added to those recorded (`patch_recovery`).
                recovery = replace(
                    current.recovery or Recovery(), message=message, suspended_jobs=tuple(jobs)
                )
                self.statuses.memory[vkey].suspending.update(jobs)
            recorded[vkey] = current.preempted
            if not await self.statuses.patch_recovery(vkey, {"preempted": preempted.to_json()}, recovery):
                raise RuntimeError("the Gang of a victim went before it recorded the preemption")

    async def unrecord_victims(self, recorded: Mapping[GangKey, Preempted | None]) -> None:
        """A preemption that took nothing: each victim's `status.preempted` as it was (else a
        member it loses later would be taken for preempted, and not recovered), and an Event
        saying so. Best effort: a write that fails leaves the gang marked preempted until its next
        decision, which deletes nothing."""
        for vkey, before in recorded.items():
            try:
                if await self.statuses.patch(vkey, {"preempted": before.merge_patch() if before else None}):
                    gang = self.statuses.gang(vkey)
                    if gang is not None:
                        await self.statuses.events.post(gang, "PreemptionWithdrawn", WITHDRAWN)
            except Exception as err:
                log.info("%s/%s: its preemption record not withdrawn: %s", *vkey, describe(err))

    async def tell_victims(
        self, preemption: Preemption, suspend: Mapping[tuple[str, str], tuple[str, str]]
    ) -> None:
        """An Event on each victim gang's Gang (a lone pod: on the pod), each told what its
        namespace may read (`Preemption.told`). Before any victim is marked, and required: an
        Event that cannot be posted fails the preemption before it takes anything."""
        for victim in preemption.victims:
            told = preemption.told(victim.namespace)
            gang_name = victim.name if victim.kind == "gang" else victim.gang
            gang = self.store.gangs.get((victim.namespace, gang_name)) if gang_name else None
            if gang is None:
                for pod in victim.pods:
                    await self.statuses.events.post(
                        pod_ref(pod), "Preempted", told, warning=True, required=True
                    )
                continue
            vkey = (victim.namespace, str(gang_name))
            jobs = sorted(n for (ns, n), (g, _) in suspend.items() if (ns, g) == vkey)
            suspended = f"; suspending Job {', '.join(jobs)} until its pods are gone" if jobs else ""
            await self.statuses.events.post(gang, "Preempted", told + suspended, warning=True, required=True)

    @staticmethod
    async def each(pods: Sequence[RunningPod], call: Any, at_once: int = 16) -> None:
        """`call` on every pod, some at once; the first error is raised once all have run."""
        limit = asyncio.Semaphore(at_once)

        async def one(pod: RunningPod) -> None:
            async with limit:
                await call(pod)

        results = await asyncio.gather(*(one(p) for p in pods), return_exceptions=True)
        for result in results:
            if isinstance(result, BaseException):
                raise result

    # -- ending ------------------------------------------------------------------------------

    def due_ends(
        self, views: Mapping[GangKey, GangView], now: float
    ) -> list[tuple[GangKey, PreemptionRecord, str, bool]]:
        """Preemptions to end now: (gang, record, why, is it a warning)."""
        out = []
        for key, record in self.in_flight().items():
            view = views.get(key)
            need = max(1, (view.min_member or 1) if view is not None else 1)
            if view is not None and view.counts()["bound"] >= need:
                out.append((key, record, f"{DONE}: {view.counts()['bound']} pods bound", False))
            elif view is None and key not in self.store.gangs:
                out.append((key, record, "the gang is gone", False))
            elif self.age(record) > self.settings.timeout_seconds:
                why = f"not bound within {self.settings.timeout_seconds:.0f}s: reserved nodes freed"
                out.append((key, record, why, True))
        return out

    def retry_after(self, key: GangKey, tenant: str) -> float:
        doublings = min(max(self.expired.get(key, 0), self.expired_tenant.get(tenant, 0)), 16)
        return float(min(self.settings.retry_seconds * (1 << doublings), EXPIRED_BACKOFF_CAP))

    async def end(
        self, key: GangKey, record: PreemptionRecord, why: str, warn: bool, bound: bool = False
    ) -> None:
        """End a preemption: its reservation taints removed and its record cleared. One that ends
        without the gang bound (`warn`) counts as tried now, and backs the next one off; its
        tenant's next gang too, as does one whose gang went before it bound (not `bound`)."""
        tenant = self.owners.get(key) or tenant_name(key[0])
        if warn:
            self.tried[key] = clock.time()
            self.expired[key] = self.expired.get(key, 0) + 1
        else:
            self.expired.pop(key, None)
        if bound:  # only a preemption that got its gang bound clears its tenant's backoff
            self.expired_tenant.pop(tenant, None)
            self.tenant_expired_at.pop(tenant, None)
        else:  # expired, or its gang deleted before it bound: the tenant backs off
            self.expired_tenant[tenant] = self.expired_tenant.get(tenant, 0) + 1
            self.tenant_expired_at[tenant] = clock.time()
        token = record.token
        for name in sorted(self.reserved_nodes(record)):
            node = self.store.nodes.get(name)
            if node is not None:
                await self.api.taint_node(node, token, add=False)
        self.tainted.pop(token, None)
        await self.settle_victims(token, why)
        if key in self.store.gangs:  # only its own record: not one another leader made since
            await self.statuses.record_if(key, {"preemption/token": token}, {"preemption": None})
        self.first_seen.pop(token, None)
        metrics.PREEMPTIONS.labels(result="Ended" if not warn else "Expired").inc()
        log.info("%s/%s: preemption ended: %s", *key, why)
        gang = self.store.gangs.get(key)
        if gang is not None:
            await self.statuses.events.post(gang, "PreemptionEnded", why, warning=warn)

    async def settle_victims(self, token: str, why: str) -> None:
        """As a preemption ends, its victims that were not taken (still bound, not terminating)
        lose their DisruptionTarget mark; a victim gang that still runs whole loses its
        `status.preempted` too, with an Event: it was not preempted after all. Found by the
        token their records name, so a new leader does it too."""
        for vkey in list(self.store.gangs):
            gang = self.statuses.gang(vkey)
            preempted = GangRecord.of(gang).preempted
            if gang is None or preempted is None or preempted.token != token:
                continue
            pods = [
                p
                for p in self.store.pods.values()
                if p["metadata"].get("namespace") == vkey[0]
                and self.store.gang_of(p) == vkey[1]
                and (p.get("spec") or {}).get("nodeName")
                and not p["metadata"].get("deletionTimestamp")
                and phase_of(p) not in ("Succeeded", "Failed")
            ]
            marked = [p for p in pods if disruption_target(p) == REASON]
            message = f"preemption ended ({why}) without taking this pod"
            for pod in marked:
                await self.api.clear_disruption_target(pod, WITHDRAWN_REASON, message)
            need = int((gang.get("spec") or {}).get("minMember") or 1)
            if len(pods) >= need and await self.statuses.patch(vkey, {"preempted": None}):
                await self.statuses.events.post(gang, "PreemptionWithdrawn", WITHDRAWN)

    def reserved_nodes(self, record: PreemptionRecord) -> set[str]:
        """The nodes a preemption's token reserves: those whose taint carries it (as the watch
        shows them, which a new leader reads too), those this process tainted, and those a
        record of an earlier version named."""
        token = record.token
        found = set(record.nodes) | self.tainted.get(token, set())
        for name, node in self.store.nodes.items():
            if any(
                t.get("key") == RESERVED_TAINT and t.get("value") == token
                for t in (node.get("spec") or {}).get("taints") or []
            ):
                found.add(name)
        return found

    def unknown_taints(self) -> list[tuple[JSON, str]]:
        """Reservation taints of no preemption in flight that this process knows: (node, token).
        Each is a preemption in flight whose record the Gang watch has not shown, or one whose
        leader died between its taint and its end; `look_up_taints` tells which."""
        live = set(self.tokens().values())
        out = []
        for node in self.store.nodes.values():
            for taint in (node.get("spec") or {}).get("taints") or []:
                if taint.get("key") == RESERVED_TAINT and taint.get("value") not in live:
                    out.append((node, str(taint.get("value") or "")))
        return out

    async def look_up_taints(self, found: list[tuple[JSON, str]]) -> None:
        """The Gangs listed afresh: a token one of them records is a preemption in flight, known
        from now on (its upkeep ends it); a token none records is stray — its preemption was
        recorded before its taint, so a list made after the taint was seen would show it — and
        its taint is removed."""
        live: dict[str, tuple[GangKey, JSON]] = {}
        for gang in await self.api.list_gangs():
            record = GangRecord.of(gang).preemption
            if record is not None:
                meta = gang.get("metadata") or {}
                live[record.token] = ((str(meta.get("namespace")), str(meta.get("name"))), gang)
        stray = []
        for node, token in found:
            if token not in live:
                stray.append((node, token))
                continue
            key, gang = live[token]
            log.info("%s/%s: preemption %s in flight, not yet shown by the Gang watch", *key, token)
            self.statuses.saw(key, gang)  # known from now on, as this process's own writes are
        await self.remove_stray_taints(stray)

    async def remove_stray_taints(self, found: list[tuple[JSON, str]]) -> None:
        for node, token in found:
            log.info(
                "node %s: removing reservation taint %s of no preemption in flight",
                node["metadata"]["name"],
                token,
            )
            await self.api.taint_node(node, token, add=False)

    def prune(self, live: set[GangKey]) -> None:
        for table in (self.tried, self.why_not, self.expired, self.owners):
            for key in [k for k in table if k not in live]:
                del table[key]
        now = clock.time()  # a tenant's backoff that has run out is forgotten, not before
        for tenant in [t for t, at in self.tenant_expired_at.items() if now - at > EXPIRED_BACKOFF_CAP]:
            self.tenant_expired_at.pop(tenant, None)
            self.expired_tenant.pop(tenant, None)
