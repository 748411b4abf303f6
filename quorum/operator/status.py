"""What a person reads, written: the Gang object of every gang (made when first needed), its
status (composed by `conditions.py`), the group object's status, and Events.

A status is written only when it changed, and for one gang at most once per interval (its last
state then; like the Job controller's status batching): a gang's pods bind and start within a
second of its release, and writing each step would cost the apiserver a write and every watcher
an event for a state nobody reads. So too the group object's status at a release: the Gang
records the decision at once, the group's status goes with the gang's next write (its pods
bound), or `GROUP_LAG_INTERVALS` intervals after the release if none comes. A status counts as
written only once the apiserver took it, so a refused write is made again by a later pass.
Transition times move only when a
condition's status does, and say when it did.

The pass decides on the event loop what is due (`due`, cheap, no I/O); the writes run in the
gang's own task (`write`), so one gang's slow or failing write delays nobody else.
"""

from __future__ import annotations

import asyncio
import copy
import logging
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field, replace
from typing import Any

from quorum.core.conditions import (
    NO_ROOM,
    VOLCANO_PHASES,
    WAITING_FOR_KUBE_SCHEDULER,
    GangState,
    GangStatus,
    compose,
    compose_recovering,
    iso,
    timestamp,
)
from quorum.core.gangs import SOURCE_KINDS, GangSource
from quorum.core.planner import Hold
from quorum.core.record import DECISIONS, Admission, GangRecord, Recovery, Resized
from quorum.k8s.api import KubeApi
from quorum.k8s.convert import gang_record, newer_or_same, unmodeled_constraints
from quorum.k8s.writes import Superseded
from quorum.operator import clock, metrics
from quorum.operator.events import EventRecorder, pod_object, worth_telling

__all__ = ["GangGone", "GangRecords", "StatusPacing", "StatusWrite", "now_rfc3339"]
from quorum.operator.gangs import GROUP_APIS, JSON, GangView, Store
from quorum.operator.memory import GangMemories, GangMemory
from quorum.operator.work import Failure, GangWork, describe

log = logging.getLogger("quorum.operator")
GangKey = tuple[str, str]
COUNTERS = ("members", "gated", "released", "bound", "running", "succeeded", "failed")
# At most this many status intervals after a release, the group's status says it (docs/status.md).
GROUP_LAG_INTERVALS = 5


OWNERLESS = frozenset(SOURCE_KINDS.values())  # Gang records no group object owns


@dataclass
class StatusPacing:
    """When each gang's status may be written: at most once per `interval` seconds (monotonic;
    each gang's last write is in its `GangMemory`)."""

    interval: float
    memory: GangMemories = field(default_factory=GangMemories)
    next_due: float = 0.0  # the earliest deferred write since `start_pass` (0: none)

    def start_pass(self) -> None:
        self.next_due = 0.0

    def may_write(self, key: GangKey, now: float) -> bool:
        """True (and the write counted) if the gang's last write is an interval ago; else the
        write is deferred and `next_due` says when a pass should write it."""
        last = self.memory[key].written_at
        due = (now - self.interval if last is None else last) + self.interval
        if now < due:
            self.next_due = min(self.next_due or due, due)
            return False
        self.memory[key].written_at = now
        return True

    def mark_written(self, key: GangKey, now: float) -> None:
        """A write that is never deferred (a release's decision) starts the interval too."""
        self.memory[key].written_at = now

    def forget(self, key: GangKey) -> None:
        if (entry := self.memory.get(key)) is not None:
            entry.written_at = None


class GangGone(Exception):
    """The Gang went while a decision was being recorded on it: nothing was recorded."""


@dataclass(frozen=True)
class StatusWrite:
    """A status due to be written: what it says, with transition times, and the Events due."""

    status: GangStatus
    timed: list[JSON]  # the conditions with their lastTransitionTime
    stamp: str  # when it was composed (RFC 3339)
    events: tuple[tuple[str, str, bool], ...] = ()  # (reason, message, warning)
    hold: Hold | None = None
    group_only: bool = False  # the Gang's status is written already: only its group's lags


def now_rfc3339() -> str:
    # Not time.gmtime(): it reads the kernel's coarse clock, up to a tick behind time.time(), so
    # a time written just after a deadline could read as the second before it.
    return iso(clock.time())


class GangRecords:
    def __init__(
        self, api: KubeApi, store: Store, interval: float = 1.0, memory: GangMemories | None = None
    ) -> None:
        self.api = api
        self.events = EventRecorder(api)  # the operator's one recorder; the others use this one
        self.store = store
        self.memory = memory if memory is not None else GangMemories()  # one entry per gang
        self.pacing = StatusPacing(interval, self.memory)
        self.told_waiting: set[str] = set()  # pods told which group they wait for
        # A change of counters only (no condition changed) is written `interval` after it was
        # first seen (`GangMemory.settling`), with what else changed by then: a gang's pods bind
        # and start within a second or two, and a write at the first of those events would be
        # followed by another a second later. Decisions this process wrote that the Gang watch
        # has not shown yet (`GangMemory.unseen`) are what a pass acts on, never the older copy.

    def written(self, key: GangKey) -> JSON | None:
        """The last status of the gang the apiserver took (in this term)."""
        entry = self.memory.get(key)
        return entry.written if entry is not None else None

    def resume(self) -> None:
        """A new leader starts from the statuses on record: their transition times are kept,
        what they say counts as written (a failover rewrites only what changed, not every
        gang at once), and the reason each held gang was announced with is not announced again."""
        for _, entry in self.memory.items():
            entry.written, entry.written_at, entry.reason, entry.transitions = None, None, None, {}
            entry.group_behind = None
            # A term counts each decision's time from its own first sight: an attempt seen in an
            # earlier term may be another decision by now (a group made again under its name).
            entry.decision_seen = None
        for key, gang in self.store.gangs.items():
            status = gang.get("status") or {}
            if not isinstance(status, dict):
                continue
            conditions = [c for c in status.get("conditions") or [] if isinstance(c, dict) and c.get("type")]
            entry = self.memory[key]
            for c in conditions:
                if c.get("lastTransitionTime"):
                    entry.transitions[c["type"]] = (str(c.get("status")), c["lastTransitionTime"])
            entry.written = {
                "phase": status.get("phase"),
                **{k: status.get(k) for k in COUNTERS},
                "conditions": [{k: v for k, v in c.items() if k != "lastTransitionTime"} for c in conditions],
            }
            admitted = next((c for c in conditions if c["type"] == "Admitted"), None)
            if admitted is not None and admitted.get("status") == "False" and admitted.get("reason"):
                entry.reason = str(admitted["reason"])
            if GangRecord.of(gang).admission is not None:
                # A release the last leader recorded may not have reached the group's status yet
                # (it goes with the gang's next write): write it within the lag, once.
                entry.group_behind = clock.monotonic()

    # -- the Gang as this process knows it ------------------------------------------------------

    def gang(self, key: GangKey) -> JSON | None:
        """The gang's Gang object as the watch shows it, with the decisions this process wrote
        since on top. They count as shown once the watch delivers a copy at or after the
        resourceVersion the last of them was written at: a copy that merely has the same value
        may be older than the write (a decision set, then cleared: the copy from before it was
        set has it cleared too). Where versions do not compare, a decision counts as shown once
        a copy has it."""
        gang = self.store.gangs.get(key)
        entry = self.memory.get(key)
        if gang is None or entry is None or not entry.unseen:
            return gang
        shown = newer_or_same(
            str((gang.get("metadata") or {}).get("resourceVersion") or ""), entry.unseen_version
        )
        if shown:
            entry.unseen.clear()
            return gang
        status = gang.get("status") or {}
        for name in [n for n, value in entry.unseen.items() if shown is None and status.get(n) == value]:
            del entry.unseen[name]
        if not entry.unseen:
            return gang
        return {**gang, "status": {**status, **entry.unseen}}

    def record(self, key: GangKey) -> GangRecord:
        """The gang's decisions, typed: the one way the operator reads them (`gang`: as the
        watch shows the Gang, with this process's writes it has not shown yet on top)."""
        return GangRecord.of(self.gang(key))

    async def patch(self, key: GangKey, fields: JSON) -> bool:
        """The one write of a Gang's status in the operator (a merge patch of `fields`); its
        decisions count from the moment the apiserver took them. False if the Gang is gone."""
        version = await self.api.patch_gang_status(key[0], key[1], fields)
        if version is not None:
            self.acknowledge(key, fields, version)
        return version is not None

    def acknowledge(self, key: GangKey, fields: JSON, version: str) -> None:
        """The decisions among `fields`, written at `version`: what this process acts on until
        the watch shows them (`gang`)."""
        decisions = {n: as_merged(v) for n, v in fields.items() if n in DECISIONS}
        if decisions:
            entry = self.memory[key]
            entry.unseen.update(decisions)
            if newer_or_same(version, entry.unseen_version) is not False:  # answers may cross
                entry.unseen_version = version

    async def patch_recovery(
        self,
        key: GangKey,
        fields: JSON,
        recovery: Recovery | None,
        dropped: Iterable[str] = (),
        expect: JSON | None = None,
    ) -> bool:
        """`patch` of `fields` with the gang's `recovery` record (recovery's and a preemption's
        writes): one at a time per gang, each keeping the Jobs the Gang records as suspended
        (`suspendedJobs`, as this process last wrote or saw them) but those in `dropped`
        (resumed, or gone): a write composed from an older copy of the Gang never drops a Job
        recorded meanwhile. The record is written whole (a field it leaves unset is removed).
        With `expect`, the write is conditional (`record_if`)."""
        entry = self.memory[key]
        async with entry.recording:
            if recovery is not None:
                current = self.record(key).recovery
                recorded = current.suspended_jobs if current is not None else ()
                jobs = tuple(sorted({*recovery.suspended_jobs, *recorded} - set(dropped)))
                recovery = replace(recovery, suspended_jobs=jobs)
                whole = recovery.to_json() if expect is not None else recovery.merge_patch()
                fields = {**fields, "recovery": whole}
            if expect is not None:
                return await self.record_if(key, expect, fields)
            return await self.patch(key, fields)

    async def record_if(self, key: GangKey, expect: JSON, fields: JSON, made: bool = False) -> bool:
        """A decision recorded only if the Gang still holds `expect` (paths under its status ->
        values; a JSON Patch `test`, so a write of another leader that landed first refuses it).
        False if it was not recorded: the Gang is gone, or holds something else — then the Gang
        as the apiserver has it now is what this process acts on from here (`gang`), until the
        watch shows it or something newer."""
        try:
            version = await self.api.patch_gang_status_if(key[0], key[1], expect, fields)
        except Superseded:
            fresh = await self.api.read_gang(*key)
            tests_null = not any(v is not None for v in expect.values())
            if fresh is not None and "status" not in fresh and tests_null and not made:
                # A Gang just made has no status, and a JSON Patch cannot test or add under a
                # path that is missing: made (an empty merge patch), then tried once more.
                await self.api.patch_gang_status(key[0], key[1], {})
                return await self.record_if(key, expect, fields, made=True)
            log.info("%s/%s: not recorded: the Gang holds a later decision than the watch showed", *key)
            if fresh is not None:
                self.saw(key, fresh)
            return False
        if version is None:
            return False
        self.acknowledge(key, fields, version)
        return True

    def saw(self, key: GangKey, fresh: JSON) -> None:
        """The Gang read from the apiserver: its decisions count until the watch catches up."""
        status = fresh.get("status") or {}
        version = str((fresh.get("metadata") or {}).get("resourceVersion") or "")
        entry = self.memory[key]
        if newer_or_same(version, entry.unseen_version) is False:
            return  # older than what this process wrote since
        entry.unseen = {name: as_merged(status.get(name)) for name in DECISIONS}
        entry.unseen_version = version

    def since_decision(self, key: GangKey, attempt: int) -> float:
        """Seconds since this process first saw the gang's decision `attempt` (monotonic): what
        its timeout is measured by. A new leader's count starts when it first sees a decision,
        so a time the last leader wrote, on another machine's clock or long ago in a Gang its
        watch has not caught up on, never makes a decision look older than it is."""
        entry = self.memory[key]
        now = clock.monotonic()
        if entry.decision_seen is None or entry.decision_seen[0] != attempt:
            entry.decision_seen = (attempt, now)
        return now - entry.decision_seen[1]

    def held_since(self, key: GangKey) -> float | None:
        """Since when the gang has been held for lack of room (Unschedulable True), if it is."""
        entry = self.memory.get(key)
        seen = entry.transitions.get("Unschedulable") if entry is not None else None
        return timestamp(seen[1]) if seen and seen[0] == "True" else None

    def prune(self) -> None:
        """Forget the pods told which group they wait for once they are gone (the gangs
        themselves are forgotten by `GangMemories.keep`)."""
        pods = self.store.pods
        self.told_waiting = {uid for uid in self.told_waiting if uid in pods}

    # -- what is due (on the event loop, no I/O) --------------------------------------------

    def state(
        self, view: GangView, hold: Hold | None, failure: str | None, released_now: int = 0
    ) -> GangState:
        counts = view.counts()
        counts["released"] += released_now  # released in this pass: not yet seen by the watch
        counts["gated"] -= released_now
        record = self.record(view.key)
        return GangState(
            counts=counts,
            min_member=view.min_member or 1,
            now=clock.time(),
            basic=view.basic,
            waiting=view.waiting,
            hold=hold,
            recovery=record.recovery,
            failure=failure,
            preemption=record.preemption,
            preempted=record.preempted,
            resized=record.resized,
        )

    def due(self, view: GangView, status: GangStatus, hold: Hold | None) -> StatusWrite | None:
        """The write of this gang's composed status if it is due now (None: unchanged, or
        deferred by the pacing: a pass at `pacing.next_due` writes the state then)."""
        if view.group is None and view.waiting:
            return None  # no Gang object until its group exists (its pods are told by Events)
        new_gang = view.key not in self.store.gangs or self.record_changes(view)
        entry = self.memory[view.key]
        written = entry.written
        if not new_gang and written == status.body:
            entry.settling = None
            return self.group_due(view, status, entry)
        if not new_gang and written is not None and same_conditions(written, status.body):
            now = clock.monotonic()
            if entry.settling is None:
                entry.settling = now
            due = entry.settling + self.pacing.interval
            if now < due:
                self.pacing.next_due = min(self.pacing.next_due or due, due)
                return None
        stamp = now_rfc3339()
        timed = self.timed(view.key, status.conditions, stamp)  # the transition's own time
        if not self.pacing.may_write(view.key, clock.monotonic()):
            return None
        events: list[tuple[str, str, bool]] = []
        if hold is not None and entry.reason != hold.reason and hold.reason != WAITING_FOR_KUBE_SCHEDULER:
            events.append((hold.reason, hold.message, hold.reason in NO_ROOM))
        held = hold is not None and bool(hold.held_nodes)
        if held and hold is not None and not entry.capacity_held:
            events.append(("CapacityHeld", hold.held_message, False))
        return StatusWrite(status, timed, stamp, tuple(events), hold)

    def group_due(self, view: GangView, status: GangStatus, entry: GangMemory) -> StatusWrite | None:
        """The group's status alone, once it has lagged the Gang's for `GROUP_LAG_INTERVALS`."""
        if entry.group_behind is None:
            return None
        due = entry.group_behind + GROUP_LAG_INTERVALS * self.pacing.interval
        if clock.monotonic() < due:
            self.pacing.next_due = min(self.pacing.next_due or due, due)
            return None
        stamp = now_rfc3339()
        return StatusWrite(status, self.timed(view.key, status.conditions, stamp), stamp, group_only=True)

    def waiting_pods(self, view: GangView) -> list[JSON]:
        """Pods of a gang waiting for its group that have not been told so yet."""
        if not view.waiting:
            return []
        return [p for p in view.pods if p["metadata"]["uid"] not in self.told_waiting]

    def timed(self, key: GangKey, conditions: list[JSON], stamp: str) -> list[JSON]:
        """The conditions with their transition times: a time changes only when the status does."""
        transitions = self.memory[key].transitions
        for c in conditions:
            seen = transitions.get(c["type"])
            if seen is None or seen[0] != c["status"]:
                transitions[c["type"]] = (c["status"], stamp)
        return [{**c, "lastTransitionTime": transitions[c["type"]][1]} for c in conditions]

    def start_writes(
        self,
        views: Mapping[GangKey, GangView],
        holds: Mapping[GangKey, Hold],
        forming: set[GangKey],
        work: GangWork,
        fail: Callable[[GangKey, str, str], None],
    ) -> dict[GangKey, GangStatus]:
        """Compose every gang's status and start, as the gang's task, the writes that are due
        (not while it forms or has a task in flight, nor while its status writes back off). The
        statuses composed, for metrics."""
        self.pacing.start_pass()
        statuses: dict[GangKey, GangStatus] = {}
        for key, view in views.items():
            try:
                hold = holds.get(key)
                status = compose(self.state(view, hold, work.failure_message(key)))
                statuses[key] = status
                failure = work.failures.get(key)
                if key in forming or work.busy(key):
                    continue
                if failure is not None and failure.stage == "status" and work.backing_off(key):
                    continue  # its status writes fail: not before the backoff ends
                if pods := self.waiting_pods(view):
                    work.start(key, "status", self.tell_waiting(view, pods))
                elif write := self.due(view, status, hold):
                    work.start(key, "status", self.write_due(view, write))
            except Exception as err:
                fail(key, "status", describe(err))
        return statuses

    async def write_due(self, view: GangView, write: StatusWrite) -> None:
        try:
            await self.write(view, write)
        except BaseException:
            self.failed(view.key)
            raise

    # -- writes (in the gang's task) --------------------------------------------------------

    async def tell_waiting(self, view: GangView, pods: list[JSON]) -> None:
        for pod in pods:
            await self.events.post(pod_object(pod), "WaitingForGroup", view.waiting or "", required=True)
            self.told_waiting.add(pod["metadata"]["uid"])

    async def write(self, view: GangView, write: StatusWrite) -> None:
        """Write a due status: the Gang (made if need be), its group's status and the Events.
        Recorded as written only when the apiserver took it."""
        entry = self.memory[view.key]
        if write.group_only:
            await self.write_group(view, write.status, write.timed, write.stamp)
            entry.group_behind = None
            return
        gang = await self.ensure_gang(view)
        await self.warn_unmodeled(view, gang)
        await asyncio.gather(
            self.patch(view.key, {**write.status.body, "conditions": write.timed}),
            self.write_group(view, write.status, write.timed, write.stamp),
        )
        entry.written, entry.settling, entry.group_behind = write.status.body, None, None
        for reason, _, _ in write.events:
            if reason == "CapacityHeld":
                entry.capacity_held = True
            else:
                entry.reason = reason
        for reason, message, warning in write.events:
            told = [gang, view.group] if reason != "CapacityHeld" else [gang]
            await self.events.post_all(told, reason, message, warning=warning)
        if not (write.hold is not None and write.hold.held_nodes):
            entry.capacity_held = False

    def failed(self, key: GangKey) -> None:
        """A write of this gang failed: the next pass composes and writes it again."""
        entry = self.memory[key]
        entry.written, entry.written_at = None, None

    async def ensure_gang(self, view: GangView) -> JSON:
        existing = self.store.gangs.get(view.key)
        kind = SOURCE_KINDS.get(view.marker.source, "Labels")
        spec, owner = gang_record(view.group, view.marker.group, view.min_member or 1, kind)
        if existing is not None:
            owners = existing["metadata"].get("ownerReferences") or []
            same = owner is None or any(o.get("uid") == owner["uid"] for o in owners)
            if same or not owners:
                # A group being deleted adopts nothing: the Gang would go with it.
                adopt = None if same or deleting(view.group) else owner
                return await self.keep_gang(view, existing, spec, adopt)
            # The group was deleted and made again under the same name: a new gang, whose
            # conditions start afresh (the next pass composes and writes them again).
            await self.api.delete_gang(view.namespace, view.name)
            self.memory[view.key].transitions = {}
        spec["scheduleTimeoutSeconds"] = view.schedule_timeout
        if view.topology_key:
            spec["topologyKey"] = view.topology_key
        gang = await self.api.create_gang(view.namespace, view.name, spec, owner)
        self.forget(view.key)  # a new object: its status is still to be written
        self.store.assume_gang(view.key, gang)
        return gang

    def record_changes(self, view: GangView) -> bool:
        """Whether the Gang itself must change (see `keep_gang`): its group was resized, or made
        again while the Gang had no owner. Such a write is due even when the status is not."""
        gang = self.store.gangs.get(view.key)
        if gang is None or view.group is None or view.min_member is None:
            return False
        if not (gang["metadata"].get("ownerReferences") or []) and not deleting(view.group):
            return True
        return (gang.get("spec") or {}).get("minMember") != view.min_member

    async def keep_gang(self, view: GangView, existing: JSON, spec: JSON, adopt: JSON | None) -> JSON:
        """The Gang kept as it is, but for two changes of its group. `adopt`: the group was made
        again while the Gang had no owner, as the upgrade of its API leaves it (the old group
        deleted with propagationPolicy Orphan, docs/workloads.md "Upgrading"): the Gang now stands
        for the new one, its records kept. A resized group (1.37's mutable `gang.minCount`): the
        resize is recorded (`status.resized`, then `spec.minMember`, in that order: recovery
        reads the gap between them as growing, never as a loss) with an Event."""
        old = (existing.get("spec") or {}).get("minMember")
        resize = view.min_member is not None and isinstance(old, int) and old != spec["minMember"]
        if adopt is None and not resize:
            return existing
        patch: JSON = {"spec": {}}
        told: list[tuple[str, str]] = []
        if adopt is not None:
            patch["metadata"] = {"ownerReferences": [adopt]}
            patch["spec"]["source"] = spec["source"]
            told.append(
                (
                    "Adopted",
                    f"the Gang now stands for {adopt['kind']} {adopt['name']} ({adopt['apiVersion']}), "
                    "made again under the same name; its records are kept",
                )
            )
        if resize and isinstance(old, int):
            new = spec["minMember"]
            # This process's own last decision, written but maybe not yet shown by the watch.
            attempt = GangRecord.of(self.gang(view.key) or existing).attempt
            resized = Resized(old, new, now_rfc3339(), attempt)
            if not await self.patch(view.key, {"resized": resized.to_json()}):
                return existing
            patch["spec"]["minMember"] = new
            how = (
                f"the {new - old} more members are released once all of them fit; until then it runs at {old}"
                if new > old
                else f"members beyond {new} are elastic: losing them is not a member loss"
            )
            told.append(
                ("Resized", f"minMember changed from {old} to {new} (its PodGroup's gang.minCount): {how}")
            )
        if not await self.api.patch_gang(view.namespace, view.name, patch):
            return existing
        current = self.store.gangs.get(view.key, existing)  # with the status just written
        updated = {**current, "spec": {**(current.get("spec") or {}), **patch["spec"]}}
        if adopt is not None:
            updated["metadata"] = {**current["metadata"], "ownerReferences": [adopt]}
        self.store.assume_gang(view.key, updated)
        for reason, message in told:
            await self.events.post_all([updated, view.group], reason, message)
        return updated

    async def warn_unmodeled(self, view: GangView, gang: JSON) -> None:
        """A gang whose pods use hard constraints the planner does not model gets a warning that
        quorum cannot guarantee its placement, and one whose group asks for what quorum does not
        enforce an Event saying what (once per gang)."""
        entry = self.memory[view.key]
        if entry.warned_unmodeled:
            return
        found = sorted({c for p in view.gated for c in unmodeled_constraints(p.get("spec") or {})})
        entry.warned_unmodeled = True
        if view.unenforced:
            await self.events.post_all(
                [gang, view.group],
                "NotEnforced",
                f"{view.marker.describe()} asks for what quorum keeps but does not enforce: "
                + "; ".join(view.unenforced),
            )
        if not found:
            return
        message = (
            f"pods of gang {view.name} use {', '.join(found)}, which quorum's plan does not model: "
            f"quorum cannot guarantee their placement (kube-scheduler may refuse a planned node)"
        )
        await self.events.post_all([gang, view.group], "UnmodeledConstraints", message, warning=True)

    async def record_release(self, view: GangView, gang: JSON, admission: Admission, planned: int) -> None:
        """The decision (`status.admission`, what a restarted operator continues) in one write
        with the status the gang has once its `planned` pods are released. The pass's status
        check then finds nothing new to write unless a release failed."""
        status = compose(self.state(view, None, None, planned))
        stamp = now_rfc3339()
        timed = self.timed(view.key, status.conditions, stamp)
        self.pacing.mark_written(view.key, clock.monotonic())
        body = {**status.body, "conditions": timed, "admission": admission.merge_patch()}
        if not await self.patch(view.key, body):
            raise GangGone(f"the Gang {view.namespace}/{view.name} went before its release was recorded")
        entry = self.memory[view.key]
        entry.decision_seen = (admission.attempt, clock.monotonic())
        entry.written, entry.settling = status.body, None
        if view.group is not None and entry.group_behind is None:
            entry.group_behind = clock.monotonic()  # written with the gang's next status

    def recovering_due(self, key: GangKey, gang: JSON, failure: str | None) -> StatusWrite | None:
        """The status of a gang in recovery that has no pod at the moment, if it changed."""
        record = GangRecord.of(gang)
        status = compose_recovering(record.recovery or Recovery(), clock.time(), failure, record.preempted)
        if self.written(key) == status.body:
            return None
        stamp = now_rfc3339()
        return StatusWrite(status, self.timed(key, status.conditions, stamp), stamp)

    async def write_recovering(self, key: GangKey, write: StatusWrite) -> None:
        await self.patch(key, {**write.status.body, "conditions": write.timed})
        self.memory[key].written = write.status.body

    async def write_group(self, view: GangView, status: GangStatus, timed: list[JSON], stamp: str) -> None:
        """The group object's status. quorum's own PodGroup kinds (v1alpha1; Volcano's v1beta1 where
        quorum installed its CRD): phase, counters and conditions prefixed `Quorum`. A Kubernetes
        PodGroup is kube-scheduler's too: only quorum's conditions, by server-side apply, so its
        `PodGroupScheduled` (1.37: `PodGroupInitiallyScheduled`) stays; in the version the cluster
        serves."""
        if view.group is None or view.marker.source not in GROUP_APIS:
            return
        api_group, version = GROUP_APIS[view.marker.source]
        if view.marker.source is GangSource.WORKLOAD_POD_GROUP:
            if self.store.pod_group_version is None:
                return
            version = self.store.pod_group_version
        name = view.group["metadata"]["name"]
        conditions = [{**c, "type": "Quorum" + c["type"], "reason": c["reason"] or "None"} for c in timed]
        if view.marker.source is GangSource.WORKLOAD_POD_GROUP:
            generation = view.group["metadata"].get("generation")
            owned = [{**c, "observedGeneration": generation} if generation else c for c in conditions]
            await self.api.apply_group_status(
                api_group, version, "PodGroup", "podgroups", view.namespace, name, {"conditions": owned}
            )
            return
        if not str(view.group.get("apiVersion", "")).endswith(version):
            return
        if api_group not in self.store.owned_group_apis:
            return  # another's CRD: its controller owns the status
        counts = status.counts
        if view.marker.source is GangSource.VOLCANO_POD_GROUP:
            # Volcano's fields and phases, as LeaderWorkerSet, Trainer and `kubectl get podgroup` read them.
            volcano_status = {
                "phase": VOLCANO_PHASES[status.phase],
                "running": counts["running"],
                "succeeded": counts["succeeded"],
                "failed": counts["failed"],
                "conditions": conditions,
            }
            await self.api.patch_group_status(
                api_group, version, "podgroups", view.namespace, name, volcano_status
            )
            return
        group_status = {
            "phase": status.phase,
            "scheduled": counts["bound"],
            "running": counts["running"],
            "succeeded": counts["succeeded"],
            "failed": counts["failed"],
            "observedGeneration": view.group["metadata"].get("generation"),
            "conditions": conditions,
        }
        if counts["released"] and not (view.group.get("status") or {}).get("scheduleStartTime"):
            group_status["scheduleStartTime"] = stamp
        await self.api.patch_group_status(api_group, version, "podgroups", view.namespace, name, group_status)

    async def report_failure(self, key: GangKey, failure: Failure) -> None:
        """A gang's work failed: a Warning Event on its Gang (or, before it has one, on one of
        its pods); the same error again only at the 2nd, 4th, 8th ... time in a row."""
        metrics.GANG_FAILURES.labels(stage=failure.stage).inc()
        if not worth_telling(failure.count):
            return
        target = self.store.gangs.get(key)
        if target is None and (entry := self.memory.get(key)) is not None and entry.first_pod is not None:
            pod = entry.first_pod
            target = pod_object(pod)
        await self.events.post(target, "PlanningFailed", failure.sentence(), warning=True)

    def label_gangs_expired(self, live: set[GangKey], retention: float) -> list[GangKey]:
        """Label-only and Kueue gangs have no owner: their Gang is deleted once no pod has been
        left for the retention time (so a recovery that deletes every pod keeps the gang's state)."""
        now = clock.monotonic()
        expired = []
        for key, gang in self.store.gangs.items():
            if key in live or ((gang.get("spec") or {}).get("source") or {}).get("kind") not in OWNERLESS:
                if (entry := self.memory.get(key)) is not None:
                    entry.last_seen = None
                continue
            entry = self.memory[key]
            if entry.last_seen is None:
                entry.last_seen = now
            if now - entry.last_seen > retention:
                expired.append(key)
        return expired

    async def delete_label_gang(self, key: GangKey) -> None:
        await self.api.delete_gang(*key)
        self.store.assume_gang(key, None)
        self.forget(key)

    def forget(self, key: GangKey) -> None:
        """A Gang made anew (or deleted): what was written, pending and on top goes."""
        if (entry := self.memory.get(key)) is not None:
            entry.written, entry.written_at, entry.settling, entry.unseen = None, None, None, {}
            entry.unseen_version = "0"


def as_merged(value: Any) -> Any:
    """A value as the object has it after a merge patch of it: members set to null are gone."""
    if isinstance(value, dict):
        return {k: as_merged(v) for k, v in value.items() if v is not None}
    return copy.deepcopy(value)


def same_conditions(written: JSON, body: JSON) -> bool:
    """The two statuses differ at most in counters, phase and messages: no condition changed
    its status or reason."""
    old, new = written.get("conditions") or [], body.get("conditions") or []
    return len(old) == len(new) and all(
        a.get("type") == b.get("type")
        and a.get("status") == b.get("status")
        and a.get("reason") == b.get("reason")
        for a, b in zip(old, new, strict=True)
    )


def deleting(obj: JSON | None) -> bool:
    return bool(((obj or {}).get("metadata") or {}).get("deletionTimestamp"))
