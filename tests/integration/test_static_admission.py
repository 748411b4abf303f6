"""quorum's fences a CKS customer cannot remove (docs/threat-model.md, "Fences a customer cannot
remove"): on Kubernetes 1.37 the apiserver loads quorum's self-protection from its disk
(manifest-based admission configuration), so the customer, cluster-admin by RBAC, can neither
delete those policies (they are not API objects) nor use its RBAC to take quorum's install
apart. Tried as the customer, on the real control plane."""

from __future__ import annotations

import json
from collections.abc import Awaitable, Callable
from typing import Any

import pytest
from kubernetes_asyncio import client
from kubernetes_asyncio.client.exceptions import ApiException

from devcluster.cluster import Instance
from quorum.install import STATIC_SUFFIX
from tests.integration.test_tenants import RESERVED, bare_pod
from tests.kube import WorkloadApi, api_client, create_namespace

pytestmark = pytest.mark.cluster


async def refused(attempt: Awaitable[Any]) -> str:
    with pytest.raises(ApiException) as err:
        await attempt
    assert err.value.status in (403, 422), (err.value.status, err.value.body)
    return str(json.loads(err.value.body)["message"])


async def test_a_customer_cannot_take_quorums_install_apart(
    api: client.ApiClient, customer_api: client.ApiClient
) -> None:
    if (await WorkloadApi.of(api)).legacy:
        pytest.skip("the local 1.36 plane does not load policies from disk (docs/threat-model.md)")
    admission = client.AdmissionregistrationV1Api(customer_api)
    crds = client.ApiextensionsV1Api(customer_api)
    core, rbac = client.CoreV1Api(customer_api), client.RbacAuthorizationV1Api(customer_api)
    apps = client.AppsV1Api(customer_api)
    label = {"metadata": {"labels": {"owned-by": "customer"}}}
    deployment = {
        "metadata": {"name": "evil"},
        "spec": {
            "selector": {"matchLabels": {"app": "evil"}},
            "template": {
                "metadata": {"labels": {"app": "evil"}},
                "spec": {"containers": [{"name": "c", "image": "registry.k8s.io/pause:3.10"}]},
            },
        },
    }
    leader_lease = {
        "metadata": {"name": "quorum-operator"},
        "spec": {"holderIdentity": "x", "leaseDurationSeconds": 2147483647},
    }
    attempts: list[tuple[str, Callable[[], Awaitable[Any]]]] = [
        (
            "delete its validating webhooks",
            lambda: admission.delete_validating_webhook_configuration("quorum-webhooks"),
        ),
        (
            "delete its mutating webhooks",
            lambda: admission.delete_mutating_webhook_configuration("quorum-webhooks"),
        ),
        (
            "change its webhooks",
            lambda: admission.patch_validating_webhook_configuration("quorum-webhooks", label),
        ),
        ("delete a fence", lambda: admission.delete_validating_admission_policy("quorum-records")),
        (
            "unbind a fence",
            lambda: admission.delete_validating_admission_policy_binding("quorum-gang-backstop"),
        ),
        ("change its CRD", lambda: crds.patch_custom_resource_definition("gangs.quorum.dev", label)),
        ("delete its CRD", lambda: crds.delete_custom_resource_definition("gangs.quorum.dev")),
        ("delete its namespace", lambda: core.delete_namespace("quorum-system")),
        ("unbind its rights", lambda: rbac.delete_cluster_role_binding("quorum-operator")),
        (
            "delete its ServiceAccount",
            lambda: core.delete_namespaced_service_account("quorum-operator", "quorum-system"),
        ),
        (
            "run something in its namespace",
            lambda: apps.create_namespaced_deployment("quorum-system", deployment),
        ),
        (  # Leases in its namespace are exempt, but not the one that says which replica acts
            "hold its leader Lease for ever",
            lambda: client.CoordinationV1Api(customer_api).create_namespaced_lease(
                "quorum-system", leader_lease
            ),
        ),
    ]
    for what, attempt in attempts:
        message = await refused(attempt())
        assert f"{STATIC_SUFFIX}" in message and "only the platform" in message, (what, message)

    # The policies themselves are not API objects: nothing to see, delete, or forge.
    names = [p.metadata.name for p in (await admission.list_validating_admission_policy()).items]
    assert not [n for n in names if n.endswith(STATIC_SUFFIX)], names
    forged = {
        "metadata": {"name": f"quorum-install{STATIC_SUFFIX}"},
        "spec": {"policyName": "x", "validationActions": ["Deny"]},
    }
    assert "static.k8s.io" in await refused(admission.create_validating_admission_policy_binding(forged))

    # What is not quorum's stays the customer's; the platform (system:masters) may still change quorum's.
    role = {
        "metadata": {"name": "customer-reader"},
        "rules": [{"apiGroups": [""], "resources": ["pods"], "verbs": ["get"]}],
    }
    await rbac.create_cluster_role(role)
    await rbac.delete_cluster_role("customer-reader")
    platform = client.AdmissionregistrationV1Api(api)
    await platform.patch_validating_webhook_configuration("quorum-webhooks", label)
    unlabel = {"metadata": {"labels": {"owned-by": None}}}
    await platform.patch_validating_webhook_configuration("quorum-webhooks", unlabel)


@pytest.mark.parametrize("kubernetes", ["1.37", "1.36"])
async def test_with_every_fence_on_disk_they_hold_and_none_is_an_api_object(
    start_instance: Callable[..., Instance], kubernetes: str
) -> None:
    """`static_admission="all"` (what `quorum manifests --static-admission DIR` writes): the
    protective policies are loaded from disk only; the customer finds none of them to delete,
    and they refuse what they refused as API objects. On 1.36 too, with the alpha gate
    `ManifestBasedAdmissionControlConfig` on."""
    name = "t-static" if kubernetes == "1.37" else "t-static-136"
    instance = start_instance(name, kubernetes=kubernetes, static_admission="all")
    admin = await api_client(instance.kubeconfig("admin"))
    customer = await api_client(instance.kubeconfig("customer"))
    async with admin, customer:
        names = [
            p.metadata.name
            for p in (
                await client.AdmissionregistrationV1Api(customer).list_validating_admission_policy()
            ).items
        ]
        # quorum-gang-pods-warnings only warns (it fences nothing): it stays an API object.
        assert not [n for n in names if n.startswith("quorum-") and n != "quorum-gang-pods-warnings"], (
            f"quorum's fences are not API objects: {names}"
        )
        await create_namespace(admin, "static")

        class AnyNode:
            @staticmethod
            def pod_spec() -> dict[str, Any]:
                return {"tolerations": []}

        pod = bare_pod("reserved", AnyNode(), [RESERVED])
        message = await refused(client.CoreV1Api(customer).create_namespaced_pod("static", pod))
        assert (
            "quorum-reserved-tolerations" in message
            and f"quorum-reserved-tolerations{STATIC_SUFFIX}" in message
        )
        admission = client.AdmissionregistrationV1Api(customer)
        message = await refused(admission.delete_validating_webhook_configuration("quorum-webhooks"))
        assert STATIC_SUFFIX in message and "only the platform" in message, message
