"""Reads beyond the watches, made rarely (once per object, cached by the caller)."""

from __future__ import annotations

from typing import Any

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


async def job(api: client.ApiClient, namespace: str, name: str) -> dict[str, Any] | None:
    """A Job as plain JSON; None if it is gone."""
    try:
        response: Any = await client.BatchV1Api(api).read_namespaced_job(
            name, namespace, _preload_content=False
        )
    except ApiException as err:
        if err.status == 404:
            return None
        raise
    data: dict[str, Any] = await response.json()
    return data
