"""Helpers for tests and benchmarks that act on a real cluster through kubernetes-asyncio."""

from __future__ import annotations

import asyncio
import os
import signal
import time
from collections import defaultdict
from collections.abc import Awaitable, Callable, Iterator, Mapping
from contextlib import contextmanager
from fractions import Fraction
from pathlib import Path
from typing import Any, TypeVar

from kubernetes_asyncio import client, config
from kubernetes_asyncio.client.exceptions import ApiException

from devcluster.cluster import Instance, node_is_ready
from devcluster.config import ClusterSpec
from devcluster.nodes import TestPool
from devcluster.process import is_alive
from quorum.core.quantity import parse_quantity
from quorum.k8s.client import without_per_request_env_lookups

T = TypeVar("T")


async def api_client(kubeconfig: Path) -> client.ApiClient:
    configuration = client.Configuration()
    await config.load_kube_config(config_file=str(kubeconfig), client_configuration=configuration)
    return without_per_request_env_lookups(configuration)


async def eventually(
    probe: Callable[[], Awaitable[T | None]],
    *,
    timeout: float,
    interval: float = 0.25,
    what: str = "condition",
) -> T:
    """Poll `probe` until it returns something truthy; fail with `what` after `timeout`."""
    deadline = time.monotonic() + timeout
    last: T | None = None
    while True:
        last = await probe()
        if last:
            return last
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out after {timeout:.0f}s waiting for {what}; last: {last!r}")
        await asyncio.sleep(interval)


async def kill_after(
    instance: Instance,
    component: str,
    released: Callable[[], Awaitable[int]],
    k: int,
    *,
    timeout: float,
    slice_seconds: float = 0.005,
) -> int:
    """SIGKILL one of the instance's processes (by its recorded PID) once `released()` counts at
    least `k`, and return the count then. The process runs in short slices (SIGCONT, a few ms,
    SIGSTOP) and is counted while stopped, once its requests in flight have landed: killed
    after the k-th release, or a request or two after it, never long after. No code of the
    process knows (no test hook in what ships)."""
    state = instance.state()
    assert state is not None
    record = next(p for p in state.processes if p.name == component)
    deadline = time.monotonic() + timeout
    try:
        while True:
            os.kill(record.pid, signal.SIGCONT)
            await asyncio.sleep(slice_seconds)
            os.kill(record.pid, signal.SIGSTOP)
            await asyncio.sleep(0.05)  # its requests sent before the stop land
            count = await released()
            if count >= k:
                os.kill(record.pid, signal.SIGKILL)
                await eventually(lambda: asyncio.sleep(0, not is_alive(record)), timeout=10, what="its death")
                return count
            if time.monotonic() > deadline:
                raise AssertionError(
                    f"timed out after {timeout:.0f}s waiting for {k} releases by {component}"
                )
    finally:
        if is_alive(record):
            os.kill(record.pid, signal.SIGCONT)


def _resources(containers: list[dict[str, Any]] | None) -> list[dict[str, Fraction]]:
    out = []
    for c in containers or []:
        requests = (c.get("resources") or {}).get("requests") or {}
        out.append({k: parse_quantity(v) for k, v in requests.items()})
    return out


def _add(a: dict[str, Fraction], b: dict[str, Fraction]) -> dict[str, Fraction]:
    return {k: a.get(k, Fraction(0)) + b.get(k, Fraction(0)) for k in a.keys() | b.keys()}


def _max(a: dict[str, Fraction], b: dict[str, Fraction]) -> dict[str, Fraction]:
    return {k: max(a.get(k, Fraction(0)), b.get(k, Fraction(0))) for k in a.keys() | b.keys()}


def pod_requests(pod: dict[str, Any]) -> dict[str, Fraction]:
    """Effective requests of a pod as kube-scheduler counts them: app containers and restartable
    (sidecar) init containers add up; each regular init container runs alone (with the sidecars
    started before it), so the pod needs the max of that and the steady state; plus overhead."""
    spec = pod.get("spec") or {}
    steady: dict[str, Fraction] = {}
    for r in _resources(spec.get("containers")):
        steady = _add(steady, r)
    sidecars: dict[str, Fraction] = {}
    init_peak: dict[str, Fraction] = {}
    for c, r in zip(spec.get("initContainers") or [], _resources(spec.get("initContainers")), strict=True):
        if c.get("restartPolicy") == "Always":
            sidecars = _add(sidecars, r)
        else:
            init_peak = _max(init_peak, _add(sidecars, r))
    total = _max(_add(steady, sidecars), init_peak)
    overhead = {k: parse_quantity(v) for k, v in (spec.get("overhead") or {}).items()}
    total = _add(total, overhead)
    total["pods"] = Fraction(1)
    return total


async def overcommitted_nodes(api: client.ApiClient) -> list[str]:
    """Nodes where the bound, non-terminal pods request more than the node's allocatable
    (kwok never refuses a pod, so this is checked after every scenario)."""
    core = client.CoreV1Api(api)
    node_items = (await raw_json(core.list_node(_preload_content=False)))["items"]
    pod_items = (
        await raw_json(
            core.list_pod_for_all_namespaces(field_selector="spec.nodeName!=", _preload_content=False)
        )
    )["items"]
    used: dict[str, dict[str, Fraction]] = defaultdict(dict)
    for pod in pod_items:
        if (pod.get("status") or {}).get("phase") in ("Succeeded", "Failed"):
            continue
        used[pod["spec"]["nodeName"]] = _add(used[pod["spec"]["nodeName"]], pod_requests(pod))
    problems = []
    for node in node_items:
        name = node["metadata"]["name"]
        allocatable = {k: parse_quantity(v) for k, v in node["status"]["allocatable"].items()}
        for resource, amount in used.get(name, {}).items():
            if amount > allocatable.get(resource, Fraction(0)):
                problems.append(
                    f"{name}: {resource} {float(amount):g} > {float(allocatable.get(resource, 0)):g}"
                )
    return problems


async def assert_no_overcommit(api: client.ApiClient) -> None:
    problems = await overcommitted_nodes(api)
    assert not problems, "over-committed nodes: " + "; ".join(problems)


async def raw_json(coro: Awaitable[Any]) -> Any:
    """Await a kubernetes-asyncio call made with `_preload_content=False`; return plain JSON."""
    response = await coro
    return await response.json()


async def create_pool_nodes(api: client.ApiClient, pool: TestPool) -> None:
    """Register the pool's nodes (as the platform) and wait until a scheduler can use them."""
    core = client.CoreV1Api(api)
    for node in pool.nodes:
        await core.create_node(node)

    async def all_ready() -> bool:
        nodes = [api.sanitize_for_serialization(await core.read_node(name)) for name in pool.names]
        return all(node_is_ready(node) for node in nodes)

    await eventually(all_ready, timeout=60, what=f"nodes of pool {pool.name} Ready and untainted")


async def create_namespace(api: client.ApiClient, name: str, labels: dict[str, str] | None = None) -> None:
    """Create a namespace and wait for its default ServiceAccount: the ServiceAccount admission
    plugin refuses pods until the controller has made it."""
    core = client.CoreV1Api(api)
    await core.create_namespace({"metadata": {"name": name, "labels": labels or {}}})

    async def default_service_account() -> bool:
        try:
            await core.read_namespaced_service_account("default", name)
        except ApiException as err:
            if err.status == 404:
                return False
            raise
        return True

    await eventually(default_service_account, timeout=30, what=f"ServiceAccount {name}/default")


async def create_podgroup(
    api: client.ApiClient,
    namespace: str,
    name: str,
    min_member: int,
    annotations: dict[str, str] | None = None,
    **spec: Any,
) -> None:
    """A PodGroup of the seeds' group (scheduling.sigs.k8s.io/v1alpha1)."""
    await client.CustomObjectsApi(api).create_namespaced_custom_object(
        "scheduling.sigs.k8s.io",
        "v1alpha1",
        namespace,
        "podgroups",
        {
            "apiVersion": "scheduling.sigs.k8s.io/v1alpha1",
            "kind": "PodGroup",
            "metadata": {"name": name, "annotations": annotations or {}},
            "spec": {"minMember": min_member, **spec},
        },
    )


EXAMPLES = Path(__file__).resolve().parents[1] / "examples"


class WorkloadApi:
    """Kubernetes' Workload Aware Scheduling API as the cluster under test serves it: 1.37's
    v1beta1 or 1.36's v1alpha2. Tests write their objects through it, so that one test shows the
    same behaviour on both (`make test` runs the marked ones on a 1.36 plane too)."""

    GROUP = "scheduling.k8s.io"

    def __init__(self, version: str) -> None:
        self.version = version

    @classmethod
    async def of(cls, api: client.ApiClient) -> WorkloadApi:
        groups = await client.ApisApi(api).get_api_versions()
        served = {v.version for g in groups.groups if g.name == cls.GROUP for v in g.versions}
        version = next(v for v in ("v1beta1", "v1alpha2") if v in served)
        return cls(version)

    @property
    def legacy(self) -> bool:
        """Kubernetes 1.36's spelling."""
        return self.version == "v1alpha2"

    @property
    def scheduled_condition(self) -> str:
        """kube-scheduler's condition on a PodGroup it placed."""
        return "PodGroupScheduled" if self.legacy else "PodGroupInitiallyScheduled"

    @property
    def examples(self) -> Path:
        """Seed 004's examples for this version."""
        base = EXAMPLES / "seed-004-workload-aware"
        return base / "kubernetes-1.36" if self.legacy else base

    def disruption(self, mode: str) -> Any:
        """`Pod` or `PodGroup` as this version spells it (1.37: `{single: {}}` or `{all: {}}`)."""
        return mode if self.legacy else {{"Pod": "single", "PodGroup": "all"}[mode]: {}}

    def workload(self, name: str, templates: list[dict[str, Any]]) -> dict[str, Any]:
        for template in templates:
            if "disruptionMode" in template:
                template["disruptionMode"] = self.disruption(template["disruptionMode"])
        return {
            "apiVersion": f"{self.GROUP}/{self.version}",
            "kind": "Workload",
            "metadata": {"name": name},
            "spec": {"podGroupTemplates": templates},
        }

    def podgroup(
        self, name: str, policy: dict[str, Any], template: tuple[str, str] | None = None, **spec: Any
    ) -> dict[str, Any]:
        """A PodGroup; `disruptionMode` in `spec` as quorum names it (Pod | PodGroup)."""
        body: dict[str, Any] = {"schedulingPolicy": policy, **spec}
        if "disruptionMode" in body:
            body["disruptionMode"] = self.disruption(body["disruptionMode"])
        if template is not None:
            if self.legacy:
                body["podGroupTemplateRef"] = {
                    "workload": {"workloadName": template[0], "podGroupTemplateName": template[1]}
                }
            else:
                body["workloadRef"] = {"workloadName": template[0], "templateName": template[1]}
        return {
            "apiVersion": f"{self.GROUP}/{self.version}",
            "kind": "PodGroup",
            "metadata": {"name": name},
            "spec": body,
        }

    async def create(self, api: client.ApiClient, namespace: str, plural: str, body: dict[str, Any]) -> None:
        await client.CustomObjectsApi(api).create_namespaced_custom_object(
            self.GROUP, self.version, namespace, plural, body
        )

    async def get(self, api: client.ApiClient, namespace: str, plural: str, name: str) -> dict[str, Any]:
        found: dict[str, Any] = await client.CustomObjectsApi(api).get_namespaced_custom_object(
            self.GROUP, self.version, namespace, plural, name
        )
        return found


@contextmanager
def operator_instance(name: str, settings: Mapping[str, str]) -> Iterator[Instance]:
    """An instance of its own whose quorum-operator runs with `settings`: {"BACKOFF_SECONDS":
    "3"} sets QUORUM_OPERATOR_BACKOFF_SECONDS=3. Taken down when done."""
    instance = Instance(name)
    saved = {key: os.environ.get(f"QUORUM_OPERATOR_{key}") for key in settings}
    try:
        os.environ.update({f"QUORUM_OPERATOR_{key}": value for key, value in settings.items()})
        instance.up(ClusterSpec(name=instance.name))
    finally:
        for key, value in saved.items():
            if value is None:
                os.environ.pop(f"QUORUM_OPERATOR_{key}", None)
            else:
                os.environ[f"QUORUM_OPERATOR_{key}"] = value
    try:
        yield instance
    finally:
        instance.down(quiet=True)
