"""quorum's RBAC grants the operator exactly what its code calls, and the webhook server nothing.

What the code calls is recorded, not written down: a fake apiserver
(tests/unit/recording_apiserver.py) records every request, and RBAC's attributes of each (verb,
group, resource[/subresource], namespace), while

- the operator runs: kopf.operator with quorum's registered handlers and main.py's arguments
  (so kopf's own calls are in: discovery, and its watch of CRDs), quorum's start-up reads, every
  watch listing, the leader election until the Lease has been renewed, the scheduling loop;
- every `LiveApi` method is called (the loop's every write and read goes through one);
- `quorum release` runs, impersonating the operator, for one gang and for all.

Why a new API call cannot slip by: every place in quorum/k8s and quorum/operator that names a
kubernetes-asyncio API method (a call, or a method handed to a watch), a LeaseLock or
ApiClient.call_api is found from the source (AST), and the test fails unless that line ran
during the recording (traced with sys.settrace). A new call is either recorded, and then must
be granted, or was not run, and the test says where it is. A new `LiveApi` method fails the
test until it is called here. The comparison goes both ways: a grant that no recorded request
needs fails too.
"""

from __future__ import annotations

import ast
import asyncio
import gc
import inspect
import sys
import time
from collections import defaultdict
from collections.abc import Awaitable, Callable, Iterator
from dataclasses import dataclass
from functools import partial
from pathlib import Path
from types import FrameType, SimpleNamespace
from typing import Any

import kopf
import pytest
from kubernetes_asyncio import client
from kubernetes_asyncio.config import kube_config

from quorum.install import (
    DEFAULT_NAMESPACE,
    OPERATOR_SERVICE_ACCOUNT,
    WEBHOOKS_SERVICE_ACCOUNT,
    operator_username,
)
from quorum.k8s.api import KubeApi, LiveApi
from quorum.k8s.client import api_client
from quorum.k8s.writes import GANG_GROUP, GANG_PLURAL, GANG_VERSION
from quorum.operator.gangs import GROUP_APIS
from tests.unit.recording_apiserver import (
    Access,
    Grant,
    RecordingApiserver,
    Request,
    access_of,
    grants,
    load_manifests,
)

REPO = Path(__file__).resolve().parents[2]
MANIFESTS = sorted((REPO / "manifests").glob("*.yaml"))
# The `quorum` command's calls (get, explain and version read with the caller's own
# credentials; uninstall and certs ensure act on quorum's own objects), never the operator's:
# not the operator's code.
COMMAND_CODE = {REPO / "quorum" / "k8s" / "command_reads.py", REPO / "quorum" / "k8s" / "objects.py"}
OPERATOR_CODE = [
    p
    for p in sorted((REPO / "quorum" / "k8s").glob("*.py"))
    + sorted((REPO / "quorum" / "operator").glob("*.py"))
    if p not in COMMAND_CODE
]
# Other kubernetes-asyncio names that make API calls: a class that makes its own (recorded too),
# and the ApiClient's method for a request to any path.
CALLING_NAMES = frozenset({"LeaseLock", "BoundedLeaseLock", "call_api"})
# What kopf.run is given in quorum/operator/main.py; the recording runs kopf the same way.
KOPF_RUN = {"standalone": True, "clusterwide": True}
# Non-resource paths: discovery, which the default ClusterRole system:discovery grants every
# authenticated user; quorum's manifests grant none.
DISCOVERY_PATHS = ("/api", "/api/v1", "/apis", "/version")
JSON = dict[str, Any]


def api_method_names() -> frozenset[str]:
    """Every method of every kubernetes-asyncio API class (CoreV1Api.list_node, ...)."""
    names: set[str] = set()
    for attr in dir(client):
        cls = getattr(client, attr)
        if isinstance(cls, type) and cls.__module__.startswith("kubernetes_asyncio.client.api."):
            names |= {n for n, v in vars(cls).items() if callable(v) and not n.startswith("_")}
    return frozenset(names)


@dataclass(frozen=True)
class Site:
    path: Path
    line: int
    end_line: int
    name: str

    def __str__(self) -> str:
        path = self.path.relative_to(REPO) if self.path.is_relative_to(REPO) else self.path
        return f"{path}:{self.line} ({self.name})"


def api_sites(paths: list[Path]) -> list[Site]:
    """Every place in `paths` that names a kubernetes-asyncio API method or a calling class."""
    methods = api_method_names() | CALLING_NAMES
    sites = []
    for path in paths:
        tree = ast.parse(path.read_text())
        # A class named as a base (class BoundedLeaseLock(LeaseLock)) makes no call there; the
        # subclass is checked where it is called.
        bases = {id(b) for c in ast.walk(tree) if isinstance(c, ast.ClassDef) for b in c.bases}
        for node in ast.walk(tree):
            name = node.attr if isinstance(node, ast.Attribute) else getattr(node, "id", None)
            if isinstance(node, ast.Attribute | ast.Name) and name in methods and id(node) not in bases:
                sites.append(Site(path, node.lineno, node.end_lineno or node.lineno, str(name)))
    return sites


class LineTrace:
    """The lines of `files` that run while it is entered (this thread)."""

    def __init__(self, files: list[Path]) -> None:
        self.files = {str(f) for f in files}
        self.lines: dict[str, set[int]] = defaultdict(set)

    def __enter__(self) -> LineTrace:
        self.previous = sys.gettrace()
        sys.settrace(self.enter)
        return self

    def __exit__(self, *exc: object) -> None:
        sys.settrace(self.previous)

    def enter(self, frame: FrameType, event: str, arg: object) -> Any:
        if frame.f_code.co_filename not in self.files:
            return None
        self.lines[frame.f_code.co_filename].add(frame.f_lineno)
        return self.line

    def line(self, frame: FrameType, event: str, arg: object) -> Any:
        if event == "line":
            self.lines[frame.f_code.co_filename].add(frame.f_lineno)
        return self.line

    def ran(self, site: Site) -> bool:
        return any(site.line <= n <= site.end_line for n in self.lines[str(site.path)])


# -- the objects the fake apiserver holds -----------------------------------------------------

CONTAINERS = [{"name": "c", "image": "registry.k8s.io/pause:3.10"}]


def gang_pod(namespace: str, name: str, gang: str) -> JSON:
    return {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": name, "namespace": namespace, "labels": {"quorum.dev/gang": gang}},
        "spec": {"containers": CONTAINERS, "schedulingGates": [{"name": "quorum.dev/gang"}]},
    }


def seed(fake: RecordingApiserver) -> None:
    for group, version in GROUP_APIS.values():
        fake.put(
            "apiextensions.k8s.io",
            "customresourcedefinitions",
            {
                "metadata": {"name": f"podgroups.{group}", "labels": {"app.kubernetes.io/part-of": "quorum"}},
                "spec": {
                    "group": group,
                    "names": {"kind": "PodGroup", "plural": "podgroups"},
                    "scope": "Namespaced",
                    "versions": [{"name": version, "served": True, "storage": True}],
                },
            },
        )
        meta = {"name": "pg", "namespace": "ml"}
        fake.put(
            group, "podgroups", {"apiVersion": f"{group}/{version}", "kind": "PodGroup", "metadata": meta}
        )
    template = {"metadata": {"labels": {"app": "a"}}, "spec": {"containers": CONTAINERS}}
    fake.put(
        "batch", "jobs", {"metadata": {"name": "train", "namespace": "ml"}, "spec": {"template": template}}
    )
    fake.put(
        "apps",
        "statefulsets",
        {
            "metadata": {"name": "db", "namespace": "ml"},
            "spec": {"selector": {"matchLabels": {"app": "a"}}, "serviceName": "db", "template": template},
        },
    )
    fake.put("", "pods", gang_pod("ml", "p-0", "g"))
    fake.put("", "pods", gang_pod("ml", "victim", "v"))  # a preemption deletes it
    fake.put("resource.k8s.io", "resourceclaims", {"metadata": {"name": "p-0-gpus", "namespace": "ml"}})
    fake.put("", "nodes", {"metadata": {"name": "node-1"}, "spec": {}})
    fake.put("", "pods", gang_pod("team", "q-0", "h"))  # a gang without a Gang object
    gang = {
        "apiVersion": f"{GANG_GROUP}/{GANG_VERSION}",
        "kind": "Gang",
        "metadata": {"name": "g", "namespace": "ml"},
    }
    fake.put(GANG_GROUP, GANG_PLURAL, gang)


def live_calls(live: LiveApi, fake: RecordingApiserver) -> dict[str, list[Callable[[], Awaitable[object]]]]:
    """Each LiveApi method, called as the operator calls it (the group objects' status as
    quorum/operator/status.py writes it: merge patch on v1alpha1, apply on Kubernetes' own, each version)."""
    pod = fake.objects[("", "pods", "ml", "p-0")]
    gang = fake.objects[(GANG_GROUP, GANG_PLURAL, "ml", "g")]
    uid = fake.objects[("batch", "jobs", "ml", "train")]["metadata"]["uid"]
    owner = {"apiVersion": "quorum.dev/v1alpha1", "kind": "Gang", "name": "g", "uid": "gang-uid"}
    groups = [(g, v) for g, v in GROUP_APIS.values()] + [
        ("scheduling.k8s.io", v) for v in ("v1alpha2", "v1alpha3")
    ]
    victim = fake.objects[("", "pods", "ml", "victim")]
    claim = fake.objects[("resource.k8s.io", "resourceclaims", "ml", "p-0-gpus")]
    node = fake.objects[("", "nodes", None, "node-1")]
    reserved = {"key": "quorum.dev/reserved", "value": "t0k3n", "effect": "NoSchedule"}
    tainted = {**node, "spec": {"taints": [reserved]}}
    return {
        "release_pod": [lambda: live.release_pod(pod, "node-1"), lambda: live.release_pod(pod, None)],
        "create_gang": [lambda: live.create_gang("ml", "new", {"minMember": 2}, None)],
        "patch_gang": [lambda: live.patch_gang("ml", "g", {"spec": {"minMember": 3}})],
        "delete_gang": [lambda: live.delete_gang("ml", "new")],
        # made, then found made (409) at another size: read and resized
        "ensure_pod_group": [
            lambda: live.ensure_pod_group("ml", "pg-new", "v1beta1", 2, owner),
            lambda: live.ensure_pod_group("ml", "pg-new", "v1beta1", 3, owner),
        ],
        "patch_gang_status": [lambda: live.patch_gang_status("ml", "g", {"phase": "Pending"})],
        "patch_gang_status_if": [lambda: live.patch_gang_status_if("ml", "g", {"disruption": None}, {})],
        "read_gang": [lambda: live.read_gang("ml", "g")],
        "list_gangs": [lambda: live.list_gangs()],
        "gang_pod_versions": [lambda: live.gang_pod_versions()],
        "resource_claim_versions": [lambda: live.resource_claim_versions()],
        "patch_group_status": [
            partial(live.patch_group_status, g, v, "podgroups", "ml", "pg", {"phase": "Pending"})
            for g, v in groups
            if v == "v1alpha1"
        ],
        "apply_group_status": [
            partial(live.apply_group_status, g, v, "PodGroup", "podgroups", "ml", "pg", {"conditions": []})
            for g, v in groups
            if v != "v1alpha1"
        ],
        "post_event": [lambda: live.post_event(gang, "Released", "released")],
        "set_job_suspend": [
            lambda: live.set_job_suspend("ml", "train", uid, True),
            lambda: live.set_job_suspend("ml", "train", uid, False),
        ],
        "read_job": [lambda: live.read_job("ml", "train")],
        "read_gang_pods": [lambda: live.read_gang_pods("ml", "g")],
        "statefulset_pod_management": [lambda: live.statefulset_pod_management("ml", "db")],
        "leases_named": [lambda: live.leases_named("scheduler-plugins-scheduler")],
        "delete_pod": [lambda: live.delete_pod(pod)],
        "taint_node": [
            lambda: live.taint_node(node, "t0k3n", add=True),
            lambda: live.taint_node(tainted, "t0k3n", add=False),
        ],
        "mark_disruption_target": [lambda: live.mark_disruption_target(victim, "PreemptionByQuorum", "m")],
        "clear_disruption_target": [lambda: live.clear_disruption_target(victim, "PreemptionWithdrawn", "m")],
        "delete_victim": [lambda: live.delete_victim(victim)],
        "allocate_claim": [lambda: live.allocate_claim(claim, {"allocation": {"devices": {"results": []}}})],
    }


def shape(request: Request) -> tuple[Any, ...]:
    access = request.access
    if access is None:
        return (request.path,)
    return (access.verb, access.group, access.resource, access.namespace)


async def wait_for(test: Callable[[], bool], what: str, timeout: float = 30) -> None:
    deadline = time.monotonic() + timeout
    while not test():
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out waiting for {what}")
        await asyncio.sleep(0.05)


async def quiet(fake: RecordingApiserver, seconds: float) -> None:
    """Until no request of a new shape has come for `seconds`."""
    seen = {shape(r) for r in fake.requests}
    last = time.monotonic()
    while time.monotonic() - last < seconds:
        await asyncio.sleep(0.1)
        now = {shape(r) for r in fake.requests}
        if now - seen:
            seen, last = now, time.monotonic()


async def run_operator(fake: RecordingApiserver) -> None:
    from quorum.operator import handlers  # registers quorum's kopf handlers

    stop: asyncio.Future[None] = asyncio.get_running_loop().create_future()
    operator = asyncio.create_task(kopf.operator(stop_flag=stop, **KOPF_RUN))  # type: ignore[arg-type]
    renewed = Access("update", "coordination.k8s.io", "leases", DEFAULT_NAMESPACE, "quorum-operator")
    try:
        # The Lease is campaigned for only once every watched kind has been listed; renewed, the
        # scheduling loop runs.
        await wait_for(lambda: any(r.access == renewed for r in fake.requests), "the Lease to be renewed")
        await quiet(fake, 1.0)
    finally:
        if not stop.done():
            stop.set_result(None)
        await asyncio.wait_for(operator, 30)
    assert all(t.done() for t in handlers.TASKS)


async def record(fake: RecordingApiserver) -> set[str]:
    """Record the operator, every LiveApi method and `quorum release`; the methods called."""
    fake.phase = "operator"
    await run_operator(fake)
    fake.phase = "LiveApi"
    async with await api_client(str(fake.kubeconfig)) as api:
        live = LiveApi(api)
        methods = live_calls(live, fake)
        for calls in methods.values():
            for call in calls:
                await call()
    fake.phase = "quorum release"
    from quorum.operator.manual import _main as quorum_release

    as_operator = operator_username(DEFAULT_NAMESPACE)
    await quorum_release(str(fake.kubeconfig), as_operator, ("ml", "g"), "recorded")
    await quorum_release(str(fake.kubeconfig), as_operator, None, "recorded")
    return {name for name, calls in methods.items() if calls}


@dataclass(frozen=True)
class Recording:
    requests: list[Request]
    trace: LineTrace
    live_methods: set[str]


@pytest.fixture(scope="module")
def recording(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Recording]:
    with pytest.MonkeyPatch.context() as patch, RecordingApiserver(tmp_path_factory.mktemp("fake")) as fake:
        patch.setenv("KUBECONFIG", str(fake.kubeconfig))
        # kopf logs in with kubernetes-asyncio, whose default reads $KUBECONFIG at import.
        patch.setattr(kube_config, "KUBE_CONFIG_DEFAULT_LOCATION", str(fake.kubeconfig))
        patch.setenv("QUORUM_OPERATOR_LEASE_SECONDS", "3")  # renewed after a second
        patch.setenv("QUORUM_OPERATOR_TENANT_LABEL", "example.com/team")  # its namespace watch too
        patch.setattr(gc, "freeze", lambda: None)  # not in the test process
        from quorum.operator import collector, handlers

        patch.setattr(collector.Collector, "install", lambda self: None)  # nor its gc callback

        patch.setattr(handlers, "TASKS", [])
        patch.setattr(handlers, "RUNNERS", [])
        seed(fake)
        with LineTrace(OPERATOR_CODE) as trace:
            live_methods = asyncio.run(record(fake))
        yield Recording(list(fake.requests), trace, live_methods)


def operator_grants() -> set[Grant]:
    return grants(load_manifests(MANIFESTS), DEFAULT_NAMESPACE, OPERATOR_SERVICE_ACCOUNT)


def test_every_api_call_in_the_operators_code_ran_in_the_recording(recording: Recording) -> None:
    sites = api_sites(OPERATOR_CODE)
    assert len(sites) >= 15, "the scan finds the API calls"
    missed = [str(s) for s in sites if not recording.trace.ran(s)]
    assert not missed, f"API calls the recording did not make (call them in this test): {missed}"


def test_the_scan_finds_a_call_that_did_not_run(tmp_path: Path) -> None:
    sample = tmp_path / "sample.py"
    sample.write_text(
        "def used(core):\n"
        "    return core.list_node\n"
        "\n"
        "def unused(core, api):\n"
        "    core.delete_namespaced_pod('x', 'y')\n"
        "    return LeaseLock('l', 'ns', 'me', api)\n"
    )
    code: dict[str, Any] = {}
    exec(compile(sample.read_text(), str(sample), "exec"), code)
    with LineTrace([sample]) as trace:
        code["used"](SimpleNamespace(list_node=None))
    assert [s.name for s in api_sites([sample]) if not trace.ran(s)] == ["delete_namespaced_pod", "LeaseLock"]


@pytest.mark.parametrize(
    ("method", "path", "query", "access"),
    [
        ("GET", "/api/v1/pods", {"watch": "True"}, Access("watch", "", "pods", None, None)),
        ("GET", "/api/v1/namespaces/ml/pods", {}, Access("list", "", "pods", "ml", None)),
        ("DELETE", "/api/v1/namespaces/ml/pods", {}, Access("deletecollection", "", "pods", "ml", None)),
        (
            "PATCH",
            "/apis/quorum.dev/v1alpha1/namespaces/ml/gangs/g/status",
            {},
            Access("patch", "quorum.dev", "gangs/status", "ml", "g"),
        ),
        ("POST", "/apis/batch/v1/namespaces/ml/jobs", {}, Access("create", "batch", "jobs", "ml", None)),
        ("GET", "/api/v1/namespaces/ml", {}, Access("get", "", "namespaces", "ml", "ml")),
        (
            "PUT",
            "/api/v1/namespaces/ml/finalize",
            {},
            Access("update", "", "namespaces/finalize", "ml", "ml"),
        ),
        ("GET", "/apis/apps/v1", {}, None),
        ("GET", "/apis", {}, None),
        ("GET", "/version", {}, None),
    ],
)
def test_requests_map_to_what_the_authorizer_is_asked(
    method: str, path: str, query: dict[str, str], access: Access | None
) -> None:
    assert access_of(method, path, query) == access


def test_a_role_grants_in_its_namespace_and_a_group_binding_counts() -> None:
    role = {"kind": "Role", "metadata": {"name": "r", "namespace": "q"}, "rules": [RULE]}
    cluster_role = {"kind": "ClusterRole", "metadata": {"name": "c"}, "rules": [RULE]}
    by_name = {"kind": "ServiceAccount", "name": "op", "namespace": "q"}
    binding = {
        "kind": "RoleBinding",
        "metadata": {"name": "b", "namespace": "q"},
        "roleRef": {"kind": "Role", "name": "r"},
        "subjects": [by_name],
    }
    (grant,) = grants([role, binding], "q", "op")
    assert grant.allows(Access("get", "", "pods", "q", "x"))
    assert not grant.allows(Access("get", "", "pods", "elsewhere", "x"))
    assert grants([role, binding], "q", "other") == set()
    everyone = {
        "kind": "ClusterRoleBinding",
        "metadata": {"name": "e"},
        "roleRef": {"kind": "ClusterRole", "name": "c"},
        "subjects": [{"kind": "Group", "name": "system:serviceaccounts"}],
    }
    (anywhere,) = grants([cluster_role, everyone], "q", "other")
    assert anywhere.allows(Access("get", "", "pods", "elsewhere", "x"))


RULE = {"apiGroups": [""], "resources": ["pods"], "verbs": ["get"]}


def test_every_live_api_method_is_called(recording: Recording) -> None:
    methods = {
        n for n, _ in inspect.getmembers(LiveApi, inspect.iscoroutinefunction) if not n.startswith("_")
    }
    assert methods == {n for n in vars(KubeApi) if not n.startswith("_")}
    assert recording.live_methods == methods, "call each LiveApi method in live_calls"


def test_kopf_runs_as_main_runs_it_with_no_resource_handlers() -> None:
    """kopf's own calls depend on its arguments and on the handlers registered: the recording
    runs it with main.py's arguments, and quorum registers only start-up and clean-up."""
    main = ast.parse((REPO / "quorum" / "operator" / "main.py").read_text())
    (run,) = [n for n in ast.walk(main) if isinstance(n, ast.Call) and ast.unparse(n.func) == "kopf.run"]
    assert {k.arg: ast.literal_eval(k.value) for k in run.keywords} == KOPF_RUN and not run.args
    from quorum.operator import handlers  # noqa: F401  (registers them)

    registry = kopf.get_default_registry()
    for kind in ("_webhooks", "_indexing", "_watching", "_spawning", "_changing"):
        assert not getattr(registry, kind).get_all_handlers(), kind


# `quorum release` asks who runs it (for its record) as the caller, before impersonating: a
# SelfSubjectReview, which Kubernetes' default ClusterRole system:basic-user grants everyone.
WHOAMI = Access("create", "authentication.k8s.io", "selfsubjectreviews", None, None)


# Changing a ResourceClaim's status.allocation, the apiserver asks the authorizer itself about
# resourceclaims/binding (cluster-wide), as no request names it (docs/dra.md).
CLAIM_STATUS = Access("patch", "resource.k8s.io", "resourceclaims/status", "ml", "p-0-gpus")
CLAIM_BINDING = Access("patch", "resource.k8s.io", "resourceclaims/binding", None, None)


def test_the_operator_makes_only_granted_calls_and_every_grant_is_used(recording: Recording) -> None:
    used = {r.access for r in recording.requests if r.access is not None and r.access != WHOAMI}
    assert CLAIM_STATUS in used, "a claim's allocation was written"
    used.add(CLAIM_BINDING)
    granted = operator_grants()
    not_granted = sorted(str(a) for a in used if not any(g.allows(a) for g in granted))
    assert not not_granted, f"calls manifests/10-rbac.yaml does not grant: {not_granted}"
    unused = sorted(str(g) for g in granted if not any(g.allows(a) for a in used))
    assert not unused, f"grants no call needs (remove them): {unused}"


def test_beyond_rbac_only_discovery(recording: Recording) -> None:
    paths = {r.path for r in recording.requests if r.access is None}
    assert "/apis" in paths, "kopf and quorum read discovery"
    assert all(p in DISCOVERY_PATHS or p.startswith("/apis/") for p in paths), paths


def test_quorum_release_acts_as_the_operator(recording: Recording) -> None:
    released = [r for r in recording.requests if r.phase == "quorum release"]
    assert any(r.access and r.access.verb == "patch" and r.access.resource == "pods" for r in released)
    asked = [r for r in released if r.access == WHOAMI]
    assert asked and all(r.impersonate is None for r in asked), "who runs it: the caller, asked first"
    assert {r.impersonate for r in released if r.access != WHOAMI} == {operator_username(DEFAULT_NAMESPACE)}
    assert all(r.impersonate is None for r in recording.requests if r.phase != "quorum release")


def test_each_part_was_recorded(recording: Recording) -> None:
    phases = {r.phase for r in recording.requests if r.access is not None}
    assert phases == {"operator", "LiveApi", "quorum release"}
    accessed = {r.access for r in recording.requests}
    crd = Access(
        "get", "apiextensions.k8s.io", "customresourcedefinitions", None, "podgroups.scheduling.x-k8s.io"
    )
    assert crd in accessed, "the operator's start-up"
    assert not any(
        a is not None and a.resource == "customresourcedefinitions" and a.verb == "watch" for a in accessed
    ), "kopf's resource observer is off (settings.scanning.disabled)"


def test_the_webhook_server_is_granted_nothing_and_calls_nothing() -> None:
    """quorum-webhooks runs without a token (automountServiceAccountToken: false); no binding in
    the manifests names it, or a group it is in; its code imports no Kubernetes client."""
    docs = load_manifests(MANIFESTS)
    assert grants(docs, DEFAULT_NAMESPACE, WEBHOOKS_SERVICE_ACCOUNT) == set()
    account = next(
        d for d in docs if d["kind"] == "ServiceAccount" and d["metadata"]["name"] == WEBHOOKS_SERVICE_ACCOUNT
    )
    assert account["automountServiceAccountToken"] is False
    for path in (REPO / "quorum" / "webhooks").rglob("*.py"):
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.Import | ast.ImportFrom):
                names = [a.name for a in node.names] if isinstance(node, ast.Import) else [node.module or ""]
                assert not any(n.split(".")[0] in ("kubernetes_asyncio", "kopf") for n in names), path
