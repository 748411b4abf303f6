"""quorum's namespace enforces Pod Security `restricted`, and quorum's own pods meet it; the
NetworkPolicies are accepted by the apiserver. (The local control plane has no pod network, so
what the NetworkPolicies admit is not exercised here: their shape is tested in
tests/unit/test_install.py.)"""

from __future__ import annotations

import copy
import json
from typing import Any

import pytest
import yaml
from kubernetes_asyncio import client
from kubernetes_asyncio.client.exceptions import ApiException

from devcluster.cluster import Instance
from quorum.install import DEFAULT_NAMESPACE, render_files

pytestmark = pytest.mark.cluster


def pod_of(deployment: dict[str, Any]) -> dict[str, Any]:
    template = copy.deepcopy(deployment["spec"]["template"])
    template["metadata"]["name"] = f"{deployment['metadata']['name']}-dry-run"
    return {"apiVersion": "v1", "kind": "Pod", **template}


def deployments() -> list[dict[str, Any]]:
    docs = yaml.safe_load_all(
        render_files(["20-webhooks-deployment.yaml", "50-operator-deployment.yaml"], DEFAULT_NAMESPACE)
    )
    return [d for d in docs if d and d["kind"] == "Deployment"]


async def test_the_namespace_is_restricted_and_quorums_pods_pass(
    cluster: Instance, api: client.ApiClient
) -> None:
    cluster.kubectl(
        "apply",
        "-f",
        "-",
        input_text=render_files(["00-namespace.yaml", "60-network-policy.yaml"], DEFAULT_NAMESPACE),
    )
    core = client.CoreV1Api(api)
    found = deployments()
    assert {d["metadata"]["name"] for d in found} == {"quorum-webhooks", "quorum-operator"}
    for deployment in found:
        # Server-side dry run: every admission step runs, Pod Security included; nothing is stored.
        await core.create_namespaced_pod(DEFAULT_NAMESPACE, pod_of(deployment), dry_run="All")
    privileged = pod_of(found[0])
    privileged["spec"]["containers"][0]["securityContext"] = {"privileged": True}
    with pytest.raises(ApiException) as refused:
        await core.create_namespaced_pod(DEFAULT_NAMESPACE, privileged, dry_run="All")
    message = json.loads(refused.value.body)["message"]
    assert refused.value.status == 403 and 'violates PodSecurity "restricted:latest"' in message
    policies = await client.NetworkingV1Api(api).list_namespaced_network_policy(DEFAULT_NAMESPACE)
    assert {p.metadata.name for p in policies.items} == {"quorum-webhooks", "quorum-operator"}
