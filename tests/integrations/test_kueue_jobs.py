"""Kueue-managed Jobs and JobSets in front of quorum (docs/quota.md): Kueue admits a Job or a
JobSet within its ClusterQueue's quota by unsuspending it (`spec.suspend`); the Job controller
then makes the pods, and quorum places them all or nothing by its label-only gang labels on the
pod template. Real Kueue v0.17.0 with its `batch/job` and `jobset.x-k8s.io/jobset` integrations
and `waitForPodsReady` on (a short timeout, so a gang Kueue admitted and quorum holds for room is
evicted while the test watches). The objects are written as Kueue's documentation writes them:
the label `kueue.x-k8s.io/queue-name` on the Job or JobSet."""

from __future__ import annotations

import json
import secrets
from collections.abc import Callable, Iterator
from typing import Any

import pytest
from kubernetes_asyncio import client

from devcluster.cluster import Instance
from devcluster.kueue import (
    JOB_FRAMEWORK,
    JOBSET_FRAMEWORK,
    QUEUE_LABEL,
    cluster_queue_objects,
    ensure_kueue,
    local_queue,
    start_kueue,
    stop_kueue,
)
from devcluster.nodes import TestPool
from tests.integration.test_gangs import GANGS, admitted, get, pods
from tests.integrations.helpers import KWOK_RUNS_FOR, apply, list_objects, whole_node_spec
from tests.integrations.test_jobset import JOBSETS
from tests.kube import assert_no_overcommit, eventually

pytestmark = pytest.mark.cluster
JSON = dict[str, Any]
POOL = 3  # nodes of 8 GPUs; each test's ClusterQueue has a GPU quota of all of them, 24
WORKLOADS = ("kueue.x-k8s.io", "v1beta2", "workloads")
JOBS = ("batch", "v1", "jobs")
PODS_READY_TIMEOUT = 45  # seconds; far below what docs/quota.md says to use, so the test sees it
BACKOFF_BASE = 10  # seconds before the first requeue after an eviction
WAIT_FOR_PODS_READY = {
    "timeout": f"{PODS_READY_TIMEOUT}s",
    "requeuingStrategy": {
        "timestamp": "Eviction",
        "backoffBaseSeconds": BACKOFF_BASE,
        "backoffMaxSeconds": 60,
    },
}
JOB_NAME_LABEL = "batch.kubernetes.io/job-name"
JOBSET_NAME_LABEL = "jobset.sigs.k8s.io/jobset-name"


@pytest.fixture(scope="module")
def kueue_jobs(cluster: Instance) -> Iterator[None]:
    """Kueue with its Job and JobSet integrations and waitForPodsReady."""
    quota = {"cpu": "1000", "memory": "10Ti", "nvidia.com/gpu": str(8 * POOL)}
    record = start_kueue(
        cluster,
        ensure_kueue(cluster.binaries),
        quota,
        frameworks=(JOB_FRAMEWORK, JOBSET_FRAMEWORK),
        wait_for_pods_ready=WAIT_FOR_PODS_READY,
    )
    try:
        yield
    finally:
        stop_kueue(cluster, record)


def queue_of_its_own(cluster: Instance, namespace: str) -> str:
    """A ClusterQueue with a GPU quota of 24 for this test alone (the quota of another test's
    workloads, still going with their namespace, does not count), and its LocalQueue."""
    queue = f"jobs-{secrets.token_hex(3)}"
    quota = {"cpu": "1000", "memory": "10Ti", "nvidia.com/gpu": str(8 * POOL)}
    cluster.kubectl("apply", "-f", "-", input_text=_listed(cluster_queue_objects(quota, queue)))
    apply(cluster, namespace, local_queue(namespace, queue))
    return queue


def _listed(items: list[JSON]) -> str:
    return json.dumps({"apiVersion": "v1", "kind": "List", "items": items})


def pod_template(pool: TestPool, gang: str, size: int, runs_for: str | None = None) -> JSON:
    """A pod of quorum's label-only gang `gang` of `size`, 8 GPUs, on the test pool; kwok runs it
    to completion at once, or after `runs_for` (a Go duration)."""
    metadata: JSON = {
        "labels": {
            "pod-group.scheduling.sigs.k8s.io/name": gang,
            "pod-group.scheduling.sigs.k8s.io/min-available": str(size),
        }
    }
    if runs_for is not None:
        metadata["annotations"] = {KWOK_RUNS_FOR: runs_for}
    return {"metadata": metadata, "spec": whole_node_spec(pool, restartPolicy="Never")}


def kueue_job(pool: TestPool, queue: str, name: str, size: int, runs_for: str | None = None) -> JSON:
    """An indexed Job of `size` pods in Kueue's LocalQueue `queue`, as Kueue's documentation
    writes one (created suspended; Kueue unsuspends it once admitted); its pods run for
    `runs_for` (see `pod_template`)."""
    return {
        "apiVersion": "batch/v1",
        "kind": "Job",
        "metadata": {"name": name, "labels": {QUEUE_LABEL: queue}},
        "spec": {
            "parallelism": size,
            "completions": size,
            "completionMode": "Indexed",
            "backoffLimit": 0,
            "suspend": True,
            "template": pod_template(pool, name, size, runs_for),
        },
    }


async def job(api: client.ApiClient, namespace: str, name: str) -> JSON:
    found = await get(api, JOBS, namespace, name)
    assert found is not None, f"Job {name} gone"
    return found


async def workload_of(api: client.ApiClient, namespace: str, kind: str, name: str) -> JSON | None:
    """Kueue's Workload for the `kind` named `name` (the one it owns)."""
    for wl in await list_objects(api, WORKLOADS, namespace):
        owners = wl["metadata"].get("ownerReferences") or []
        if any(o["kind"] == kind and o["name"] == name for o in owners):
            return wl
    return None


def condition(obj: JSON | None, kind: str) -> JSON:
    conditions = ((obj or {}).get("status") or {}).get("conditions") or []
    return next((c for c in conditions if c["type"] == kind), {})


def live(found: list[JSON]) -> list[JSON]:
    return [p for p in found if not p["metadata"].get("deletionTimestamp")]


async def placed_whole(
    api: client.ApiClient, namespace: str, selector: str, size: int, what: str
) -> list[JSON]:
    """The `size` pods of `selector` once all are bound, one to a node (8 GPUs each)."""

    async def probe() -> list[JSON] | None:
        found = live(await pods(api, namespace, selector))
        return found if len(found) == size and all(p["spec"].get("nodeName") for p in found) else None

    found = await eventually(probe, timeout=120, what=what)
    assert len({p["spec"]["nodeName"] for p in found}) == size, "8 GPUs a pod: one pod a node"
    return found


async def test_a_kueue_managed_job_within_quota_is_placed_whole_and_one_over_it_stays_suspended(
    cluster: Instance, kueue_jobs: None, api: client.ApiClient, namespace: str, test_pool: Callable[..., Any]
) -> None:
    """A GPU quota of 24 on a pool of 3 nodes of 8. Job a (2 pods, 16 GPUs) is admitted by
    Kueue, unsuspended, and its pods are placed whole by quorum. Job b (2 pods) is over what is
    left of the quota: its Workload is not admitted, the Job stays suspended and has no pod.
    Job a deleted, Kueue admits b and quorum places it whole. a's pods run for 10 minutes: a Job
    that finished would give its quota back before b is tried."""
    pool: TestPool = await test_pool(count=POOL)
    queue = queue_of_its_own(cluster, namespace)
    apply(cluster, namespace, kueue_job(pool, queue, "a", 2, runs_for="600s"))

    async def a_admitted() -> JSON | None:
        wl = await workload_of(api, namespace, "Job", "a")
        return wl if condition(wl, "Admitted").get("status") == "True" else None

    await eventually(a_admitted, timeout=60, what="Job a's Workload admitted by Kueue")
    await placed_whole(api, namespace, f"{JOB_NAME_LABEL}=a", 2, "Job a's 2 pods placed whole")
    assert (await job(api, namespace, "a"))["spec"]["suspend"] is False
    assert admitted(await get(api, GANGS, namespace, "lbl-a")).get("status") == "True"

    apply(cluster, namespace, kueue_job(pool, queue, "b", 2))

    async def b_pending() -> JSON | None:
        wl = await workload_of(api, namespace, "Job", "b")
        reserved = condition(wl, "QuotaReserved")
        pending = reserved.get("status") == "False" and "insufficient" in reserved.get("message", "")
        return wl if pending else None

    wl_b = await eventually(b_pending, timeout=60, what="Job b's Workload pending for quota")
    assert condition(wl_b, "Admitted").get("status") != "True", condition(wl_b, "Admitted")
    assert (await job(api, namespace, "b"))["spec"]["suspend"] is True
    assert not await pods(api, namespace, f"{JOB_NAME_LABEL}=b"), "a suspended Job has no pod"
    await assert_no_overcommit(api)

    # Quota returns: Kueue admits b, and quorum places it whole.
    await client.BatchV1Api(api).delete_namespaced_job("a", namespace, propagation_policy="Background")
    await placed_whole(api, namespace, f"{JOB_NAME_LABEL}=b", 2, "Job b admitted and placed whole")
    assert (await job(api, namespace, "b"))["spec"]["suspend"] is False
    await assert_no_overcommit(api)


async def test_a_kueue_managed_jobset_within_quota_is_placed_whole(
    cluster: Instance, kueue_jobs: None, api: client.ApiClient, namespace: str, test_pool: Callable[..., Any]
) -> None:
    """A JobSet of 2 replicated Jobs of 1 pod each, one gang of 2 across both Jobs (the label-only
    gang labels on the pod template), in Kueue's queue: Kueue admits the JobSet's Workload and
    unsuspends it, JobSet makes the Jobs, quorum places both pods together."""
    pool: TestPool = await test_pool(count=POOL)
    queue = queue_of_its_own(cluster, namespace)
    jobset = {
        "apiVersion": "jobset.x-k8s.io/v1alpha2",
        "kind": "JobSet",
        "metadata": {"name": "js", "labels": {QUEUE_LABEL: queue}},
        "spec": {
            "replicatedJobs": [
                {
                    "name": "workers",
                    "replicas": 2,
                    "template": {
                        "spec": {
                            "parallelism": 1,
                            "completions": 1,
                            "backoffLimit": 0,
                            "template": pod_template(pool, "js", 2),
                        }
                    },
                }
            ]
        },
    }
    apply(cluster, namespace, jobset)

    async def js_admitted() -> JSON | None:
        wl = await workload_of(api, namespace, "JobSet", "js")
        return wl if condition(wl, "Admitted").get("status") == "True" else None

    wl = await eventually(js_admitted, timeout=60, what="the JobSet's Workload admitted by Kueue")
    assert sum(int(ps["count"]) for ps in wl["spec"]["podSets"]) == 2, wl["spec"]["podSets"]
    placed = await placed_whole(
        api, namespace, f"{JOBSET_NAME_LABEL}=js", 2, "the JobSet's pods placed whole"
    )
    assert len({p["metadata"]["labels"][JOB_NAME_LABEL] for p in placed}) == 2, "one pod in each Job"
    assert admitted(await get(api, GANGS, namespace, "lbl-js")).get("status") == "True"
    found = await get(api, JOBSETS, namespace, "js")
    assert found is not None and not found["spec"].get("suspend"), "Kueue unsuspended the JobSet"

    async def pods_ready() -> JSON | None:  # or done already: kwok runs the pods to completion
        wl = await workload_of(api, namespace, "JobSet", "js")
        ready = condition(wl, "PodsReady").get("status") == "True"
        return wl if ready or condition(wl, "Finished").get("reason") == "Succeeded" else None

    await eventually(pods_ready, timeout=60, what="Kueue: the JobSet's pods ready in time, or it done")
    await assert_no_overcommit(api)


async def test_wait_for_pods_ready_evicts_a_job_quorum_holds_for_room_and_requeues_it_until_room_returns(
    cluster: Instance, kueue_jobs: None, api: client.ApiClient, namespace: str, test_pool: Callable[..., Any]
) -> None:
    """A pool of 3 nodes, one taken by a pod outside Kueue. Job c (3 pods, 24 GPUs) is within
    the quota: Kueue admits it, quorum holds it for room (no pod bound). After the PodsReady
    timeout Kueue evicts the Workload (Evicted, reason PodsReadyTimeout) and suspends the Job,
    whose pods the Job controller deletes; the Workload is requeued after its backoff. With
    room back, Kueue admits it again and quorum places it whole; no pod of it was bound before."""
    pool: TestPool = await test_pool(count=POOL)
    queue = queue_of_its_own(cluster, namespace)
    blocker = {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": "blocker"},
        "spec": pod_template(pool, "unused", 1)["spec"] | {"restartPolicy": "Always"},
    }
    apply(cluster, namespace, blocker)
    core = client.CoreV1Api(api)

    async def blocker_bound() -> bool:
        return bool((await core.read_namespaced_pod("blocker", namespace)).spec.node_name)

    await eventually(blocker_bound, timeout=60, what="the pod outside Kueue bound")
    selector = f"{JOB_NAME_LABEL}=c"
    seen: dict[str, str] = {}  # every pod of Job c seen, by uid: its node ("" unbound)
    history: list[tuple[str, str, str]] = []  # the Workload's conditions, in the order first seen

    async def look() -> list[JSON]:
        found = await pods(api, namespace, selector)
        for p in found:
            seen[p["metadata"]["uid"]] = p["spec"].get("nodeName") or ""
        wl = await workload_of(api, namespace, "Job", "c")
        for c in ((wl or {}).get("status") or {}).get("conditions") or []:
            if (c["type"], c["status"], c["reason"]) not in history:
                history.append((c["type"], c["status"], c["reason"]))
        return found

    apply(cluster, namespace, kueue_job(pool, queue, "c", 3))

    async def held() -> JSON | None:
        found = await look()
        gang = await get(api, GANGS, namespace, "lbl-c")
        wl = await workload_of(api, namespace, "Job", "c")
        is_held = admitted(gang).get("reason") == "Unschedulable" and len(live(found)) == 3
        return wl if is_held and condition(wl, "Admitted").get("status") == "True" else None

    await eventually(held, timeout=60, what="Job c admitted by Kueue and held by quorum for room")
    assert not any(seen.values()), f"no pod of a held gang bound: {seen}"

    async def evicted() -> JSON | None:
        await look()
        wl = await workload_of(api, namespace, "Job", "c")
        cond = condition(wl, "Evicted")
        return wl if cond.get("status") == "True" and cond.get("reason") == "PodsReadyTimeout" else None

    wl = await eventually(evicted, timeout=PODS_READY_TIMEOUT + 40, what="Kueue: Evicted, PodsReadyTimeout")
    assert not any(seen.values()), f"no pod bound while held: {seen}"
    assert "Exceeded the PodsReady timeout" in condition(wl, "Evicted")["message"]
    assert int(wl["status"]["requeueState"]["count"]) == 1, wl["status"].get("requeueState")
    first = set(seen)

    async def suspended_without_pods() -> bool:
        found = await look()
        return (await job(api, namespace, "c"))["spec"]["suspend"] is True and not found

    await eventually(suspended_without_pods, timeout=30, what="Job c suspended by Kueue, its pods deleted")
    assert not any(seen.values()), f"no pod bound while held: {seen}"

    # Room returns; after its backoff Kueue admits c again, and quorum places it whole.
    await core.delete_namespaced_pod("blocker", namespace, grace_period_seconds=0)

    async def admitted_again() -> JSON | None:
        await look()
        wl = await workload_of(api, namespace, "Job", "c")
        again = condition(wl, "Admitted").get("status") == "True"
        return wl if again and condition(wl, "Evicted").get("status") != "True" else None

    await eventually(admitted_again, timeout=BACKOFF_BASE + 60, what="Kueue: Job c requeued, admitted again")
    placed = await placed_whole(api, namespace, selector, 3, "Job c placed whole once room returned")
    await look()
    print("Workload conditions, in the order first seen:", history)
    assert ("Requeued", "True", "BackoffFinished") in history, history
    assert not any(seen[u] for u in first), f"the evicted pods never bound: {seen}"
    assert {p["metadata"]["uid"] for p in placed}.isdisjoint(first), "new pods, made after the resume"
    assert (await job(api, namespace, "c"))["spec"]["suspend"] is False

    async def pods_ready() -> JSON | None:
        # kwok runs a Job's pods to completion: the Job may finish before Kueue marks them ready.
        wl = await workload_of(api, namespace, "Job", "c")
        ready = condition(wl, "PodsReady").get("status") == "True"
        done = condition(wl, "Finished").get("reason") == "Succeeded"
        return wl if ready or done else None

    try:
        wl = await eventually(pods_ready, timeout=60, what="Kueue: Job c's pods ready, or the Job done")
    except AssertionError as err:  # say what Kueue and the Job said instead
        now = await workload_of(api, namespace, "Job", "c") or {}
        conditions = [
            (c["type"], c["status"], c["reason"]) for c in (now.get("status") or {}).get("conditions") or []
        ]
        ready = (await job(api, namespace, "c"))["status"].get("ready")
        raise AssertionError(f"{err}; Workload: {conditions}; Job status.ready: {ready}") from None
    assert condition(wl, "Evicted").get("status") != "True", condition(wl, "Evicted")
    await assert_no_overcommit(api)
