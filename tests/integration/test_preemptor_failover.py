"""A preemptor whose leader dies after its victims were deleted and before all its pods were
released: the next leader finishes its release on the freed, reserved nodes, and neither side
loses work twice (docs/lifecycle.md, "When quorum removes a pod")."""

from __future__ import annotations

from collections.abc import Callable

import pytest
from kubernetes_asyncio import client

from devcluster.cluster import Instance
from devcluster.process import is_alive
from tests.integration.test_gangs import gated, pods
from tests.integration.test_preemption import HIGH, LOW, apply_gang, events, make_pool, running
from tests.kube import api_client, assert_no_overcommit, create_namespace, eventually

pytestmark = pytest.mark.cluster


async def test_a_preemptor_cut_off_mid_release_runs_on_the_freed_nodes_after_a_failover(
    start_instance: Callable[..., Instance], monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("QUORUM_OPERATOR_RELEASE_CONCURRENCY", "1")  # one by one: the kill is exact
    monkeypatch.setenv("QUORUM_OPERATOR_LEASE_SECONDS", "3")
    monkeypatch.setenv("QUORUM_OPERATOR_PREEMPTION_RETRY_SECONDS", "2")
    # The victim's 2 releases, then the preemptor's first: SIGKILL before its second.
    monkeypatch.setenv("QUORUM_OPERATOR_TEST_CRASH_AFTER", "3")
    instance = start_instance("t-prefail")
    state = instance.state()
    assert state is not None
    operator = next(p for p in state.processes if p.name == "quorum-operator")
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

        async def died() -> bool:
            return not is_alive(operator)

        await eventually(died, timeout=90, what="the operator killed after the preemptor's first release")
        high = await pods(api, "prefail", "app=high")
        assert len(high) == 2 and sum(1 for p in high if gated(p)) == 1, "one preemptor pod released"
        uids = {p["metadata"]["uid"] for p in high}

        monkeypatch.delenv("QUORUM_OPERATOR_TEST_CRASH_AFTER")
        instance.start_component("quorum-operator")
        done = await running(api, "prefail", "high", 2)
        assert {p["metadata"]["uid"] for p in done} == uids, "the preemptor's pods were kept, not recovered"
        assert {p["spec"]["nodeName"] for p in done} == set(pool.names), "on the freed nodes"
        assert not await events(api, "prefail", "PartiallyPlaced")
        await assert_no_overcommit(api)
