"""Kubernetes Workload Aware Scheduling on the real control plane (the scheduler's own gang
plugin on, as in the default instance): a Workload's PodGroup held until minCount pods exist and
fit, then released together; quorum's conditions beside the scheduler's. The same assertions on
1.37 (v1beta1) and, in `make test`'s second run, on 1.36 (v1alpha2)."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import pytest
from kubernetes_asyncio import client

from devcluster.cluster import Instance
from devcluster.nodes import TestPool
from tests.integration.test_gangs import GANGS, admitted, assert_as_planned, gated, get, pods
from tests.integration.test_instances import WITHOUT_GANG_SCHEDULING
from tests.integration.test_topology import RACK
from tests.kube import WorkloadApi, api_client, assert_no_overcommit, create_namespace, eventually

pytestmark = [pytest.mark.cluster, pytest.mark.kubernetes_1_36]


class NoPool:
    """Pods that may go to any production node of an instance of their own."""

    @staticmethod
    def pod_spec() -> dict[str, Any]:
        return {}


NO_POOL: Any = NoPool()


async def gang_reason(api: client.ApiClient, namespace: str, name: str, reason: str) -> bool:
    return admitted(await get(api, GANGS, namespace, name)).get("reason") == reason


def member(name: str, group: str, pool: TestPool, gpus: int) -> dict[str, Any]:
    return {
        "metadata": {"name": name, "labels": {"app": group}},
        "spec": {
            "schedulingGroup": {"podGroupName": group},
            "containers": [
                {
                    "name": "c",
                    "image": "registry.k8s.io/pause:3.10",
                    "resources": {"limits": {"nvidia.com/gpu": str(gpus)}} if gpus else {},
                }
            ],
            **pool.pod_spec(),
        },
    }


async def test_a_workload_podgroup_of_min_count_4_is_held_then_released_together(
    customer_api: client.ApiClient, api: client.ApiClient, namespace: str, test_pool: Callable[..., Any]
) -> None:
    pool: TestPool = await test_pool(count=4)
    was = await WorkloadApi.of(api)
    gang = {"gang": {"minCount": 4}}
    await was.create(
        customer_api,
        namespace,
        "workloads",
        was.workload("train", [{"name": "workers", "schedulingPolicy": gang}]),
    )
    await was.create(
        customer_api, namespace, "podgroups", was.podgroup("train-workers", gang, ("train", "workers"))
    )
    core = client.CoreV1Api(customer_api)
    for i in range(3):
        await core.create_namespaced_pod(namespace, member(f"w{i}", "train-workers", pool, 8))

    async def three_of_four() -> dict[str, Any] | None:
        gang = await get(api, GANGS, namespace, "wpg-train-workers")
        return gang if admitted(gang).get("message") == "3 of 4 members exist (minMember 4)" else None

    held = await eventually(three_of_four, timeout=30, what="3 of 4 members held")
    assert admitted(held)["reason"] == "WaitingForMembers"
    assert all(gated(p) and not p["spec"].get("nodeName") for p in await pods(api, namespace))

    await core.create_namespaced_pod(namespace, member("w3", "train-workers", pool, 8))

    async def all_bound() -> list[dict[str, Any]] | None:
        found = await pods(api, namespace)
        return found if len(found) == 4 and all(p["spec"].get("nodeName") for p in found) else None

    await eventually(all_bound, timeout=60, what="the 4 workers bound")
    gang_obj = await get(api, GANGS, namespace, "wpg-train-workers")
    assert gang_obj is not None and gang_obj["status"]["admission"]["attempt"] == 1
    assert len(gang_obj["status"]["admission"]["placement"]) == 4, "one decision for the whole gang"
    await assert_as_planned(api, namespace, "wpg-train-workers")

    async def both_conditions() -> dict[str, Any] | None:
        group = await was.get(api, namespace, "podgroups", "train-workers")
        types = {c["type"]: c for c in (group.get("status") or {}).get("conditions") or []}
        ours = types.get("QuorumAdmitted", {}).get("status") == "True"
        return types if ours and was.scheduled_condition in types else None

    types = await eventually(
        both_conditions, timeout=30, what=f"QuorumAdmitted beside {was.scheduled_condition}"
    )
    assert types[was.scheduled_condition]["status"] == "True", "the scheduler's condition is kept"
    await assert_no_overcommit(api)


async def test_basic_policy_pods_go_at_once_and_a_late_podgroup_frees_its_waiting_pods(
    customer_api: client.ApiClient, api: client.ApiClient, namespace: str, test_pool: Callable[..., Any]
) -> None:
    """A Workload with two templates: one driver with `basic`, workers with `gang minCount 4`.
    The workers' PodGroup is created after its pods: they wait, told which PodGroup, then go."""
    pool: TestPool = await test_pool(count=4)
    was = await WorkloadApi.of(api)
    workers = {"gang": {"minCount": 4}}
    templates = [
        {"name": "driver", "schedulingPolicy": {"basic": {}}},
        {"name": "workers", "schedulingPolicy": workers},
    ]
    await was.create(customer_api, namespace, "workloads", was.workload("job", templates))
    await was.create(
        customer_api, namespace, "podgroups", was.podgroup("job-driver", {"basic": {}}, ("job", "driver"))
    )
    core = client.CoreV1Api(customer_api)
    await core.create_namespaced_pod(namespace, member("driver", "job-driver", pool, 0))
    for i in range(4):
        await core.create_namespaced_pod(namespace, member(f"w{i}", "job-workers", pool, 8))

    async def driver_bound() -> bool:
        return bool((await core.read_namespaced_pod("driver", namespace)).spec.node_name)

    await eventually(driver_bound, timeout=30, what="the basic-policy driver released at once")

    async def told_which_group() -> bool:
        events = (await core.list_namespaced_event(namespace)).items
        waiting = [e for e in events if e.reason == "WaitingForGroup" and e.involved_object.name == "w0"]
        return bool(waiting) and "PodGroup job-workers (scheduling.k8s.io)" in waiting[0].message

    await eventually(told_which_group, timeout=30, what="an Event naming the missing PodGroup")
    assert all(gated(p) for p in await pods(api, namespace, "app=job-workers"))

    await was.create(
        customer_api, namespace, "podgroups", was.podgroup("job-workers", workers, ("job", "workers"))
    )

    async def workers_bound() -> bool:
        found = await pods(api, namespace, "app=job-workers")
        return len(found) == 4 and all(p["spec"].get("nodeName") for p in found)

    await eventually(workers_bound, timeout=60, what="the workers released once their PodGroup exists")
    await assert_as_planned(api, namespace, "wpg-job-workers")


async def test_a_workload_topology_constraint_puts_the_gang_in_one_rack(
    cluster: Instance,
    customer_api: client.ApiClient,
    api: client.ApiClient,
    namespace: str,
    test_pool: Callable[..., Any],
) -> None:
    pool: TestPool = await test_pool(count=10, racks={"r2": 4, "r1": 6})
    was = await WorkloadApi.of(api)
    policy = {"gang": {"minCount": 4}}
    constraints = {"topology": [{"key": RACK}]}
    template = {"name": "workers", "schedulingPolicy": policy, "schedulingConstraints": constraints}
    await was.create(customer_api, namespace, "workloads", was.workload("ring", [template]))
    group = was.podgroup("ring-workers", policy, ("ring", "workers"), schedulingConstraints=constraints)
    await was.create(customer_api, namespace, "podgroups", group)
    stored = await was.get(api, namespace, "podgroups", "ring-workers")
    assert stored["spec"].get("schedulingConstraints") == constraints, (
        "TopologyAwareWorkloadScheduling keeps it"
    )
    core = client.CoreV1Api(customer_api)
    for i in range(4):
        await core.create_namespaced_pod(namespace, member(f"w{i}", "ring-workers", pool, 8))

    async def all_bound() -> list[dict[str, Any]] | None:
        found = await pods(api, namespace)
        return found if len(found) == 4 and all(p["spec"].get("nodeName") for p in found) else None

    bound = await eventually(all_bound, timeout=60, what="the ring bound")
    labels = {(await core.read_node(p["spec"]["nodeName"])).metadata.labels[RACK] for p in bound}
    assert labels == {f"{pool.name}-r2"}, "the 4-node rack: least waste"
    await assert_as_planned(api, namespace, "wpg-ring-workers")


async def test_without_the_schedulers_gang_plugin_quorum_still_releases_whole_gangs(
    start_instance: Callable[..., Instance],
) -> None:
    """kube-scheduler with a profile that disables GangScheduling: quorum alone keeps the gang
    whole — nothing binds while 2 of 3 members exist, then all 3 bind to their planned nodes."""
    instance = start_instance("t-nogang-q", scheduler_profiles=WITHOUT_GANG_SCHEDULING)
    admin = await api_client(instance.kubeconfig("admin"))
    async with admin:
        await create_namespace(admin, "ng")
        was = await WorkloadApi.of(admin)
        await was.create(admin, "ng", "podgroups", was.podgroup("trio", {"gang": {"minCount": 3}}))
        core = client.CoreV1Api(admin)
        pool = NO_POOL
        for i in range(2):
            await core.create_namespaced_pod("ng", member(f"p{i}", "trio", pool, 1))
        await eventually(
            lambda: gang_reason(admin, "ng", "wpg-trio", "WaitingForMembers"), timeout=30, what="2 of 3 held"
        )
        assert not any(p["spec"].get("nodeName") for p in await pods(admin, "ng")), "nothing binds early"
        await core.create_namespaced_pod("ng", member("p2", "trio", pool, 1))

        async def all_bound() -> bool:
            found = await pods(admin, "ng")
            return len(found) == 3 and all(p["spec"].get("nodeName") for p in found)

        await eventually(all_bound, timeout=60, what="the trio bound")
        await assert_as_planned(admin, "ng", "wpg-trio")


@pytest.mark.parametrize("example", ["gang", "topology", "preemption"])
async def test_the_seed_004_examples_run(
    cluster: Instance, api: client.ApiClient, namespace: str, example: str
) -> None:
    """examples/seed-004-workload-aware/*.yaml exactly (1.36: its kubernetes-1.36/), applied by a
    customer with kubectl."""
    was = await WorkloadApi.of(api)
    manifest = (was.examples / f"{example}.yaml").read_text()
    applied = cluster.kubectl("-n", namespace, "apply", "-f", "-", who="customer", input_text=manifest)
    assert applied.returncode == 0, applied.stderr
    size = {"gang": 4, "topology": 4, "preemption": 2}[example]

    async def all_running() -> list[dict[str, Any]] | None:
        found = await pods(api, namespace)
        ok = len(found) == size and all(p["status"].get("phase") == "Running" for p in found)
        return found if ok else None

    running = await eventually(all_running, timeout=60, what=f"the {example} example running")
    group = {"gang": "trainer-workers", "topology": "ring-workers", "preemption": "urgent-workers"}[example]
    await assert_as_planned(api, namespace, f"wpg-{group}")
    if example == "topology":
        core = client.CoreV1Api(api)
        found = {(await core.read_node(p["spec"]["nodeName"])).metadata.labels[RACK] for p in running}
        assert len(found) == 1, f"one rack, not {found}"
    if example == "preemption":
        gang = await get(api, GANGS, namespace, f"wpg-{group}")
        assert gang is not None and all(p["spec"]["priority"] == 100000 for p in running)
