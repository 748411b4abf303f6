"""Every hold the planner does not make, composed in one place (beside `conditions.py`, which
turns a hold into the Gang's conditions): a gang whose work failed and is backing off, one
waiting for others' scheduling gates, one in its backoff after a partial placement, one still
forming, a StatefulSet whose OrderedReady policy means the gang can never form, and why
preemption could not help a gang held for lack of room. The planner's own holds (no room,
search budget, too few members) come from `quorum.core.planner`; `explain` adds to them what
the planner cannot see.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import replace

from quorum.core.conditions import WAITING_FOR_KUBE_SCHEDULER, backoff_message, iso_deadline
from quorum.core.model import Gang
from quorum.core.planner import Hold
from quorum.core.record import Recovery
from quorum.k8s.api import KubeApi
from quorum.operator.gangs import JSON, GangView, Store
from quorum.operator.recovery import Recoverer
from quorum.operator.status import GangRecords
from quorum.operator.work import GangWork

GangKey = tuple[str, str]
# A whole gang kube-scheduler places (placement kube-scheduler) is written as waiting only once it
# has waited this long beyond the forming grace (kube-scheduler says at once when it finds no
# room: that hold, `Unschedulable`, is written without delay): its normal path is to be bound
# within seconds, and a write of each gang's wait costs the apiserver as much as the rest of
# quorum's work on it (docs/benchmarks.md).
KUBE_SCHEDULER_GRACE_SECONDS = 30.0


class Holds:
    def __init__(
        self, api: KubeApi, records: GangRecords, work: GangWork, recoverer: Recoverer, forming_grace: float
    ) -> None:
        self.api = api
        self.records = records
        self.store: Store = records.store
        self.work = work
        self.recoverer = recoverer
        self.forming_grace = forming_grace
        self.statefulsets: dict[str, str | None] = {}  # uid -> podManagementPolicy
        self.memory = records.memory  # each gang's `first_seen`
        self.next_backoff_end = 0.0  # the earliest end of a backoff: a pass is due then
        self.next_forming_due = 0.0  # when a forming gang's grace ends: a pass is due then

    def sort_out(
        self, views: dict[GangKey, GangView], now: float
    ) -> tuple[dict[GangKey, Hold], dict[GangKey, GangView]]:
        """Which gangs the planner sees; why the others are held (those that are neither are
        admitted already, or busy)."""
        holds: dict[GangKey, Hold] = {}
        plannable: dict[GangKey, GangView] = {}
        self.next_backoff_end = 0.0
        for key, view in views.items():
            if self.work.blocks_planning(key):
                continue
            if failure := self.work.backing_off(key):
                if view.min_member is not None and view.counts()["released"] < view.min_member:
                    holds[key] = Hold(Gang(*key, view.min_member, ()), "PlanningFailed", failure.sentence())
                continue
            if view.waiting is not None or view.min_member is None or not view.releasable:
                admitted = view.min_member is not None and view.counts()["released"] >= view.min_member
                if view.gated and view.waiting is None and view.min_member is not None and not admitted:
                    holds[key] = Hold(
                        Gang(*key, view.min_member, ()), "WaitingForOtherGates", view.blocked() or ""
                    )
                continue
            record = self.records.record(key)
            until = self.recoverer.backoff_until(key, record)
            if until > now:
                recovery = replace(
                    record.recovery or Recovery(failures=1), next_attempt_time=iso_deadline(until)
                )
                holds[key] = Hold(Gang(*key, view.min_member, ()), "Backoff", backoff_message(recovery, now))
                self.next_backoff_end = min(self.next_backoff_end or until, until)
                continue
            plannable[key] = view
        return holds, plannable

    def forming(self, live: set[GangKey], holds: dict[GangKey, Hold], now: float) -> set[GangKey]:
        """Gangs short of members, first seen less than the grace ago, or whole and waiting for
        kube-scheduler's first placement less than the grace and `KUBE_SCHEDULER_GRACE_SECONDS`
        ago, with nothing written yet: their writes wait (a pass is due when the first grace
        ends)."""
        for key, entry in self.memory.items():
            if key not in live:
                entry.first_seen = None  # gone (its pods): back again, a new grace
        for key in live:
            if self.memory[key].first_seen is None:
                self.memory[key].first_seen = now
        first_seen = self.first_seen
        grace = self.forming_grace
        since: dict[GangKey, float] = {}
        for key in live:
            entry = self.memory[key]
            hold = holds.get(key)
            if hold is not None and hold.reason == WAITING_FOR_KUBE_SCHEDULER:
                entry.placing_since = entry.placing_since or now  # whole now: kube-scheduler's turn
                since[key] = entry.placing_since
            else:
                entry.placing_since = None
                since[key] = first_seen[key]

        def grace_of(key: GangKey) -> float:
            hold = holds.get(key)
            placing = hold is not None and hold.reason == WAITING_FOR_KUBE_SCHEDULER
            return grace + KUBE_SCHEDULER_GRACE_SECONDS if placing else grace

        forming = {
            key
            for key in live
            if (hold := holds.get(key)) is not None
            and hold.reason in ("WaitingForMembers", "WaitingForClaims", WAITING_FOR_KUBE_SCHEDULER)
            and key not in self.store.gangs
            and now - since[key] < grace_of(key)
        }
        self.next_forming_due = min((since[k] + grace_of(k) for k in forming), default=0.0)
        return forming

    def explain(self, view: GangView, hold: Hold) -> Hold:
        """Add what the planner cannot see: pods held by others' gates too, and a StatefulSet
        whose OrderedReady policy means the gang can never form (its policy is read once, in
        the gang's task, and used from the next pass on)."""
        if blocked := view.blocked():
            # The members exist but some are held by another gate: that is what it waits for.
            waits_for_gates = hold.reason == "WaitingForMembers" and hold.gang.members >= hold.gang.min_member
            reason = "WaitingForOtherGates" if waits_for_gates else hold.reason
            hold = Hold(hold.gang, reason, f"{hold.message}; {blocked}", hold.held_nodes, hold.held_message)
        if hold.reason != "WaitingForMembers" or (view.min_member or 1) <= 1:
            return hold
        for pod in view.pods:
            for owner in pod["metadata"].get("ownerReferences") or []:
                if owner.get("kind") != "StatefulSet" or not owner.get("controller"):
                    continue
                if owner["uid"] not in self.statefulsets:
                    self.work.start(view.key, "status", self.learn_statefulset(view.namespace, owner))
                elif self.statefulsets[owner["uid"]] == "OrderedReady":
                    hint = (
                        f"StatefulSet {owner['name']} uses podManagementPolicy OrderedReady: it creates "
                        f"each pod only after the previous one is Ready, and quorum holds every pod until "
                        f"the gang is whole, so the gang cannot form. Set podManagementPolicy: Parallel"
                    )
                    return Hold(hold.gang, hold.reason, f"{hold.message}; {hint}")
        return hold

    async def learn_statefulset(self, namespace: str, owner: JSON) -> None:
        self.statefulsets[owner["uid"]] = await self.api.statefulset_pod_management(namespace, owner["name"])

    @property
    def first_seen(self) -> dict[GangKey, float]:
        """When a pass first saw each gang that has pods."""
        return {k: e.first_seen for k, e in self.memory.items() if e.first_seen is not None}

    @staticmethod
    def add_why_not(holds: dict[GangKey, Hold], why_not: Mapping[GangKey, str]) -> None:
        """Why preemption could not make room, added to each gang held for lack of it."""
        for key, why in why_not.items():
            hold = holds.get(key)
            if hold is not None and hold.reason == "Unschedulable" and why not in hold.message:
                holds[key] = Hold(
                    hold.gang, hold.reason, f"{hold.message}; {why}", hold.held_nodes, hold.held_message
                )

    def prune(self) -> None:
        """Forget the StatefulSets no pod of a gang is owned by any more."""
        if not self.statefulsets:  # (a scan of every pod: only when there is something to prune)
            return
        owners = {
            o.get("uid") for p in self.store.pods.values() for o in p["metadata"].get("ownerReferences") or []
        }
        self.statefulsets = {uid: v for uid, v in self.statefulsets.items() if uid in owners}
