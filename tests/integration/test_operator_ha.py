"""Two operator replicas: only the Lease holder acts; when it dies, the other takes over."""

from __future__ import annotations

import asyncio
import os
import signal
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
from kubernetes_asyncio import client

from devcluster.cluster import REPO_ROOT, Instance, free_ports
from devcluster.kubeconfig import probe
from devcluster.process import ProcessRecord, is_alive, spawn, stop
from tests.kube import api_client, create_namespace, create_podgroup, eventually

pytestmark = pytest.mark.cluster

LEASE_SECONDS = 6


async def holder(api: client.ApiClient) -> str | None:
    try:
        lease = await client.CoordinationV1Api(api).read_namespaced_lease("quorum-operator", "quorum-system")
    except client.exceptions.ApiException:
        return None
    return str(lease.spec.holder_identity) if lease.spec.holder_identity else None


async def gang_runs(api: client.ApiClient, namespace: str, name: str) -> dict[str, Any]:
    custom, apps = client.CustomObjectsApi(api), client.AppsV1Api(api)
    await create_podgroup(api, namespace, name, 2)
    await apps.create_namespaced_deployment(
        namespace,
        {
            "metadata": {"name": name},
            "spec": {
                "replicas": 2,
                "selector": {"matchLabels": {"app": name}},
                "template": {
                    "metadata": {"labels": {"app": name, "pod-group.scheduling.sigs.k8s.io": name}},
                    "spec": {"containers": [{"name": "c", "image": "registry.k8s.io/pause:3.10"}]},
                },
            },
        },
    )
    core = client.CoreV1Api(api)

    async def running() -> bool:
        pods = (await core.list_namespaced_pod(namespace, label_selector=f"app={name}")).items
        return len(pods) == 2 and all(p.status.phase == "Running" for p in pods)

    await eventually(running, timeout=60, what=f"gang {name} Running")
    gang: dict[str, Any] = await custom.get_namespaced_custom_object(
        "quorum.dev", "v1alpha1", namespace, "gangs", f"pg-{name}"
    )
    return gang


async def test_only_the_lease_holder_releases_and_the_other_takes_over(
    start_instance: Callable[..., Instance], monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("QUORUM_OPERATOR_LEASE_SECONDS", str(LEASE_SECONDS))
    instance = start_instance("t-ha")
    state = instance.state()
    assert state is not None
    first = next(p for p in state.processes if p.name == "quorum-operator")
    (port,) = free_ports(1)
    env = {**os.environ, "PYTHONPATH": str(REPO_ROOT)}
    second = spawn(
        "quorum-operator-2",
        [
            sys.executable,
            "-m",
            "quorum.operator.main",
            f"--kubeconfig={instance.kubeconfig('quorum-operator')}",
            f"--health-address=127.0.0.1:{port}",
        ],
        instance.layout.log("quorum-operator-2"),
        instance.layout.root,
        env,
    )
    try:

        async def second_up() -> bool:
            return await asyncio.to_thread(probe, f"http://127.0.0.1:{port}/healthz")

        await eventually(second_up, timeout=30, what="the second operator up")
        api = await api_client(instance.kubeconfig("admin"))
        async with api:
            await create_namespace(api, "ha")
            lead = await eventually(lambda: holder(api), timeout=30, what="a Lease holder")
            leader, standby = (first, second) if lead.endswith(f"_{first.pid}") else (second, first)
            assert lead.endswith(f"_{leader.pid}")

            gang = await gang_runs(api, "ha", "one")
            assert gang["status"]["admission"]["attempt"] == 1
            assert released_lines(instance, standby) == 0, "the standby replica acted"
            assert released_lines(instance, leader) >= 1

            os.kill(leader.pid, signal.SIGKILL)
            killed_at = time.monotonic()

            async def taken_over() -> bool:
                return (await holder(api) or "").endswith(f"_{standby.pid}")

            await eventually(taken_over, timeout=4 * LEASE_SECONDS, what="the standby holding the Lease")
            takeover = time.monotonic() - killed_at
            assert takeover <= 2 * LEASE_SECONDS + 2, f"took {takeover:.1f}s for a {LEASE_SECONDS}s lease"
            gang = await gang_runs(api, "ha", "two")
            assert gang["status"]["admission"]["attempt"] == 1
            assert released_lines(instance, standby) >= 1
            assert not is_alive(leader)
    finally:
        stop([second])


def released_lines(instance: Instance, record: ProcessRecord) -> int:
    log: Path = instance.layout.log(record.name)
    return sum(
        1 for line in log.read_text().splitlines() if "quorum.operator:" in line and "released" in line
    )
