"""The identities of the local cluster are the ones of a real CKS cluster (docs/architecture.md)."""

from __future__ import annotations

import pytest
from kubernetes_asyncio import client

from devcluster.cluster import Instance
from tests.kube import api_client

pytestmark = pytest.mark.cluster


async def whoami(instance: Instance, who: str) -> tuple[str, set[str]]:
    api = await api_client(instance.kubeconfig(who))
    async with api:
        review = await client.AuthenticationV1Api(api).create_self_subject_review(
            {"apiVersion": "authentication.k8s.io/v1", "kind": "SelfSubjectReview"}
        )
        info = review.status.user_info
        return str(info.username), set(info.groups or [])


async def can_i(
    instance: Instance,
    who: str,
    verb: str,
    resource: str,
    group: str = "",
    namespace: str | None = None,
    subresource: str = "",
) -> bool:
    api = await api_client(instance.kubeconfig(who))
    async with api:
        attrs = {"verb": verb, "resource": resource, "group": group, "subresource": subresource}
        if namespace:
            attrs["namespace"] = namespace
        review = await client.AuthorizationV1Api(api).create_self_subject_access_review(
            {"spec": {"resourceAttributes": attrs}}
        )
        return bool(review.status.allowed)


async def test_admin_is_system_masters(cluster: Instance) -> None:
    user, groups = await whoami(cluster, "admin")
    assert "system:masters" in groups, (user, groups)


async def test_customer_is_cluster_admin_by_rbac_not_system_masters(cluster: Instance) -> None:
    user, groups = await whoami(cluster, "customer")
    assert user == "customer@example.com"
    assert "system:masters" not in groups
    assert "quorum:customers" in groups
    assert await can_i(cluster, "customer", "create", "deployments", "apps", "default")
    assert await can_i(cluster, "customer", "*", "*", "*")


async def test_platform_identity_registers_nodes_and_nothing_else(cluster: Instance) -> None:
    user, groups = await whoami(cluster, "platform")
    assert user == "quorum:node-lifecycle"
    assert "system:masters" not in groups
    assert await can_i(cluster, "platform", "create", "nodes")
    assert await can_i(cluster, "platform", "patch", "nodes")
    assert not await can_i(cluster, "platform", "create", "pods", namespace="default")


async def test_operator_runs_with_its_service_account_token(cluster: Instance) -> None:
    """quorum runs locally with exactly the rights of manifests/: its own ServiceAccount."""
    user, groups = await whoami(cluster, "quorum-operator")
    assert user == "system:serviceaccount:quorum-system:quorum-operator"
    assert "system:masters" not in groups
    assert await can_i(cluster, "quorum-operator", "patch", "pods", namespace="default")
    assert await can_i(cluster, "quorum-operator", "watch", "nodes")
    assert await can_i(
        cluster,
        "quorum-operator",
        "patch",
        "podgroups",
        "scheduling.sigs.k8s.io",
        "default",
        subresource="status",
    )
    # It reads users' PodGroups and writes only their status; of Kubernetes' own it may make and
    # resize those of gangs kube-scheduler places (RBAC; quorum-operator-podgroup-fence narrows it
    # to its own: test_operator_rights.py), and delete none.
    assert not await can_i(cluster, "quorum-operator", "patch", "podgroups", "scheduling.x-k8s.io", "default")
    assert await can_i(cluster, "quorum-operator", "patch", "podgroups", "scheduling.k8s.io", "default")
    assert not await can_i(cluster, "quorum-operator", "delete", "podgroups", "scheduling.k8s.io", "default")
    assert await can_i(cluster, "quorum-operator", "update", "leases", "coordination.k8s.io", "quorum-system")
    assert not await can_i(cluster, "quorum-operator", "update", "leases", "coordination.k8s.io", "default")
    assert not await can_i(cluster, "quorum-operator", "create", "nodes")
    assert not await can_i(cluster, "quorum-operator", "get", "secrets", namespace="default")
    assert not await can_i(cluster, "quorum-operator", "create", "pods", namespace="default")
