"""What a gang's status says, composed in one place: a pure function from the gang's state (its
pods' counters, why it is held, its recovery record, a failure of quorum's own work) to its
phase, counters and conditions. The operator's `status.py` writes what this composes, and the
SUNK scheduler composes the Gangs of gangs Slurm places with it; nothing else builds a condition.

| condition | True when |
|---|---|
| `Admitted` | at least minMember pods are released (reason `Released`); else the reason it waits |
| `Unschedulable` | the plan found no room for the whole gang now (or gave up searching) |
| `PartiallyPlaced` | the last release did not bind minMember pods in time (recovered, see lifecycle) |
| `Backoff` | it waits after a partial placement before it is planned again |
| `CapacityHeld` | the starvation guard holds nodes for it |
| `PlanningFailed` | quorum's own work on it failed (an error, a refused write); retried with backoff |
| `Preempting` | quorum is taking lower-priority work's room for it (docs/preemption.md) |
| `Preempted` | it was preempted for a higher-priority gang and is not admitted again yet |
| `Restarted` | it lost members while running and was restarted whole (RestartGang), not admitted again yet |
| `Resized` | its group's minCount grew and the new size is not released yet (present once resized) |
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from quorum.core.planner import Hold
from quorum.core.record import Preempted, PreemptionRecord, Recovery, Resized
from quorum.core.times import iso as iso  # re-exported: the operator's modules use them here
from quorum.core.times import iso_deadline as iso_deadline
from quorum.core.times import timestamp as timestamp

JSON = dict[str, Any]
CONDITION_TYPES = (
    "Admitted",
    "Unschedulable",
    "PartiallyPlaced",
    "Backoff",
    "CapacityHeld",
    "PlanningFailed",
    "Preempting",
    "Preempted",
    "Restarted",
)  # and `Resized`, once a gang was resized
# Hold reasons that mean "no room for the whole gang now": Unschedulable=True, and the
# starvation guard's clock runs. SlurmResources: Slurm holds a gang it places for lack of nodes.
NO_ROOM = ("Unschedulable", "BudgetExhausted", "SlurmResources")
# A gang kube-scheduler places (placement kube-scheduler) that it has not bound whole yet: its
# normal path, as a release is the gate's, so it is told by the status alone, no Event, and not
# written at all if kube-scheduler binds it within the forming grace.
WAITING_FOR_KUBE_SCHEDULER = "WaitingForKubeScheduler"


@dataclass(frozen=True)
class Waiting:
    """Why a gang that another scheduler places (Slurm, docs/sunk.md) is not admitted: a hold
    that no plan of quorum's made."""

    reason: str
    message: str
    held_nodes: tuple[str, ...] = ()
    held_message: str = ""


@dataclass(frozen=True)
class GangState:
    """Everything a gang's status is composed from."""

    counts: Mapping[str, int]  # members, gated, released, bound, running, succeeded, failed
    min_member: int
    now: float  # epoch seconds
    basic: bool = False  # a 1.36 PodGroup with the `basic` policy: admitted once any pod is released
    waiting: str | None = None  # why it cannot be planned at all (its group is missing or invalid)
    hold: Hold | Waiting | None = None  # why the last pass held it
    recovery: Recovery | None = None  # the Gang's `status.recovery`
    failure: str | None = None  # what of quorum's work on it failed, in a sentence
    preemption: PreemptionRecord | None = None  # the Gang's `status.preemption` (it preempts)
    preempted: Preempted | None = None  # the Gang's `status.preempted` (it was preempted)
    resized: Resized | None = None  # the Gang's `status.resized` (its minCount changed)


@dataclass(frozen=True)
class GangStatus:
    """A gang's status without transition times: counters, phase and conditions."""

    counts: dict[str, int]
    phase: str
    conditions: list[JSON]

    @property
    def body(self) -> JSON:
        return {"phase": self.phase, **self.counts, "conditions": self.conditions}

    def condition(self, kind: str) -> JSON:
        return next(c for c in self.conditions if c["type"] == kind)


def keep_transition_times(conditions: list[JSON], previous: list[JSON] | None, stamp: str) -> list[JSON]:
    """The conditions with their lastTransitionTime: the previous one's while its status is
    unchanged, else `stamp`."""
    before = {c.get("type"): c for c in previous or [] if isinstance(c, dict)}
    timed = []
    for condition in conditions:
        old = before.get(condition["type"])
        kept = old is not None and old.get("status") == condition["status"] and old.get("lastTransitionTime")
        timed.append({**condition, "lastTransitionTime": kept or stamp})
    return timed


def compose(state: GangState) -> GangStatus:
    counts = dict(state.counts)
    return GangStatus(counts, phase(counts, state.min_member), conditions(state))


def phase(counts: Mapping[str, int], min_member: int) -> str:
    need = max(1, min_member)
    if counts["members"] == 0 and counts["succeeded"] >= need:
        return "Finished"
    if counts["failed"] and counts["members"] + counts["succeeded"] < need:
        return "Failed"
    if counts["running"] >= need:
        return "Running"
    if counts["released"] > 0:
        return "Scheduling"
    return "Pending"


# A gang's phase as Volcano names it on its PodGroup (scheduling.volcano.sh/v1beta1): released
# and not yet running is Volcano's Inqueue; Volcano has no Failed phase (its Unknown is a gang
# short of running members).
VOLCANO_PHASES = {
    "Pending": "Pending",
    "Scheduling": "Inqueue",
    "Running": "Running",
    "Finished": "Completed",
    "Failed": "Unknown",
}


def admitted(state: GangState) -> tuple[str, str, str]:
    """(status, reason, message) of the `Admitted` condition."""
    need = max(1, state.min_member)
    counts, hold = state.counts, state.hold
    if state.waiting:
        return "False", "WaitingForGroup", state.waiting
    if hold is not None:
        return "False", hold.reason, hold.message
    released = counts["released"]
    if released >= need or (state.basic and released):
        return "True", "Released", f"{released} of {counts['members']} pods released (minMember {need})"
    return "False", "Pending", f"{counts['members']} of {need} members exist (minMember {need})"


def conditions(state: GangState) -> list[JSON]:
    status, reason, message = admitted(state)
    hold = state.hold
    no_room = hold is not None and hold.reason in NO_ROOM
    held = hold is not None and bool(hold.held_nodes)
    in_backoff = state.recovery is not None and state.recovery.backoff_until > state.now
    return [
        {"type": "Admitted", "status": status, "reason": reason, "message": message},
        {
            "type": "Unschedulable",
            "status": "True" if no_room else "False",
            "reason": hold.reason if hold is not None and no_room else reason,
            "message": hold.message if hold is not None and no_room else "",
        },
        partially_placed(state.recovery),
        backoff(state.recovery, state.now, in_backoff),
        {
            "type": "CapacityHeld",
            "status": "True" if held else "False",
            "reason": "Starving" if held else "NotHeld",
            "message": hold.held_message if hold is not None and held else "",
        },
        planning_failed(state.failure),
        preempting(state.preemption),
        preempted(state.preempted, readmitted=status == "True"),
        restarted(state.recovery, readmitted=status == "True"),
        *resized(state.resized, state.counts["released"]),
    ]


def resized(record: Resized | None, released: int) -> list[JSON]:
    """True while a gang whose minMember grew has fewer released than the new size; the message
    (from what to what, and how it goes on) stays until the next resize. None before any resize:
    each condition costs every status write of every gang its bytes."""
    if record is None:
        return []
    old, new = record.old, record.new
    message = f"minMember changed from {old} to {new} at {record.time}"
    if new > old and released < new:
        message += f": {released} released; the other {new - released} go once all of them fit"
        return [{"type": "Resized", "status": "True", "reason": "Growing", "message": message}]
    if new < old:
        message += f": members beyond {new} are elastic"
    return [{"type": "Resized", "status": "False", "reason": "Resized", "message": message}]


def preempting(record: PreemptionRecord | None) -> JSON:
    if record is not None:
        return {"type": "Preempting", "status": "True", "reason": "Preempting", "message": record.message}
    return {"type": "Preempting", "status": "False", "reason": "NotPreempting", "message": ""}


def preempted(record: Preempted | None, readmitted: bool) -> JSON:
    """True from the preemption until the gang is admitted again; the message stays."""
    if record is None:
        return {"type": "Preempted", "status": "False", "reason": "NotPreempted", "message": ""}
    message = record.message
    if readmitted:
        return {"type": "Preempted", "status": "False", "reason": "Readmitted", "message": message}
    return {"type": "Preempted", "status": "True", "reason": "PreemptionByQuorum", "message": message}


def compose_recovering(
    recovery: Recovery,
    now: float,
    failure: str | None = None,
    preempted_by: Preempted | None = None,
) -> GangStatus:
    """A gang in recovery that has no pod at the moment (its Job suspended, its pods deleted
    and not made again yet): what happened and when it is tried again."""
    message = recovery.message
    if recovery.suspended_jobs:
        message += f"; waiting for the pods of Job {', '.join(recovery.suspended_jobs)} to go"
    counts = dict.fromkeys(("members", "gated", "released", "bound", "running", "succeeded", "failed"), 0)
    in_backoff = recovery.backoff_until > now
    return GangStatus(
        counts,
        "Pending",
        [
            {"type": "Admitted", "status": "False", "reason": "Recovering", "message": message},
            {"type": "Unschedulable", "status": "False", "reason": "Recovering", "message": ""},
            partially_placed(recovery),
            backoff(recovery, now, in_backoff),
            {"type": "CapacityHeld", "status": "False", "reason": "NotHeld", "message": ""},
            planning_failed(failure),
            preempting(None),
            preempted(preempted_by, readmitted=False),
            restarted(recovery, readmitted=False),
        ],
    )


def restarted(recovery: Recovery | None, readmitted: bool) -> JSON:
    """True from a restart after a member loss until the gang is admitted again; the message
    (what was lost, what quorum did) stays until the next recovery."""
    if recovery is None or recovery.reason != "MemberLost":
        return {"type": "Restarted", "status": "False", "reason": "NotRestarted", "message": ""}
    message = recovery.message
    if readmitted:
        return {"type": "Restarted", "status": "False", "reason": "Readmitted", "message": message}
    return {"type": "Restarted", "status": "True", "reason": "MemberLost", "message": message}


def partially_placed(recovery: Recovery | None) -> JSON:
    if recovery is not None and recovery.failures:
        return {
            "type": "PartiallyPlaced",
            "status": "True",
            "reason": "TimedOut",
            "message": recovery.message,
        }
    return {"type": "PartiallyPlaced", "status": "False", "reason": "NotPartial", "message": ""}


def backoff(recovery: Recovery | None, now: float, in_backoff: bool) -> JSON:
    return {
        "type": "Backoff",
        "status": "True" if in_backoff else "False",
        "reason": "PartialPlacement" if in_backoff else "NoBackoff",
        "message": backoff_message(recovery, now) if in_backoff else "",
    }


def planning_failed(failure: str | None) -> JSON:
    if failure:
        return {"type": "PlanningFailed", "status": "True", "reason": "Error", "message": failure}
    return {"type": "PlanningFailed", "status": "False", "reason": "NoError", "message": ""}


# -- the recovery record on the Gang (`status.recovery`) ------------------------------------


def backoff_message(recovery: Recovery | None, now: float) -> str:
    failures = recovery.failures if recovery is not None and recovery.failures else 1
    until = recovery.backoff_until if recovery is not None else 0.0
    return (
        f"backing off after a partial placement ({failures} in a row): next try at "
        f"{recovery.next_attempt_time if recovery else None} (in {max(0.0, until - now):.0f}s)"
    )
