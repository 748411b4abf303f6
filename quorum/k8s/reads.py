"""Reads beyond the watches, made rarely (once per object, cached by the caller), and the paged
listing both the watches and a new leader's listings use."""

from __future__ import annotations

import functools
from collections.abc import Awaitable, Callable
from typing import Any

import orjson
from kubernetes_asyncio import client
from kubernetes_asyncio.client.exceptions import ApiException

from quorum.core.gangs import GANG_LABEL

LIST_TIMEOUT_SECONDS = 120  # a list that takes longer is cut off and made again
# Objects per list request, as client-go's informers list. Parsing a whole listing in one piece
# costs about 17x its body while orjson holds its document: a relisting of 23,631 pods, a 57 MB
# body, took the operator's memory up by about a gigabyte (docs/benchmarks.md).
LIST_PAGE = 500


def raise_for_status(response: Any) -> None:
    """kubernetes-asyncio raises for an error answer only when it reads the body itself; a raw
    answer (`_preload_content=False`) of 403 or 404 must fail as an ApiException too, not be
    taken for a listing."""
    status = getattr(response, "status", 200)
    if not 200 <= status <= 299:
        raise ApiException(status=status, reason=getattr(response, "reason", None) or "error")


async def for_each_page(
    list_call: Callable[..., Awaitable[Any]], take: Callable[[list[dict[str, Any]]], None]
) -> str:
    """List what `list_call` lists, LIST_PAGE objects at a time, handing each page to `take` as
    soon as it is parsed; the listing's resourceVersion. A caller that keeps little of each object
    holds one page at a time. The pages are one consistent listing (the apiserver's continue
    token); a token that expired between pages fails with 410 Gone, and the caller lists again
    from the start, as after a watch's 410."""
    token: str | None = None
    while True:
        page_of = {"_continue": token} if token else {}
        response: Any = await list_call(
            limit=LIST_PAGE, _preload_content=False, _request_timeout=LIST_TIMEOUT_SECONDS, **page_of
        )
        raise_for_status(response)
        page = orjson.loads(await response.read())
        take(page.get("items") or [])
        metadata = page.get("metadata") or {}
        token = metadata.get("continue") or None
        if token is None:
            return str(metadata["resourceVersion"])


async def list_in_pages(list_call: Callable[..., Awaitable[Any]]) -> tuple[list[dict[str, Any]], str]:
    """Every object `list_call` lists, and the listing's resourceVersion (`for_each_page`)."""
    items: list[dict[str, Any]] = []
    version = await for_each_page(list_call, items.extend)
    return items, version


async def versions_in_pages(list_call: Callable[..., Awaitable[Any]]) -> dict[str, str]:
    """uid -> resourceVersion of every object `list_call` lists, one page held at a time."""
    versions: dict[str, str] = {}

    def take(page: list[dict[str, Any]]) -> None:
        for obj in page:
            meta = obj.get("metadata") or {}
            versions[str(meta.get("uid"))] = str(meta.get("resourceVersion") or "")

    await for_each_page(list_call, take)
    return versions


async def statefulset_pod_management(api: client.ApiClient, namespace: str, name: str) -> str | None:
    """`spec.podManagementPolicy` of a StatefulSet (OrderedReady when unset); None if it is gone."""
    try:
        sts = await client.AppsV1Api(api).read_namespaced_stateful_set(name, namespace)
    except ApiException as err:
        if err.status == 404:
            return None
        raise
    return str(sts.spec.pod_management_policy or "OrderedReady")


async def items_of(response: Any) -> list[dict[str, Any]]:
    """The items of a list made with `_preload_content=False`, as plain JSON (the client does not
    check an unparsed answer's status: an error is raised here)."""
    if not 200 <= getattr(response, "status", 200) <= 299:
        error = ApiException(status=response.status, reason=response.reason)
        error.body = await response.read()
        raise error
    items: list[dict[str, Any]] = (await response.json())["items"]
    return items


async def leases_named(api: client.ApiClient, name: str) -> list[dict[str, Any]]:
    """Every Lease of that name, in any namespace (a scheduler's leader election, say)."""
    response: Any = await client.CoordinationV1Api(api).list_lease_for_all_namespaces(
        field_selector=f"metadata.name={name}", _preload_content=False
    )
    return await items_of(response)


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


async def gang_pods(
    api: client.ApiClient, namespace: str | None, gang: str | None, *also: str
) -> list[dict[str, Any]]:
    """Pods carrying quorum's gang label: of one gang in one namespace (its label `gang`, or any
    of `also`), or all (plain JSON)."""
    core = client.CoreV1Api(api)
    if gang is None:
        selector = GANG_LABEL
    else:
        selector = f"{GANG_LABEL} in ({','.join((gang, *also))})" if also else f"{GANG_LABEL}={gang}"
    if namespace is None:  # every gang pod: a new leader's listing, as large as the cluster's gangs
        items, _ = await list_in_pages(
            functools.partial(core.list_pod_for_all_namespaces, label_selector=selector)
        )
        return items
    response = await core.list_namespaced_pod(namespace, label_selector=selector, _preload_content=False)
    return await items_of(response)


async def gang_pod_versions(api: client.ApiClient) -> dict[str, str]:
    """uid -> resourceVersion of every pod carrying quorum's gang label: what a new leader waits
    for its watches to show (`GangLoop.take_over`), listed without holding the pods."""
    core = client.CoreV1Api(api)
    return await versions_in_pages(
        functools.partial(core.list_pod_for_all_namespaces, label_selector=GANG_LABEL)
    )


async def resource_claim_versions(api: client.ApiClient) -> dict[str, str]:
    """uid -> resourceVersion of every DRA ResourceClaim (none where resource.k8s.io/v1 is not
    served), listed without holding the claims."""
    try:
        return await versions_in_pages(client.ResourceV1Api(api).list_resource_claim_for_all_namespaces)
    except ApiException as err:
        if err.status == 404:
            return {}
        raise


async def gangs(api: client.ApiClient) -> list[dict[str, Any]]:
    """Every Gang of the cluster, as plain JSON."""
    custom = client.CustomObjectsApi(api)
    items, _ = await list_in_pages(
        functools.partial(custom.list_cluster_custom_object, "quorum.dev", "v1alpha1", "gangs")
    )
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


async def served_versions(api: client.ApiClient, group: str) -> list[str]:
    """The versions of `group` the apiserver serves (discovery; [] where it serves none).
    Raises ApiException when discovery itself fails: "not served" is never guessed."""
    response: Any = await api.call_api(
        "/apis", "GET", auth_settings=["BearerToken"], _preload_content=False, _request_timeout=30
    )
    status = getattr(response, "status", 200)
    if status != 200:  # an apiserver starting up answers 403 before its RBAC is loaded
        raise ApiException(status=status, reason="API discovery failed")
    answer = await response.json()
    if not isinstance(answer, dict) or answer.get("kind") != "APIGroupList":
        raise ApiException(status=500, reason="API discovery answered something else than an APIGroupList")
    groups = answer.get("groups") or []
    return [str(v.get("version")) for g in groups if g.get("name") == group for v in g.get("versions") or []]


class ServedListing:
    """A cluster-wide list (and watch) of `plural` of `group` at the first of `versions` the
    apiserver serves, found by discovery before every (re)list; `on_version` hears each answer.
    Where none is served it answers 404, as the apiserver does for a CRD not installed: the
    watch (`quorum.k8s.watch`) lists it as empty and asks again every 30 s, so an API enabled
    later is picked up without a restart, and after a control-plane upgrade the failed watch
    relists at the version now served."""

    def __init__(
        self,
        api: client.ApiClient,
        group: str,
        plural: str,
        versions: tuple[str, ...],
        on_version: Callable[[str | None], None],
    ) -> None:
        self.api, self.group, self.plural, self.versions = api, group, plural, versions
        self.on_version = on_version
        self.version: str | None = None
        self.__name__ = f"{plural}.{group}"

    async def __call__(self, *args: Any, **kwargs: Any) -> Any:
        if not kwargs.get("watch") and not kwargs.get("_continue"):  # a new listing, not its next page
            served = await served_versions(self.api, self.group)
            self.version = next((v for v in self.versions if v in served), None)
            self.on_version(self.version)
        if self.version is None:
            raise ApiException(status=404, reason=f"{self.group} serves none of {', '.join(self.versions)}")
        return await client.CustomObjectsApi(self.api).list_cluster_custom_object(
            self.group, self.version, self.plural, *args, **kwargs
        )
