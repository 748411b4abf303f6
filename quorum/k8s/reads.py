"""Reads beyond the watches, made rarely (once per object, cached by the caller)."""

from __future__ import annotations

from collections.abc import Awaitable
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


async def json_unless_gone(call: Awaitable[Any]) -> dict[str, Any] | None:
    """The answer of a read made with `_preload_content=False`, as plain JSON; None if the object
    is gone (404)."""
    try:
        response: Any = await call
    except ApiException as err:
        if err.status == 404:
            return None
        raise
    data: dict[str, Any] = await response.json()
    return data


async def job(api: client.ApiClient, namespace: str, name: str) -> dict[str, Any] | None:
    """A Job as plain JSON; None if it is gone."""
    return await json_unless_gone(
        client.BatchV1Api(api).read_namespaced_job(name, namespace, _preload_content=False)
    )


async def gang_pods(api: client.ApiClient, namespace: str | None, gang: str | None) -> list[dict[str, Any]]:
    """Pods carrying quorum's gang label: of one gang in one namespace, or all (plain JSON)."""
    core = client.CoreV1Api(api)
    selector = "quorum.dev/gang" if gang is None else f"quorum.dev/gang={gang}"
    if namespace is None:
        response: Any = await core.list_pod_for_all_namespaces(
            label_selector=selector, _preload_content=False
        )
    else:
        response = await core.list_namespaced_pod(namespace, label_selector=selector, _preload_content=False)
    items: list[dict[str, Any]] = (await response.json())["items"]
    return items


async def crd_labels(api: client.ApiClient, name: str) -> dict[str, str] | None:
    """The labels of the CustomResourceDefinition `name`, None if it is not installed."""
    try:
        crd = await client.ApiextensionsV1Api(api).read_custom_resource_definition(name)
    except ApiException as err:
        if err.status == 404:
            return None
        raise
    return dict(crd.metadata.labels or {})


async def serves(api: client.ApiClient, group: str, version: str) -> bool:
    """Whether the apiserver serves `group/version` (discovery)."""
    try:
        groups = await client.ApisApi(api).get_api_versions()
    except ApiException:
        return False
    return any(g.name == group and any(v.version == version for v in g.versions) for g in groups.groups)
