"""What a person reads: the Gang object of every gang (made when first needed), its status and
conditions, the group object's status, and Events. Written only when something changed, and
for one gang at most once per interval (its last state then; like the Job controller's status
batching): a gang's pods bind and start within a second of its release, and writing each
step would cost the apiserver a write and every watcher an event for a state nobody reads.
Transition times move only when a condition's status does, and say when it did."""

from __future__ import annotations

import asyncio
import logging
import time
from dataclasses import dataclass, field
from typing import Any

from kubernetes_asyncio import client

from quorum.core.gangs import GangSource
from quorum.core.planner import Hold
from quorum.k8s import writes
from quorum.k8s.convert import pod_from_api
from quorum.operator.gangs import GROUP_APIS, JSON, GangView, Store, admitted_condition, phase, timestamp
from quorum.operator.recovery import backoff_message, backoff_until, partial_condition, recovery_of

log = logging.getLogger("quorum.operator")
CONDITION_TYPES = ("Admitted", "Unschedulable", "PartiallyPlaced", "Backoff", "CapacityHeld")


@dataclass
class StatusPacing:
    """When each gang's status may be written: at most once per `interval` seconds (monotonic)."""

    interval: float
    written_at: dict[tuple[str, str], float] = field(default_factory=dict)
    next_due: float = 0.0  # the earliest deferred write since `start_pass` (0: none)

    def start_pass(self) -> None:
        self.next_due = 0.0

    def may_write(self, key: tuple[str, str], now: float) -> bool:
        """True (and the write counted) if the gang's last write is an interval ago; else the
        write is deferred and `next_due` says when a pass should write it."""
        due = self.written_at.get(key, now - self.interval) + self.interval
        if now < due:
            self.next_due = min(self.next_due or due, due)
            return False
        self.written_at[key] = now
        return True

    def mark_written(self, key: tuple[str, str], now: float) -> None:
        """A write that is never deferred (a release's decision) starts the interval too."""
        self.written_at[key] = now

    def forget(self, key: tuple[str, str]) -> None:
        self.written_at.pop(key, None)


@dataclass(frozen=True)
class GangStatus:
    """What a gang's status says: its counters, phase, and the body written (without times)."""

    counts: dict[str, int]
    phase: str
    wanted: JSON


Recorded = tuple[GangStatus, list[JSON], str]  # a status written: with its conditions' times, when


class GangRecords:
    def __init__(self, api: client.ApiClient, store: Store, interval: float = 1.0) -> None:
        self.api = api
        self.store = store
        self.written: dict[tuple[str, str], dict[str, Any]] = {}  # last status written per gang
        self.pacing = StatusPacing(interval)
        self.reasons: dict[tuple[str, str], str] = {}  # last hold reason announced per gang
        self.told_waiting: set[str] = set()  # pods told which group they wait for
        self.warned_unmodeled: set[tuple[str, str]] = set()
        self.transitions: dict[tuple[tuple[str, str], str], tuple[str, str]] = {}  # -> (status, time)
        self.capacity_held: set[tuple[str, str]] = set()

    def resume(self) -> None:
        """A new leader writes every status afresh, keeping the transition times on record."""
        self.written.clear()
        self.pacing.written_at.clear()
        self.reasons.clear()
        self.transitions.clear()
        for key, gang in self.store.gangs.items():
            for c in (gang.get("status") or {}).get("conditions") or []:
                if c.get("lastTransitionTime"):
                    self.transitions[(key, c["type"])] = (c["status"], c["lastTransitionTime"])

    def held_since(self, key: tuple[str, str]) -> float | None:
        """Since when the gang has been held for lack of room (Unschedulable True), if it is."""
        seen = self.transitions.get((key, "Unschedulable"))
        return timestamp(seen[1]) if seen and seen[0] == "True" else None

    async def ensure_gang(self, view: GangView) -> JSON:
        existing = self.store.gangs.get(view.key)
        owner = None
        if view.group is not None:
            meta = view.group["metadata"]
            owner = {
                "apiVersion": view.group["apiVersion"],
                "kind": view.group["kind"],
                "name": meta["name"],
                "uid": meta["uid"],
                "blockOwnerDeletion": False,
                "controller": False,
            }
        if existing is not None:
            owners = existing["metadata"].get("ownerReferences") or []
            if owner is None or any(o.get("uid") == owner["uid"] for o in owners):
                return existing
            # The group was deleted and made again under the same name: a new gang.
            await writes.delete_gang(self.api, view.namespace, view.name)
        source: dict[str, Any] = {"kind": "Labels", "name": view.marker.group}
        if view.group is not None:
            source = {
                "apiVersion": view.group["apiVersion"],
                "kind": view.group["kind"],
                "name": view.group["metadata"]["name"],
                "uid": view.group["metadata"]["uid"],
            }
        spec: dict[str, Any] = {
            "source": source,
            "minMember": view.min_member or 1,
            "scheduleTimeoutSeconds": view.schedule_timeout,
        }
        if view.topology_key:
            spec["topologyKey"] = view.topology_key
        gang = await writes.create_gang(self.api, view.namespace, view.name, spec, owner)
        self.forget(view.key)  # a new object: its status is still to be written
        for condition in CONDITION_TYPES:
            self.transitions.pop((view.key, condition), None)
        self.store.gangs[view.key] = gang
        return gang

    async def warn_unmodeled(self, view: GangView, gang: JSON) -> None:
        """DESIGN.md: a gang whose pods use hard constraints the planner does not model gets a
        warning that quorum cannot guarantee its placement (once per gang)."""
        if view.key in self.warned_unmodeled:
            return
        found = sorted({c for p in view.gated for c in pod_from_api(p).unmodeled})
        if not found:
            return
        self.warned_unmodeled.add(view.key)
        message = (
            f"pods of gang {view.name} use {', '.join(found)}, which quorum's plan does not model: "
            f"quorum cannot guarantee their placement (kube-scheduler may refuse a planned node)"
        )
        for obj in (gang, view.group):
            if obj is not None:
                await writes.post_event(self.api, obj, "UnmodeledConstraints", message, warning=True)

    async def tell_waiting(self, view: GangView) -> None:
        if not view.waiting:
            return
        for pod in view.pods:
            if pod["metadata"]["uid"] not in self.told_waiting:
                self.told_waiting.add(pod["metadata"]["uid"])
                await writes.post_event(
                    self.api, {"apiVersion": "v1", "kind": "Pod", **pod}, "WaitingForGroup", view.waiting
                )

    def conditions(self, view: GangView, gang: JSON, hold: Hold | None, counts: dict[str, int]) -> list[JSON]:
        status, reason, message = admitted_condition(view, counts, hold, 0)
        unschedulable = hold is not None and hold.reason == "Unschedulable"
        in_backoff = backoff_until(gang) > time.time()
        held = hold is not None and bool(hold.held_nodes)
        return [
            {"type": "Admitted", "status": status, "reason": reason, "message": message},
            {
                "type": "Unschedulable",
                "status": "True" if unschedulable else "False",
                "reason": "Unschedulable" if unschedulable else reason,
                "message": hold.message if hold is not None and unschedulable else "",
            },
            partial_condition(gang),
            {
                "type": "Backoff",
                "status": "True" if in_backoff else "False",
                "reason": "PartialPlacement" if in_backoff else "NoBackoff",
                "message": message if in_backoff else "",
            },
            {
                "type": "CapacityHeld",
                "status": "True" if held else "False",
                "reason": "Starving" if held else "NotHeld",
                "message": hold.held_message if hold is not None and held else "",
            },
        ]

    def compose(self, view: GangView, gang: JSON, hold: Hold | None, released_now: int) -> GangStatus:
        counts = view.counts()
        counts["released"] += released_now  # released in this pass: not yet seen by the watch
        counts["gated"] -= released_now
        gang_phase = phase(view, counts)
        conditions = self.conditions(view, gang, hold, counts)
        return GangStatus(counts, gang_phase, {"phase": gang_phase, **counts, "conditions": conditions})

    async def record_release(self, view: GangView, gang: JSON, admission: JSON, planned: int) -> Recorded:
        """The decision (`status.admission`, what a restarted operator continues) in one write
        with the status the gang has once its `planned` pods are released; what was written, for
        `write_group_released`. The pass's `write` then finds nothing new to write unless a
        release failed."""
        status = self.compose(view, gang, None, planned)
        stamp = writes.now()
        timed = self.timed(view.key, status.wanted["conditions"], stamp)
        self.pacing.mark_written(view.key, time.monotonic())
        body = {**status.wanted, "conditions": timed, "admission": admission}
        await writes.patch_gang_status(self.api, view.namespace, view.name, body)
        self.written[view.key] = status.wanted
        return status, timed, stamp

    async def write_group_released(self, view: GangView, recorded: Recorded) -> None:
        """The group's status as `record_release` wrote the Gang's (beside the pods' releases).
        It never fails the release: if the write fails, the pass's `write` writes both again."""
        status, timed, stamp = recorded
        try:
            await self.write_group(view, status.counts, status.phase, timed, stamp)
        except Exception:
            log.warning("status of the group of gang %s/%s not written", *view.key, exc_info=True)
            self.written.pop(view.key, None)
            self.pacing.forget(view.key)

    async def write(self, view: GangView, hold: Hold | None, released_now: int) -> None:
        await self.tell_waiting(view)
        if view.group is None and view.waiting:
            return  # no Gang object until its group exists
        gang = await self.ensure_gang(view)
        await self.warn_unmodeled(view, gang)
        status = self.compose(view, gang, hold, released_now)
        counts, gang_phase, wanted = status.counts, status.phase, status.wanted
        if self.written.get(view.key) == wanted:
            return  # unchanged: no write
        stamp = writes.now()
        # The transition's own time, even if the write is deferred.
        timed = self.timed(view.key, wanted["conditions"], stamp)
        if not self.pacing.may_write(view.key, time.monotonic()):
            return  # a pass at `pacing.next_due` writes it, with the state then
        self.written[view.key] = wanted
        # The Gang's status, its group's and the Events are independent: one round trip, not four.
        writing = [
            writes.patch_gang_status(self.api, view.namespace, view.name, {**wanted, "conditions": timed}),
            self.write_group(view, counts, gang_phase, timed, stamp),
        ]
        if hold is not None and self.reasons.get(view.key) != hold.reason:
            self.reasons[view.key] = hold.reason
            warning = hold.reason == "Unschedulable"
            writing += [
                writes.post_event(self.api, obj, hold.reason, hold.message, warning=warning)
                for obj in (gang, view.group)
                if obj is not None
            ]
        await asyncio.gather(*writing)
        held = hold is not None and bool(hold.held_nodes)
        if held != (view.key in self.capacity_held):
            if held and hold is not None:
                self.capacity_held.add(view.key)
                await writes.post_event(self.api, gang, "CapacityHeld", hold.held_message)
            else:
                self.capacity_held.discard(view.key)

    def timed(self, key: tuple[str, str], conditions: list[JSON], stamp: str) -> list[JSON]:
        """The conditions with their transition times: a time changes only when the status does."""
        for c in conditions:
            seen = self.transitions.get((key, c["type"]))
            if seen is None or seen[0] != c["status"]:
                self.transitions[(key, c["type"])] = (c["status"], stamp)
        return [{**c, "lastTransitionTime": self.transitions[(key, c["type"])][1]} for c in conditions]

    async def write_recovering(self, key: tuple[str, str], gang: JSON) -> None:
        """The status of a gang in recovery that has no pod at the moment (its Job suspended,
        its pods deleted and not made again yet): what happened and when it is tried again."""
        recovery = recovery_of(gang)
        in_backoff = backoff_until(gang) > time.time()
        message = recovery.get("message", "")
        if recovery.get("suspendedJobs"):
            message += f"; waiting for the pods of Job {', '.join(recovery['suspendedJobs'])} to go"
        conditions = [
            {"type": "Admitted", "status": "False", "reason": "Recovering", "message": message},
            {"type": "Unschedulable", "status": "False", "reason": "Recovering", "message": ""},
            partial_condition(gang),
            {
                "type": "Backoff",
                "status": "True" if in_backoff else "False",
                "reason": "PartialPlacement" if in_backoff else "NoBackoff",
                "message": backoff_message(gang, time.time()) if in_backoff else "",
            },
            {"type": "CapacityHeld", "status": "False", "reason": "NotHeld", "message": ""},
        ]
        counts = dict.fromkeys(("members", "gated", "released", "bound", "running"), 0)
        wanted = {"phase": "Pending", **counts, "conditions": conditions}
        if self.written.get(key) == wanted:
            return
        self.written[key] = wanted
        timed = self.timed(key, conditions, writes.now())
        await writes.patch_gang_status(self.api, key[0], key[1], {**wanted, "conditions": timed})

    async def write_group(
        self, view: GangView, counts: dict[str, int], gang_phase: str, timed: list[JSON], stamp: str
    ) -> None:
        """The group object's status. quorum's own PodGroup kinds (v1alpha1): phase, counters and
        conditions prefixed `Quorum`. A Kubernetes 1.36 PodGroup is kube-scheduler's too: only
        quorum's conditions, by server-side apply, so its `PodGroupScheduled` stays."""
        if view.group is None or view.marker.source not in GROUP_APIS:
            return
        api_group, version = GROUP_APIS[view.marker.source]
        name = view.group["metadata"]["name"]
        conditions = [{**c, "type": "Quorum" + c["type"], "reason": c["reason"] or "None"} for c in timed]
        if view.marker.source is GangSource.WORKLOAD_POD_GROUP:
            generation = view.group["metadata"].get("generation")
            owned = [{**c, "observedGeneration": generation} if generation else c for c in conditions]
            await writes.apply_status(
                self.api,
                api_group,
                version,
                "PodGroup",
                "podgroups",
                view.namespace,
                name,
                {"conditions": owned},
            )
            return
        if not view.group["apiVersion"].endswith("v1alpha1"):
            return
        group_status = {
            "phase": gang_phase,
            "scheduled": counts["bound"],
            "running": counts["running"],
            "succeeded": counts["succeeded"],
            "failed": counts["failed"],
            "observedGeneration": view.group["metadata"].get("generation"),
            "conditions": conditions,
        }
        if counts["released"] and not (view.group.get("status") or {}).get("scheduleStartTime"):
            group_status["scheduleStartTime"] = stamp
        await writes.patch_status(
            self.api, api_group, version, "podgroups", view.namespace, name, group_status
        )

    def forget(self, key: tuple[str, str]) -> None:
        self.written.pop(key, None)
        self.pacing.forget(key)
