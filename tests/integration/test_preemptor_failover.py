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

SIZE = 4  # each gang, one pod per node of a pool of this many


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
        pool = await make_pool(instance, SIZE)
        await apply_gang(api, "prefail", "low", SIZE, pool, LOW)
        await running(api, "prefail", "low", SIZE)
        await apply_gang(api, "prefail", "high", SIZE, pool, HIGH)

        async def released() -> int:  # the preemptor's, after its victims were deleted
            return sum(1 for p in await pods(api, "prefail", "app=high") if not gated(p))

        # SIGKILL after the preemptor's first release (or a release or two later), before its last.
        at_kill = await kill_after(instance, "quorum-operator", released, 1, timeout=120)
        high = await pods(api, "prefail", "app=high")
        gated_at_kill = sum(1 for p in high if gated(p))
        assert len(high) == SIZE and gated_at_kill == SIZE - at_kill > 0, (
            "cut off in the middle of its release"
        )
        uids = {p["metadata"]["uid"] for p in high}

        instance.start_component("quorum-operator")
        done = await running(api, "prefail", "high", SIZE)
        assert {p["metadata"]["uid"] for p in done} == uids, "the preemptor's pods were kept, not recovered"
        assert {p["spec"]["nodeName"] for p in done} == set(pool.names), "on the freed nodes"
        assert not await events(api, "prefail", "PartiallyPlaced")
        await assert_no_overcommit(api)
