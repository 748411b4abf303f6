"""A cluster that has scheduler-plugins' own `podgroups.scheduling.x-k8s.io` CRD: quorum's
install path (`kubectl create -f crds/scheduler-plugins/`) leaves it in place, and quorum admits
the gangs of its PodGroups without writing their status (scheduler-plugins' controller owns it);
the Gang object has quorum's story."""

from __future__ import annotations

import json
from collections.abc import Callable
from typing import Any

import pytest
import yaml
from kubernetes_asyncio import client

from devcluster.cluster import CRDS, Instance
from tests.integration.test_gangs import GANGS, get, pods
from tests.kube import api_client, create_namespace, eventually

pytestmark = pytest.mark.cluster

CRD = "podgroups.scheduling.x-k8s.io"
QUORUMS = CRDS / "scheduler-plugins" / "scheduling.x-k8s.io_podgroups.yaml"


def their_crd() -> dict[str, Any]:
    """scheduler-plugins' CRD as far as quorum can tell: the same API, not labelled as quorum's."""
    crd: dict[str, Any] = yaml.safe_load(QUORUMS.read_text())
    crd["metadata"]["labels"] = {"app.kubernetes.io/name": "scheduler-plugins"}
    return crd


def workers(name: str, group: str) -> dict[str, Any]:
    return {
        "apiVersion": "apps/v1",
        "kind": "Deployment",
        "metadata": {"name": name},
        "spec": {
            "replicas": 2,
            "selector": {"matchLabels": {"app": name}},
            "template": {
                "metadata": {"labels": {"app": name, "scheduling.x-k8s.io/pod-group": group}},
                "spec": {
                    "containers": [
                        {"name": "c", "image": "pause", "resources": {"limits": {"nvidia.com/gpu": "1"}}}
                    ]
                },
            },
        },
    }


async def test_their_podgroup_crd_stays_and_quorum_writes_none_of_its_status(
    start_instance: Callable[..., Instance],
) -> None:
    instance = start_instance("t-theircrd")
    instance.kubectl("delete", "crd", CRD)
    instance.kubectl("create", "-f", "-", input_text=json.dumps(their_crd()))
    instance.wait_established(f"crd/{CRD}")
    ours = instance.kubectl("create", "-f", str(CRDS / "scheduler-plugins"), check=False)
    assert ours.returncode != 0 and "AlreadyExists" in ours.stderr, ours.stderr
    labels = json.loads(instance.kubectl("get", "crd", CRD, "-o", "json").stdout)["metadata"]["labels"]
    assert labels == {"app.kubernetes.io/name": "scheduler-plugins"}
    # The operator learns whose CRD it is when it starts.
    instance.stop_component("quorum-operator")
    instance.start_component("quorum-operator")

    api = await api_client(instance.kubeconfig("admin"))
    async with api:
        await create_namespace(api, "team")
        await client.CustomObjectsApi(api).create_namespaced_custom_object(
            "scheduling.x-k8s.io",
            "v1alpha1",
            "team",
            "podgroups",
            {
                "apiVersion": "scheduling.x-k8s.io/v1alpha1",
                "kind": "PodGroup",
                "metadata": {"name": "g"},
                "spec": {"minMember": 2},
            },
        )
        await client.AppsV1Api(api).create_namespaced_deployment("team", workers("w", "g"))

        async def running() -> bool:
            found = await pods(api, "team", "app=w")
            return len(found) == 2 and all(p["status"].get("phase") == "Running" for p in found)

        await eventually(running, timeout=90, what="the gang released and Running")

        async def gang_running() -> dict[str, Any] | None:
            gang = await get(api, GANGS, "team", "xpg-g")
            return gang if gang and gang.get("status", {}).get("phase") == "Running" else None

        await eventually(gang_running, timeout=60, what="the Gang's status Running")
        group = await client.CustomObjectsApi(api).get_namespaced_custom_object(
            "scheduling.x-k8s.io", "v1alpha1", "team", "podgroups", "g"
        )
        assert "status" not in group or not group["status"], group.get("status")
