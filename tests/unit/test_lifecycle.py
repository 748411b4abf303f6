"""Timeout, recovery by owner kind, backoff and member loss: the pure rules of a released gang's life."""

from __future__ import annotations

from hypothesis import given
from hypothesis import strategies as st

from quorum.core.lifecycle import (
    Action,
    BackoffPolicy,
    JobFacts,
    Member,
    MemberLossPolicy,
    MemberState,
    Owner,
    is_partially_placed,
    job_may_resume,
    member_loss,
    member_loss_policy,
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
            elapsed=now - 100.0,
            timeout_seconds=60.0,
            min_member=4,
            bound=bound,
            unbound_released=unbound,
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
        ("k", Owner("TFJob", "x")),
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
    assert job_may_resume(0, 0, 0) and job_may_resume(None, None, 0)
    assert not job_may_resume(1, 0, 0) and not job_may_resume(0, 2, 0)
    # Its status says none, but a pod it controls is still listed: the status lags behind.
    assert not job_may_resume(0, 0, 1) and not job_may_resume(None, None, 2)


# -- a running gang that loses members ---------------------------------------------------------


def test_the_policy_comes_from_the_annotation_else_the_default() -> None:
    replace, restart = MemberLossPolicy.REPLACE, MemberLossPolicy.RESTART_GANG
    assert member_loss_policy([], restart) == (restart, None)
    assert member_loss_policy([None, None], replace) == (replace, None)
    assert member_loss_policy(["RestartGang"], replace) == (restart, None)
    assert member_loss_policy(["RestartGang", None, "RestartGang"], replace) == (restart, None)
    policy, problem = member_loss_policy(["restart"], replace)
    assert policy is replace and problem is not None
    assert (
        "must be Replace or RestartGang" in problem
        and "'restart'" in problem
        and "Replace applies" in problem
    )
    policy, problem = member_loss_policy(["Replace", "RestartGang"], restart)
    assert policy is restart and problem is not None and "alike on every pod" in problem


def held(name: str, node: str = "n", disrupted: bool = False) -> Member:
    return Member(name, MemberState.HELD, node, disrupted)


def test_a_whole_gang_that_keeps_fewer_than_min_member_has_lost_members() -> None:
    members = [
        held("a", "n1"),
        held("b", "n2"),
        Member("c", MemberState.DELETED, "n3"),
        Member("d", MemberState.FAILED, "n4"),
        Member("e", MemberState.GATED),  # its replacement, waiting
        Member("f", MemberState.DELETED),  # never bound: not a lost member
    ]
    loss = member_loss(members, min_member=4, was_whole=True)
    assert loss is not None and loss.left == 2 and [m.name for m in loss.lost] == ["c", "d"]
    assert loss.describe() == (
        "2 of 4 members lost (pod c on node n3 deleted, pod d on node n4 failed); 2 left, minMember 4"
    )


def test_no_loss_while_released_finishing_taken_or_gone_whole() -> None:
    three = [held("a"), held("b"), held("c"), Member("d", MemberState.DELETED, "n")]
    assert member_loss(three, min_member=4, was_whole=True) is not None
    assert member_loss(three, min_member=4, was_whole=False) is None, "still being released"
    assert member_loss(three, min_member=3, was_whole=True) is None, "minMember still there"
    assert member_loss(three, min_member=4, was_whole=True, preempted=True) is None, "quorum took it"
    done = [*three, Member("e", MemberState.SUCCEEDED, "n")]
    assert member_loss(done, min_member=4, was_whole=True) is None, "finishing: Succeeded is done"
    taken = [held("a"), held("b", disrupted=True), held("c"), Member("d", MemberState.DELETED, "n")]
    assert member_loss(taken, min_member=4, was_whole=True) is None, "the rest is being taken too"
    gone = [Member(n, MemberState.DELETED, "n") for n in "abcd"] + [Member("e", MemberState.GATED)]
    assert member_loss(gone, min_member=4, was_whole=True) is None, "all evicted: it re-forms whole"


states = st.sampled_from(list(MemberState))
members_strategy = st.lists(
    st.builds(
        Member, st.text("abcdef", min_size=1, max_size=3), states, st.none() | st.just("n1"), st.booleans()
    ),
    max_size=10,
)


@given(members_strategy, st.integers(min_value=1, max_value=8), st.booleans(), st.booleans())
def test_a_loss_is_found_exactly_when_a_whole_gang_keeps_some_but_too_few(
    members: list[Member], min_member: int, was_whole: bool, preempted: bool
) -> None:
    loss = member_loss(members, min_member=min_member, was_whole=was_whole, preempted=preempted)
    kept = [m for m in members if m.state is MemberState.HELD]
    expected = (
        was_whole
        and not preempted
        and 0 < len(kept) < min_member
        and not any(m.state is MemberState.SUCCEEDED for m in members)
        and not any(m.disrupted for m in kept)
    )
    assert (loss is not None) == expected
    if loss is not None:
        assert loss.left == len(kept) and loss.min_member == min_member
        assert all(m.state in (MemberState.DELETED, MemberState.FAILED) and m.node for m in loss.lost)
        assert f"{loss.left} left, minMember {min_member}" in loss.describe()


def test_pods_of_controllers_that_make_them_again_are_deleted_by_kind_and_group() -> None:
    """KubeRay's RayCluster and the MPI Operator's MPIJob make a deleted pod again, as a
    ReplicaSet does; a kind of the same name in another API group is not theirs: reported."""
    members = [
        ("head", Owner("RayCluster", "rc", "u1", "ray.io")),
        ("worker", Owner("MPIJob", "pi", "u2", "kubeflow.org")),
        ("lws-0-1", Owner("StatefulSet", "lws-0", "u3", "apps")),
        ("fake", Owner("RayCluster", "rc", "u4", "example.com")),
    ]
    plan = plan_recovery(members, {})
    assert [s.target for s in plan.of(Action.DELETE_POD)] == ["head", "worker", "lws-0-1"]
    (report,) = plan.of(Action.REPORT)
    assert report.target == "fake" and "RayCluster" in report.why
