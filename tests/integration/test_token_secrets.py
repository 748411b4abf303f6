"""quorum-token-secrets: no ServiceAccount token Secret is made in quorum's namespace, by anyone
(a stolen token of the chart's certificate hook, which may create Secrets there, must not mint a
long-lived token of quorum-operator); other Secrets there, and token Secrets elsewhere, are made."""

from __future__ import annotations

import pytest
from kubernetes_asyncio import client
from kubernetes_asyncio.client.exceptions import ApiException

from devcluster.cluster import Instance
from quorum.install import DEFAULT_NAMESPACE

pytestmark = pytest.mark.cluster


def token_secret(name: str, account: str) -> dict[str, object]:
    return {
        "metadata": {"name": name, "annotations": {"kubernetes.io/service-account.name": account}},
        "type": "kubernetes.io/service-account-token",
    }


async def test_no_token_secret_in_quorums_namespace(
    cluster: Instance, api: client.ApiClient, namespace: str
) -> None:
    core = client.CoreV1Api(api)
    with pytest.raises(ApiException) as refused:  # even system:masters
        await core.create_namespaced_secret(DEFAULT_NAMESPACE, token_secret("minted", "quorum-operator"))
    assert refused.value.status in (403, 422), refused.value
    assert "quorum-token-secrets" in str(refused.value.body), refused.value.body

    plain = await core.create_namespaced_secret(
        DEFAULT_NAMESPACE, {"metadata": {"name": "t-plain-secret"}, "stringData": {"k": "v"}}
    )
    assert plain.type == "Opaque"
    await core.delete_namespaced_secret("t-plain-secret", DEFAULT_NAMESPACE)

    elsewhere = await core.create_namespaced_secret(namespace, token_secret("tenant-token", "default"))
    assert elsewhere.type == "kubernetes.io/service-account-token"
