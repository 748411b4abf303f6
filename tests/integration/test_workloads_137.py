"""What Kubernetes 1.37 adds to Workload Aware Scheduling, on the real control plane: composite
gangs (a CompositePodGroup's minGroupCount all-or-nothing, nested composites at each level), a
PodGroup's minCount changed live, and Jobs with `spec.scheduling` (the Job controller makes the
Workload and PodGroup)."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import pytest
from kubernetes_asyncio import client

from devcluster.nodes import TestPool
from quorum.core.gangs import GangSource, gang_name
from tests.integration.test_gangs import GANGS, admitted, assert_as_planned, gated, get, pods
from tests.integration.test_workloads import member
from tests.kube import WorkloadApi, assert_no_overcommit, eventually

pytestmark = pytest.mark.cluster


@pytest.fixture
async def was(api: client.ApiClient) -> WorkloadApi:
    found = await WorkloadApi.of(api)
    if found.legacy:
        pytest.skip("Kubernetes 1.37's API (this plane runs 1.36)")
    return found


def condition(gang: dict[str, Any] | None, kind: str) -> dict[str, Any]:
    return next(
        (c for c in ((gang or {}).get("status") or {}).get("conditions") or [] if c["type"] == kind), {}
    )


async def block_one_node(core: client.CoreV1Api, namespace: str, pool: TestPool) -> None:
    """An ordinary 8-GPU pod named `blocker`, bound: it holds one node of the pool."""
    blocker = member("blocker", "none", pool, 8)
    del blocker["spec"]["schedulingGroup"]
    await core.create_namespaced_pod(namespace, blocker)

    async def blocker_bound() -> bool:
        return bool((await core.read_namespaced_pod("blocker", namespace)).spec.node_name)

    await eventually(blocker_bound, timeout=30, what="the blocker bound")


async def gang_members(api: client.ApiClient, namespace: str) -> list[dict[str, Any]]:
    return [p for p in await pods(api, namespace) if p["metadata"]["name"] != "blocker"]


async def none_released(api: client.ApiClient, namespace: str, count: int, why: str) -> None:
    members = await gang_members(api, namespace)
    assert len(members) == count and all(gated(p) and not p["spec"].get("nodeName") for p in members), why


async def all_bound_on_their_own_nodes(api: client.ApiClient, namespace: str, count: int, what: str) -> None:
    """The `count` gang pods all bound (within 60 s), each on a node of its own."""

    async def all_bound() -> list[dict[str, Any]] | None:
        found = await gang_members(api, namespace)
        return found if len(found) == count and all(p["spec"].get("nodeName") for p in found) else None

    bound = await eventually(all_bound, timeout=60, what=what)
    assert len({p["spec"]["nodeName"] for p in bound}) == count


async def test_a_composite_whose_gangs_each_fit_alone_but_not_together_releases_none_until_room_appears(
    api: client.ApiClient,
    customer_api: client.ApiClient,
    namespace: str,
    test_pool: Callable[..., Any],
    was: WorkloadApi,
) -> None:
    """A launcher (1 x 8 GPUs) and workers (2 x 8 GPUs) under a CompositePodGroup of
    minGroupCount 2, in a pool with two free 8-GPU nodes: each gang would fit alone, both
    together would not, so neither is released; once a third node frees, both go at once."""
    pool: TestPool = await test_pool(count=3)
    core = client.CoreV1Api(customer_api)
    await block_one_node(core, namespace, pool)
    templates = [
        {
            "name": "cluster",
            "schedulingPolicy": {"gang": {"minGroupCount": 2}},
            "podGroupTemplates": [
                {"name": "launcher", "schedulingPolicy": {"gang": {"minCount": 1}}},
                {"name": "workers", "schedulingPolicy": {"gang": {"minCount": 2}}},
            ],
        }
    ]
    workload = was.workload("trainer", [])
    workload["spec"] = {"compositePodGroupTemplates": templates}
    await was.create(customer_api, namespace, "workloads", workload)
    composite = {
        "apiVersion": "scheduling.k8s.io/v1alpha3",
        "kind": "CompositePodGroup",
        "metadata": {"name": "trainer-cluster"},
        "spec": {
            "workloadRef": {"workloadName": "trainer", "templateName": "cluster"},
            "schedulingPolicy": {"gang": {"minGroupCount": 2}},
        },
    }
    await client.CustomObjectsApi(customer_api).create_namespaced_custom_object(
        "scheduling.k8s.io", "v1alpha3", namespace, "compositepodgroups", composite
    )
    for name, count in (("launcher", 1), ("workers", 2)):
        group = was.podgroup(
            f"trainer-{name}",
            {"gang": {"minCount": count}},
            ("trainer", name),
            parentCompositePodGroupName="trainer-cluster",
        )
        await was.create(customer_api, namespace, "podgroups", group)
        for i in range(count):
            await core.create_namespaced_pod(namespace, member(f"{name}-{i}", f"trainer-{name}", pool, 8))

    async def both_held_for_the_composite() -> list[dict[str, Any]] | None:
        found = [await get(api, GANGS, namespace, f"wpg-trainer-{n}") for n in ("launcher", "workers")]
        gangs = [g for g in found if g is not None]
        held = len(gangs) == 2 and all(admitted(g).get("reason") == "WaitingForGroups" for g in gangs)
        return gangs if held else None

    gangs = await eventually(
        both_held_for_the_composite, timeout=60, what="both gangs held for their composite"
    )
    assert (
        "CompositePodGroup trainer-cluster needs 2 of its gangs placed together"
        in admitted(gangs[0])["message"]
    )
    await none_released(api, namespace, 3, "neither gang released: each alone would have fit")
    await core.delete_namespaced_pod("blocker", namespace, grace_period_seconds=0)
    await all_bound_on_their_own_nodes(api, namespace, 3, "both gangs released together once room appeared")
    for name in ("launcher", "workers"):
        await assert_as_planned(api, namespace, f"wpg-trainer-{name}")
    await assert_no_overcommit(api)


async def test_a_job_of_slices_releases_no_slice_until_both_fit_together(
    api: client.ApiClient,
    customer_api: client.ApiClient,
    namespace: str,
    test_pool: Callable[..., Any],
    was: WorkloadApi,
) -> None:
    """Composites nested: a job (minGroupCount 2) of two slices, each a CompositePodGroup
    (minGroupCount 2) of a launcher and a worker PodGroup of one 8-GPU pod. With three free
    nodes each slice fits alone and both do not: nothing is released, each gang held for the
    job; once a fourth node frees, all four go at once."""
    pool: TestPool = await test_pool(count=4)
    core = client.CoreV1Api(customer_api)
    custom = client.CustomObjectsApi(customer_api)
    await block_one_node(core, namespace, pool)
    roles = ("launcher", "worker")
    slices = [
        {
            "name": f"slice{s}",
            "schedulingPolicy": {"gang": {"minGroupCount": 2}},
            "podGroupTemplates": [
                {"name": f"{role}{s}", "schedulingPolicy": {"gang": {"minCount": 1}}} for role in roles
            ],
        }
        for s in range(2)
    ]
    workload = was.workload("multislice", [])
    workload["spec"] = {
        "compositePodGroupTemplates": [
            {
                "name": "job",
                "schedulingPolicy": {"gang": {"minGroupCount": 2}},
                "compositePodGroupTemplates": slices,
            }
        ]
    }
    await was.create(customer_api, namespace, "workloads", workload)

    def composite(name: str, template: str, parent: str | None) -> dict[str, Any]:
        return {
            "apiVersion": "scheduling.k8s.io/v1alpha3",
            "kind": "CompositePodGroup",
            "metadata": {"name": name},
            "spec": {
                "workloadRef": {"workloadName": "multislice", "templateName": template},
                "schedulingPolicy": {"gang": {"minGroupCount": 2}},
                **({"parentCompositePodGroupName": parent} if parent else {}),
            },
        }

    await custom.create_namespaced_custom_object(
        "scheduling.k8s.io", "v1alpha3", namespace, "compositepodgroups", composite("ms-job", "job", None)
    )
    groups = [f"{role}{s}" for s in range(2) for role in roles]
    for s in range(2):
        await custom.create_namespaced_custom_object(
            "scheduling.k8s.io",
            "v1alpha3",
            namespace,
            "compositepodgroups",
            composite(f"ms-slice{s}", f"slice{s}", "ms-job"),
        )
        for role in roles:
            group = was.podgroup(
                f"ms-{role}{s}",
                {"gang": {"minCount": 1}},
                ("multislice", f"{role}{s}"),
                parentCompositePodGroupName=f"ms-slice{s}",
            )
            await was.create(customer_api, namespace, "podgroups", group)
            await core.create_namespaced_pod(namespace, member(f"{role}{s}", f"ms-{role}{s}", pool, 8))

    async def all_held_for_the_job() -> list[dict[str, Any]] | None:
        found = [await get(api, GANGS, namespace, f"wpg-ms-{g}") for g in groups]
        gangs = [g for g in found if g is not None]
        held = len(gangs) == 4 and all(admitted(g).get("reason") == "WaitingForGroups" for g in gangs)
        return gangs if held else None

    gangs = await eventually(all_held_for_the_job, timeout=60, what="every gang held for the job")
    assert all(
        "CompositePodGroup ms-job needs 2 of its groups placed together" in admitted(g)["message"]
        for g in gangs
    ), [admitted(g)["message"] for g in gangs]
    await none_released(api, namespace, 4, "no slice released: each alone would have fit")
    await core.delete_namespaced_pod("blocker", namespace, grace_period_seconds=0)
    await all_bound_on_their_own_nodes(api, namespace, 4, "both slices released together once room appeared")
    for name in groups:
        await assert_as_planned(api, namespace, f"wpg-ms-{name}")
    await assert_no_overcommit(api)


async def test_a_podgroup_that_grows_releases_the_new_members_together_and_keeps_the_running_ones(
    api: client.ApiClient,
    customer_api: client.ApiClient,
    namespace: str,
    test_pool: Callable[..., Any],
    was: WorkloadApi,
) -> None:
    """gang.minCount 2 -> 4 while 2 run: the Gang records the resize (Resized, an Event), the 2
    running pods are kept (a resize is not a member loss), and the 2 new members are released
    together once both exist."""
    pool: TestPool = await test_pool(count=4)
    core = client.CoreV1Api(customer_api)
    await was.create(customer_api, namespace, "podgroups", was.podgroup("elastic", {"gang": {"minCount": 2}}))
    for i in range(2):
        await core.create_namespaced_pod(namespace, member(f"w{i}", "elastic", pool, 8))

    async def running(count: int) -> list[dict[str, Any]] | None:
        found = await pods(api, namespace)
        ok = len(found) == count and all(p["status"].get("phase") == "Running" for p in found)
        return found if ok else None

    first = await eventually(lambda: running(2), timeout=60, what="the first 2 running")
    await client.CustomObjectsApi(customer_api).patch_namespaced_custom_object(
        "scheduling.k8s.io",
        was.version,
        namespace,
        "podgroups",
        "elastic",
        {"spec": {"schedulingPolicy": {"gang": {"minCount": 4}}}},
        _content_type="application/merge-patch+json",  # type: ignore[call-arg]
    )
    await core.create_namespaced_pod(namespace, member("w2", "elastic", pool, 8))

    async def growing() -> dict[str, Any] | None:
        gang = await get(api, GANGS, namespace, "wpg-elastic")
        resized = condition(gang, "Resized")
        return (
            gang if resized.get("reason") == "Growing" and gang and gang["spec"]["minMember"] == 4 else None
        )

    gang = await eventually(growing, timeout=30, what="the Gang resized to 4, growing")
    assert "minMember changed from 2 to 4" in condition(gang, "Resized")["message"]
    (w2,) = [p for p in await pods(api, namespace) if p["metadata"]["name"] == "w2"]
    assert gated(w2), "one new member of two: not released alone"
    await core.create_namespaced_pod(namespace, member("w3", "elastic", pool, 8))
    found = await eventually(lambda: running(4), timeout=60, what="all 4 running")
    uids = {p["metadata"]["uid"] for p in found}
    assert {p["metadata"]["uid"] for p in first} <= uids, "the running members were kept"
    final = await get(api, GANGS, namespace, "wpg-elastic")
    assert final is not None and condition(final, "Resized")["status"] == "False"
    assert final["status"]["admission"]["attempt"] == 2, "the growth was a decision of its own"
    events = (await core.list_namespaced_event(namespace)).items
    assert any(e.reason == "Resized" and "from 2 to 4" in e.message for e in events)
    assert not any(e.reason in ("GangRestarted", "MemberLost") for e in events)


async def test_a_job_with_spec_scheduling_is_a_gang_of_the_podgroup_its_controller_makes(
    api: client.ApiClient,
    customer_api: client.ApiClient,
    namespace: str,
    test_pool: Callable[..., Any],
    was: WorkloadApi,
) -> None:
    """`spec.scheduling` (WorkloadWithJob): the Job controller makes a Workload and a PodGroup
    (gang, minCount 3) and names it on each pod; quorum holds the pods as that gang and releases
    them together."""
    pool: TestPool = await test_pool(count=3)
    template = member("x", "unused", pool, 8)
    del template["spec"]["schedulingGroup"]
    template["spec"]["restartPolicy"] = "Never"
    template["metadata"] = {
        "labels": {"app": "trainer"},
        "annotations": {"pod-complete.stage.kwok.x-k8s.io/delay": "600s"},
    }
    job = {
        "metadata": {"name": "trainer"},
        "spec": {
            "completionMode": "Indexed",
            "completions": 3,
            "parallelism": 3,
            "scheduling": {"schedulingPolicy": {"gang": {"minCount": 3}}},
            "template": template,
        },
    }
    await client.BatchV1Api(customer_api).create_namespaced_job(namespace, job)

    async def all_running() -> list[dict[str, Any]] | None:
        found = await pods(api, namespace, "app=trainer")
        ok = len(found) == 3 and all(p["status"].get("phase") == "Running" for p in found)
        return found if ok else None

    found = await eventually(all_running, timeout=90, what="the Job's 3 pods running")
    (group,) = {p["spec"]["schedulingGroup"]["podGroupName"] for p in found}
    (name,) = {p["metadata"]["labels"]["quorum.dev/gang"] for p in found}
    assert name == gang_name(GangSource.WORKLOAD_POD_GROUP, group)
    gang = await get(api, GANGS, namespace, name)
    assert gang is not None and gang["spec"]["minMember"] == 3, (name, gang)
    assert len(gang["status"]["admission"]["placement"]) == 3, "one decision for the whole Job"
    assert gang["spec"]["source"]["apiVersion"] == f"scheduling.k8s.io/{was.version}"
    await assert_as_planned(api, namespace, name)
