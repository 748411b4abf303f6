"""Upgrading a control plane from Kubernetes 1.36 to 1.37 under quorum (docs/workloads.md,
"Upgrading from 1.36"), on the real control plane: with one Workload gang running and another
held, `quorum upgrade-workloads save`, the upgrade of etcd, kube-apiserver, controller-manager
and scheduler in place, `quorum upgrade-workloads restore`. No gang is lost or half placed: the
running one keeps its pods and its Gang's records, the held one is released whole afterwards."""

from __future__ import annotations

import asyncio
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
from kubernetes_asyncio import client

from devcluster.cluster import Instance
from quorum.core.times import timestamp
from tests.integration.test_gangs import GANGS, admitted, assert_as_planned, gated, get, pods
from tests.integration.test_workloads import NO_POOL, member
from tests.kube import WorkloadApi, api_client, create_namespace, eventually

pytestmark = pytest.mark.cluster
GC_WATCH_LAG_SECONDS = 10.0  # how old a Gang is before the upgrade deletes its owner


async def quorum(instance: Instance, *args: str) -> subprocess.CompletedProcess[str]:
    return await asyncio.to_thread(
        subprocess.run,
        [sys.executable, "-m", "quorum", *args, f"--kubeconfig={instance.kubeconfig('admin')}"],
        capture_output=True,
        text=True,
        check=False,
        timeout=300,
    )


async def test_an_upgrade_from_1_36_to_1_37_loses_no_gang_and_places_none_by_halves(
    start_instance: Callable[..., Instance], tmp_path: Path
) -> None:
    instance = start_instance("t-upgrade", kubernetes="1.36")
    saved = tmp_path / "workloads.yaml"
    admin = await api_client(instance.kubeconfig("admin"))
    async with admin:
        was = await WorkloadApi.of(admin)
        assert was.legacy
        await create_namespace(admin, "ml")
        core = client.CoreV1Api(admin)
        for name, size in (("running", 2), ("held", 3)):
            template = {
                "name": "workers",
                "schedulingPolicy": {"gang": {"minCount": size}},
                "disruptionMode": "PodGroup",
            }
            await was.create(admin, "ml", "workloads", was.workload(name, [template]))
            group = was.podgroup(
                f"{name}-workers", {"gang": {"minCount": size}}, (name, "workers"), disruptionMode="PodGroup"
            )
            await was.create(admin, "ml", "podgroups", group)
        for i in range(2):
            await core.create_namespaced_pod("ml", member(f"running-{i}", "running-workers", NO_POOL, 1))
            await core.create_namespaced_pod("ml", member(f"held-{i}", "held-workers", NO_POOL, 1))

        async def running() -> list[dict[str, Any]] | None:
            found = await pods(admin, "ml", "app=running-workers")
            return (
                found
                if len(found) == 2 and all(p["status"].get("phase") == "Running" for p in found)
                else None
            )

        before = {
            p["metadata"]["uid"]
            for p in await eventually(running, timeout=60, what="the running gang running")
        }
        await eventually(
            lambda: gang_reason(admin, "wpg-held-workers", "WaitingForMembers"),
            timeout=30,
            what="the held gang held",
        )
        gang_before = await get(admin, GANGS, "ml", "wpg-running-workers")
        assert (
            gang_before is not None
            and gang_before["spec"]["source"]["apiVersion"] == "scheduling.k8s.io/v1alpha2"
        )
        # The garbage collector orphans only the dependents its watches have shown it; a Gang it
        # learns of after its owner went with propagationPolicy Orphan, it deletes. On a cluster
        # being upgraded the Gangs are long known; here they are seconds old, and a loaded machine
        # delays the collector's watch by seconds (seen once in make test): give it that time.
        age = time.time() - timestamp(gang_before["metadata"]["creationTimestamp"])
        await asyncio.sleep(max(0.0, GC_WATCH_LAG_SECONDS - age))

        done = await quorum(instance, "upgrade-workloads", "save", "--to", str(saved))
        assert done.returncode == 0, done.stderr
        custom = client.CustomObjectsApi(admin)
        assert not (await custom.list_cluster_custom_object("scheduling.k8s.io", "v1alpha2", "podgroups"))[
            "items"
        ]
        orphaned = await get(admin, GANGS, "ml", "wpg-running-workers")
        assert orphaned is not None and not orphaned["metadata"].get("ownerReferences"), (
            "kept, without its owner"
        )

    await asyncio.to_thread(instance.upgrade, "1.37")

    admin = await api_client(instance.kubeconfig("admin"))
    async with admin:
        was = await WorkloadApi.of(admin)
        assert not was.legacy
        done = await quorum(instance, "upgrade-workloads", "restore", "--from", str(saved))
        assert done.returncode == 0, done.stderr
        group = await was.get(admin, "ml", "podgroups", "running-workers")
        assert (
            group["spec"]["disruptionMode"] == {"all": {}}
            and group["spec"]["workloadRef"]["templateName"] == "workers"
        )

        async def adopted() -> dict[str, Any] | None:
            gang = await get(admin, GANGS, "ml", "wpg-running-workers")
            owners = (gang or {}).get("metadata", {}).get("ownerReferences") or []
            return gang if owners and owners[0]["uid"] == group["metadata"]["uid"] else None

        gang = await eventually(
            adopted, timeout=60, what="the running gang's Gang adopted by its PodGroup made again"
        )
        assert gang["spec"]["source"]["apiVersion"] == "scheduling.k8s.io/v1beta1"
        assert gang["status"]["admission"] == gang_before["status"]["admission"], "its records kept"
        found = await pods(admin, "ml", "app=running-workers")
        assert {p["metadata"]["uid"] for p in found} == before, "the running gang kept its pods"
        assert all(p["status"].get("phase") == "Running" for p in found)

        held = await pods(admin, "ml", "app=held-workers")
        assert len(held) == 2 and all(gated(p) for p in held), "still held whole"
        await client.CoreV1Api(admin).create_namespaced_pod(
            "ml", member("held-2", "held-workers", NO_POOL, 1)
        )

        async def released() -> bool:
            found = await pods(admin, "ml", "app=held-workers")
            return len(found) == 3 and all(p["spec"].get("nodeName") for p in found)

        await eventually(released, timeout=90, what="the held gang released whole on 1.37")
        await assert_as_planned(admin, "ml", "wpg-held-workers")


async def gang_reason(api: client.ApiClient, name: str, reason: str) -> bool:
    return admitted(await get(api, GANGS, "ml", name)).get("reason") == reason
