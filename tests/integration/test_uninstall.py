"""The README's uninstall order, followed step by step on an instance of its own: no pod is left
gated and no pod creation is denied at any point."""

from __future__ import annotations

import asyncio
import subprocess
import sys
from collections.abc import Callable
from typing import Any

import pytest
from kubernetes_asyncio import client

from devcluster.cluster import MANIFESTS, REPO_ROOT, Instance
from tests.kube import api_client, create_namespace, create_podgroup, eventually, raw_json

pytestmark = pytest.mark.cluster

GATE = "quorum.dev/gang"


async def gated_anywhere(api: client.ApiClient) -> list[str]:
    items = (await raw_json(client.CoreV1Api(api).list_pod_for_all_namespaces(_preload_content=False)))[
        "items"
    ]
    return [
        f"{p['metadata']['namespace']}/{p['metadata']['name']}"
        for p in items
        if any(g["name"] == GATE for g in p["spec"].get("schedulingGates") or [])
    ]


def workload(name: str, replicas: int, labels: dict[str, str]) -> dict[str, Any]:
    return {
        "metadata": {"name": name},
        "spec": {
            "replicas": replicas,
            "selector": {"matchLabels": {"app": name}},
            "template": {
                "metadata": {"labels": {"app": name, **labels}},
                "spec": {"containers": [{"name": "c", "image": "registry.k8s.io/pause:3.10"}]},
            },
        },
    }


async def test_the_uninstall_order_leaves_no_pod_gated_and_denies_no_pod(
    start_instance: Callable[..., Instance],
) -> None:
    instance = start_instance("t-uninstall")
    api = await api_client(instance.kubeconfig("admin"))
    async with api:
        core, apps = client.CoreV1Api(api), client.AppsV1Api(api)
        await create_namespace(api, "ml")
        await create_podgroup(api, "ml", "held", 4)  # 2 of 4 members: held at the gate
        await apps.create_namespaced_deployment(
            "ml", workload("held", 2, {"pod-group.scheduling.sigs.k8s.io": "held"})
        )
        lone = {
            "pod-group.scheduling.sigs.k8s.io/name": "lone",
            "pod-group.scheduling.sigs.k8s.io/min-available": "2",
        }
        await apps.create_namespaced_deployment("ml", workload("lone", 1, lone))

        async def three_gated_and_recorded() -> list[str] | None:
            found = await gated_anywhere(api)
            gangs = await client.CustomObjectsApi(api).list_namespaced_custom_object(
                "quorum.dev", "v1alpha1", "ml", "gangs"
            )
            names = {g["metadata"]["name"] for g in gangs["items"]}
            # The operator writes a gang short of members only after its forming grace: the
            # hand release records itself on the Gang, so wait until both are written.
            return found if len(found) == 3 and names >= {"pg-held", "lbl-lone"} else None

        await eventually(three_gated_and_recorded, timeout=60, what="3 gated pods, 2 Gangs written")

        # 1. No new gates: the backstop's binding, then the mutating webhook.
        instance.kubectl("delete", "validatingadmissionpolicybinding", "quorum-gang-backstop")

        async def backstop_dropped() -> bool:
            probe = ("create", "--dry-run=server", "-f", str(REPO_ROOT / "hack/backstop-probe.yaml"))
            return (await asyncio.to_thread(instance.kubectl, *probe, check=False)).returncode == 0

        await eventually(backstop_dropped, timeout=30, what="the apiserver to drop the backstop binding")
        instance.kubectl("delete", "mutatingwebhookconfiguration", "quorum-webhooks")
        await apps.patch_namespaced_deployment_scale("held", "ml", {"spec": {"replicas": 3}})

        # 2. Release every gated pod, as quorum's operator identity, with a reason.
        released = await asyncio.to_thread(
            subprocess.run,
            [
                sys.executable,
                "-m",
                "quorum",
                "release",
                "--all",
                "--reason",
                "uninstalling quorum",
                f"--kubeconfig={instance.kubeconfig('admin')}",
            ],
            capture_output=True,
            text=True,
            cwd=REPO_ROOT,
            timeout=120,
            check=False,
        )
        assert released.returncode == 0, released.stdout + released.stderr
        assert "ml/pg-held: 2 of 2 gated pods released by hand" in released.stdout, released.stdout
        assert "ml/lbl-lone: 1 of 1 gated pods released by hand" in released.stdout, released.stdout
        assert await gated_anywhere(api) == []
        gang = await client.CustomObjectsApi(api).get_namespaced_custom_object(
            "quorum.dev", "v1alpha1", "ml", "gangs", "pg-held"
        )
        assert gang["status"]["manualRelease"]["reason"] == "uninstalling quorum"

        # 3. Gate protection, the validating webhooks, the operator (and the backstop policy).
        instance.kubectl("delete", "-f", str(MANIFESTS / "40-gate-protection.yaml"))
        instance.kubectl("delete", "validatingwebhookconfiguration", "quorum-webhooks")
        instance.stop_component("quorum-operator")
        instance.stop_component("quorum-webhooks")
        instance.kubectl("delete", "-f", str(MANIFESTS / "45-gang-backstop.yaml"), "--ignore-not-found")

        # 4. The CRDs last: quorum's only (a scheduler-plugins CRD would stay).
        instance.kubectl("delete", "crd", "-l", "app.kubernetes.io/part-of=quorum")
        assert not instance.kubectl("get", "crd", "-o", "name").stdout.count("podgroups.scheduling")

        async def all_running() -> bool:
            pods = (await core.list_namespaced_pod("ml")).items
            return len(pods) == 4 and all(p.status.phase == "Running" for p in pods)

        await eventually(all_running, timeout=60, what="every pod running without quorum")
        await apps.patch_namespaced_deployment_scale("held", "ml", {"spec": {"replicas": 4}})

        async def four_of_held() -> bool:
            dep = await apps.read_namespaced_deployment("held", "ml")
            return dep.status.available_replicas == 4

        await eventually(four_of_held, timeout=60, what="new pods created and running after the uninstall")
        assert await gated_anywhere(api) == []
        events = (await raw_json(core.list_namespaced_event("ml", _preload_content=False)))["items"]
        denied = [e["message"] for e in events if e["reason"] == "FailedCreate"]
        assert not denied, f"a pod creation was denied during the uninstall: {denied}"
