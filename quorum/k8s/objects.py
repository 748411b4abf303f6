"""quorum's own objects, by kind and name (`quorum.core.removal.Ref`): read, delete, patch; the
backstop probe; who the caller is. For `quorum uninstall` and `quorum certs ensure`, which act
on quorum's install rather than on tenants' workloads."""

from __future__ import annotations

import getpass
import json
from typing import Any

from kubernetes_asyncio import client
from kubernetes_asyncio.client.exceptions import ApiException

from quorum.core.removal import Kind, Ref

JSON = dict[str, Any]
JSON_PATCH = "application/json-patch+json"


def refusal(err: ApiException) -> str:
    """An apiserver's refusal in a line: status, reason and the Status's message (else the body)."""
    body = err.body
    raw = body.decode(errors="replace") if isinstance(body, bytes) else str(body or "")
    try:
        status = json.loads(raw)
    except ValueError:
        status = None
    message = str(status.get("message") or raw) if isinstance(status, dict) else raw
    return f"{err.status} {err.reason}: {message}".strip()


def path(
    kind: Kind, name: str | None = None, namespace: str | None = None, all_namespaces: bool = False
) -> str:
    base = f"/apis/{kind.group}/{kind.version}" if kind.group else f"/api/{kind.version}"
    if kind.namespaced and not all_namespaces:
        if namespace is None:
            raise ValueError(f"{kind.kind} is namespaced: name its namespace")
        base += f"/namespaces/{namespace}"
    base += f"/{kind.plural}"
    return f"{base}/{name}" if name else base


async def _call(
    api: client.ApiClient,
    method: str,
    url: str,
    query: list[tuple[str, str]] | None = None,
    body: Any = None,
    content_type: str = "application/json",
    fresh_connection: bool = False,
) -> JSON:
    """One request; its answer as JSON. Raises ApiException (status, reason, body) for any
    answer that is not 2xx. `fresh_connection`: on a connection of its own, closed after the
    answer (`Connection: close`), so that behind a load balancer it may reach another
    apiserver than the requests before it."""
    headers = {"Accept": "application/json", "Content-Type": content_type}
    if fresh_connection:
        headers["Connection"] = "close"
    response: Any = await api.call_api(
        url,
        method,
        query_params=query or [],
        header_params=headers,
        body=body,
        auth_settings=["BearerToken"],
        _preload_content=False,
        _request_timeout=30,
    )
    data = await response.read()
    status = getattr(response, "status", 200)
    if not 200 <= status <= 299:
        error = ApiException(status=status, reason=getattr(response, "reason", ""))
        error.body = data
        raise error
    answer: JSON = json.loads(data) if data else {}
    return answer


async def read(api: client.ApiClient, ref: Ref) -> JSON | None:
    """The object, None if it does not exist."""
    try:
        return await _call(api, "GET", path(ref.kind, ref.name, ref.namespace))
    except ApiException as err:
        if err.status == 404:
            return None
        raise


async def delete(api: client.ApiClient, ref: Ref, dry_run: bool = False) -> bool:
    """Delete the object (with `dry_run`, ask the apiserver whether it would: a server-side dry
    run, which changes nothing); False if it does not exist. Dependents go in the background
    (the garbage collector)."""
    query = [("dryRun", "All")] if dry_run else []
    try:
        await _call(api, "DELETE", path(ref.kind, ref.name, ref.namespace), query)
    except ApiException as err:
        if err.status == 404:
            return False
        raise
    return True


async def count(api: client.ApiClient, kind: Kind, page: int = 500) -> int:
    """How many objects of `kind` exist (in every namespace), without listing them: a list of
    one (`limit=1`) says how many more there are (`remainingItemCount`). Where it does not say
    (an apiserver may leave it out), the rest is counted page by page, `page` at a time."""
    where = path(kind, all_namespaces=True)
    listed = await _call(api, "GET", where, [("limit", "1")])
    total = len(listed.get("items") or [])
    meta = listed.get("metadata") or {}
    remaining, token = meta.get("remainingItemCount"), meta.get("continue")
    if isinstance(remaining, int) and not isinstance(remaining, bool):
        return total + remaining
    while token:
        listed = await _call(api, "GET", where, [("limit", str(page)), ("continue", str(token))])
        total += len(listed.get("items") or [])
        token = (listed.get("metadata") or {}).get("continue")
    return total


async def items(
    api: client.ApiClient,
    kind: Kind,
    field_selector: str | None = None,
    label_selector: str | None = None,
    namespace: str | None = None,
) -> list[JSON]:
    """The objects of `kind` (in every namespace, or in `namespace`), those `field_selector`
    and `label_selector` select if given (a list, for identities that may list but not get, as
    quorum's operator may nodes)."""
    query = [("fieldSelector", field_selector)] if field_selector else []
    if label_selector:
        query.append(("labelSelector", label_selector))
    where = path(kind, namespace=namespace, all_namespaces=namespace is None)
    listed = await _call(api, "GET", where, query)
    return list(listed.get("items") or [])


async def dry_run_create(
    api: client.ApiClient, kind: Kind, namespace: str | None, body: JSON, fresh_connection: bool = False
) -> JSON:
    """Create `body` with a server-side dry run (admission runs, nothing is stored): the object
    as admission left it; raises the apiserver's refusal as ApiException. `fresh_connection`: on
    a connection of its own (see `_call`)."""
    query = [("dryRun", "All")]
    return await _call(
        api, "POST", path(kind, None, namespace), query, body, fresh_connection=fresh_connection
    )


async def create(
    api: client.ApiClient, kind: Kind, namespace: str | None, body: JSON, dry_run: bool = False
) -> JSON:
    query = [("dryRun", "All")] if dry_run else None
    return await _call(api, "POST", path(kind, None, namespace), query, body)


async def replace(api: client.ApiClient, ref: Ref, body: JSON, dry_run: bool = False) -> JSON:
    """PUT: fails with 409 if `body`'s resourceVersion is not the stored one. `dry_run`: a
    server-side dry run (admission runs, nothing is stored)."""
    query = [("dryRun", "All")] if dry_run else None
    return await _call(api, "PUT", path(ref.kind, ref.name, ref.namespace), query, body)


async def json_patch(api: client.ApiClient, ref: Ref, ops: list[JSON], dry_run: bool = False) -> JSON:
    """`dry_run`: a server-side dry run (admission runs, nothing is stored)."""
    query = [("dryRun", "All")] if dry_run else None
    return await _call(api, "PATCH", path(ref.kind, ref.name, ref.namespace), query, ops, JSON_PATCH)


async def patch_would_apply(api: client.ApiClient, ref: Ref, ops: list[JSON]) -> bool:
    """Whether the apiserver would apply the JSON patch (a server-side dry run); False if the
    object is gone or its tests fail; raises the apiserver's refusal."""
    try:
        await json_patch(api, ref, ops, dry_run=True)
    except ApiException as err:
        if err.status in (404, 409, 422):
            return False
        raise
    return True


async def whoami(api: client.ApiClient) -> str:
    """The caller's username as the apiserver authenticates it (a SelfSubjectReview, which every
    authenticated identity may make)."""
    review = {"apiVersion": "authentication.k8s.io/v1", "kind": "SelfSubjectReview"}
    answer = await _call(api, "POST", "/apis/authentication.k8s.io/v1/selfsubjectreviews", None, review)
    return str(((answer.get("status") or {}).get("userInfo") or {}).get("username") or "")


async def caller_name(api: client.ApiClient) -> str:
    """Who the caller is, for a record (`by`): the apiserver's answer (`whoami`), else the local
    user name, else "" (a cluster that refuses SelfSubjectReviews, in an image whose uid has no
    passwd entry: getpass raises KeyError there). Call it on a client that impersonates nobody."""
    try:
        return await whoami(api)
    except ApiException:
        pass
    try:
        return getpass.getuser()
    except (KeyError, OSError, ImportError):
        return ""
