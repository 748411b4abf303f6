"""With quorum-webhooks hung (SIGSTOP: the apiserver's calls wait their full timeout, as with a
wedged or partitioned server), the cluster's own work goes on and what quorum protects stays
refused. On an instance of its own, whose node lifecycle controller gives up on a silent node
after 20 s.

"Goes on" is checked twice: each operation takes under 1 s more than the same operation took
with the server healthy (a webhook call would cost its 3 s timeout), and the apiserver's own
count of calls to quorum's validating webhooks does not move while they run."""

from __future__ import annotations

import asyncio
import json
import re
import signal
import time
from collections.abc import AsyncIterator, Awaitable, Callable, Iterator
from functools import partial
from typing import Any

import pytest
from kubernetes_asyncio import client
from kubernetes_asyncio.client.exceptions import ApiException

from devcluster.cluster import Instance
from devcluster.config import ClusterSpec
from devcluster.nodes import KWOK_ANNOTATION, TestPool
from tests.integration.test_gang_lifecycle import quorum_release, running
from tests.integration.test_gangs import deployment, gated, pods
from tests.integration.test_webhooks import _remove_gate as remove_gate
from tests.kube import api_client, create_namespace, create_podgroup, create_pool_nodes, eventually

pytestmark = pytest.mark.cluster

NS = "work"
SLACK = 1.0  # seconds beyond normal


@pytest.fixture(scope="module")
def hung() -> Iterator[Instance]:
    instance = Instance("t-hung")
    instance.up(
        ClusterSpec(
            name=instance.name,
            extra_args={"kube-controller-manager": ("--node-monitor-grace-period=20s",)},
        )
    )
    try:
        yield instance
    finally:
        instance.signal_component("quorum-webhooks", signal.SIGCONT)
        instance.down(quiet=True)


@pytest.fixture
async def admin(hung: Instance) -> AsyncIterator[client.ApiClient]:
    api = await api_client(hung.kubeconfig("admin"))
    async with api:
        yield api


def validating_calls(instance: Instance, kind: str = "validating") -> dict[str, float]:
    """The apiserver's count of calls per quorum webhook of `kind` (validating or admit)."""
    _, body = instance.rest().get("/metrics", timeout=30)
    calls: dict[str, float] = {}
    for line in body.decode().splitlines():
        if line.startswith("apiserver_admission_webhook_request_total{") and f'type="{kind}"' in line:
            name = re.search(r'name="([^"]+)"', line)
            if name and name.group(1).endswith(".quorum.dev"):
                calls[name.group(1)] = calls.get(name.group(1), 0) + float(line.rsplit(" ", 1)[1])
    return calls


def timed(instance: Instance, who: str, *args: str) -> float:
    started = time.monotonic()
    instance.kubectl(*args, who=who)
    return time.monotonic() - started


def node_operations(node: str) -> list[tuple[str, ...]]:
    return [
        ("cordon", node),
        ("uncordon", node),
        ("taint", "node", node, "example.com/maintenance=yes:NoExecute"),
        ("taint", "node", node, "example.com/maintenance-"),
        ("label", "node", node, "example.com/team=a", "--overwrite"),
        ("label", "node", node, "example.com/team-"),
    ]


def interruptable(workload: dict[str, Any]) -> dict[str, Any]:
    workload["spec"]["template"]["metadata"]["labels"]["qos.coreweave.cloud/interruptable"] = "true"
    return workload


async def gated_pods(api: client.ApiClient, selector: str, count: int) -> bool:
    found = await pods(api, NS, selector)
    return len(found) == count and all(gated(p) for p in found)


async def refused(call: Callable[[], Awaitable[Any]]) -> str:
    """The apiserver's message refusing `call`."""
    with pytest.raises(ApiException) as err:
        await call()
    message: str = json.loads(err.value.body)["message"]
    return message


async def test_a_hung_webhook_server_stops_no_cluster_work_and_lets_nothing_protected_through(
    hung: Instance, admin: client.ApiClient
) -> None:
    core, apps = client.CoreV1Api(admin), client.AppsV1Api(admin)
    platform = await api_client(hung.kubeconfig("platform"))
    customer = await api_client(hung.kubeconfig("customer"))
    await create_namespace(admin, NS)
    pool = TestPool("hung", 3)
    # CKS-like nodes of the default pool (they carry node.coreweave.cloud/* labels).
    by_admin, by_platform = "gpu-h100-001", "gpu-h100-002"
    async with platform, customer:
        await create_pool_nodes(platform, TestPool("hung", 2))
        # Before the hang: an interruptable Deployment; an interruptable gang of two 8-GPU pods
        # held for room (one of the pool's two nodes is taken); gangs held for a missing member.
        await apps.create_namespaced_deployment(NS, deployment("filler", 1, 8, pool, None))
        await running(admin, NS, "app=filler", 1)
        await apps.create_namespaced_deployment(NS, interruptable(deployment("inference", 1, 0, None, None)))
        await create_podgroup(admin, NS, "ranks", 2)
        await apps.create_namespaced_deployment(NS, interruptable(deployment("ranks", 2, 8, pool, "ranks")))
        for name in ("stuck", "stuck2", "held"):
            await create_podgroup(admin, NS, name, 3)
            await apps.create_namespaced_deployment(NS, deployment(name, 2, 0, pool, name))
        for app in ("ranks", "stuck", "stuck2", "held"):
            await eventually(partial(gated_pods, admin, f"app={app}", 2), timeout=60, what=f"{app} gated")

        # Normal: the same operations with the server healthy.
        normal = max(
            [timed(hung, "admin", *op) for op in node_operations(by_admin)]
            + [timed(hung, "platform", *op) for op in node_operations(by_platform)]
            + [timed(hung, "admin", "label", "namespace", NS, "example.com/x=1")]
            + [timed(hung, "admin", "rollout", "restart", "deployment/inference", f"--namespace={NS}")]
        )
        started = time.monotonic()
        baseline = await asyncio.to_thread(quorum_release, hung, "admin", f"{NS}/pg-stuck", "--reason", "x")
        normal_release = time.monotonic() - started
        assert baseline.returncode == 0, baseline.stdout + baseline.stderr

        # A refusal with the server healthy: its message names the label.
        reserved = {"metadata": {"labels": {"foo.coreweave.cloud/bar": "1"}}}
        healthy = await refused(lambda: client.CoreV1Api(customer).patch_node(by_admin, reserved))
        assert "is in a reserved domain" in healthy, healthy

        hung.signal_component("quorum-webhooks", signal.SIGSTOP)
        try:
            calls_before = validating_calls(hung)
            assert calls_before.get("reserved-labels.objects.quorum.dev"), calls_before
            slow: list[tuple[tuple[str, ...], float]] = []
            for who, node in (("admin", by_admin), ("platform", by_platform)):
                for op in node_operations(node):
                    if (took := timed(hung, who, *op)) > normal + SLACK:
                        slow.append(((who, *op), took))
            for op in (
                ("label", "namespace", NS, "example.com/x=2", "--overwrite"),
                ("rollout", "restart", "deployment/inference", f"--namespace={NS}"),
            ):
                if (took := timed(hung, "admin", *op)) > normal + SLACK:
                    slow.append((op, took))
            assert not slow, f"normal {normal:.2f}s; slower with the server hung: {slow}"

            # quorum releases the interruptable gang when room appears: a node joins the pool.
            await client.CoreV1Api(platform).create_node(TestPool("hung", 3).nodes[2])
            await running(admin, NS, "app=ranks", 2)  # the interruptable gang, released

            started = time.monotonic()
            manual = await asyncio.to_thread(
                quorum_release, hung, "admin", f"{NS}/pg-stuck2", "--reason", "server hung"
            )
            took = time.monotonic() - started
            assert manual.returncode == 0 and "2 of 2 gated pods released" in manual.stdout, manual.stdout
            assert took < normal_release + SLACK, (took, normal_release)

            # The node lifecycle controller taints a node that sends no heartbeat (one kwok
            # does not manage: registered by the platform, never Ready).
            silent_node = TestPool("silent", 1).nodes[0]
            silent_node["metadata"]["annotations"].pop(KWOK_ANNOTATION)
            silent = silent_node["metadata"]["name"]
            await client.CoreV1Api(platform).create_node(silent_node)

            async def unreachable() -> bool:
                node = await core.read_node(silent)
                return any(
                    t.key in ("node.kubernetes.io/unreachable", "node.kubernetes.io/not-ready")
                    and t.effect == "NoExecute"
                    for t in node.spec.taints or []
                )

            await eventually(unreachable, timeout=120, what=f"{silent} tainted NoExecute")
            assert validating_calls(hung) == calls_before, "no validating webhook was called for any of it"

            # Still refused: a customer's reserved-domain label on a node, a namespace, a pod and
            # a template; a quorum key in a template; a customer removing quorum's gate; a gang
            # pod without the gate.
            customer_core = client.CoreV1Api(customer)
            labelled_pod = {
                "metadata": {"name": "labelled", **reserved["metadata"]},
                "spec": {"containers": [{"name": "c", "image": "pause"}]},
            }
            template = {"spec": {"template": {"metadata": {"labels": {"x.coreweave.com/y": "1"}}}}}
            quorum_key = {"spec": {"template": {"metadata": {"labels": {"quorum.dev/gang": "forged"}}}}}
            for webhook, call in (
                ("reserved-labels.objects", lambda: customer_core.patch_node(by_admin, reserved)),
                ("reserved-labels.objects", lambda: customer_core.patch_namespace(NS, reserved)),
                ("labels.pods", lambda: customer_core.create_namespaced_pod(NS, labelled_pod)),
                (
                    "reserved-labels.workloads",
                    lambda: client.AppsV1Api(customer).patch_namespaced_deployment("inference", NS, template),
                ),
                (
                    "gangs.workloads",
                    lambda: client.AppsV1Api(customer).patch_namespaced_deployment(
                        "inference", NS, quorum_key
                    ),
                ),
            ):
                body = await refused(call)
                assert f'failed calling webhook "{webhook}.quorum.dev"' in body, body
            held = (await pods(admin, NS, "app=held"))[0]["metadata"]["name"]
            ungate = await remove_gate(hung, admin, "customer", NS, held)
            assert ungate.returncode != 0 and "quorum-gate-protection" in ungate.stderr, ungate.stderr
            # Pods are admitted in the apiserver: a gang pod is gated without the server, at
            # once; one whose gang name only the server can make (a dotted group) is refused.
            gang_pod = {
                "metadata": {
                    "name": "gated-in-apiserver",
                    "labels": {"pod-group.scheduling.sigs.k8s.io": "held"},
                },
                "spec": {"containers": [{"name": "c", "image": "pause"}]},
            }
            mutating_before = validating_calls(hung, "admit").get("pods.mutate.quorum.dev", 0)
            created = await customer_core.create_namespaced_pod(NS, gang_pod)
            assert [g.name for g in created.spec.scheduling_gates or []] == ["quorum.dev/gang"]
            assert validating_calls(hung, "admit").get("pods.mutate.quorum.dev", 0) == mutating_before
            dotted = {
                "metadata": {"name": "ungated", "labels": {"pod-group.scheduling.sigs.k8s.io": "held.1"}},
                "spec": {"containers": [{"name": "c", "image": "pause"}]},
            }
            backstop = await refused(lambda: customer_core.create_namespaced_pod(NS, dotted))
            assert "quorum-gang-backstop" in backstop, backstop
        finally:
            hung.signal_component("quorum-webhooks", signal.SIGCONT)
        # Back: the server answers again, with its own message.
        body = await refused(lambda: client.CoreV1Api(customer).patch_node(by_admin, reserved))
        assert "is in a reserved domain" in body, body
