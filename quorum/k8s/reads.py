"""Reads beyond the watches, made rarely (once per object, cached by the caller)."""

from __future__ import annotations

from kubernetes_asyncio import client
from kubernetes_asyncio.client.exceptions import ApiException


async def statefulset_pod_management(api: client.ApiClient, namespace: str, name: str) -> str | None:
    """`spec.podManagementPolicy` of a StatefulSet (OrderedReady when unset); None if it is gone."""
    try:
        sts = await client.AppsV1Api(api).read_namespaced_stateful_set(name, namespace)
    except ApiException as err:
        if err.status == 404:
            return None
        raise
    return str(sts.spec.pod_management_policy or "OrderedReady")
