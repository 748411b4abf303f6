"""A preemptor whose leader dies after its victims were deleted and before all its pods were
released: the next leader finishes its release on the freed, reserved nodes, and neither side
loses work twice (docs/lifecycle.md, "When quorum removes a pod")."""

from __future__ import annotations

from collections.abc import Callable

import pytest
from kubernetes_asyncio import client

from devcluster.cluster import Instance
from tests.integration.test_gangs import gated, pods
from tests.integration.test_preemption import HIGH, LOW, apply_gang, events, make_pool, running
from tests.kube import api_client, assert_no_overcommit, create_namespace, kill_after

pytestmark = pytest.mark.cluster


async def test_a_preemptor_cut_off_mid_release_runs_on_the_freed_nodes_after_a_failover(
    start_instance: Callable[..., Instance], monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("QUORUM_OPERATOR_RELEASE_CONCURRENCY", "1")  # one by one
    monkeypatch.setenv("QUORUM_OPERATOR_LEASE_SECONDS", "3")
    monkeypatch.setenv("QUORUM_OPERATOR_PREEMPTION_RETRY_SECONDS", "2")
    instance = start_instance("t-prefail")
    api = await api_client(instance.kubeconfig("admin"))
    async with api:
        for name, value in ((HIGH, 1000), (LOW, 10)):
            body = {"metadata": {"name": name}, "value": value}
            await client.SchedulingV1Api(api).create_priority_class(body)
        await create_namespace(api, "prefail")
        pool = await make_pool(instance, 2)
        await apply_gang(api, "prefail", "low", 2, pool, LOW)
        await running(api, "prefail", "low", 2)
        await apply_gang(api, "prefail", "high", 2, pool, HIGH)

        async def released() -> int:  # the preemptor's, after its victims were deleted
            return sum(1 for p in await pods(api, "prefail", "app=high") if not gated(p))

        # SIGKILL after the preemptor's first release, before its second.
        assert await kill_after(instance, "quorum-operator", released, 1, timeout=120) == 1
        high = await pods(api, "prefail", "app=high")
        assert len(high) == 2 and sum(1 for p in high if gated(p)) == 1, "one preemptor pod released"
        uids = {p["metadata"]["uid"] for p in high}

        instance.start_component("quorum-operator")
        done = await running(api, "prefail", "high", 2)
        assert {p["metadata"]["uid"] for p in done} == uids, "the preemptor's pods were kept, not recovered"
        assert {p["spec"]["nodeName"] for p in done} == set(pool.names), "on the freed nodes"
        assert not await events(api, "prefail", "PartiallyPlaced")
        await assert_no_overcommit(api)
