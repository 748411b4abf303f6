"""A gang's life after its release, on an instance of its own with short lifecycle settings
(backoff 3 s, starvation guard after 8 s): timeout and recovery by owner kind, elastic gangs and
churn, and a large gang under a stream of small ones."""

from __future__ import annotations

import asyncio
import secrets
import subprocess
import sys
import time
from collections.abc import AsyncIterator, Awaitable, Iterator
from typing import Any

import pytest
from kubernetes_asyncio import client

from devcluster.cluster import REPO_ROOT, Instance
from devcluster.nodes import TestPool
from tests.integration.test_gangs import GANGS, deployment, gated, get, pods
from tests.kube import (
    api_client,
    assert_no_overcommit,
    create_namespace,
    create_podgroup,
    create_pool_nodes,
    eventually,
    operator_instance,
    raw_json,
)

pytestmark = pytest.mark.cluster

BACKOFF_SECONDS = 3
STARVATION_SECONDS = 8


@pytest.fixture(scope="module")
def life() -> Iterator[Instance]:
    with operator_instance(
        "t-life", {"BACKOFF_SECONDS": str(BACKOFF_SECONDS), "STARVATION_SECONDS": str(STARVATION_SECONDS)}
    ) as instance:
        yield instance


@pytest.fixture
async def api(life: Instance) -> AsyncIterator[client.ApiClient]:
    api = await api_client(life.kubeconfig("admin"))
    async with api:
        yield api


@pytest.fixture
async def ns(api: client.ApiClient) -> AsyncIterator[str]:
    name = f"life-{secrets.token_hex(3)}"
    await create_namespace(api, name)
    yield name
    await client.CoreV1Api(api).delete_namespace(name, propagation_policy="Background")


async def make_pool(life: Instance, count: int) -> TestPool:
    pool = TestPool(f"tp-{secrets.token_hex(3)}", count)
    platform = await api_client(life.kubeconfig("platform"))
    async with platform:
        await create_pool_nodes(platform, pool)
    return pool


def condition(gang: dict[str, Any] | None, kind: str) -> dict[str, Any]:
    return next(
        (c for c in ((gang or {}).get("status") or {}).get("conditions") or [] if c["type"] == kind), {}
    )


async def gang_where(
    api: client.ApiClient, ns: str, name: str, test: Any, what: str, timeout: float = 60
) -> Any:
    async def probe() -> dict[str, Any] | None:
        gang = await get(api, GANGS, ns, name)
        return gang if gang is not None and test(gang) else None

    return await eventually(probe, timeout=timeout, what=f"gang {name}: {what}")


async def running(api: client.ApiClient, ns: str, selector: str, count: int) -> list[dict[str, Any]]:
    async def probe() -> list[dict[str, Any]] | None:
        found = [p for p in await pods(api, ns, selector) if not p["metadata"].get("deletionTimestamp")]
        ok = len(found) == count and all(p["status"].get("phase") == "Running" for p in found)
        return found if ok else None

    return await eventually(probe, timeout=60, what=f"{count} pods Running ({selector})")


async def released_then_stray(
    api: client.ApiClient, life: Instance, ns: str, gang: str, pool: TestPool, create: Awaitable[object]
) -> str:
    """With kube-scheduler stopped, create the workload (`create`), wait for quorum to release
    the gang, then put a pod that nobody planned (nodeName set, 8 GPUs) on one of the planned
    nodes and start the scheduler again: it starts from a fresh list that has the stray pod, so
    one planned pod can never bind. Returns the node taken."""
    life.stop_component("kube-scheduler")
    try:
        await create
        return await put_stray(api, ns, gang, pool)
    finally:
        await asyncio.to_thread(life.start_component, "kube-scheduler")


async def put_stray(api: client.ApiClient, ns: str, gang: str, pool: TestPool) -> str:
    admitted = await gang_where(api, ns, gang, lambda g: (g.get("status") or {}).get("admission"), "released")
    taken = admitted["status"]["admission"]["placement"][0]["node"]
    stray = {
        "metadata": {"name": "stray"},
        "spec": {
            "nodeName": taken,
            "containers": [
                {
                    "name": "c",
                    "image": "registry.k8s.io/pause:3.10",
                    "resources": {"limits": {"nvidia.com/gpu": "8"}},
                }
            ],
            "tolerations": pool.pod_spec()["tolerations"],
        },
    }
    core = client.CoreV1Api(api)
    await core.create_namespaced_pod(ns, stray)

    async def stray_running() -> bool:
        return (await core.read_namespaced_pod("stray", ns)).status.phase == "Running"

    await eventually(stray_running, timeout=30, what="the stray pod running")
    return str(taken)


async def test_a_stray_pod_on_a_planned_node_times_out_the_gang_and_its_pods_are_made_again(
    life: Instance, api: client.ApiClient, ns: str
) -> None:
    pool = await make_pool(life, 3)
    await create_podgroup(api, ns, "dep", 2, scheduleTimeoutSeconds=5)
    apps = client.AppsV1Api(api)
    create = apps.create_namespaced_deployment(ns, deployment("dep", 2, 8, pool, "dep"))
    taken = await released_then_stray(api, life, ns, "pg-dep", pool, create)
    first = {p["metadata"]["uid"] for p in await pods(api, ns, "app=dep")}

    partial = await gang_where(
        api,
        ns,
        "pg-dep",
        lambda g: condition(g, "PartiallyPlaced").get("status") == "True",
        "PartiallyPlaced",
    )
    recovery = partial["status"]["recovery"]
    assert recovery["failures"] == 1 and recovery["attempt"] == 1
    assert "1 of 2 pods bound 5s after the release" in recovery["message"]
    assert "deleted 2 pods for their controllers to make again" in recovery["message"]
    assert recovery["nextAttemptTime"] >= recovery["time"]

    again = await gang_where(
        api, ns, "pg-dep", lambda g: g["status"]["admission"]["attempt"] == 2, "admitted again", timeout=60
    )
    assert again["status"]["admission"]["time"] >= recovery["nextAttemptTime"], (
        "tried again only after the backoff"
    )
    assert not {e["uid"] for e in again["status"]["admission"]["placement"]} & first, "pods made again"
    placed = await running(api, ns, "app=dep", 2)
    assert taken not in {p["spec"]["nodeName"] for p in placed}, "the taken node is not planned again"
    planned = {e["uid"]: e["node"] for e in again["status"]["admission"]["placement"]}
    assert {p["metadata"]["uid"]: p["spec"]["nodeName"] for p in placed} == planned
    healed = await gang_where(
        api, ns, "pg-dep", lambda g: condition(g, "PartiallyPlaced").get("status") == "False", "whole again"
    )
    assert healed["status"]["recovery"]["failures"] == 0
    events = (await raw_json(client.CoreV1Api(api).list_namespaced_event(ns, _preload_content=False)))[
        "items"
    ]
    assert any(e["reason"] == "PartiallyPlaced" and e["type"] == "Warning" for e in events)
    await assert_no_overcommit(api)


def job(name: str, pool: TestPool, completions: int) -> dict[str, Any]:
    return {
        "metadata": {"name": name},
        "spec": {
            "parallelism": completions,
            "completions": completions,
            "backoffLimit": 0,
            "template": {
                "metadata": {
                    "labels": {"pod-group.scheduling.sigs.k8s.io": name},
                    "annotations": {"pod-complete.stage.kwok.x-k8s.io/delay": "600s"},
                },
                "spec": {
                    "restartPolicy": "Never",
                    "containers": [
                        {
                            "name": "c",
                            "image": "registry.k8s.io/pause:3.10",
                            "resources": {"limits": {"nvidia.com/gpu": "8"}},
                        }
                    ],
                    **pool.pod_spec(),
                },
            },
        },
    }


async def test_a_partially_placed_job_is_suspended_then_resumed_without_counting_failures(
    life: Instance, api: client.ApiClient, ns: str
) -> None:
    pool = await make_pool(life, 3)
    batch = client.BatchV1Api(api)
    await create_podgroup(api, ns, "train", 2, scheduleTimeoutSeconds=5)
    await released_then_stray(
        api, life, ns, "pg-train", pool, batch.create_namespaced_job(ns, job("train", pool, 2))
    )

    # While the Job is suspended the gang has no pod; its status says what happened (the
    # recovery record stays after the gang is whole again, the condition does not).
    recovering = await gang_where(
        api, ns, "pg-train", lambda g: (g["status"].get("recovery") or {}).get("attempt") == 1, "recovered"
    )
    assert "suspended Job train until its pods are gone" in recovering["status"]["recovery"]["message"]

    async def resumed_and_admitted() -> bool:
        gang = await get(api, GANGS, ns, "pg-train")
        return bool(gang and gang["status"]["admission"]["attempt"] == 2)

    await eventually(resumed_and_admitted, timeout=90, what="the Job resumed and its new pods admitted")
    await running(api, ns, "job-name=train", 2)
    status = (await batch.read_namespaced_job("train", ns)).status
    assert not status.failed, f"pods deleted by the suspension counted as failed: {status.failed}"
    assert not (await batch.read_namespaced_job("train", ns)).spec.suspend
    gang = await get(api, GANGS, ns, "pg-train")
    assert gang is not None and gang["status"]["recovery"]["suspendedJobs"] == []
    events = (await raw_json(client.CoreV1Api(api).list_namespaced_event(ns, _preload_content=False)))[
        "items"
    ]
    reasons = {e["reason"] for e in events if e["involvedObject"]["kind"] == "Gang"}
    assert {"PartiallyPlaced", "JobResumed"} <= reasons, reasons
    await assert_no_overcommit(api)


async def test_scale_up_beyond_min_member_replace_a_member_and_scale_down(
    life: Instance, api: client.ApiClient, ns: str
) -> None:
    pool = await make_pool(life, 2)
    apps = client.AppsV1Api(api)
    await create_podgroup(api, ns, "el", 2)
    await apps.create_namespaced_deployment(ns, deployment("el", 2, 4, pool, "el"))
    await running(api, ns, "app=el", 2)
    await assert_no_overcommit(api)

    await apps.patch_namespaced_deployment_scale("el", ns, {"spec": {"replicas": 5}})

    async def four_running_one_gated() -> list[dict[str, Any]] | None:
        found = await pods(api, ns, "app=el")
        run = [p for p in found if p["status"].get("phase") == "Running"]
        return found if len(found) == 5 and len(run) == 4 and sum(map(gated, found)) == 1 else None

    found = await eventually(four_running_one_gated, timeout=60, what="4 running, the 5th waiting for room")
    gang = await get(api, GANGS, ns, "pg-el")
    assert condition(gang, "Admitted").get("status") == "True", "an admitted gang stays admitted"
    await assert_no_overcommit(api)

    await apps.patch_namespaced_deployment_scale("el", ns, {"spec": {"replicas": 4}})
    attempt = (await get(api, GANGS, ns, "pg-el") or {})["status"]["admission"]["attempt"]
    victim = next(p for p in found if p["status"].get("phase") == "Running")
    await client.CoreV1Api(api).delete_namespaced_pod(victim["metadata"]["name"], ns)
    after = await gang_where(
        api, ns, "pg-el", lambda g: g["status"]["admission"]["attempt"] > attempt, "the replacement released"
    )
    (entry,) = after["status"]["admission"]["placement"]
    assert entry["uid"] != victim["metadata"]["uid"], "the replacement is released alone"
    survivors = await running(api, ns, "app=el", 4)
    await assert_no_overcommit(api)

    await apps.patch_namespaced_deployment_scale("el", ns, {"spec": {"replicas": 2}})

    async def two_left() -> list[dict[str, Any]] | None:
        left = [p for p in await pods(api, ns, "app=el") if not p["metadata"].get("deletionTimestamp")]
        return left if len(left) == 2 else None

    left = await eventually(two_left, timeout=30, what="scaled down to 2")
    assert {p["metadata"]["uid"] for p in left} <= {p["metadata"]["uid"] for p in survivors}
    assert all(p["status"].get("phase") == "Running" for p in left), "the rest is not disturbed"
    gang = await get(api, GANGS, ns, "pg-el")
    assert condition(gang, "Admitted").get("status") == "True"
    await assert_no_overcommit(api)


def small_job(name: str, pool: TestPool, seconds: int) -> dict[str, Any]:
    spec = job(name, pool, 1)
    template = spec["spec"]["template"]
    template["metadata"]["labels"] = {
        "pod-group.scheduling.sigs.k8s.io/name": name,
        "pod-group.scheduling.sigs.k8s.io/min-available": "1",
    }
    template["metadata"]["annotations"]["pod-complete.stage.kwok.x-k8s.io/delay"] = f"{seconds}s"
    return spec


async def test_a_large_gang_is_admitted_under_a_stream_of_small_ones(
    life: Instance, api: client.ApiClient, ns: str
) -> None:
    """4 nodes x 8 GPUs; 1-node Jobs running 2 to 6 s (staggered, so the nodes never all free at
    once) arrive so that 4 more always wait, and a 4-node gang arrives after the first ones.
    Backfill alone would hand every freed node to a small Job for as long as they come; the
    starvation guard holds the nodes for the large gang once it has waited 8 s, so it is
    admitted within 8 s + the longest small Job (6 s) + a pass or two. Asserted bound: 30 s."""
    durations, bound = (2, 3, 4, 5, 6), 30.0
    pool = await make_pool(life, 4)
    batch, apps = client.BatchV1Api(api), client.AppsV1Api(api)
    made = 0
    small_selector = "pod-group.scheduling.sigs.k8s.io/min-available=1"

    async def add_small() -> None:
        nonlocal made
        await batch.create_namespaced_job(ns, small_job(f"s{made}", pool, durations[made % len(durations)]))
        made += 1

    for _ in range(4):
        await add_small()
    await running(api, ns, small_selector, 4)
    await create_podgroup(api, ns, "large", 4)
    await apps.create_namespaced_deployment(ns, deployment("large", 4, 8, pool, "large"))
    created = (await apps.read_namespaced_deployment("large", ns)).metadata.creation_timestamp
    start = time.monotonic()
    held_seen = backfilled = False
    admitted_after = None
    while time.monotonic() - start < 90 and made < 80:
        gang = await get(api, GANGS, ns, "pg-large")
        held_seen |= condition(gang, "CapacityHeld").get("status") == "True"
        if gang and (gang.get("status") or {}).get("admission"):
            admitted_after = time.monotonic() - start
            break
        small = await pods(api, ns, small_selector)
        backfilled |= any(
            p["status"].get("phase") in ("Running", "Succeeded")
            and p["metadata"]["creationTimestamp"] > created.strftime("%Y-%m-%dT%H:%M:%SZ")
            for p in small
        )
        for _ in range(max(0, 4 - sum(1 for p in small if gated(p)))):
            await add_small()
        await asyncio.sleep(0.5)
    assert admitted_after is not None, f"the large gang starved for 90 s under {made} small Jobs"
    print(f"large gang admitted {admitted_after:.1f}s after it was created, {made} small Jobs made")
    assert admitted_after <= bound, f"admitted after {admitted_after:.1f}s, bound {bound:.0f}s"
    assert held_seen, "capacity was held for the large gang, visibly (CapacityHeld)"
    assert backfilled, "small Jobs made after the large gang ran before it (backfill competed)"
    await running(api, ns, "app=large", 4)
    await assert_no_overcommit(api)


def quorum_release(life: Instance, who: str, *args: str) -> subprocess.CompletedProcess[str]:
    argv = [sys.executable, "-m", "quorum", "release", *args, f"--kubeconfig={life.kubeconfig(who)}"]
    return subprocess.run(argv, capture_output=True, text=True, cwd=REPO_ROOT, timeout=120, check=False)


async def test_quorum_release_lets_a_gang_go_now_and_records_who_and_why(
    life: Instance, api: client.ApiClient, ns: str
) -> None:
    pool = await make_pool(life, 1)
    await create_podgroup(api, ns, "stuck", 3)  # 2 of 3 members: held
    await client.AppsV1Api(api).create_namespaced_deployment(ns, deployment("stuck", 2, 1, pool, "stuck"))
    await gang_where(
        api, ns, "pg-stuck", lambda g: condition(g, "Admitted").get("reason") == "WaitingForMembers", "held"
    )

    refused = await asyncio.to_thread(
        quorum_release, life, "customer", f"{ns}/pg-stuck", "--reason", "x", "--as", ""
    )
    assert refused.returncode == 1, refused.stdout
    assert "403" in refused.stdout and "break-glass" in refused.stdout, refused.stdout
    assert all(gated(p) for p in await pods(api, ns, "app=stuck")), "the gate protection held"

    done = await asyncio.to_thread(
        quorum_release, life, "admin", f"{ns}/pg-stuck", "--reason", "smoke test now"
    )
    assert done.returncode == 0, done.stdout + done.stderr
    assert f"{ns}/pg-stuck: 2 of 2 gated pods released by hand" in done.stdout
    await running(api, ns, "app=stuck", 2)
    gang = await get(api, GANGS, ns, "pg-stuck")
    assert gang is not None and gang["status"]["manualRelease"]["reason"] == "smoke test now"
    events = (await raw_json(client.CoreV1Api(api).list_namespaced_event(ns, _preload_content=False)))[
        "items"
    ]
    assert any(e["reason"] == "ReleasedByHand" and "smoke test now" in e["message"] for e in events)
    again = await asyncio.to_thread(quorum_release, life, "admin", f"{ns}/pg-stuck", "--reason", "again")
    assert "no gated pods (nothing to release)" in again.stdout


async def test_a_running_gangs_pod_that_lost_its_node_is_made_again_alone(
    life: Instance, api: client.ApiClient, ns: str
) -> None:
    """minMember 1 of 2: both pods are released together, one planned node is taken; the gang is
    whole without that pod, so only it is deleted and made again, onto a free node."""
    pool = await make_pool(life, 3)
    await create_podgroup(api, ns, "el", 1, scheduleTimeoutSeconds=5)
    apps = client.AppsV1Api(api)
    create = apps.create_namespaced_deployment(ns, deployment("el", 2, 8, pool, "el"))
    taken = await released_then_stray(api, life, ns, "pg-el", pool, create)
    first = {p["metadata"]["uid"]: p for p in await pods(api, ns, "app=el")}
    placed = await running(api, ns, "app=el", 2)
    assert taken not in {p["spec"]["nodeName"] for p in placed}
    survivors = [p for p in placed if p["metadata"]["uid"] in first]
    assert len(survivors) == 1, "the pod that bound was not disturbed; the stuck one was made again"
    gang = await get(api, GANGS, ns, "pg-el")
    assert condition(gang, "PartiallyPlaced").get("status") == "False", "the gang itself was never partial"
    events = (await raw_json(client.CoreV1Api(api).list_namespaced_event(ns, _preload_content=False)))[
        "items"
    ]
    assert any(e["reason"] == "StuckPodReplaced" for e in events)
    await assert_no_overcommit(api)
