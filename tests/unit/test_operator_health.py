"""quorum-operator's /healthz, /readyz and /metrics; the event loop lag monitor; the count of
API requests by verb and code."""

from __future__ import annotations

import asyncio
import contextlib
import socket
import time
from collections.abc import AsyncIterator
from typing import Any

import aiohttp
import pytest
from aiohttp import web
from aiohttp.test_utils import TestClient, TestServer
from kubernetes_asyncio import client

from quorum.k8s.client import without_per_request_env_lookups
from quorum.operator import metrics
from quorum.operator.health import Health, make_app, monitor_event_loop_lag, serve
from quorum.operator.metrics import REGISTRY, api_trace_config, api_verb, set_gangs


def sample(name: str, **labels: str) -> float:
    return REGISTRY.get_sample_value(name, labels) or 0.0


@pytest.fixture
async def probe() -> AsyncIterator[tuple[Health, TestClient[Any, Any]]]:
    health = Health()
    http = TestClient(TestServer(make_app(health)))
    await http.start_server()
    yield health, http
    await http.close()


async def test_a_replica_that_does_not_lead_is_live(probe: tuple[Health, TestClient[Any, Any]]) -> None:
    health, http = probe
    health.last_pass = time.monotonic() - 3600  # no pass for an hour: irrelevant when not leading
    response = await http.get("/healthz")
    assert response.status == 200
    assert await response.text() == "ok"


async def test_a_leader_is_live_while_its_passes_complete(probe: tuple[Health, TestClient[Any, Any]]) -> None:
    health, http = probe
    health.set_leading(True)
    assert time.monotonic() - health.last_pass < 5, "leading starts the clock"
    assert (await http.get("/healthz")).status == 200
    health.last_pass = time.monotonic() - 75
    response = await http.get("/healthz")
    assert response.status == 500
    assert await response.text() == "leading, but no scheduling pass completed for 75s (limit 60s)"
    health.pass_completed()
    assert (await http.get("/healthz")).status == 200
    health.liveness_seconds = 30
    health.last_pass = time.monotonic() - 31
    assert "(limit 30s)" in await (await http.get("/healthz")).text()
    health.set_leading(False)
    assert (await http.get("/healthz")).status == 200


def test_leading_again_restarts_the_clock_but_staying_leader_does_not() -> None:
    health = Health(liveness_seconds=60)
    health.set_leading(True)
    health.last_pass = time.monotonic() - 100
    health.set_leading(True)  # still the leader: the stall stays visible
    assert health.liveness()[0] is False
    health.set_leading(False)
    health.set_leading(True)
    assert health.liveness()[0] is True
    assert health.liveness(now=health.last_pass + 61) == (
        False,
        "leading, but no scheduling pass completed for 61s (limit 60s)",
    )


async def test_ready_once_every_watched_kind_is_listed(probe: tuple[Health, TestClient[Any, Any]]) -> None:
    health, http = probe
    for kind in ("Pod", "Node", "PodGroup"):
        health.set_synced(kind, False)
    health.set_synced("Node", True)
    response = await http.get("/readyz")
    assert response.status == 503
    assert await response.text() == "not listed yet: Pod, PodGroup"
    health.set_synced("Pod", True)
    health.set_synced("PodGroup", True)
    response = await http.get("/readyz")
    assert response.status == 200
    assert await response.text() == "ok"


async def test_metrics_show_leader_cache_and_the_operator_metrics(
    probe: tuple[Health, TestClient[Any, Any]],
) -> None:
    health, http = probe
    health.set_leading(True)
    health.set_synced("Pod", True)
    health.synced["Node"] = False  # a direct assignment reaches the gauge at the next scrape
    metrics.PASS_DURATION.observe(0.02)
    set_gangs({("Pending", "Unschedulable"): 2, ("Running", "Released"): 1})
    set_gangs({("Running", "Released"): 3})
    response = await http.get("/metrics")
    assert response.status == 200
    assert response.headers["Content-Type"] == "text/plain; version=0.0.4; charset=utf-8"
    lines = (await response.text()).splitlines()
    assert "quorum_operator_leader 1.0" in lines
    assert 'quorum_operator_cache_synced{kind="Pod"} 1.0' in lines
    assert 'quorum_operator_cache_synced{kind="Node"} 0.0' in lines
    assert 'quorum_operator_gangs{phase="Pending",reason="Unschedulable"} 0.0' in lines
    assert 'quorum_operator_gangs{phase="Running",reason="Released"} 3.0' in lines
    # The fixed label values have their series from the start.
    for action in ("DeletePod", "SuspendJob", "Report", "ResumeJob"):
        assert any(
            line.startswith(f'quorum_operator_recoveries_total{{action="{action}"}} ') for line in lines
        )
    for stage in ("assemble", "plan", "release", "status", "recover"):
        assert any(
            line.startswith(f'quorum_operator_gang_failures_total{{stage="{stage}"}} ') for line in lines
        )
    names = {line.split()[2] for line in lines if line.startswith("# TYPE ")}
    assert names == {
        "quorum_operator_pass_duration_max_seconds",
        "quorum_operator_pass_duration_seconds",
        "quorum_operator_plan_duration_seconds",
        "quorum_operator_event_loop_lag_seconds",
        "quorum_operator_event_loop_lag_max_seconds",
        "quorum_operator_gc_pause_seconds",
        "quorum_operator_gangs",
        "quorum_operator_gated_pods",
        "quorum_operator_starvation_held_nodes",
        "quorum_operator_starvation_resting_tenants",
        "quorum_operator_release_latency_seconds",
        "quorum_operator_bound_latency_seconds",
        "quorum_operator_releases_total",
        "quorum_operator_pods_released_total",
        "quorum_operator_partial_placements_total",
        "quorum_operator_gang_restarts_total",
        "quorum_operator_recoveries_total",
        "quorum_operator_gang_failures_total",
        "quorum_operator_leader",
        "quorum_operator_api_requests_total",
        "quorum_operator_dra_devices_allocated_twice",
        "quorum_operator_cache_synced",
        "quorum_operator_preemptions_total",
        "quorum_operator_preemption_past_budgets_total",
        "quorum_operator_preemption_victims",
    }
    assert 'quorum_operator_pass_duration_seconds_bucket{le="30.0"}' in "\n".join(lines)
    assert not [line for line in lines if "_created" in line]
    helps = [line for line in lines if line.startswith("# HELP ")]
    assert all(len(line.split(" ", 3)[3]) > 30 for line in helps), "every metric says what it measures"
    health.set_leading(False)
    assert sample("quorum_operator_leader") == 0


async def test_serve_listens_and_the_runner_stops_it() -> None:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    runner = await serve("127.0.0.1", port, Health())
    try:
        async with aiohttp.ClientSession() as session:
            response = await session.get(f"http://127.0.0.1:{port}/healthz")
            assert response.status == 200
    finally:
        await runner.cleanup()


async def test_the_lag_monitor_sees_a_blocked_loop() -> None:
    metrics.EVENT_LOOP_LAG_MAX.set(0)
    count = sample("quorum_operator_event_loop_lag_seconds_count")
    task = asyncio.create_task(monitor_event_loop_lag(interval=0.01))
    try:
        await asyncio.sleep(0.05)  # the monitor is sleeping
        asyncio.get_running_loop().call_soon(time.sleep, 0.2)  # blocks the loop once, on purpose
        # Ordinary jitter is well under a millisecond; the block makes the next wake-up ~0.2 s late.
        for _ in range(500):
            if sample("quorum_operator_event_loop_lag_max_seconds") > 0.1:
                break
            await asyncio.sleep(0.01)
        worst = sample("quorum_operator_event_loop_lag_max_seconds")
        assert 0.1 < worst < 5, f"a 0.2 s block measured as {worst} s"
        assert sample("quorum_operator_event_loop_lag_seconds_count") > count
        assert sample("quorum_operator_event_loop_lag_seconds_bucket", le="+Inf") > count
    finally:
        task.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await task


@pytest.mark.parametrize(
    ("method", "url", "verb"),
    [
        ("GET", "https://k:6443/api/v1/pods", "list"),
        ("GET", "https://k:6443/api/v1/pods?labelSelector=a%3Db&limit=500", "list"),
        ("GET", "https://k:6443/api/v1/pods?watch=true&resourceVersion=5", "watch"),
        ("GET", "https://k:6443/api/v1/pods?watch=True", "watch"),
        ("GET", "https://k:6443/api/v1/pods?watch=1", "watch"),
        ("GET", "https://k:6443/api/v1/pods?watch=false", "list"),
        ("GET", "https://k:6443/api/v1/watch/pods", "watch"),
        ("GET", "https://k:6443/api/v1/namespaces", "list"),
        ("GET", "https://k:6443/api/v1/namespaces/ns", "get"),
        ("GET", "https://k:6443/api/v1/namespaces/ns/status", "get"),
        ("GET", "https://k:6443/api/v1/namespaces/ns/pods", "list"),
        ("GET", "https://k:6443/api/v1/namespaces/ns/pods/p", "get"),
        ("GET", "https://k:6443/api/v1/namespaces/ns/pods/p/status", "get"),
        ("GET", "https://k:6443/api/v1/namespaces/ns/pods?watch=true", "watch"),
        ("GET", "https://k:6443/api/v1/nodes", "list"),
        ("GET", "https://k:6443/api/v1/nodes/n1", "get"),
        ("GET", "https://k:6443/apis/quorum.dev/v1alpha1/gangs", "list"),
        ("GET", "https://k:6443/apis/quorum.dev/v1alpha1/namespaces/ns/gangs", "list"),
        ("GET", "https://k:6443/apis/quorum.dev/v1alpha1/namespaces/ns/gangs/g", "get"),
        ("GET", "https://k:6443/apis/coordination.k8s.io/v1/namespaces/ns/leases/quorum", "get"),
        ("GET", "https://k:6443/apis/batch/v1/jobs?watch=1", "watch"),
        ("GET", "https://k:6443/api", "get"),
        ("GET", "https://k:6443/api/v1", "get"),
        ("GET", "https://k:6443/apis/batch/v1", "get"),
        ("GET", "https://k:6443/version", "get"),
        ("POST", "https://k:6443/api/v1/namespaces/ns/events", "create"),
        ("POST", "https://k:6443/api/v1/namespaces/ns/pods/p/binding", "create"),
        ("PUT", "https://k:6443/apis/coordination.k8s.io/v1/namespaces/ns/leases/quorum", "update"),
        ("PATCH", "https://k:6443/api/v1/namespaces/ns/pods/p", "patch"),
        ("patch", "https://k:6443/apis/quorum.dev/v1alpha1/namespaces/ns/gangs/g/status", "patch"),
        ("DELETE", "https://k:6443/api/v1/namespaces/ns/pods/p", "delete"),
        ("DELETE", "https://k:6443/api/v1/namespaces/ns/pods", "delete"),
        ("HEAD", "https://k:6443/api/v1/pods", "head"),
    ],
)
def test_api_verb(method: str, url: str, verb: str) -> None:
    assert api_verb(method, url) == verb


async def test_the_trace_config_counts_requests_by_verb_and_code() -> None:
    async def pods(_: web.Request) -> web.Response:
        return web.json_response({"items": []})

    async def missing(_: web.Request) -> web.Response:
        return web.json_response({"reason": "NotFound"}, status=404)

    app = web.Application()
    app.router.add_get("/api/v1/namespaces/ns/pods", pods)
    app.router.add_patch("/api/v1/namespaces/ns/pods/p", missing)
    lists = sample("quorum_operator_api_requests_total", verb="list", code="200")
    not_found = sample("quorum_operator_api_requests_total", verb="patch", code="404")
    errors = sample("quorum_operator_api_requests_total", verb="get", code="error")
    with socket.socket() as s:  # a port nothing listens on
        s.bind(("127.0.0.1", 0))
        closed = s.getsockname()[1]
    async with (
        TestServer(app) as server,
        aiohttp.ClientSession(trace_configs=[api_trace_config()]) as session,
    ):
        async with session.get(server.make_url("/api/v1/namespaces/ns/pods")) as response:
            assert response.status == 200
        async with session.patch(server.make_url("/api/v1/namespaces/ns/pods/p"), json={}) as response:
            assert response.status == 404
        with pytest.raises(aiohttp.ClientConnectionError):
            await session.get(f"http://127.0.0.1:{closed}/api/v1/nodes/n1")
    assert sample("quorum_operator_api_requests_total", verb="list", code="200") == lists + 1
    assert sample("quorum_operator_api_requests_total", verb="patch", code="404") == not_found + 1
    assert sample("quorum_operator_api_requests_total", verb="get", code="error") == errors + 1


async def test_the_api_client_session_gets_the_trace_configs() -> None:
    trace = api_trace_config()
    api = without_per_request_env_lookups(
        client.Configuration(host="https://apiserver.example:6443"), [trace]
    )
    async with api:
        assert api.rest_client.pool_manager.trace_configs == [trace]
