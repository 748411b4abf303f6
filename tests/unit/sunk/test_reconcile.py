"""One reconcile pass of the SUNK scheduler (docs/sunk.md), over stateful fakes of the
apiserver and of Slurm: a gang is submitted once and only whole, bound where Slurm allocated
it, its Gang says so by the operator's status rules, and its pods are deleted only when their
Slurm job ended, each after the Event that says why."""

from __future__ import annotations

import datetime
from typing import Any

import pytest

from quorum.core.gangs import SIGS_POD_GROUP_LABEL
from quorum.sunk import model
from quorum.sunk.scheduler import SunkScheduler
from quorum.sunk.settings import SunkSettings
from quorum.sunk.slurm import SlurmError, SlurmUnavailable
from tests.unit.sunk.fakes import FakeSlurm, FakeSunkApi

JSON = dict[str, Any]
SCHEDULER = SunkSettings().scheduler_name
CREATED = "2026-11-25T10:00:00Z"
CREATED_AT = int(datetime.datetime(2026, 11, 25, 10, tzinfo=datetime.UTC).timestamp())


def pod(name: str, group: str | None = None, created: str = CREATED, **labels: str) -> JSON:
    requests = {"cpu": "2", "memory": "4Gi", "nvidia.com/gpu": "2"}
    if group is not None:
        labels[SIGS_POD_GROUP_LABEL] = group
    return {
        "metadata": {
            "name": name,
            "namespace": "ns",
            "labels": labels,
            "annotations": {},
            "creationTimestamp": created,
        },
        "spec": {
            "schedulerName": SCHEDULER,
            "terminationGracePeriodSeconds": 5,
            "containers": [{"name": "c", "resources": {"requests": requests, "limits": requests}}],
        },
        "status": {"phase": "Pending"},
    }


def podgroup(name: str, min_member: int) -> JSON:
    return {"metadata": {"name": name, "namespace": "ns"}, "spec": {"minMember": min_member}}


ALLOWED = {"ns": model.Allowance(partitions=frozenset({"gpu"}))}  # the platform's allow-list


class Cluster:
    def __init__(self) -> None:
        self.api = FakeSunkApi()
        self.slurm = FakeSlurm()
        self.scheduler = SunkScheduler(SunkSettings(namespaces=ALLOWED), self.api, self.slurm)

    async def reconcile(self) -> model.Counts:
        self.api.sync(self.scheduler)
        counts = await self.scheduler.reconcile()
        self.scheduler.passes += 1
        return counts

    def gang(self, name: str) -> JSON:
        return self.api.gangs[("ns", name)]

    def condition(self, gang: str, kind: str) -> JSON:
        return next(c for c in self.gang(gang)["status"]["conditions"] if c["type"] == kind)

    async def submitted_gang(self, size: int = 2) -> int:
        """PodGroup `train` of `size` pods, made and submitted (one pass): its job's id."""
        self.api.add_group("scheduling.sigs.k8s.io", "v1alpha1", podgroup("train", size))
        for i in range(size):
            self.api.add_pod(pod(f"train-{i}", "train"))
        await self.reconcile()
        (group,) = self.slurm.components
        return group

    def run(self, *names: str) -> None:
        for name in names:
            found = self.api.pod(name)
            assert found is not None
            found["status"]["phase"] = "Running"


@pytest.fixture
def cluster() -> Cluster:
    return Cluster()


async def test_a_gang_is_submitted_once_and_only_when_all_its_members_exist(cluster: Cluster) -> None:
    cluster.api.add_group("scheduling.sigs.k8s.io", "v1alpha1", podgroup("train", 2))
    cluster.api.add_pod(pod("train-0", "train"))
    assert (await cluster.reconcile()).submitted == 0
    assert cluster.slurm.bodies == []
    assert ("train-0", "WaitingForGang", "waiting for the gang's members: 1 of 2 pods exist", False) in (
        cluster.api.events
    )
    admitted = cluster.condition("pg-train", "Admitted")
    assert (admitted["status"], admitted["reason"]) == ("False", "WaitingForMembers")
    assert cluster.gang("pg-train")["metadata"]["ownerReferences"][0]["name"] == "train"

    cluster.api.add_pod(pod("train-1", "train"))
    assert (await cluster.reconcile()).submitted == 1
    assert (await cluster.reconcile()).submitted == 0  # the live job is found by its comment
    (body,) = cluster.slurm.bodies
    assert body["job"]["tasks"] == 2 and body["job"]["comment"] == "quorum-sunk gang/ns/pg-train"
    status = cluster.gang("pg-train")["status"]
    assert status["phase"] == "Pending" and status["slurm"]["state"] == "PENDING"
    assert cluster.condition("pg-train", "Unschedulable")["reason"] == "SlurmResources"
    assert cluster.condition("pg-train", "Admitted")["reason"] == "SlurmResources"


async def test_a_started_job_binds_its_pods_where_slurm_allocated_them_and_admits_the_gang(
    cluster: Cluster,
) -> None:
    group = await cluster.submitted_gang()
    cluster.slurm.start(group, [("gpu-a", 2, 2), ("gpu-b", 2, 2)])

    assert (await cluster.reconcile()).bound == 2
    where = {p["metadata"]["name"]: p["spec"]["nodeName"] for p in cluster.api.pods.values()}
    assert where == {"train-0": "gpu-a", "train-1": "gpu-b"}
    assert all(model.LOCK_TOLERATION in p["spec"]["tolerations"] for p in cluster.api.pods.values())
    # The toleration goes on before the binding: a bound pod never stands on a locked node without it.
    calls = [c for c, _ in cluster.api.calls if c in ("add_toleration", "bind_pod")]
    assert calls == ["add_toleration", "bind_pod", "add_toleration", "bind_pod"]

    cluster.run("train-0", "train-1")
    await cluster.reconcile()
    status = cluster.gang("pg-train")["status"]
    assert (status["phase"], status["released"], status["bound"]) == ("Running", 2, 2)
    assert (cluster.condition("pg-train", "Admitted")["status"], status["slurm"]["nodes"]) == (
        "True",
        "gpu-a,gpu-b",
    )
    # The same conditions as every gang quorum-operator admits, so `kubectl get gangs` reads alike.
    assert [c["type"] for c in status["conditions"]][:3] == ["Admitted", "Unschedulable", "PartiallyPlaced"]


async def test_an_ended_job_deletes_its_pods_each_after_the_event_that_says_why(cluster: Cluster) -> None:
    group = await cluster.submitted_gang()
    cluster.slurm.start(group, [("gpu-a", 2, 2), ("gpu-b", 2, 2)])
    await cluster.reconcile()
    cluster.run("train-0", "train-1")
    cluster.slurm.end(group, "PREEMPTED", end_time=CREATED_AT + 600)
    cluster.slurm.components[group][0].preempt_time = CREATED_AT + 590
    cluster.api.calls.clear()

    assert (await cluster.reconcile()).deleted == 2
    assert cluster.api.pods == {}
    for name in ("train-0", "train-1"):
        told = cluster.api.calls.index(("post_event", name))
        assert cluster.api.calls.index(("delete_pod", name)) > told
        assert any(e[0] == name and e[1] == "SlurmJobPreempted" and e[3] for e in cluster.api.events)


async def test_a_pod_made_after_its_gangs_job_ended_is_not_deleted_but_submitted_anew(
    cluster: Cluster,
) -> None:
    cluster.api.add_group("scheduling.sigs.k8s.io", "v1alpha1", podgroup("train", 1))
    cluster.api.add_pod(pod("train-0", "train"))
    await cluster.reconcile()
    (group,) = cluster.slurm.components
    cluster.slurm.end(group, "CANCELLED", end_time=CREATED_AT + 60)
    cluster.api.pods.clear()
    cluster.api.add_pod(pod("train-0", "train", created="2026-11-25T10:05:00Z"))  # its Job made it again

    counts = await cluster.reconcile()
    assert (counts.deleted, counts.submitted) == (0, 1)
    assert cluster.api.pod("train-0") is not None and len(cluster.slurm.bodies) == 2


async def test_a_live_job_whose_pods_are_gone_is_cancelled(cluster: Cluster) -> None:
    cluster.api.add_pod(pod("solo"))
    await cluster.reconcile()
    (group,) = cluster.slurm.components
    cluster.api.pods.clear()
    assert (await cluster.reconcile()).cancelled == 1
    assert cluster.slurm.cancelled == [group]


async def test_slurm_unreachable_skips_the_pass_and_touches_nothing(cluster: Cluster) -> None:
    cluster.api.add_pod(pod("solo"))
    cluster.slurm.down = True
    with pytest.raises(SlurmUnavailable):
        await cluster.reconcile()
    assert cluster.api.calls == [] and cluster.slurm.bodies == []
    cluster.slurm.down = False
    assert (await cluster.reconcile()).submitted == 1


async def test_a_pod_slurm_refused_is_told_once_and_not_sent_again_until_it_changes(cluster: Cluster) -> None:
    refusal = SlurmError("slurmrestd POST /job/submit: HTTP 500: Invalid partition name specified")
    cluster.slurm.refusals.append(refusal)
    cluster.api.add_pod(pod("solo"))
    await cluster.reconcile()
    await cluster.reconcile()
    assert cluster.slurm.bodies == []
    assert [e[1] for e in cluster.api.events] == ["SlurmRejected"]
    found = cluster.api.pod("solo")
    assert found is not None
    found["metadata"]["annotations"][model.PARTITION] = "gpu"  # the tenant fixes it
    assert (await cluster.reconcile()).submitted == 1


async def test_a_gang_named_like_one_of_quorum_operators_is_not_written(cluster: Cluster) -> None:
    cluster.api.add_group("scheduling.sigs.k8s.io", "v1alpha1", podgroup("train", 1))
    cluster.api.gangs[("ns", "pg-train")] = {"metadata": {"name": "pg-train", "namespace": "ns"}, "spec": {}}
    cluster.api.add_pod(pod("train-0", "train"))
    await cluster.reconcile()
    assert "status" not in cluster.gang("pg-train")
    assert ("patch_gang_status", "pg-train") not in cluster.api.calls


async def test_one_gangs_failed_status_write_does_not_keep_the_next_from_being_written(
    cluster: Cluster,
) -> None:
    for name in ("a", "b"):
        cluster.api.add_group("scheduling.sigs.k8s.io", "v1alpha1", podgroup(name, 1))
        cluster.api.add_pod(pod(f"{name}-0", name))
    cluster.api.failing.add(("patch_gang_status", "pg-a"))
    await cluster.reconcile()
    assert "status" not in cluster.gang("pg-a") and cluster.gang("pg-b")["status"]["members"] == 1
    cluster.api.failing.clear()
    await cluster.reconcile()  # forgotten as written: written again
    assert cluster.gang("pg-a")["status"]["members"] == 1


async def test_a_label_gangs_gang_is_deleted_once_its_pods_and_job_are_gone(cluster: Cluster) -> None:
    labels = {
        "pod-group.scheduling.sigs.k8s.io/name": "mpi",
        "pod-group.scheduling.sigs.k8s.io/min-available": "1",
    }
    cluster.api.add_pod(pod("mpi-0", **labels))
    await cluster.reconcile()
    assert cluster.gang("lbl-mpi")["spec"]["source"] == {"kind": "Labels", "name": "mpi"}
    (group,) = cluster.slurm.components
    cluster.api.pods.clear()
    await cluster.reconcile()  # the job is cancelled
    assert cluster.slurm.cancelled == [group]
    await cluster.reconcile()
    assert ("ns", "lbl-mpi") not in cluster.api.gangs


async def test_a_job_another_slurm_user_gave_a_quorum_comment_is_not_taken_for_ours(cluster: Cluster) -> None:
    """Any Slurm user can `sbatch --comment="quorum-sunk gang/ns/pg-train"`: such a job neither
    keeps the gang from being submitted nor has the gang's pods bound onto it, and when it ends
    no pod is deleted for it."""
    cluster.api.add_group("scheduling.sigs.k8s.io", "v1alpha1", podgroup("train", 1))
    decoy = cluster.slurm.sbatch("mallory", "quorum-sunk gang/ns/pg-train" + model.STARTED, state="RUNNING")
    cluster.api.add_pod(pod("train-0", "train"))
    assert (await cluster.reconcile()).submitted == 1
    cluster.slurm.end(decoy, "CANCELLED", end_time=CREATED_AT + 3600)
    counts = await cluster.reconcile()
    assert (counts.deleted, counts.bound, counts.submitted) == (0, 0, 0)
    assert cluster.api.pod("train-0") is not None and cluster.slurm.cancelled == []


async def test_a_job_an_earlier_release_submitted_under_the_gangs_old_name_is_still_its_job(
    cluster: Cluster,
) -> None:
    """PodGroup `train-0badcafe` was gang `pg-train-0badcafe` in earlier releases (its name ends
    like a hashed one: quorum.core.gangs.gang_name). Its job, submitted then, is neither cancelled
    nor submitted again after the upgrade."""
    cluster.api.add_group("scheduling.sigs.k8s.io", "v1alpha1", podgroup("train-0badcafe", 2))
    for i in range(2):
        cluster.api.add_pod(pod(f"train-{i}", "train-0badcafe"))
    assert (await cluster.reconcile()).submitted == 1
    (group,) = cluster.slurm.components
    for job in cluster.slurm.components[group]:
        job.comment = "quorum-sunk gang/ns/pg-train-0badcafe"  # as the earlier release wrote it
    counts = await cluster.reconcile()
    assert (counts.cancelled, counts.submitted) == (0, 0)
    assert cluster.slurm.cancelled == [] and len(cluster.slurm.components) == 1
