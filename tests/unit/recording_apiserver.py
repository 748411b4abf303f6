"""A fake apiserver over plain HTTP that records every request it is sent, and what RBAC would
decide it on: for tests that must know every call a client makes (tests/unit/test_operator_rbac.py).

It answers like an apiserver as far as the clients need (discovery, an in-memory object store,
list, watch streams held open, 404 for what is absent), without applying patches or checking
anything. Any client pointed at `kubeconfig` goes through it: kubernetes-asyncio's ApiClient and
kopf's own aiohttp client alike, so nothing inside a client has to be stubbed.
"""

from __future__ import annotations

import asyncio
import itertools
import threading
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import yaml
from aiohttp import web

JSON = dict[str, Any]

# (group, version) -> (plural, kind, namespaced, subresources): what discovery shows.
RESOURCES: dict[tuple[str, str], list[tuple[str, str, bool, tuple[str, ...]]]] = {
    ("", "v1"): [
        ("pods", "Pod", True, ("status", "eviction")),
        ("nodes", "Node", False, ("status",)),
        ("namespaces", "Namespace", False, ()),
        ("events", "Event", True, ()),
    ],
    ("apiextensions.k8s.io", "v1"): [("customresourcedefinitions", "CustomResourceDefinition", False, ())],
    ("coordination.k8s.io", "v1"): [("leases", "Lease", True, ())],
    ("events.k8s.io", "v1"): [("events", "Event", True, ())],
    ("apps", "v1"): [("statefulsets", "StatefulSet", True, ("status",))],
    ("batch", "v1"): [("jobs", "Job", True, ("status",))],
    ("resource.k8s.io", "v1"): [
        ("resourceslices", "ResourceSlice", False, ()),
        ("deviceclasses", "DeviceClass", False, ()),
        ("resourceclaims", "ResourceClaim", True, ("status", "binding")),
    ],
    ("policy", "v1"): [("poddisruptionbudgets", "PodDisruptionBudget", True, ("status",))],
    ("quorum.dev", "v1alpha1"): [("gangs", "Gang", True, ("status",))],
    ("scheduling.sigs.k8s.io", "v1alpha1"): [("podgroups", "PodGroup", True, ("status",))],
    ("scheduling.x-k8s.io", "v1alpha1"): [("podgroups", "PodGroup", True, ("status",))],
    ("scheduling.k8s.io", "v1alpha2"): [("podgroups", "PodGroup", True, ("status",))],
    ("scheduling.k8s.io", "v1beta1"): [("podgroups", "PodGroup", True, ("status",))],
    ("scheduling.k8s.io", "v1alpha3"): [
        ("podgroups", "PodGroup", True, ("status",)),
        ("compositepodgroups", "CompositePodGroup", True, ("status",)),
    ],
}
TOKEN_USER = "recorded-user"  # who the kubeconfig's token is, as a SelfSubjectReview answers
VERBS = ["create", "delete", "deletecollection", "get", "list", "patch", "update", "watch"]


@dataclass(frozen=True)
class Access:
    """What the apiserver's authorizer is asked about one request (its RequestInfo)."""

    verb: str
    group: str
    resource: str  # with the subresource: "gangs/status"
    namespace: str | None
    name: str | None


@dataclass(frozen=True)
class Request:
    method: str
    path: str
    query: tuple[tuple[str, str], ...]
    impersonate: str | None
    phase: str
    peer: tuple[str, int] | None = None  # the client's address and port: which connection

    @property
    def access(self) -> Access | None:
        return access_of(self.method, self.path, dict(self.query))


def access_of(method: str, path: str, query: dict[str, str]) -> Access | None:
    """The authorizer's attributes of a request, as the apiserver's RequestInfo resolver makes
    them; None for a non-resource path (discovery: /api, /apis, /apis/<group>/<version>, ...)."""
    parts = [p for p in path.split("/") if p]
    if parts[:2] == ["api", "v1"]:
        group, rest = "", parts[2:]
    elif parts[:1] == ["apis"] and len(parts) >= 3:
        group, rest = parts[1], parts[3:]
    else:
        return None
    if not rest:
        return None
    namespace = None
    if rest[0] == "namespaces" and len(rest) >= 3 and rest[2] not in ("status", "finalize"):
        namespace, rest = rest[1], rest[2:]  # else the Namespace itself, or its subresource
    resource, name, sub = rest[0], rest[1] if len(rest) > 1 else None, rest[2] if len(rest) > 2 else None
    if resource == "namespaces" and name is not None:
        namespace = name
    watching = query.get("watch", "").lower() in ("1", "t", "true")  # Go's strconv.ParseBool
    verb = {
        "GET": "watch" if watching else ("get" if name else "list"),
        "POST": "create",
        "PUT": "update",
        "PATCH": "patch",
        "DELETE": "delete" if name else "deletecollection",
    }[method]
    return Access(verb, group, f"{resource}/{sub}" if sub else resource, namespace, name)


@dataclass(frozen=True)
class Grant:
    """One (group, resource, verb) a rule grants; `namespace` None for a ClusterRoleBinding's,
    `names` None unless the rule has resourceNames."""

    group: str
    resource: str
    verb: str
    namespace: str | None
    names: frozenset[str] | None

    def allows(self, access: Access) -> bool:
        return (
            self.group in (access.group, "*")
            and self.resource in (access.resource, "*")
            and self.verb in (access.verb, "*")
            and (self.namespace is None or self.namespace == access.namespace)
            and (self.names is None or access.name in self.names)
        )


def names_service_account(subject: JSON, namespace: str, name: str) -> bool:
    """Whether a binding's subject is the ServiceAccount, by name or by a group it is in."""
    if subject["kind"] == "ServiceAccount":
        return bool(subject["name"] == name and subject.get("namespace") == namespace)
    if subject["kind"] == "User":
        return bool(subject["name"] == f"system:serviceaccount:{namespace}:{name}")
    groups = ("system:serviceaccounts", f"system:serviceaccounts:{namespace}", "system:authenticated")
    return bool(subject["kind"] == "Group" and subject["name"] in groups)


def grants(docs: Iterable[JSON], namespace: str, name: str) -> set[Grant]:
    """Everything RBAC objects `docs` grant the ServiceAccount `namespace`/`name`:
    ClusterRoleBindings cluster-wide, RoleBindings in their namespace."""
    docs = [d for d in docs if d]
    roles = {(d["kind"], d["metadata"].get("namespace"), d["metadata"]["name"]): d for d in docs}
    out: set[Grant] = set()
    for binding in docs:
        if binding["kind"] not in ("ClusterRoleBinding", "RoleBinding"):
            continue
        if not any(names_service_account(s, namespace, name) for s in binding.get("subjects") or []):
            continue
        where = binding["metadata"].get("namespace") if binding["kind"] == "RoleBinding" else None
        ref = binding["roleRef"]
        role = roles[(ref["kind"], None if ref["kind"] == "ClusterRole" else where, ref["name"])]
        for rule in role.get("rules") or []:
            names = frozenset(rule["resourceNames"]) if rule.get("resourceNames") else None
            for group in rule.get("apiGroups") or []:
                for resource in rule.get("resources") or []:
                    for verb in rule["verbs"]:
                        out.add(Grant(group, resource, verb, where, names))
    return out


def load_manifests(paths: Iterable[Path]) -> list[JSON]:
    return [d for p in paths for d in yaml.safe_load_all(p.read_text()) if d]


def _status(code: int, reason: str, message: str) -> web.Response:
    body = {"kind": "Status", "apiVersion": "v1", "status": "Failure", "reason": reason, "code": code}
    return web.json_response({**body, "message": message}, status=code)


class RecordingApiserver:
    """`with RecordingApiserver(tmp) as fake:` serves on 127.0.0.1 from a thread of its own (so
    that nothing it runs is part of the clients' event loop: kopf cancels every task it did not
    start when it stops); `fake.kubeconfig` is a kubeconfig for it (a token user); `fake.put`
    stores an object; `fake.requests` is every request made, tagged with `fake.phase` (and the
    client's address and port: which connection it came on)."""

    def __init__(self, directory: Path) -> None:
        self.directory = directory
        self.phase = ""
        self.requests: list[Request] = []
        self.objects: dict[tuple[str, str, str | None, str], JSON] = {}
        self.kubeconfig = directory / "kubeconfig"
        self._versions = itertools.count(100)
        self._loop = asyncio.new_event_loop()
        self._closing = asyncio.Event()
        self._runner: web.AppRunner | None = None
        self._thread = threading.Thread(
            target=self._loop.run_forever, name="recording-apiserver", daemon=True
        )

    def __enter__(self) -> RecordingApiserver:
        self._thread.start()
        port = asyncio.run_coroutine_threadsafe(self._start(), self._loop).result(timeout=10)
        self.kubeconfig.write_text(
            yaml.safe_dump(
                {
                    "apiVersion": "v1",
                    "kind": "Config",
                    "clusters": [{"name": "fake", "cluster": {"server": f"http://127.0.0.1:{port}"}}],
                    "users": [{"name": "u", "user": {"token": "recorded"}}],
                    "contexts": [{"name": "fake", "context": {"cluster": "fake", "user": "u"}}],
                    "current-context": "fake",
                }
            )
        )
        return self

    def __exit__(self, *exc: object) -> None:
        asyncio.run_coroutine_threadsafe(self._stop(), self._loop).result(timeout=10)
        self._loop.call_soon_threadsafe(self._loop.stop)
        self._thread.join(timeout=10)
        self._loop.close()

    async def _start(self) -> int:
        app = web.Application()
        app.router.add_route("*", "/{path:.*}", self.handle)
        self._runner = web.AppRunner(app, shutdown_timeout=1)
        await self._runner.setup()
        site = web.TCPSite(self._runner, "127.0.0.1", 0)
        await site.start()
        return int(self._runner.addresses[0][1])

    async def _stop(self) -> None:
        self._closing.set()
        assert self._runner is not None
        await self._runner.cleanup()

    def put(self, group: str, resource: str, obj: JSON) -> JSON:
        meta = obj.setdefault("metadata", {})
        meta.setdefault("uid", f"uid-{next(self._versions)}")
        meta["resourceVersion"] = str(next(self._versions))
        self.objects[(group, resource, meta.get("namespace"), meta["name"])] = obj
        return obj

    async def handle(self, request: web.Request) -> web.StreamResponse:
        impersonate = request.headers.get("Impersonate-User")
        query = tuple(sorted(request.query.items()))
        peer = request.transport.get_extra_info("peername") if request.transport is not None else None
        self.requests.append(
            Request(
                request.method, request.path, query, impersonate, self.phase, tuple(peer) if peer else None
            )
        )
        access = access_of(request.method, request.path, dict(request.query))
        if access is None:
            return self.discovery(request.path)
        resource = access.resource.partition("/")[0]  # a subresource is its object's
        key = (access.group, resource, access.namespace, access.name or "")
        if access.verb == "watch":
            stream = web.StreamResponse(headers={"Content-Type": "application/json"})
            await stream.prepare(request)
            await self._closing.wait()  # held open, as a quiet watch is, until the server stops
            return stream
        if access.verb == "list":  # in pages where the client asks for them (limit, continue)
            items = self.listing(access, request)
            start = int(request.query.get("continue") or 0)
            limit = int(request.query.get("limit") or 0) or len(items) or 1
            metadata: JSON = {"resourceVersion": "1"}
            if start + limit < len(items):
                metadata["continue"] = str(start + limit)
            return web.json_response({"metadata": metadata, "items": items[start : start + limit]})
        if access.verb == "create":
            body = await request.json()
            meta = body.setdefault("metadata", {})
            meta.setdefault("name", f"{meta.get('generateName', 'x')}{next(self._versions)}")
            if access.namespace:
                meta["namespace"] = access.namespace
            # The one create whose 409 the operator reads (ensure_pod_group); others create anew.
            if (
                resource == "podgroups"
                and (access.group, resource, access.namespace, meta["name"]) in self.objects
            ):
                return _status(409, "AlreadyExists", f"{resource} {meta['name']!r} already exists")
            if resource == "selfsubjectreviews":  # who the caller is: the kubeconfig's token user
                body["status"] = {"userInfo": {"username": impersonate or TOKEN_USER}}
            return web.json_response(self.put(access.group, resource, body), status=201)
        found = self.objects.get(key)
        if found is None:
            return _status(404, "NotFound", f"{resource} {access.name!r} not found")
        if access.verb == "update":
            found = self.put(access.group, resource, await request.json())
        elif access.verb == "delete":
            del self.objects[key]
        return web.json_response(found)

    def listing(self, access: Access, request: web.Request) -> list[JSON]:
        selector = request.query.get("labelSelector", "")
        key, _, value = selector.partition("=")
        out = []
        for (group, resource, namespace, _name), obj in self.objects.items():
            if (group, resource) != (access.group, access.resource):
                continue
            if access.namespace is not None and namespace != access.namespace:
                continue
            labels = obj["metadata"].get("labels") or {}
            if key and (key not in labels or (value and labels[key] != value)):
                continue
            out.append(obj)
        return out

    def discovery(self, path: str) -> web.Response:
        parts = [p for p in path.split("/") if p]
        if parts == ["api"]:
            return web.json_response({"kind": "APIVersions", "versions": ["v1"]})
        if parts == ["apis"]:
            groups = [
                {
                    "name": group,
                    "versions": [{"groupVersion": f"{group}/{version}", "version": version}],
                    "preferredVersion": {"groupVersion": f"{group}/{version}", "version": version},
                }
                for group, version in RESOURCES
                if group
            ]
            return web.json_response({"kind": "APIGroupList", "apiVersion": "v1", "groups": groups})
        if parts == ["version"]:
            return web.json_response({"major": "1", "minor": "36", "gitVersion": "v1.36.4"})
        group, version = (
            ("", "v1") if parts[:1] == ["api"] else (parts[1], parts[2] if len(parts) > 2 else "")
        )
        listed = RESOURCES.get((group, version))
        if listed is None:
            return _status(404, "NotFound", f"no API {path}")
        resources: list[JSON] = []
        for plural, kind, namespaced, subresources in listed:
            entry = {"name": plural, "singularName": kind.lower(), "namespaced": namespaced, "kind": kind}
            resources.append({**entry, "verbs": VERBS})
            resources += [
                {**entry, "name": f"{plural}/{s}", "verbs": ["get", "patch", "update"]} for s in subresources
            ]
        return web.json_response(
            {
                "kind": "APIResourceList",
                "groupVersion": f"{group}/{version}".lstrip("/"),
                "resources": resources,
            }
        )
