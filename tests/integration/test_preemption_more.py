"""Preemption's edges, on an instance of its own (docs/preemption.md): a preempted Job keeps its
backoffLimit (quorum suspends it, resumes it once its pods are gone, and its new pods wait gated
as a gang until room returns); a gang whose PriorityClass says `preemptionPolicy: Never` takes
nothing, and neither does kube-scheduler's native (workload-aware) preemption for it: its pods
are gated, so they never reach the scheduler."""

from __future__ import annotations

import secrets
from collections.abc import AsyncIterator, Iterator
from typing import Any

import pytest
from kubernetes_asyncio import client

from devcluster.cluster import REPO_ROOT, Instance
from devcluster.nodes import TestPool
from tests.integration.test_gang_lifecycle import job
from tests.integration.test_gangs import GANGS, deployment, gated, get, pods
from tests.integration.test_preemption import HIGH, LOW, apply_gang, make_pool
from tests.kube import (
    WorkloadApi,
    api_client,
    assert_no_overcommit,
    create_namespace,
    create_podgroup,
    eventually,
    operator_instance,
)

pytestmark = pytest.mark.cluster


JOB = "job-name=train"
NEVER = "quorum-test-high-never"


async def live(api: client.ApiClient, ns: str, selector: str) -> list[dict[str, Any]]:
    return [p for p in await pods(api, ns, selector) if not p["metadata"].get("deletionTimestamp")]


async def running(api: client.ApiClient, ns: str, selector: str, count: int) -> list[dict[str, Any]]:
    async def probe() -> list[dict[str, Any]] | None:
        found = await live(api, ns, selector)
        ok = len(found) == count and all(p["status"].get("phase") == "Running" for p in found)
        return found if ok else None

    return await eventually(probe, timeout=90, what=f"{count} pods Running ({selector})")


@pytest.fixture(scope="module")
def preempting() -> Iterator[Instance]:
    with operator_instance("t-preempt-more", {"PREEMPTION_RETRY_SECONDS": "2"}) as instance:
        yield instance


@pytest.fixture
async def api(preempting: Instance) -> AsyncIterator[client.ApiClient]:
    api = await api_client(preempting.kubeconfig("admin"))
    async with api:
        for name, value, policy in ((HIGH, 1000, None), (LOW, 10, None), (NEVER, 1000, "Never")):
            body = {"apiVersion": "scheduling.k8s.io/v1", "kind": "PriorityClass", "metadata": {"name": name}}
            if policy:
                body["preemptionPolicy"] = policy
            try:
                await client.SchedulingV1Api(api).create_priority_class({**body, "value": value})
            except client.ApiException as err:
                if err.status != 409:
                    raise
        yield api


@pytest.fixture
async def ns(api: client.ApiClient) -> AsyncIterator[str]:
    name = f"prej-{secrets.token_hex(3)}"
    await create_namespace(api, name)
    yield name
    await client.CoreV1Api(api).delete_namespace(name, propagation_policy="Background")


async def test_a_preempted_job_is_suspended_and_resumed_and_loses_none_of_its_backoff_limit(
    preempting: Instance, api: client.ApiClient, ns: str
) -> None:
    pool = await make_pool(preempting, 2)
    batch = client.BatchV1Api(api)
    body: dict[str, Any] = job("train", pool, 2)  # backoffLimit 0: one counted failure fails it
    body["spec"]["template"]["spec"]["priorityClassName"] = LOW
    await create_podgroup(api, ns, "train", 2)
    await batch.create_namespaced_job(ns, body)
    first = {p["metadata"]["uid"] for p in await running(api, ns, JOB, 2)}

    await apply_gang(api, ns, "urgent", 2, pool, HIGH)
    await running(api, ns, "app=urgent", 2)

    async def told() -> dict[str, Any] | None:
        gang = await get(api, GANGS, ns, "pg-train")
        status = (gang or {}).get("status") or {}
        return gang if (status.get("preempted") or {}).get("by") == f"{ns}/pg-urgent" else None

    await eventually(told, timeout=30, what="the Job's gang recorded as preempted")

    async def resumed() -> bool:
        current = await batch.read_namespaced_job("train", ns)
        return not current.spec.suspend and bool(await live(api, ns, JOB))

    await eventually(resumed, timeout=90, what="the Job resumed once its old pods were gone")

    async def gated_again() -> list[dict[str, Any]] | None:
        found = await live(api, ns, JOB)
        return found if len(found) == 2 and all(gated(p) for p in found) else None

    new = await eventually(gated_again, timeout=60, what="the Job's new pods, held as a gang")
    assert not {p["metadata"]["uid"] for p in new} & first
    status = (await batch.read_namespaced_job("train", ns)).status
    assert not status.failed, f"pods taken by the preemption counted as failed: {status.failed}"
    assert not [p for p in await live(api, ns, JOB) if p["spec"].get("nodeName")], "none of it runs"
    await assert_no_overcommit(api)

    await client.AppsV1Api(api).delete_namespaced_deployment("urgent", ns)
    await running(api, ns, JOB, 2)
    status = (await batch.read_namespaced_job("train", ns)).status
    failed = [c for c in status.conditions or [] if c.type == "Failed" and c.status == "True"]
    assert not status.failed and not failed, status
    await assert_no_overcommit(api)


async def test_preemption_policy_never_takes_nothing_and_the_native_plugin_sees_no_gated_pod(
    preempting: Instance, api: client.ApiClient, ns: str
) -> None:
    pool = await make_pool(preempting, 1)
    await apply_gang(api, ns, "low", 1, pool, LOW)
    (low,) = await running(api, ns, "app=low", 1)
    await apply_gang(api, ns, "polite", 1, pool, NEVER)

    async def decided() -> dict[str, Any] | None:
        gang = await get(api, GANGS, ns, "pg-polite")
        conditions = ((gang or {}).get("status") or {}).get("conditions") or []
        found = next((c for c in conditions if c["type"] == "Unschedulable" and c["status"] == "True"), None)
        return found if found and "preemptionPolicy: Never" in found["message"] else None

    await eventually(decided, timeout=60, what="quorum's decision not to preempt for pg-polite")
    (still,) = await running(api, ns, "app=low", 1)
    assert still["metadata"]["uid"] == low["metadata"]["uid"], "the low-priority pod kept running"
    (polite,) = await live(api, ns, "app=polite")
    assert gated(polite) and not polite["spec"].get("nodeName"), "gated: kube-scheduler never saw it"
    assert not polite.get("status", {}).get("nominatedNodeName"), "no native preemption was nominated"
    events = await client.CoreV1Api(api).list_namespaced_event(ns)
    assert not [e for e in events.items if e.reason in ("Preempted", "Preempting")], "nothing taken"
    await assert_no_overcommit(api)


async def unschedulable_says(api: client.ApiClient, ns: str, gang: str, text: str) -> dict[str, Any]:
    async def probe() -> dict[str, Any] | None:
        found = await get(api, GANGS, ns, gang)
        conditions = ((found or {}).get("status") or {}).get("conditions") or []
        held = next((c for c in conditions if c["type"] == "Unschedulable" and c["status"] == "True"), None)
        return held if held and text in held["message"] else None

    return await eventually(probe, timeout=60, what=f"{gang}'s Unschedulable message to say {text!r}")


async def test_of_two_possible_victims_the_interruptable_one_is_taken(
    preempting: Instance, api: client.ApiClient, ns: str
) -> None:
    pool = await make_pool(preempting, 2)
    await apply_gang(api, ns, "steady", 1, pool, LOW)
    (steady,) = await running(api, ns, "app=steady", 1)
    soft = {"qos.coreweave.cloud/interruptable": "true"}
    await apply_gang(api, ns, "spot", 1, pool, LOW, labels=soft)
    await running(api, ns, "app=spot", 1)
    await apply_gang(api, ns, "urgent", 1, pool, HIGH)
    await running(api, ns, "app=urgent", 1)
    (still,) = await running(api, ns, "app=steady", 1)
    assert still["metadata"]["uid"] == steady["metadata"]["uid"], "the non-interruptable gang kept running"

    async def spot_back_gated() -> list[dict[str, Any]] | None:
        found = await live(api, ns, "app=spot")
        return found if len(found) == 1 and gated(found[0]) else None

    await eventually(spot_back_gated, timeout=60, what="the interruptable gang back and gated")
    await assert_no_overcommit(api)


async def test_equal_priority_and_not_interruptable_takes_nothing(
    preempting: Instance, api: client.ApiClient, ns: str
) -> None:
    pool = await make_pool(preempting, 1)
    await apply_gang(api, ns, "first", 1, pool, LOW)
    (first,) = await running(api, ns, "app=first", 1)
    await apply_gang(api, ns, "second", 1, pool, LOW)
    await unschedulable_says(api, ns, "pg-second", "no preemption (NothingToPreempt)")
    (still,) = await running(api, ns, "app=first", 1)
    assert still["metadata"]["uid"] == first["metadata"]["uid"]
    await assert_no_overcommit(api)


async def test_a_disruption_budget_is_kept_where_another_victim_will_do(
    preempting: Instance, api: client.ApiClient, ns: str
) -> None:
    """Two low-priority gangs, one node each; the younger (the first choice otherwise) is guarded
    by a budget that allows nothing, so the older is taken. (A budget that leaves no other way
    does not veto: tests/integration/test_tenants.py.)"""
    pool = await make_pool(preempting, 2)
    await apply_gang(api, ns, "older", 1, pool, LOW)
    await running(api, ns, "app=older", 1)
    await apply_gang(api, ns, "guarded", 1, pool, LOW)
    (guarded,) = await running(api, ns, "app=guarded", 1)
    pdb = {
        "apiVersion": "policy/v1",
        "kind": "PodDisruptionBudget",
        "metadata": {"name": "keep-guarded"},
        "spec": {"minAvailable": 1, "selector": {"matchLabels": {"app": "guarded"}}},
    }
    policy = client.PolicyV1Api(api)
    await policy.create_namespaced_pod_disruption_budget(ns, pdb)

    async def counted() -> bool:
        status = (await policy.read_namespaced_pod_disruption_budget("keep-guarded", ns)).status
        return bool(status and status.observed_generation and status.current_healthy == 1)

    await eventually(counted, timeout=60, what="the budget counting its one healthy pod")
    await apply_gang(api, ns, "urgent", 1, pool, HIGH)
    await running(api, ns, "app=urgent", 1)
    (still,) = await running(api, ns, "app=guarded", 1)
    assert still["metadata"]["uid"] == guarded["metadata"]["uid"]
    preempted = await get(api, GANGS, ns, "pg-older")
    assert preempted is not None
    assert preempted["status"]["preempted"]["by"] == f"{ns}/pg-urgent", preempted["status"]
    await assert_no_overcommit(api)


async def test_ordinary_pods_flooding_the_pool_do_not_take_the_room_freed_for_the_preemptor(
    preempting: Instance, api: client.ApiClient, ns: str
) -> None:
    pool = await make_pool(preempting, 2)
    await apply_gang(api, ns, "low", 2, pool, LOW)
    await running(api, ns, "app=low", 2)
    flood = deployment("flood", 6, 8, pool, None)  # no gang: the default scheduler's pods
    flood["spec"]["template"]["spec"].update(schedulerName="default-scheduler", priorityClassName=LOW)
    await client.AppsV1Api(api).create_namespaced_deployment(ns, flood)
    await apply_gang(api, ns, "urgent", 2, pool, HIGH)
    urgent = await running(api, ns, "app=urgent", 2)
    assert sorted(p["spec"]["nodeName"] for p in urgent) == sorted(pool.names)
    bound = [p for p in await live(api, ns, "app=flood") if p["spec"].get("nodeName")]
    assert not bound, f"ordinary pods took reserved room: {[p['spec']['nodeName'] for p in bound]}"
    await assert_no_overcommit(api)


async def test_seed_004_preemption_example_as_written_takes_room_from_low_priority_work(
    preempting: Instance, api: client.ApiClient, ns: str
) -> None:
    """The example, unchanged, in a cluster whose GPUs are all taken by low-priority pods."""
    gpu_nodes = [
        n
        for n in (await client.CoreV1Api(api).list_node(label_selector="gpu.nvidia.com/class")).items
        if not n.spec.unschedulable
        and (n.metadata.labels or {}).get("node.coreweave.cloud/state") == "production"
        and not any(t.effect == "NoSchedule" for t in n.spec.taints or [])
    ]
    filler = deployment("filler", len(gpu_nodes), 8, None, None)
    filler["spec"]["template"]["spec"].update(schedulerName="default-scheduler", priorityClassName=LOW)
    await client.AppsV1Api(api).create_namespaced_deployment(ns, filler)
    before = {p["metadata"]["uid"] for p in await running(api, ns, "app=filler", len(gpu_nodes))}
    example = (REPO_ROOT / "examples/seed-004-workload-aware/preemption.yaml").read_text()
    applied = preempting.kubectl("-n", ns, "apply", "-f", "-", input_text=example)
    assert applied.returncode == 0, applied.stderr
    await running(api, ns, "job-name=urgent", 2)
    after = {p["metadata"]["uid"] for p in await live(api, ns, "app=filler")}
    taken = before - after
    assert len(taken) == 1, f"one low-priority pod (8 GPUs) frees room for 2 × 1 GPU: {len(taken)} taken"
    await assert_no_overcommit(api)


def elastic_objects(pool: TestPool, was: WorkloadApi) -> list[tuple[str, dict[str, Any]]]:
    """A Workload and PodGroup of two 8-GPU low-priority pods, `disruptionMode: Pod` (1.37:
    `{single: {}}`)."""
    policy = {"gang": {"minCount": 2}}
    template = {
        "name": "workers",
        "schedulingPolicy": policy,
        "disruptionMode": "Pod",
        "priorityClassName": LOW,
    }
    container = {
        "name": "c",
        "image": "registry.k8s.io/pause:3.10",
        "resources": {"limits": {"nvidia.com/gpu": "8"}},
    }
    pod_spec = {
        "schedulingGroup": {"podGroupName": "elastic-workers"},
        "priorityClassName": LOW,
        "containers": [container],
        **pool.pod_spec(),
    }
    return [
        ("workloads", was.workload("elastic", [template])),
        (
            "podgroups",
            was.podgroup(
                "elastic-workers", policy, ("elastic", "workers"), disruptionMode="Pod", priorityClassName=LOW
            ),
        ),
        *[
            ("pods", {"metadata": {"name": f"elastic-{i}", "labels": {"app": "elastic"}}, "spec": pod_spec})
            for i in range(2)
        ],
    ]


async def test_a_podgroup_with_disruption_mode_pod_gives_up_only_the_pods_needed(
    preempting: Instance, api: client.ApiClient, ns: str
) -> None:
    """`disruptionMode: Pod` (1.37: `{single: {}}`): its owner lets its pods go one by one, so a
    preemptor needing one node takes one of its pods, not the whole gang."""
    pool = await make_pool(preempting, 2)
    core = client.CoreV1Api(api)
    was = await WorkloadApi.of(api)
    for plural, body in elastic_objects(pool, was):
        if plural == "pods":
            await core.create_namespaced_pod(ns, body)
        else:
            await was.create(api, ns, plural, body)
    before = {p["metadata"]["name"]: p["metadata"]["uid"] for p in await running(api, ns, "app=elastic", 2)}

    await apply_gang(api, ns, "urgent", 1, pool, HIGH)  # one node's worth: 8 GPUs
    (urgent,) = await running(api, ns, "app=urgent", 1)
    left = await live(api, ns, "app=elastic")
    assert len(left) == 1, f"one pod taken, not the gang: {[p['metadata']['name'] for p in left]}"
    (kept,) = left
    assert kept["metadata"]["uid"] == before[kept["metadata"]["name"]], "the other pod was not touched"
    assert kept["status"]["phase"] == "Running" and kept["spec"]["nodeName"] != urgent["spec"]["nodeName"]
    events = (await core.list_namespaced_event(ns)).items
    preempted = {e.involved_object.name for e in events if e.reason == "Preempted"}
    assert preempted and kept["metadata"]["name"] not in preempted, preempted
    await assert_no_overcommit(api)


async def test_a_podgroup_with_preemption_policy_never_takes_nothing(
    preempting: Instance, api: client.ApiClient, ns: str
) -> None:
    """Kubernetes 1.37's PodGroup `preemptionPolicy: Never` (its pods' PriorityClass says the
    same: 1.37's kube-scheduler wants the group's priority and policy on its pods): quorum says
    so and takes nothing."""
    was = await WorkloadApi.of(api)
    if was.legacy:
        pytest.skip("PodGroup preemptionPolicy is Kubernetes 1.37's (this plane runs 1.36)")
    pool = await make_pool(preempting, 1)
    await apply_gang(api, ns, "low", 1, pool, LOW)
    (low,) = await running(api, ns, "app=low", 1)
    group = was.podgroup(
        "polite", {"gang": {"minCount": 1}}, preemptionPolicy="Never", priorityClassName=NEVER
    )
    await was.create(api, ns, "podgroups", group)
    container = {
        "name": "c",
        "image": "registry.k8s.io/pause:3.10",
        "resources": {"limits": {"nvidia.com/gpu": "8"}},
    }
    spec = {
        "schedulingGroup": {"podGroupName": "polite"},
        "priorityClassName": NEVER,
        "containers": [container],
    }
    body = {
        "metadata": {"name": "polite-0", "labels": {"app": "polite"}},
        "spec": {**spec, **pool.pod_spec()},
    }
    await client.CoreV1Api(api).create_namespaced_pod(ns, body)
    held = await unschedulable_says(api, ns, "wpg-polite", "its PodGroup has preemptionPolicy: Never")
    assert held["status"] == "True"
    (still,) = await running(api, ns, "app=low", 1)
    assert still["metadata"]["uid"] == low["metadata"]["uid"], "the low-priority pod kept running"
    events = await client.CoreV1Api(api).list_namespaced_event(ns)
    assert not [e for e in events.items if e.reason in ("Preempted", "Preempting")], "nothing taken"
