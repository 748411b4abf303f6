"""On the real control plane: one gang's trouble stays that gang's.

- a pathological gang (1 CPU launcher + 1,300 one-GPU workers, 20 GPUs short: the MPI shape
  that once stopped the loop by recursion) is held with its reason while small gangs behind it
  are released;
- a gang whose status the apiserver refuses (a ValidatingAdmissionPolicy on gangs/status) gets
  a Warning Event and does not hold up another gang; once the apiserver takes it, it is released;
- a restarted operator keeps the reservations of released, unbound pods: a gang that would fit
  only in their room stays held, and nothing is over-committed once they bind.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from typing import Any

import pytest
from kubernetes_asyncio import client
from kubernetes_asyncio.client.exceptions import ApiException

from devcluster.cluster import Instance
from devcluster.nodes import TestPool
from tests.integration.test_gang_lifecycle import condition, gang_where
from tests.integration.test_gangs import GANGS, gated, get, pods
from tests.kube import api_client, assert_no_overcommit, create_podgroup, eventually

pytestmark = pytest.mark.cluster


def bare_pod(name: str, group: str, pool: TestPool, gpus: int, cpu: str = "100m") -> dict[str, Any]:
    resources: dict[str, Any] = {"requests": {"cpu": cpu, "memory": "64Mi"}}
    if gpus:
        resources["limits"] = {"nvidia.com/gpu": str(gpus)}  # extended resources: limits
    return {
        "metadata": {"name": name, "labels": {"pod-group.scheduling.sigs.k8s.io": group}},
        "spec": {
            **pool.pod_spec(),
            "containers": [{"name": "c", "image": "registry.k8s.io/pause:3.10", "resources": resources}],
        },
    }


async def create_pods(api: client.ApiClient, namespace: str, bodies: list[dict[str, Any]]) -> None:
    core = client.CoreV1Api(api)
    gate = asyncio.Semaphore(32)

    async def one(body: dict[str, Any]) -> None:
        async with gate:
            await core.create_namespaced_pod(namespace, body)

    await asyncio.gather(*(one(b) for b in bodies))


async def all_released(api: client.ApiClient, ns: str, group: str, count: int, timeout: float = 60) -> None:
    async def probe() -> bool:
        found = await pods(api, ns, f"pod-group.scheduling.sigs.k8s.io={group}")
        return len(found) == count and not any(gated(p) for p in found)

    await eventually(probe, timeout=timeout, what=f"the {count} pods of {group} released")


async def test_a_pathological_gang_is_held_with_its_reason_while_small_gangs_go_on(
    api: client.ApiClient, namespace: str, test_pool: Callable[..., Any]
) -> None:
    pool = await test_pool(
        20, capacity={"cpu": "256", "memory": "2Ti", "nvidia.com/gpu": "64", "pods": "110"}
    )
    workers = 1300  # 20 nodes x 64 GPUs = 1,280: 20 short
    await create_podgroup(api, namespace, "big", workers + 1)
    bodies = [bare_pod("big-launcher", "big", pool, gpus=0, cpu="2")]
    bodies += [bare_pod(f"big-worker-{i}", "big", pool, gpus=1) for i in range(workers)]
    await create_pods(api, namespace, bodies)
    big = await gang_where(
        api,
        namespace,
        "pg-big",
        lambda g: condition(g, "Unschedulable").get("status") == "True",
        "held",
        timeout=90,
    )
    held = condition(big, "Unschedulable")
    assert held["reason"] in ("Unschedulable", "BudgetExhausted"), held
    assert "short by 20" in held["message"] or "search budget exhausted" in held["message"], held["message"]
    for n in range(3):  # small gangs arriving one after another, behind the big one
        name = f"small{n}"
        await create_podgroup(api, namespace, name, 2)
        await create_pods(api, namespace, [bare_pod(f"{name}-{i}", name, pool, gpus=1) for i in range(2)])
        await all_released(api, namespace, name, 2)
    big = await get(api, GANGS, namespace, "pg-big")
    assert condition(big, "Admitted")["status"] == "False", "the big gang is still held"
    assert condition(big, "PlanningFailed").get("status") == "False"
    await assert_no_overcommit(api)


REJECT = "quorum-test-reject-gang-status"


async def test_a_gang_whose_status_the_apiserver_refuses_delays_no_other_gang(
    cluster: Instance, api: client.ApiClient, namespace: str, test_pool: Callable[..., Any]
) -> None:
    admission = client.AdmissionregistrationV1Api(api)
    policy = {
        "metadata": {"name": REJECT},
        "spec": {
            "failurePolicy": "Fail",
            "matchConstraints": {
                "resourceRules": [
                    {
                        "apiGroups": ["quorum.dev"],
                        "apiVersions": ["*"],
                        "operations": ["UPDATE"],
                        "resources": ["gangs/status"],
                    }
                ]
            },
            "validations": [
                {
                    "expression": (
                        f"object.metadata.namespace != '{namespace}' || object.metadata.name != 'pg-refused'"
                    ),
                    "message": "test: the status of this gang is refused",
                }
            ],
        },
    }
    binding = {
        "metadata": {"name": REJECT},
        "spec": {"policyName": REJECT, "validationActions": ["Deny"]},
    }
    await admission.create_validating_admission_policy(policy)
    await admission.create_validating_admission_policy_binding(binding)
    try:
        operator = await api_client(cluster.kubeconfig("quorum-operator"))
        async with operator:
            await policy_in_force(operator, namespace)
        pool = await test_pool(2)
        for name in ("refused", "fine"):
            await create_podgroup(api, namespace, name, 2)
            await create_pods(api, namespace, [bare_pod(f"{name}-{i}", name, pool, gpus=4) for i in range(2)])
        await all_released(api, namespace, "fine", 2)

        async def warned() -> list[Any] | None:
            events = (await client.CoreV1Api(api).list_namespaced_event(namespace)).items
            found = [
                e
                for e in events
                if e.involved_object.name == "pg-refused"
                and e.reason == "PlanningFailed"
                and e.type == "Warning"
            ]
            return found or None

        (event, *_) = await eventually(
            warned, timeout=60, what="a PlanningFailed Warning Event on pg-refused"
        )
        assert "failed" in event.message and "the status of this gang is refused" in event.message
        assert all(gated(p) for p in await pods(api, namespace, "pod-group.scheduling.sigs.k8s.io=refused"))
    finally:
        await admission.delete_validating_admission_policy_binding(REJECT)
        await admission.delete_validating_admission_policy(REJECT)
    await all_released(api, namespace, "refused", 2, timeout=120)  # retried with backoff, then taken
    gang = await get(api, GANGS, namespace, "pg-refused")
    assert gang is not None and gang["status"]["admission"]["attempt"] >= 1
    await assert_no_overcommit(api)


async def policy_in_force(api: client.ApiClient, namespace: str) -> None:
    """Wait until the apiserver enforces the test policy: a probe Gang's status is refused. `api`
    acts as quorum-operator: only quorum writes Gangs (the policy quorum-records)."""
    custom = client.CustomObjectsApi(api)
    body = {
        "apiVersion": "quorum.dev/v1alpha1",
        "kind": "Gang",
        "metadata": {"name": "pg-refused"},
        "spec": {"source": {"kind": "Labels", "name": "probe"}, "minMember": 1},
    }
    await custom.create_namespaced_custom_object("quorum.dev", "v1alpha1", namespace, "gangs", body)

    async def refused() -> bool:
        try:
            await custom.patch_namespaced_custom_object_status(
                "quorum.dev",
                "v1alpha1",
                namespace,
                "gangs",
                "pg-refused",
                {"status": {"phase": "Pending"}},
                _content_type="application/merge-patch+json",  # type: ignore[call-arg]
            )
        except ApiException as err:
            return err.status in (400, 403, 422)
        return False

    await eventually(refused, timeout=30, what="the test policy in force")
    await custom.delete_namespaced_custom_object("quorum.dev", "v1alpha1", namespace, "gangs", "pg-refused")

    async def gone() -> bool:
        return await get(api, GANGS, namespace, "pg-refused") is None

    await eventually(gone, timeout=30, what="the probe Gang gone")


async def test_a_restart_keeps_released_unbound_pods_reserved(
    cluster: Instance, api: client.ApiClient, namespace: str, test_pool: Callable[..., Any]
) -> None:
    pool = await test_pool(2)  # 2 x 8 GPUs
    cluster.stop_component("kube-scheduler")
    try:
        await create_podgroup(api, namespace, "first", 2)
        await create_pods(api, namespace, [bare_pod(f"first-{i}", "first", pool, gpus=8) for i in range(2)])
        await all_released(api, namespace, "first", 2)  # released, and nobody binds them
        cluster.stop_component("quorum-operator")
        cluster.start_component("quorum-operator")
        await create_podgroup(api, namespace, "second", 1)
        await create_pods(api, namespace, [bare_pod("second-0", "second", pool, gpus=8)])
        second = await gang_where(
            api,
            namespace,
            "pg-second",
            lambda g: condition(g, "Unschedulable").get("status") == "True",
            "held by the restarted operator",
            timeout=120,
        )
        assert "short by 1" in condition(second, "Unschedulable")["message"]
    finally:
        cluster.start_component("kube-scheduler")

    async def first_bound() -> bool:
        found = await pods(api, namespace, "pod-group.scheduling.sigs.k8s.io=first")
        return all((p.get("spec") or {}).get("nodeName") for p in found)

    await eventually(first_bound, timeout=60, what="the first gang bound")
    (second_pod,) = await pods(api, namespace, "pod-group.scheduling.sigs.k8s.io=second")
    assert gated(second_pod), "the second gang never got the first gang's room"
    await assert_no_overcommit(api)
