"""What the `quorum` command reads (`get`, `explain`, `version`), with the credentials of the
person running it, never the operator's: what they may read is all it shows them.

A read refused (403) raises `Forbidden`, which names what was refused; the commands then show
less (the recorded view of a gang, say) and say why.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

import orjson
from kubernetes_asyncio import client
from kubernetes_asyncio.client.exceptions import ApiException

from quorum.core.gangs import GROUP_APIS, PLACED_BY_LABEL, PLACED_BY_SLURM
from quorum.core.workloads import COMPOSITE_VERSIONS, POD_GROUP_VERSIONS, WAS_GROUP
from quorum.k8s import reads

JSON = dict[str, Any]
GANGS = ("quorum.dev", "v1alpha1", "gangs")
TIMEOUT = 30  # seconds a read may take
PAGE = 500  # objects one page of a cluster-wide list holds (limit/continue, as kubectl pages)


class Forbidden(RuntimeError):
    """The apiserver refused a read: `what` names it ("list nodes")."""

    def __init__(self, what: str) -> None:
        super().__init__(f"you may not {what}")
        self.what = what


async def _json(call: Any, what: str) -> JSON:
    """The answer of a read made with `_preload_content=False` (whose status the client does not
    check), as plain JSON; ApiException for a status other than 2xx, `Forbidden` for 403."""
    response: Any = await call
    body = await response.read()
    response.release()
    if response.status == 403:
        raise Forbidden(what)
    if not 200 <= response.status <= 299:
        error = ApiException(status=response.status, reason=response.reason)
        error.body = body.decode(errors="replace")
        raise error
    data: JSON = orjson.loads(body)
    return data


async def may(api: client.ApiClient, verb: str, resource: str, group: str = "", namespace: str = "") -> bool:
    """Whether the caller may `verb` `resource` (in `namespace`; "" is every namespace): a
    SelfSubjectAccessReview, which every authenticated user may make."""
    body = {
        "apiVersion": "authorization.k8s.io/v1",
        "kind": "SelfSubjectAccessReview",
        "spec": {
            "resourceAttributes": {"verb": verb, "resource": resource, "group": group, "namespace": namespace}
        },
    }
    answer = await _json(
        client.AuthorizationV1Api(api).create_self_subject_access_review(
            body,  # type: ignore[arg-type]
            _preload_content=False,
            _request_timeout=TIMEOUT,
        ),
        "create selfsubjectaccessreviews",
    )
    return bool((answer.get("status") or {}).get("allowed"))


async def gang(api: client.ApiClient, namespace: str, name: str) -> JSON | None:
    """One Gang; None if there is none of that name."""
    try:
        return await _json(
            client.CustomObjectsApi(api).get_namespaced_custom_object(
                *GANGS[:2], namespace, GANGS[2], name, _preload_content=False, _request_timeout=TIMEOUT
            ),
            f"get gangs.quorum.dev in namespace {namespace}",
        )
    except ApiException as err:
        if err.status == 404:
            return None
        raise


async def gangs(api: client.ApiClient, namespace: str | None) -> list[JSON]:
    """The Gangs of one namespace, or of all (None)."""
    custom = client.CustomObjectsApi(api)
    if namespace is None:
        call = custom.list_cluster_custom_object(*GANGS, _preload_content=False, _request_timeout=TIMEOUT)
        what = "list gangs.quorum.dev in every namespace"
    else:
        call = custom.list_namespaced_custom_object(
            *GANGS[:2], namespace, GANGS[2], _preload_content=False, _request_timeout=TIMEOUT
        )
        what = f"list gangs.quorum.dev in namespace {namespace}"
    items: list[JSON] = (await _json(call, what)).get("items") or []
    return items


async def events_about(api: client.ApiClient, namespace: str, uid: str) -> list[JSON]:
    """The Events (core v1) whose object has this uid."""
    call = client.CoreV1Api(api).list_namespaced_event(
        namespace,
        field_selector=f"involvedObject.uid={uid}",
        _preload_content=False,
        _request_timeout=TIMEOUT,
    )
    items: list[JSON] = (await _json(call, f"list events in namespace {namespace}")).get("items") or []
    return items


@dataclass
class ClusterObjects:
    """What quorum-operator watches, read once: enough to plan every gang as its next pass would."""

    nodes: list[JSON] = field(default_factory=list)
    pods: list[JSON] = field(default_factory=list)  # every pod of every namespace
    gangs: list[JSON] = field(default_factory=list)  # the Gangs quorum-operator plans (not Slurm's)
    groups: dict[str, list[JSON]] = field(default_factory=dict)  # API group -> its PodGroups
    composites: list[JSON] = field(default_factory=list)
    pdbs: list[JSON] = field(default_factory=list)
    pdbs_read: bool = True  # False: the caller may not list PodDisruptionBudgets
    pod_group_version: str | None = None  # of scheduling.k8s.io, where served
    composite_version: str | None = None
    # DRA (resource.k8s.io/v1; empty where not served): devices, their classes, claims.
    resource_slices: list[JSON] = field(default_factory=list)
    device_classes: list[JSON] = field(default_factory=list)
    resource_claims: list[JSON] = field(default_factory=list)


async def cluster_objects(api: client.ApiClient, found: ClusterObjects | None = None) -> ClusterObjects:
    """Every node, pod, Gang and group object, as the operator's watches list them, a page of
    `PAGE` at a time (one request for every pod of a large cluster would take the apiserver
    long to answer, and this process long to parse); `Forbidden` names the first the caller may
    not list. `found` is filled as the pages come, so a caller that gives up (its own time
    limit) can say how far it got."""
    core, custom = client.CoreV1Api(api), client.CustomObjectsApi(api)
    found = found if found is not None else ClusterObjects()
    await _pages(core.list_node, (), "list nodes", found.nodes)
    await _pages(core.list_pod_for_all_namespaces, (), "list pods in every namespace", found.pods)
    await _pages(
        custom.list_cluster_custom_object,
        GANGS,
        "list gangs.quorum.dev in every namespace",
        found.gangs,
        label_selector=f"{PLACED_BY_LABEL}!={PLACED_BY_SLURM}",
    )
    for group, version in GROUP_APIS.values():
        if group != WAS_GROUP:
            found.groups[group] = await _custom_items(custom, group, version, "podgroups", "PodGroup")
    served = await reads.served_versions(api, WAS_GROUP)
    found.pod_group_version = next((v for v in POD_GROUP_VERSIONS if v in served), None)
    found.composite_version = next((v for v in COMPOSITE_VERSIONS if v in served), None)
    if found.pod_group_version is not None:
        found.groups[WAS_GROUP] = await _custom_items(
            custom, WAS_GROUP, found.pod_group_version, "podgroups", "PodGroup"
        )
    if found.composite_version is not None:
        found.composites = await _custom_items(
            custom, WAS_GROUP, found.composite_version, "compositepodgroups", "CompositePodGroup"
        )
    try:
        await _pages(
            client.PolicyV1Api(api).list_pod_disruption_budget_for_all_namespaces,
            (),
            "list poddisruptionbudgets in every namespace",
            found.pdbs,
        )
    except Forbidden:
        found.pdbs = []
        found.pdbs_read = False
    resource = client.ResourceV1Api(api)
    for call, plural, into in (
        (resource.list_resource_slice, "resourceslices", found.resource_slices),
        (resource.list_device_class, "deviceclasses", found.device_classes),
        (resource.list_resource_claim_for_all_namespaces, "resourceclaims", found.resource_claims),
    ):
        try:
            await _pages(call, (), f"list {plural}.resource.k8s.io in every namespace", into)
        except ApiException as err:
            if err.status != 404:  # 404: DRA not served, nothing to count
                raise
    return found


async def _pages(
    call: Callable[..., Awaitable[Any]], args: Sequence[str], what: str, into: list[JSON], **kwargs: Any
) -> list[JSON]:
    """Every item of a list, `PAGE` at a time (the apiserver's `continue` token), appended to
    `into` as each page comes."""
    token = ""
    while True:
        more = {"_continue": token} if token else {}
        page = await _json(
            call(*args, limit=PAGE, _preload_content=False, _request_timeout=TIMEOUT, **kwargs, **more), what
        )
        into += page.get("items") or []
        token = (page.get("metadata") or {}).get("continue") or ""
        if not token:
            return into


async def _custom_items(
    custom: client.CustomObjectsApi, group: str, version: str, plural: str, kind: str
) -> list[JSON]:
    """Every object of a custom kind ([] where it is not installed), typed as a watch sees it."""
    try:
        items = await _pages(
            custom.list_cluster_custom_object,
            (group, version, plural),
            f"list {plural}.{group} in every namespace",
            [],
        )
    except ApiException as err:
        if err.status == 404:
            return []
        raise
    for item in items:
        item.setdefault("apiVersion", f"{group}/{version}")
        item.setdefault("kind", kind)
    return items


async def server_version(api: client.ApiClient) -> str:
    """The apiserver's Kubernetes version (gitVersion)."""
    answer = await _json(
        client.VersionApi(api).get_code(_preload_content=False, _request_timeout=10), "get /version"
    )
    return str(answer.get("gitVersion") or "unknown")


async def deployment(api: client.ApiClient, namespace: str, name: str) -> JSON | None:
    """A Deployment; None if there is none of that name."""
    try:
        return await _json(
            client.AppsV1Api(api).read_namespaced_deployment(
                name, namespace, _preload_content=False, _request_timeout=TIMEOUT
            ),
            f"get deployments in namespace {namespace}",
        )
    except ApiException as err:
        if err.status == 404:
            return None
        raise


async def crd_installed(api: client.ApiClient, name: str) -> bool:
    """Whether the CustomResourceDefinition `name` is installed."""
    try:
        return await reads.crd_labels(api, name) is not None
    except ApiException as err:
        if err.status == 403:
            raise Forbidden("get customresourcedefinitions") from None
        raise
