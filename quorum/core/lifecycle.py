"""A released gang's life after the decision: did it bind in time, and if not, how it recovers.

Pure rules, tested with plain data; the operator's recovery task applies them.

- **Timeout.** A release gives the gang `scheduleTimeoutSeconds` until at least minMember of its
  pods are bound. A gang still short of that when the time runs out, with released pods that
  did not bind (a pod scheduled by someone else took a planned node, say), is *partially
  placed*: it holds capacity and cannot run.
- **Recovery by owner kind.** Pods of ReplicaSets and StatefulSets are deleted (their
  controllers make new ones, which the webhook gates); a Job is suspended (its controller
  deletes its pods without counting them as failures) and resumed once it has no active or
  terminating pods; a Job whose `suspend` belongs to another controller (`spec.managedBy`,
  Kueue, JobSet) and bare pods or pods of any other owner are reported, not touched.
- **Backoff.** After a recovery the gang waits `base * 2^(n-1)` seconds (n: recoveries in a
  row, the wait capped) before it is planned again; a gang that binds whole resets n.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from enum import StrEnum

JOB_CONTROLLER = "kubernetes.io/job-controller"
KUEUE_QUEUE_LABEL = "kueue.x-k8s.io/queue-name"


@dataclass(frozen=True, slots=True)
class BackoffPolicy:
    base_seconds: float = 10.0
    """Wait after the first recovery."""
    cap_seconds: float = 300.0
    """No wait is longer than this, however many recoveries in a row."""

    def delay(self, failures: int) -> float:
        if failures <= 0:
            return 0.0
        return min(self.cap_seconds, self.base_seconds * float(2 ** min(failures - 1, 32)))


def is_partially_placed(
    *,
    released_at: float,
    timeout_seconds: float,
    min_member: int,
    bound: int,
    unbound_released: int,
    now: float,
) -> bool:
    """The gang's time is up, fewer than minMember of its pods are bound, and some released pod
    is still not bound (so it is not merely waiting for members to be made again)."""
    return unbound_released > 0 and bound < min_member and now - released_at > timeout_seconds


class Action(StrEnum):
    DELETE_POD = "DeletePod"
    SUSPEND_JOB = "SuspendJob"
    REPORT = "Report"


@dataclass(frozen=True, slots=True)
class Owner:
    """A pod's controller (ownerReference with controller: true), or None for a bare pod."""

    kind: str
    name: str
    uid: str = ""


@dataclass(frozen=True, slots=True)
class JobFacts:
    """What decides whether quorum may suspend a Job."""

    name: str
    managed_by: str | None = None
    labels: Mapping[str, str] = field(default_factory=dict)
    owner_kinds: tuple[str, ...] = ()  # kinds of the Job's own controllers (CronJob, JobSet, ...)

    def suspend_owner(self) -> str | None:
        """Who else decides the Job's `suspend`, if anyone (then quorum only reports)."""
        if self.managed_by and self.managed_by != JOB_CONTROLLER:
            return f"spec.managedBy {self.managed_by}"
        if self.labels.get(KUEUE_QUEUE_LABEL):
            return f"Kueue (label {KUEUE_QUEUE_LABEL})"
        for kind in self.owner_kinds:
            if kind != "CronJob":  # a CronJob never touches its Jobs' suspend
                return f"its owner {kind}"
        return None


@dataclass(frozen=True, slots=True)
class Step:
    action: Action
    target: str  # pod name, or Job name
    why: str = ""  # for REPORT: why quorum does not act


@dataclass(frozen=True, slots=True)
class RecoveryPlan:
    steps: tuple[Step, ...]

    def of(self, action: Action) -> list[Step]:
        return [s for s in self.steps if s.action is action]

    def summary(self) -> str:
        """One line a person reads in `kubectl describe gang`."""
        parts = []
        if deleted := self.of(Action.DELETE_POD):
            parts.append(f"deleted {len(deleted)} pods for their controllers to make again")
        if jobs := self.of(Action.SUSPEND_JOB):
            parts.append(
                "suspended Job " + ", ".join(sorted({s.target for s in jobs})) + " until its pods are gone"
            )
        if reports := self.of(Action.REPORT):
            reasons = sorted({s.why for s in reports})
            parts.append(
                f"left {len(reports)} pods as they are ({'; '.join(reasons)}): delete them yourself to retry"
            )
        return "; ".join(parts) or "nothing to recover"


def plan_recovery(members: Sequence[tuple[str, Owner | None]], jobs: Mapping[str, JobFacts]) -> RecoveryPlan:
    """What to do with each active member (pod name, its controller) of a partially placed gang.
    `jobs` has the facts of every Job that owns a member (a Job missing from it is gone)."""
    steps: list[Step] = []
    suspended: set[str] = set()
    for pod, owner in members:
        if owner is None:
            steps.append(Step(Action.REPORT, pod, "bare pods are never deleted by quorum"))
        elif owner.kind in ("ReplicaSet", "StatefulSet"):
            steps.append(Step(Action.DELETE_POD, pod))
        elif owner.kind == "Job":
            job = jobs.get(owner.name)
            other = job.suspend_owner() if job is not None else "the Job is gone"
            if other is not None:
                steps.append(Step(Action.REPORT, pod, f"Job {owner.name}'s suspend belongs to {other}"))
            elif owner.name not in suspended:
                suspended.add(owner.name)
                steps.append(Step(Action.SUSPEND_JOB, owner.name))
        else:
            steps.append(Step(Action.REPORT, pod, f"pods of a {owner.kind} are not quorum's to delete"))
    return RecoveryPlan(tuple(steps))


def job_may_resume(active: int | None, terminating: int | None) -> bool:
    """A suspended Job is resumed only when none of its pods is left, so that none of the old
    pods can fail after the resume and count against its backoffLimit."""
    return not active and not terminating
