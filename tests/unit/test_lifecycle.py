"""Timeout, recovery by owner kind and backoff: the pure rules of a released gang's life."""

from __future__ import annotations

from hypothesis import given
from hypothesis import strategies as st

from quorum.core.lifecycle import (
    Action,
    BackoffPolicy,
    JobFacts,
    Owner,
    is_partially_placed,
    job_may_resume,
    plan_recovery,
)


def test_backoff_doubles_and_is_capped() -> None:
    policy = BackoffPolicy(base_seconds=10, cap_seconds=60)
    assert [policy.delay(n) for n in range(6)] == [0, 10, 20, 40, 60, 60]


@given(st.integers(min_value=1, max_value=10_000))
def test_backoff_never_exceeds_the_cap_or_shrinks(n: int) -> None:
    policy = BackoffPolicy(base_seconds=3, cap_seconds=300)
    assert 3 <= policy.delay(n) <= 300 and policy.delay(n + 1) >= policy.delay(n)


def test_partially_placed_only_after_the_timeout_with_a_released_pod_unbound() -> None:
    def partial(bound: int, unbound: int, now: float) -> bool:
        return is_partially_placed(
            released_at=100.0,
            timeout_seconds=60.0,
            min_member=4,
            bound=bound,
            unbound_released=unbound,
            now=now,
        )

    assert not partial(3, 1, 150.0), "still in time"
    assert partial(3, 1, 161.0)
    assert not partial(4, 1, 161.0), "minMember bound"
    assert not partial(3, 0, 161.0), "waits for members to be made again"


def test_recovery_by_owner_kind() -> None:
    rs, sts = Owner("ReplicaSet", "web-7d9"), Owner("StatefulSet", "db")
    jobs = {
        "train": JobFacts("train"),
        "cron-123": JobFacts("cron-123", owner_kinds=("CronJob",)),
        "kueued": JobFacts("kueued", labels={"kueue.x-k8s.io/queue-name": "q"}),
        "managed": JobFacts("managed", managed_by="example.com/ctl"),
        "js-0": JobFacts("js-0", owner_kinds=("JobSet",)),
    }
    members = [
        ("a", rs),
        ("b", sts),
        ("c", Owner("Job", "train")),
        ("d", Owner("Job", "train")),
        ("e", Owner("Job", "cron-123")),
        ("f", Owner("Job", "kueued")),
        ("g", Owner("Job", "managed")),
        ("h", Owner("Job", "js-0")),
        ("i", None),
        ("j", Owner("Job", "gone")),
        ("k", Owner("MPIJob", "x")),
    ]
    plan = plan_recovery(members, jobs)
    assert [s.target for s in plan.of(Action.DELETE_POD)] == ["a", "b"]
    assert [s.target for s in plan.of(Action.SUSPEND_JOB)] == ["train", "cron-123"], "each Job once"
    reports = {s.target: s.why for s in plan.of(Action.REPORT)}
    assert set(reports) == {"f", "g", "h", "i", "j", "k"}
    assert "Kueue" in reports["f"] and "example.com/ctl" in reports["g"] and "JobSet" in reports["h"]
    summary = plan.summary()
    assert "deleted 2 pods" in summary and "suspended Job cron-123, train" in summary
    assert "left 6 pods as they are" in summary and "delete them yourself" in summary


def test_a_job_managed_by_the_job_controller_is_quorums_to_suspend() -> None:
    assert JobFacts("j", managed_by="kubernetes.io/job-controller").suspend_owner() is None


def test_a_suspended_job_resumes_only_without_pods() -> None:
    assert job_may_resume(0, 0) and job_may_resume(None, None)
    assert not job_may_resume(1, 0) and not job_may_resume(0, 2)
