"""A released gang's life after the decision: did it bind in time, and if not, how it recovers.

Pure rules, tested with plain data; the operator's recovery task applies them.

- **Timeout.** A release gives the gang `scheduleTimeoutSeconds` until at least minMember of its
  pods are bound. A gang still short of that when the time runs out, with released pods that
  did not bind (a pod scheduled by someone else took a planned node, say), is *partially
  placed*: it holds capacity and cannot run.
- **Recovery by owner kind.** Pods of ReplicaSets and StatefulSets (so LeaderWorkerSets'), of
  KubeRay's RayClusters and of the MPI Operator's MPIJobs (its workers) are deleted (their
  controllers make new ones, which the webhook gates); a Job is suspended (its controller
  deletes its pods without counting them as failures) and resumed once it has no active or
  terminating pods; a Job whose `suspend` belongs to another controller (`spec.managedBy`,
  Kueue, JobSet) and bare pods or pods of any other owner are reported, not touched.
- **Backoff.** After a recovery the gang waits `base * 2^(n-1)` seconds (n: recoveries in a
  row, the wait capped) before it is planned again; a gang that binds whole resets n.
- **Member loss.** A gang that ran whole (minMember pods bound) and keeps fewer than minMember of
  its released pods — a member deleted, evicted or failed — has lost members. Its policy says
  what follows: `Replace` (the replacements are released alone) or `RestartGang` (the rest is
  recovered by owner kind as above, so the gang is admitted again whole). Not a loss: a gang
  none of whose members is left (all evicted or suspended at once: it re-forms whole anyway), a
  gang with a Succeeded member (it is finishing), a gang whose remaining members are being taken
  too (they carry `DisruptionTarget`), or one preempted by quorum.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from enum import StrEnum

JOB_CONTROLLER = "kubernetes.io/job-controller"
KUEUE_QUEUE_LABEL = "kueue.x-k8s.io/queue-name"
MEMBER_LOSS_ANNOTATION = "quorum.dev/member-loss-policy"


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
    elapsed: float,
    timeout_seconds: float,
    min_member: int,
    bound: int,
    unbound_released: int,
) -> bool:
    """The gang's time is up (`elapsed`: seconds since its decision, as one process measured
    them), fewer than minMember of its pods are bound, and some released pod is still not bound
    (so it is not merely waiting for members to be made again)."""
    return unbound_released > 0 and bound < min_member and elapsed > timeout_seconds


class Action(StrEnum):
    DELETE_POD = "DeletePod"
    SUSPEND_JOB = "SuspendJob"
    REPORT = "Report"


# Controllers that make a deleted pod again, by kind, with their API group: recovery deletes
# their pods (docs/lifecycle.md, docs/integrations.md). A kind of another group is not one of them.
RECREATING_OWNERS = {
    "ReplicaSet": "apps",
    "StatefulSet": "apps",  # and so LeaderWorkerSet's leaders and workers
    "RayCluster": "ray.io",  # KubeRay makes missing head and worker pods again
    "MPIJob": "kubeflow.org",  # the MPI Operator makes missing worker pods again
}


@dataclass(frozen=True, slots=True)
class Owner:
    """A pod's controller (ownerReference with controller: true), or None for a bare pod."""

    kind: str
    name: str
    uid: str = ""
    group: str | None = None  # the API group of its apiVersion; None: not known (tests)

    @property
    def recreates_pods(self) -> bool:
        """Whether its controller makes a deleted pod again (`RECREATING_OWNERS`)."""
        group = RECREATING_OWNERS.get(self.kind)
        return group is not None and self.group in (None, group)


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
        elif owner.recreates_pods:
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


def job_may_resume(active: int | None, terminating: int | None, pods_left: int) -> bool:
    """Whether a Job quorum suspended may be resumed: only once none of its pods is left, so
    that none of the old pods can fail after the resume and count against its backoffLimit.
    Both what the Job's status counts (`active`, `terminating`) and what the caller listed
    (`pods_left`: pods the Job controls, by uid, neither Succeeded nor Failed) must say none:
    the status lags behind the pods. The one rule of quorum's recovery and of `quorum
    uninstall`, which resumes them once quorum is gone."""
    return not active and not terminating and pods_left <= 0


# -- a running gang that loses members ---------------------------------------------------------


class MemberLossPolicy(StrEnum):
    REPLACE = "Replace"
    """The replacements of lost members are released alone; the rest runs on."""
    RESTART_GANG = "RestartGang"
    """The rest is recovered by owner kind; the gang is admitted again whole."""


def member_loss_policy(
    values: Iterable[str | None], default: MemberLossPolicy
) -> tuple[MemberLossPolicy, str | None]:
    """The policy a gang's `quorum.dev/member-loss-policy` annotations say (the group object's,
    or every pod's of a label-only gang; None: not set), and what is wrong with them, if
    anything: a value that is not a policy, or pods that disagree, leave the default."""
    found = sorted({v for v in values if v is not None})
    if not found:
        return default, None
    if len(found) == 1 and found[0] in {p.value for p in MemberLossPolicy}:
        return MemberLossPolicy(found[0]), None
    return default, (
        f"annotation {MEMBER_LOSS_ANNOTATION} must be Replace or RestartGang (alike on every pod of a "
        f"label-only gang); found {', '.join(repr(v[:40]) for v in found[:4])}: the cluster default "
        f"{default.value} applies"
    )


class MemberState(StrEnum):
    HELD = "held"  # released (bound, or binding) and active: it holds its place in the gang
    GATED = "gated"  # waiting at quorum's gate: a replacement, say
    DELETED = "deleted"  # terminating, or gone
    FAILED = "failed"
    SUCCEEDED = "succeeded"


@dataclass(frozen=True, slots=True)
class Member:
    name: str
    state: MemberState
    node: str | None = None
    disrupted: bool = False  # carries the DisruptionTarget condition: someone is taking it


@dataclass(frozen=True, slots=True)
class MemberLoss:
    min_member: int
    left: int  # members that still hold their place
    lost: tuple[Member, ...]  # those known to have been lost (bound once, now deleted or failed)

    def describe(self) -> str:
        """What happened, in numbers, for an Event and `status.recovery.message`."""
        if not self.lost:
            return f"members lost: {self.left} left, minMember {self.min_member}"
        shown = ", ".join(f"pod {m.name} on node {m.node} {m.state.value}" for m in self.lost[:5])
        more = f" and {len(self.lost) - 5} more" if len(self.lost) > 5 else ""
        return (
            f"{len(self.lost)} of {self.left + len(self.lost)} members lost ({shown}{more}); "
            f"{self.left} left, minMember {self.min_member}"
        )


def member_loss(
    members: Sequence[Member], *, min_member: int, was_whole: bool, preempted: bool = False
) -> MemberLoss | None:
    """Whether a gang has lost members: it ran whole (`was_whole`: minMember pods bound since its
    last decision) and fewer than minMember members hold their place now, but some still do.
    None when it never ran whole (it is still being released), when none is left (evicted or
    suspended whole: it re-forms whole by itself), when a member Succeeded (the gang is
    finishing), or when the rest is being taken as well (`DisruptionTarget` on them, or
    `preempted` by quorum since its decision)."""
    held = [m for m in members if m.state is MemberState.HELD]
    if not was_whole or preempted or not held or len(held) >= min_member:
        return None
    if any(m.state is MemberState.SUCCEEDED for m in members) or any(m.disrupted for m in held):
        return None
    lost = tuple(
        m for m in members if m.state in (MemberState.DELETED, MemberState.FAILED) and m.node is not None
    )
    return MemberLoss(min_member, len(held), lost)
