"""`POST /hooks/stop?job=` with the shared secret, over the stateful fakes: it deletes only the
pods this scheduler bound to that job (the Binding recorded the job on each), and only when Slurm
is ending a job of quorum's; any other call is refused (404 for a job Slurm does not know, 403
for another user's job or one that runs) and deletes nothing."""

from __future__ import annotations

import pytest
from aiohttp.test_utils import TestClient, TestServer
from kubernetes_asyncio.client.exceptions import ApiException

from quorum.sunk import model
from quorum.sunk.hooks import make_app
from quorum.sunk.scheduler import SunkScheduler
from quorum.sunk.settings import SunkSettings
from quorum.sunk.slurm import Job
from tests.unit.sunk.fakes import JSON, FakeSunkApi
from tests.unit.sunk.test_reconcile import ALLOWED, CREATED_AT, Cluster, pod, podgroup

TOKEN = "t" * 32
# A stop waits for its pods KillWait - 5 s: 6 s here (the pods' grace period is 5 s).
QUICK = SunkSettings(namespaces=ALLOWED, slurm_kill_wait_seconds=11)


@pytest.fixture
def cluster() -> Cluster:
    found = Cluster()
    found.api.watch(found.scheduler)  # pod deletions reach the scheduler's index, as its watch would
    return found


async def stop(cluster: Cluster, job: int) -> tuple[int, str]:
    """The placeholder script's call, with the token."""
    server = TestServer(make_app(cluster.scheduler, TOKEN))
    async with TestClient(server) as http:
        answer = await http.post(f"/hooks/stop?job={job}", headers={"Authorization": f"Bearer {TOKEN}"})
        return answer.status, (await answer.text()).strip()


async def bound_gang(cluster: Cluster) -> int:
    """Gang `train` of two pods, submitted, started and bound: its job's id."""
    group = await cluster.submitted_gang()
    cluster.slurm.start(group, [("gpu-a", 2, 2), ("gpu-b", 2, 2)])
    assert (await cluster.reconcile()).bound == 2
    return group


def pod_names(api: FakeSunkApi) -> set[str]:
    return {p["metadata"]["name"] for p in api.pods.values()}


async def test_the_binding_records_the_job_on_each_pod(cluster: Cluster) -> None:
    group = await bound_gang(cluster)
    assert {p["metadata"]["annotations"][model.JOB_ID] for p in cluster.api.pods.values()} == {str(group)}
    assert all(model.bound_by(p, group) for p in cluster.api.pods.values())


async def test_a_stop_for_a_job_slurm_is_ending_deletes_its_pods_each_after_the_event(
    cluster: Cluster,
) -> None:
    group = await bound_gang(cluster)
    cluster.slurm.stopping(group)  # scancel: COMPLETING while the script has SIGTERM
    cluster.api.calls.clear()

    assert await stop(cluster, group) == (200, "pods gone")
    assert cluster.api.pods == {}
    for name in ("train-0", "train-1"):
        assert cluster.api.calls.index(("post_event", name)) < cluster.api.calls.index(("delete_pod", name))
        assert any(e[:2] == (name, "SlurmJobCancelled") and e[3] for e in cluster.api.events)


async def test_a_stop_during_a_preemptions_grace_time_is_one_slurm_made(cluster: Cluster) -> None:
    group = await bound_gang(cluster)
    for job in cluster.slurm.components[group]:
        job.preempt_time = CREATED_AT + 60  # still RUNNING: PreemptMode with a GraceTime
    assert await stop(cluster, group) == (200, "pods gone")
    assert any(e[1] == "SlurmJobPreempted" for e in cluster.api.events)


async def test_a_stop_right_after_the_binding_finds_the_pods_before_the_watch_shows_it() -> None:
    """scancel a moment after the binding: the scheduler's index may not show the Binding yet, but
    the scheduler knows what it bound."""
    cluster = Cluster()
    group = await cluster.submitted_gang()
    cluster.slurm.start(group, [("gpu-a", 2, 2), ("gpu-b", 2, 2)])
    assert (await cluster.reconcile()).bound == 2
    assert not any(p["spec"].get("nodeName") for p in cluster.scheduler.pods.items.values()), "not shown yet"
    cluster.api.watcher = cluster.scheduler  # from now on its watch delivers the deletions
    cluster.slurm.stopping(group)
    assert await stop(cluster, group) == (200, "pods gone")
    assert cluster.api.pods == {}


async def test_a_stop_for_a_job_that_runs_is_refused_and_deletes_nothing(cluster: Cluster) -> None:
    group = await bound_gang(cluster)
    cluster.api.calls.clear()
    status, text = await stop(cluster, group)
    assert status == 403
    assert text.startswith(f"job {group} is RUNNING in Slurm, not stopping"), text
    assert pod_names(cluster.api) == {"train-0", "train-1"}
    assert cluster.api.calls == []


async def test_a_stop_for_a_job_slurm_does_not_know_is_not_found(cluster: Cluster) -> None:
    await bound_gang(cluster)
    assert await stop(cluster, 999999) == (404, "Slurm knows no job 999999")
    assert pod_names(cluster.api) == {"train-0", "train-1"}


async def test_a_stop_for_another_users_job_with_a_copied_comment_deletes_nothing(cluster: Cluster) -> None:
    await bound_gang(cluster)
    decoy = cluster.slurm.sbatch(
        "mallory", f"quorum-sunk gang/ns/pg-train{model.STARTED}", state="COMPLETING"
    )
    cluster.api.calls.clear()
    status, text = await stop(cluster, decoy)
    assert status == 403 and f"job {decoy} is not a placeholder job of quorum-sunk-scheduler" in text
    assert "its Slurm user is mallory" in text, text
    assert pod_names(cluster.api) == {"train-0", "train-1"} and cluster.api.calls == []


async def test_a_stop_for_an_earlier_job_of_the_same_gang_leaves_the_pods_of_the_new_one(
    cluster: Cluster,
) -> None:
    """The gang's first job ended and its pods went; the pods made again run under a second job.
    A stop naming the first job (it is quorum's, and ended) finds no pod bound to it."""
    first = await bound_gang(cluster)
    cluster.slurm.end(first, "CANCELLED", end_time=CREATED_AT + 60)
    assert (await cluster.reconcile()).deleted == 2
    for i in range(2):
        cluster.api.add_pod(pod(f"train-{i}", "train", created="2026-11-25T10:05:00Z"))
    assert (await cluster.reconcile()).submitted == 1
    second = max(cluster.slurm.components)
    cluster.slurm.start(second, [("gpu-c", 2, 2), ("gpu-d", 2, 2)])
    assert (await cluster.reconcile()).bound == 2
    cluster.api.calls.clear()

    assert await stop(cluster, first) == (200, "pods gone")
    assert pod_names(cluster.api) == {"train-0", "train-1"}
    assert [c for c, _ in cluster.api.calls if c == "delete_pod"] == []
    cluster.slurm.stopping(second)
    assert await stop(cluster, second) == (200, "pods gone")
    assert cluster.api.pods == {}


async def test_a_stop_leaves_a_pod_of_the_gang_whose_binding_failed(cluster: Cluster) -> None:
    """Only pods bound to the job are the stop's: one pod's Binding failed (etcd timed out), so
    the stop deletes the other. Whether the failed one was bound it cannot know until the watch
    shows the pod again, so it does not say "pods gone" (504: the script drains the node); the
    next pass deletes the unbound pod for the job that ended (with the same Event)."""
    cluster.scheduler = SunkScheduler(QUICK, cluster.api, cluster.slurm)
    cluster.api.watch(cluster.scheduler)
    cluster.api.add_group("scheduling.sigs.k8s.io", "v1alpha1", podgroup("train", 2))
    for i in range(2):
        cluster.api.add_pod(pod(f"train-{i}", "train"))
    await cluster.reconcile()
    (group,) = cluster.slurm.components
    cluster.slurm.start(group, [("gpu-a", 2, 2), ("gpu-b", 2, 2)])
    cluster.api.failing.add(("bind_pod", "train-1"))
    with pytest.raises(ApiException, match="request timed out"):
        await cluster.reconcile()
    cluster.api.failing.clear()
    cluster.slurm.stopping(group)

    assert await stop(cluster, group) == (504, "pods still there")
    assert pod_names(cluster.api) == {"train-1"}
    cluster.slurm.end(group, "CANCELLED", end_time=CREATED_AT + 60)
    assert (await cluster.reconcile()).deleted == 1
    assert cluster.api.pods == {}


@pytest.mark.parametrize(
    ("state", "preempt_time", "legitimate"),
    [
        ("COMPLETING", 0, True),  # scancel, a time limit, a preemption (CANCEL) while KillWait runs
        ("CANCELLED", 0, True),
        ("TIMEOUT", 0, True),
        ("PREEMPTED", 0, True),
        ("NODE_FAIL", 0, True),
        ("REQUEUED", 0, True),
        ("RUNNING", CREATED_AT, True),  # a preemption's GraceTime
        ("RUNNING", 0, False),
        ("PENDING", 0, False),
        ("CONFIGURING", 0, False),
        ("SUSPENDED", 0, False),
        ("SIGNALING", 0, False),  # `scancel --signal=TERM`: Slurm is not ending the job
        ("SOMETHING_NEW", 0, False),
    ],
)
def test_a_stop_is_legitimate_only_while_slurm_ends_the_job(
    state: str, preempt_time: int, legitimate: bool
) -> None:
    job = Job(
        job_id=7,
        job_state=state,
        preempt_time=preempt_time,
        user_name="root",
        comment="quorum-sunk pod/a/b/c",
    )
    refusal = model.stop_refusal(7, [job], "root")
    assert (refusal is None) == legitimate, refusal
    if refusal is not None:
        assert refusal == model.StopRefusal(
            403,
            f"job 7 is {state} in Slurm, not stopping: /hooks/stop is for a placeholder job Slurm is ending "
            "(cancelled, preempted, out of time); its pods stay",
        )
    stranger = job.model_copy(update={"user_name": "mallory"})
    assert model.stop_refusal(7, [stranger], "root") is not None, "never another user's job"
    unmarked = job.model_copy(update={"comment": "nightly batch"})
    assert model.stop_refusal(7, [unmarked], "root") is not None, "never a job without quorum's comment"


class AnswerLostApi(FakeSunkApi):
    """The apiserver binds `lose` but its answer never comes back (a timeout after the write)."""

    lose = "train-1"

    async def bind_pod(self, pod: JSON, node: str, job_id: int) -> bool:
        bound = await super().bind_pod(pod, node, job_id)
        if pod["metadata"]["name"] == self.lose:
            raise ApiException(status=504, reason="Gateway Timeout")
        return bound


async def test_a_stop_does_not_call_pods_gone_while_a_binding_to_the_job_may_have_happened() -> None:
    """The Binding of train-1 was made but its answer lost, and the scheduler's view does not
    show it yet: the stop deletes what it knows is bound and then answers that pods may still be
    there (504: the script drains the node), never "pods gone" over a pod that may be on it."""
    cluster = Cluster()
    cluster.api = AnswerLostApi()
    cluster.scheduler = SunkScheduler(QUICK, cluster.api, cluster.slurm)
    group = await cluster.submitted_gang()
    cluster.slurm.start(group, [("gpu-a", 2, 2), ("gpu-b", 2, 2)])
    with pytest.raises(ApiException, match="Gateway Timeout"):
        await cluster.reconcile()
    lost = cluster.api.pod("train-1")
    assert lost is not None and model.bound_by(lost, group), "the set-up: bound, unbeknown to it"
    cluster.slurm.stopping(group)

    assert await stop(cluster, group) == (504, "pods still there")
    assert pod_names(cluster.api) == {"train-1"}, "train-0, known bound, went; train-1 is unknown"


async def test_a_pod_whose_owner_rewrote_its_job_record_still_goes_with_the_job(cluster: Cluster) -> None:
    """The tenant edits `sunk.coreweave.com/job-id` on its bound pod (annotations are its to
    edit) to stay on the node after its job ends: the stop and the pass after the end both take
    a bound pod whose record names no live job of its key, and the node is not left to it."""
    group = await bound_gang(cluster)
    for name, record in (("train-0", "999999"), ("train-1", None)):
        found = cluster.api.pod(name)
        assert found is not None
        annotations = found["metadata"]["annotations"]
        if record is None:
            del annotations[model.JOB_ID]
        else:
            annotations[model.JOB_ID] = record
    # A scheduler that restarted since: it knows only what the pods say.
    cluster.scheduler = SunkScheduler(QUICK, cluster.api, cluster.slurm)
    cluster.api.watch(cluster.scheduler)
    cluster.api.sync(cluster.scheduler)
    cluster.slurm.stopping(group)
    assert await stop(cluster, group) == (200, "pods gone")
    assert cluster.api.pods == {}, "both deleted, each after its Event"
    assert {e[0] for e in cluster.api.events if e[1] == "SlurmJobCancelled"} == {"train-0", "train-1"}
