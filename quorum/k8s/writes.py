"""Every write quorum makes: the conditional release patch, Gang objects and their status, the
status of the group objects, and Events."""

from __future__ import annotations

import datetime
import json
import logging
import re
from collections.abc import Awaitable
from typing import Any

from kubernetes_asyncio import client
from kubernetes_asyncio.client.exceptions import ApiException

from quorum.core.gangs import GATE as GATE  # re-exported, as is RESERVED_TAINT
from quorum.core.gangs import RESERVED_TAINT as RESERVED_TAINT
from quorum.core.workloads import WAS_GROUP
from quorum.k8s.convert import pod_group_seen
from quorum.k8s.devices import DELETE_PROTECTION

log = logging.getLogger("quorum.k8s.writes")

GANG_GROUP, GANG_VERSION, GANG_PLURAL = "quorum.dev", "v1alpha1", "gangs"
MERGE = "application/merge-patch+json"
COMPONENT = "quorum-operator"


async def discard(call: Awaitable[Any]) -> None:
    """Make a write and skip turning its answer into a model (the hot writes' answers are not
    used; parsing them cost more than the rest of the release)."""
    response = await call
    body = await response.read()
    response.release()
    if not 200 <= response.status <= 299:  # unparsed answers are not checked by the client
        error = ApiException(status=response.status, reason=response.reason)
        error.body = body.decode(errors="replace")
        raise error


async def unless_gone(call: Awaitable[Any]) -> bool:
    """Make a write whose answer is not needed; False if the object is gone (404)."""
    try:
        await discard(call)
    except ApiException as err:
        if err.status == 404:
            return False
        raise
    return True


def now() -> str:
    return datetime.datetime.now(datetime.UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


REQUIRED = "requiredDuringSchedulingIgnoredDuringExecution"


def reserved_toleration(token: str) -> dict[str, str]:
    """What lets a preemptor's pods onto the nodes reserved for it (`quorum.operator.preemption`)."""
    return {"key": RESERVED_TAINT, "operator": "Equal", "value": token, "effect": "NoSchedule"}


def release_patch(
    pod: dict[str, Any], node: str | None, tolerate: str | None = None
) -> list[dict[str, Any]] | None:
    """The JSON patch that releases one pod onto a node: it applies only to this pod (uid) while
    quorum's gate is still where it was, removes that gate alone, and pins the pod to the node
    by name (`pin_to_node`); a preemptor's pod also gains the toleration of the taint that
    reserves its nodes (`tolerate`: the reservation's token). None when the gate is gone
    already."""
    spec = pod.get("spec") or {}
    gates = [g.get("name") for g in spec.get("schedulingGates") or []]
    if GATE not in gates:
        return None
    index = gates.index(GATE)
    ops: list[dict[str, Any]] = [
        {"op": "test", "path": "/metadata/uid", "value": pod["metadata"]["uid"]},
        {"op": "test", "path": f"/spec/schedulingGates/{index}/name", "value": GATE},
        {"op": "remove", "path": f"/spec/schedulingGates/{index}"},
    ]
    if node is None:  # released without a plan (a pod whose group can never exist)
        return ops
    ops += pin_to_node(spec, node)
    if tolerate is not None:
        toleration = reserved_toleration(tolerate)
        if spec.get("tolerations"):
            ops.append({"op": "add", "path": "/spec/tolerations/-", "value": toleration})
        else:
            ops.append({"op": "add", "path": "/spec/tolerations", "value": [toleration]})
    return ops


def pin_to_node(spec: dict[str, Any], node: str) -> list[dict[str, Any]]:
    """Required node affinity on the node's name (`matchFields` metadata.name In [node]), as the
    DaemonSet controller pins its pods: kube-scheduler's NodeAffinity PreFilter then evaluates
    that one node instead of filtering every node of the cluster for each pod. While the pod is
    gated, KEP-3838 lets required node affinity be set when there is none, and lets each of its
    existing terms gain requirements (terms are ORed: each one gets the pin); a term with no
    requirement at all matches no node and may not gain one, so it stays as it is."""
    pin: dict[str, Any] = {"key": "metadata.name", "operator": "In", "values": [node]}
    affinity = spec.get("affinity") or {}
    node_affinity = affinity.get("nodeAffinity") or {}
    terms = (node_affinity.get(REQUIRED) or {}).get("nodeSelectorTerms") or []
    pinned = {"nodeSelectorTerms": [{"matchFields": [pin]}]}
    if not terms:
        if not affinity:
            return [{"op": "add", "path": "/spec/affinity", "value": {"nodeAffinity": {REQUIRED: pinned}}}]
        if not node_affinity:
            return [{"op": "add", "path": "/spec/affinity/nodeAffinity", "value": {REQUIRED: pinned}}]
        return [{"op": "add", "path": f"/spec/affinity/nodeAffinity/{REQUIRED}", "value": pinned}]
    base = f"/spec/affinity/nodeAffinity/{REQUIRED}/nodeSelectorTerms"
    ops: list[dict[str, Any]] = []
    for i, term in enumerate(terms):
        if term.get("matchFields"):
            ops.append({"op": "add", "path": f"{base}/{i}/matchFields/-", "value": pin})
        elif term.get("matchExpressions"):
            ops.append({"op": "add", "path": f"{base}/{i}/matchFields", "value": [pin]})
    return ops


def pinned_node(spec: dict[str, Any]) -> str | None:
    """The node a released pod was pinned to (`pin_to_node`): the one name the `metadata.name`
    matchField of each of its required node-affinity terms allows; None if it is not pinned so."""
    affinity = (spec.get("affinity") or {}).get("nodeAffinity") or {}
    found: set[str] = set()
    for term in (affinity.get(REQUIRED) or {}).get("nodeSelectorTerms") or []:
        if not term.get("matchFields") and not term.get("matchExpressions"):
            continue  # matches no node
        pins = [
            {f["values"][0]}
            for f in term.get("matchFields") or []
            if f.get("key") == "metadata.name"
            and f.get("operator") == "In"
            and len(f.get("values") or []) == 1
        ]
        if not pins:
            return None  # the term allows nodes by other names
        found |= set.intersection(*pins)  # empty where the user's pin and quorum's differ
    return found.pop() if len(found) == 1 else None


async def release_pod(
    api: client.ApiClient, pod: dict[str, Any], node: str | None, tolerate: str | None = None
) -> bool:
    """Apply the release patch; False if the pod is gone, changed or already released."""
    ops = release_patch(pod, node, tolerate)
    if ops is None:
        return False
    meta = pod["metadata"]
    try:
        await discard(
            client.CoreV1Api(api).patch_namespaced_pod(
                meta["name"], meta["namespace"], ops, _preload_content=False
            )
        )
    except ApiException as err:
        if err.status in (404, 409, 422):  # gone, or a `test` failed: someone else acted first
            log.info("pod %s/%s not released: %s %s", meta["namespace"], meta["name"], err.reason, err.body)
            return False
        raise
    return True


async def allocate_claim(api: client.ApiClient, claim: dict[str, Any], status: dict[str, Any]) -> bool:
    """Allocate a DRA claim of a pod quorum releases: the finalizer kube-scheduler adds to the
    claims it allocates (the resourceclaim controller removes it once the claim is neither used
    nor allocated), then the status, on the claim's version (a claim allocated or changed
    meanwhile is left alone: False)."""
    meta = claim["metadata"]
    name, namespace = meta["name"], meta["namespace"]
    resource = client.ResourceV1Api(api)
    if (claim.get("status") or {}).get("allocation") is not None:
        return False
    version = meta.get("resourceVersion", "")
    try:
        if DELETE_PROTECTION not in (meta.get("finalizers") or []):
            ops: list[dict[str, Any]] = [
                {"op": "test", "path": "/metadata/uid", "value": meta["uid"]},
                {"op": "test", "path": "/metadata/resourceVersion", "value": version},
            ]
            if meta.get("finalizers"):
                ops.append({"op": "add", "path": "/metadata/finalizers/-", "value": DELETE_PROTECTION})
            else:
                ops.append({"op": "add", "path": "/metadata/finalizers", "value": [DELETE_PROTECTION]})
            patched: Any = await resource.patch_namespaced_resource_claim(
                name,
                namespace,
                ops,
                field_manager=COMPONENT,
                _content_type=JSON_PATCH,  # type: ignore[call-arg]
                _preload_content=False,
            )
            version = json.loads(await patched.read())["metadata"]["resourceVersion"]
        body = {"metadata": {"uid": meta["uid"], "resourceVersion": version}, "status": status}
        await discard(
            resource.patch_namespaced_resource_claim_status(
                name,
                namespace,
                body,
                field_manager=COMPONENT,
                _content_type=MERGE,  # type: ignore[call-arg]
                _preload_content=False,
            )
        )
    except ApiException as err:
        if err.status in (404, 409, 422):
            log.info("claim %s/%s not allocated: %s %s", namespace, name, err.reason, err.body)
            return False
        raise
    return True


async def get_gang(api: client.ApiClient, namespace: str, name: str) -> dict[str, Any] | None:
    try:
        obj: dict[str, Any] = await client.CustomObjectsApi(api).get_namespaced_custom_object(
            GANG_GROUP, GANG_VERSION, namespace, GANG_PLURAL, name
        )
    except ApiException as err:
        if err.status == 404:
            return None
        raise
    return obj


async def create_gang(
    api: client.ApiClient,
    namespace: str,
    name: str,
    spec: dict[str, Any],
    owner: dict[str, Any] | None,
    labels: dict[str, str] | None = None,
) -> dict[str, Any]:
    """Create a Gang; the existing one if it is there already."""
    body: dict[str, Any] = {
        "apiVersion": f"{GANG_GROUP}/{GANG_VERSION}",
        "kind": "Gang",
        "metadata": {
            "name": name,
            "namespace": namespace,
            "labels": {"app.kubernetes.io/managed-by": "quorum", **(labels or {})},
        },
        "spec": spec,
    }
    if owner is not None:
        body["metadata"]["ownerReferences"] = [owner]
    try:
        created: dict[str, Any] = await client.CustomObjectsApi(api).create_namespaced_custom_object(
            GANG_GROUP, GANG_VERSION, namespace, GANG_PLURAL, body
        )
    except ApiException as err:
        if err.status != 409:
            raise
        existing = await get_gang(api, namespace, name)
        assert existing is not None
        return existing
    return created


MANAGED_BY = {"app.kubernetes.io/managed-by": "quorum"}


def delegated_pod_group(
    namespace: str, name: str, version: str, min_count: int, owner: dict[str, Any]
) -> dict[str, Any]:
    """The Kubernetes PodGroup quorum makes for a gang kube-scheduler places (docs/placement.md)."""
    return {
        "apiVersion": f"{WAS_GROUP}/{version}",
        "kind": "PodGroup",
        "metadata": {
            "name": name,
            "namespace": namespace,
            "labels": dict(MANAGED_BY),
            "ownerReferences": [owner],
        },
        "spec": {"schedulingPolicy": {"gang": {"minCount": min_count}}},
    }


async def ensure_pod_group(
    api: client.ApiClient, namespace: str, name: str, version: str, min_count: int, owner: dict[str, Any]
) -> dict[str, Any]:
    custom = client.CustomObjectsApi(api)
    body = delegated_pod_group(namespace, name, version, min_count, owner)
    try:
        made: dict[str, Any] = await custom.create_namespaced_custom_object(
            WAS_GROUP, version, namespace, "podgroups", body
        )
        return made
    except ApiException as err:
        if err.status != 409:
            raise
    existing: dict[str, Any] = await custom.get_namespaced_custom_object(
        WAS_GROUP, version, namespace, "podgroups", name
    )
    if pod_group_seen(existing).left_as_is(min_count):
        return existing
    # minCount is mutable (a PodGroup resized live); the resourceVersion makes it this version's.
    patched: dict[str, Any] = await custom.patch_namespaced_custom_object(
        WAS_GROUP,
        version,
        namespace,
        "podgroups",
        name,
        {
            "metadata": {"resourceVersion": existing["metadata"]["resourceVersion"]},
            "spec": {"schedulingPolicy": {"gang": {"minCount": min_count}}},
        },
        _content_type=MERGE,  # type: ignore[call-arg]
    )
    return patched


async def patch_status(
    api: client.ApiClient,
    group: str,
    version: str,
    plural: str,
    namespace: str,
    name: str,
    status: dict[str, Any],
) -> bool:
    """Merge-patch the status of a custom object; False if it is gone."""
    return await unless_gone(
        client.CustomObjectsApi(api).patch_namespaced_custom_object_status(
            group,
            version,
            namespace,
            plural,
            name,
            {"status": status},
            _content_type=MERGE,  # type: ignore[call-arg]  # accepted; a dict body would go as JSON patch
            _preload_content=False,
        )
    )


async def apply_status(
    api: client.ApiClient,
    group: str,
    version: str,
    kind: str,
    plural: str,
    namespace: str,
    name: str,
    status: dict[str, Any],
) -> bool:
    """Server-side apply of the status fields quorum owns, as field manager `quorum-operator`:
    on an object that is not quorum's (a Kubernetes 1.36 PodGroup) this sets quorum's condition
    types and leaves the others' (kube-scheduler's `PodGroupScheduled`) as they are — the
    conditions list is a map keyed by type. False if the object is gone."""
    body = {
        "apiVersion": f"{group}/{version}",
        "kind": kind,
        "metadata": {"name": name, "namespace": namespace},
        "status": status,
    }
    return await unless_gone(
        client.CustomObjectsApi(api).patch_namespaced_custom_object_status(
            group,
            version,
            namespace,
            plural,
            name,
            body,
            field_manager=COMPONENT,
            force=True,
            _content_type="application/apply-patch+yaml",  # type: ignore[call-arg]  # JSON is YAML
            _preload_content=False,
        )
    )


async def patch_gang_status(
    api: client.ApiClient, namespace: str, name: str, status: dict[str, Any]
) -> str | None:
    """Merge-patch a Gang's status: the resourceVersion it was written at ("0" if the answer has
    none), None if the Gang is gone."""
    response = await client.CustomObjectsApi(api).patch_namespaced_custom_object_status(
        GANG_GROUP,
        GANG_VERSION,
        namespace,
        GANG_PLURAL,
        name,
        {"status": status},
        _content_type=MERGE,  # type: ignore[call-arg]
        _preload_content=False,
    )
    return await status_written(response)


async def status_written(response: Any, refused: type[Exception] | None = None) -> str | None:
    """The answer of a Gang status patch: the resourceVersion written at ("0" if the answer has
    none), None if the Gang is gone; a 422 raises `refused` where the caller gives one."""
    body = await response.read()
    response.release()
    if response.status == 404:
        return None
    if refused is not None and response.status == 422 and did_not_apply(body):
        raise refused(body.decode(errors="replace"))
    if not 200 <= response.status <= 299:
        error = ApiException(status=response.status, reason=response.reason)
        error.body = body.decode(errors="replace")
        raise error
    # A Gang's one resourceVersion is its metadata's (no other field of it has that name); a
    # search, not a parse: the answer of a large gang's decision is hundreds of kilobytes.
    found = RESOURCE_VERSION.search(body)
    return found.group(1).decode() if found else "0"


def did_not_apply(body: bytes) -> bool:
    """Whether a 422 is a JSON Patch that did not apply to the Gang as it is (a `test` that
    failed, or a path it lacks), not a value its schema refuses. The apiserver says neither
    which test nor why for the first ("the server rejected our request due to an error in our
    request", no details); the second names the Gang and each field (`details.causes`)."""
    try:
        details = json.loads(body).get("details") or {}
    except (ValueError, AttributeError):
        return False
    return isinstance(details, dict) and not details.get("causes")


RESOURCE_VERSION = re.compile(rb'"resourceVersion"\s*:\s*"([0-9]+)"')
JSON_PATCH = "application/json-patch+json"


class Superseded(Exception):
    """A conditional write of a Gang refused: it no longer holds the decision the write was
    made on (a JSON Patch `test` failed). Nothing was written."""


def conditional_status_patch(expect: dict[str, Any], fields: dict[str, Any]) -> list[dict[str, Any]]:
    """A JSON Patch of a Gang's status: `test` each of `expect` (a path under status -> its
    value), then set each of `fields`; a field set to null is removed, which RFC 6902 allows
    only where it exists, so `expect` must test a value under it."""
    ops: list[dict[str, Any]] = [
        {"op": "test", "path": f"/status/{path}", "value": value} for path, value in expect.items()
    ]
    for name, value in fields.items():
        if value is None:
            if not any(path.startswith(f"{name}/") and v is not None for path, v in expect.items()):
                raise ValueError(f"{name} is removed only where a test says it is there")
            ops.append({"op": "remove", "path": f"/status/{name}"})
        else:
            ops.append({"op": "add", "path": f"/status/{name}", "value": value})
    return ops


async def patch_gang_status_if(
    api: client.ApiClient, namespace: str, name: str, expect: dict[str, Any], fields: dict[str, Any]
) -> str | None:
    """Write `fields` of a Gang's status only if it holds `expect` (paths under status, e.g.
    `admission/attempt`), in one request: the resourceVersion written at, None if the Gang is
    gone; raises `Superseded` if a test failed (`did_not_apply`). A write the Gang's schema
    refuses is a 422 too, raised as the ApiException it is: a bug of ours, logged and counted as
    the gang's failure, never taken for another leader's decision."""
    response = await client.CustomObjectsApi(api).patch_namespaced_custom_object_status(
        GANG_GROUP,
        GANG_VERSION,
        namespace,
        GANG_PLURAL,
        name,
        conditional_status_patch(expect, fields),
        _content_type=JSON_PATCH,  # type: ignore[call-arg]
        _preload_content=False,
    )
    return await status_written(response, refused=Superseded)


async def patch_gang(api: client.ApiClient, namespace: str, name: str, patch: dict[str, Any]) -> bool:
    """A merge patch of a Gang (not its status); False if it is gone."""
    return await unless_gone(
        client.CustomObjectsApi(api).patch_namespaced_custom_object(
            GANG_GROUP,
            GANG_VERSION,
            namespace,
            GANG_PLURAL,
            name,
            patch,
            _content_type="application/merge-patch+json",  # type: ignore[call-arg]
            _preload_content=False,
        )
    )


async def delete_gang(api: client.ApiClient, namespace: str, name: str) -> None:
    try:
        await client.CustomObjectsApi(api).delete_namespaced_custom_object(
            GANG_GROUP, GANG_VERSION, namespace, GANG_PLURAL, name
        )
    except ApiException as err:
        if err.status != 404:
            raise


async def post_event(
    api: client.ApiClient,
    obj: dict[str, Any],
    reason: str,
    message: str,
    warning: bool = False,
    component: str = COMPONENT,
) -> None:
    """One Event on `obj` (a Gang, a group object or a pod), shown by `kubectl describe`."""
    meta = obj["metadata"]
    stamp = now()
    body = {
        "metadata": {"generateName": f"{meta['name']}.", "namespace": meta["namespace"]},
        "involvedObject": {
            "apiVersion": obj["apiVersion"],
            "kind": obj["kind"],
            "name": meta["name"],
            "namespace": meta["namespace"],
            "uid": meta.get("uid"),
        },
        "reason": reason,
        "message": message[:1024],
        "type": "Warning" if warning else "Normal",
        "source": {"component": component},
        "reportingComponent": component,
        "reportingInstance": component,
        "firstTimestamp": stamp,
        "lastTimestamp": stamp,
        "count": 1,
    }
    try:
        await discard(
            client.CoreV1Api(api).create_namespaced_event(meta["namespace"], body, _preload_content=False)  # type: ignore[arg-type]
        )
    except ApiException as err:
        log.warning("event %s on %s/%s not posted: %s", reason, meta["namespace"], meta["name"], err.reason)


async def delete_pod(api: client.ApiClient, pod: dict[str, Any], unchanged: bool = False) -> bool:
    """Delete exactly this pod (uid precondition, so a pod made again under the name survives;
    with `unchanged`, also its resourceVersion: a pod bound since it was read is not deleted);
    False if it is gone already, or changed."""
    meta = pod["metadata"]
    body: dict[str, Any] = {"preconditions": {"uid": meta["uid"]}}
    if unchanged and meta.get("resourceVersion"):
        body["preconditions"]["resourceVersion"] = meta["resourceVersion"]
    try:
        await client.CoreV1Api(api).delete_namespaced_pod(meta["name"], meta["namespace"], body=body)  # type: ignore[arg-type]
    except ApiException as err:
        if err.status in (404, 409):
            return False
        raise
    return True


def job_suspend_patch(uid: str, suspend: bool) -> list[dict[str, Any]]:
    """The JSON patch that suspends or resumes a Job: only this Job (uid), only spec.suspend."""
    return [
        {"op": "test", "path": "/metadata/uid", "value": uid},
        {"op": "add", "path": "/spec/suspend", "value": suspend},  # add replaces a member that exists
    ]


async def set_job_suspend(api: client.ApiClient, namespace: str, name: str, uid: str, suspend: bool) -> bool:
    """Suspend or resume one Job (uid-tested JSON patch); False if it is gone or was replaced."""
    ops = job_suspend_patch(uid, suspend)
    try:
        await client.BatchV1Api(api).patch_namespaced_job(name, namespace, ops)
    except ApiException as err:
        if err.status in (404, 409, 422):
            log.info(
                "Job %s/%s not %s: %s", namespace, name, "suspended" if suspend else "resumed", err.reason
            )
            return False
        raise
    return True


def taint_patch(node: dict[str, Any], token: str) -> list[dict[str, Any]] | None:
    """The JSON patch that adds the reservation taint `quorum.dev/reserved=<token>:NoSchedule`;
    None when the node has it already."""
    taints = (node.get("spec") or {}).get("taints") or []
    if any(t.get("key") == RESERVED_TAINT and t.get("value") == token for t in taints):
        return None
    taint = {"key": RESERVED_TAINT, "value": token, "effect": "NoSchedule"}
    if not taints:
        return [{"op": "add", "path": "/spec/taints", "value": [taint]}]
    return [
        {"op": "test", "path": "/spec/taints", "value": taints},  # nobody changed them meanwhile
        {"op": "add", "path": "/spec/taints/-", "value": taint},
    ]


def untaint_patch(node: dict[str, Any], token: str | None) -> list[dict[str, Any]] | None:
    """The JSON patch that removes the reservation taint with this token (None: any token);
    None when the node has none."""
    taints = (node.get("spec") or {}).get("taints") or []
    for i, t in enumerate(taints):
        if t.get("key") == RESERVED_TAINT and (token is None or t.get("value") == token):
            return [
                {"op": "test", "path": f"/spec/taints/{i}", "value": t},
                {"op": "remove", "path": f"/spec/taints/{i}"},
            ]
    return None


async def patch_node(api: client.ApiClient, node: dict[str, Any], ops: list[dict[str, Any]]) -> bool:
    """Apply a JSON patch to a node (its taints, its annotations); False if the node is gone or
    the patch's tests failed because it changed meanwhile (the caller reads it again and retries)."""
    try:
        await discard(client.CoreV1Api(api).patch_node(node["metadata"]["name"], ops, _preload_content=False))
    except ApiException as err:
        if err.status in (404, 409, 422):
            return False
        raise
    return True


async def mark_disruption_target(
    api: client.ApiClient, pod: dict[str, Any], reason: str, message: str, marked: bool = True
) -> bool:
    """Set the pod's `DisruptionTarget` condition (before it is deleted: a Job's podFailurePolicy
    reads it), or with `marked` False set it False (a preemption withdrawn: the pod stays);
    False if the pod is gone."""
    meta = pod["metadata"]
    condition = {
        "type": "DisruptionTarget",
        "status": "True" if marked else "False",
        "reason": reason,
        "message": message[:1024],
        "lastTransitionTime": now(),
    }
    body = {"status": {"conditions": [condition]}}
    return await unless_gone(
        client.CoreV1Api(api).patch_namespaced_pod_status(
            meta["name"], meta["namespace"], body, _preload_content=False
        )
    )
