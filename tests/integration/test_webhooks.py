"""The CKS policies through the real apiserver, which calls quorum-webhooks over TLS; the
gate protection policy inside the apiserver. Everything is done as a customer (cluster-admin by
RBAC, not system:masters) unless said otherwise, with the real kubectl where a person would."""

from __future__ import annotations

import json
import subprocess
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
import yaml
from kubernetes_asyncio import client
from kubernetes_asyncio.client.exceptions import ApiException

from devcluster.cluster import Instance
from devcluster.nodes import TestPool
from devcluster.process import is_alive
from tests.kube import api_client, create_namespace, create_podgroup, eventually

pytestmark = [pytest.mark.cluster, pytest.mark.kubernetes_1_36]

GATE = "quorum.dev/gang"
EXAMPLES = Path(__file__).resolve().parents[2] / "examples"
INTERRUPTABLE = "qos.coreweave.cloud/interruptable"


def kubectl(
    instance: Instance, who: str, *args: str, stdin: str | None = None
) -> subprocess.CompletedProcess[str]:
    return instance.kubectl(*args, who=who, input_text=stdin, check=False)


def container(gpus: int = 0) -> dict[str, Any]:
    c: dict[str, Any] = {"name": "c", "image": "registry.k8s.io/pause:3.10"}
    if gpus:
        c["resources"] = {"limits": {"nvidia.com/gpu": str(gpus)}}
    return c


def deployment(name: str, labels: dict[str, str]) -> dict[str, Any]:
    return {
        "apiVersion": "apps/v1",
        "kind": "Deployment",
        "metadata": {"name": name},
        "spec": {
            "replicas": 1,
            "selector": {"matchLabels": {"app": name}},
            "template": {
                "metadata": {"labels": {"app": name, **labels}},
                "spec": {"containers": [container()]},
            },
        },
    }


async def test_customer_cannot_label_a_node_in_a_reserved_domain(
    cluster: Instance, test_pool: Callable[..., Any]
) -> None:
    pool: TestPool = await test_pool(count=1)
    node = pool.names[0]
    denied = kubectl(cluster, "customer", "label", "node", node, "foo.coreweave.cloud/bar=true")
    assert denied.returncode != 0
    assert 'admission webhook "reserved-labels.objects.quorum.dev" denied the request' in denied.stderr
    assert '"foo.coreweave.cloud/bar"' in denied.stderr
    assert "*.coreweave.cloud or *.coreweave.com" in denied.stderr
    # Look-alike domains are the customer's to use.
    assert (
        kubectl(cluster, "customer", "label", "node", node, "coreweave.cloud.example.com/x=1").returncode == 0
    )
    # system:masters is not exempt by default; the platform identity is.
    assert kubectl(cluster, "admin", "label", "node", node, "node.coreweave.cloud/x=1").returncode != 0
    allowed = kubectl(cluster, "platform", "label", "node", node, "node.coreweave.cloud/x=1")
    assert allowed.returncode == 0, allowed.stderr


async def test_overwriting_a_reserved_label_on_a_pod_is_denied(
    cluster: Instance, api: client.ApiClient, namespace: str
) -> None:
    # The platform identity (here given `edit` in this namespace) sets a reserved label...
    rbac = client.RbacAuthorizationV1Api(api)
    await rbac.create_namespaced_role_binding(
        namespace,
        {
            "metadata": {"name": "platform-edit"},
            "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "ClusterRole", "name": "edit"},
            "subjects": [
                {"apiGroup": "rbac.authorization.k8s.io", "kind": "User", "name": "quorum:node-lifecycle"}
            ],
        },
    )
    platform = await api_client(cluster.kubeconfig("platform"))
    async with platform:
        await client.CoreV1Api(platform).create_namespaced_pod(
            namespace,
            {
                "metadata": {"name": "billed", "labels": {"billing.coreweave.cloud/org": "abc"}},
                "spec": {"containers": [container()]},
            },
        )
    # ...which the customer may keep but not change.
    denied = kubectl(
        cluster,
        "customer",
        "-n",
        namespace,
        "label",
        "--overwrite",
        "pod",
        "billed",
        "billing.coreweave.cloud/org=xyz",
    )
    assert denied.returncode != 0
    assert '"billing.coreweave.cloud/org"' in denied.stderr and "reserved domain" in denied.stderr
    unrelated = kubectl(cluster, "customer", "-n", namespace, "label", "pod", "billed", "team=ml")
    assert unrelated.returncode == 0, unrelated.stderr


async def test_deployment_template_with_a_reserved_label_is_denied(
    customer_api: client.ApiClient, namespace: str
) -> None:
    apps = client.AppsV1Api(customer_api)
    with pytest.raises(ApiException) as denied:
        await apps.create_namespaced_deployment(namespace, deployment("d", {"team.coreweave.com/x": "1"}))
    assert denied.value.status == 403
    assert "spec.template.metadata.labels" in str(denied.value.body)
    assert '\\"team.coreweave.com/x\\"' in str(denied.value.body)


async def test_cpu_pod_gets_the_toleration_and_runs_on_a_cpu_node(
    customer_api: client.ApiClient, api: client.ApiClient, namespace: str
) -> None:
    core = client.CoreV1Api(customer_api)
    cpu = await core.create_namespaced_pod(
        namespace, {"metadata": {"name": "cpu"}, "spec": {"containers": [container()]}}
    )
    gpu = await core.create_namespaced_pod(
        namespace, {"metadata": {"name": "gpu"}, "spec": {"containers": [container(gpus=1)]}}
    )
    assert any(
        t.key == "is_cpu_compute" and t.operator == "Exists" and t.effect == "NoSchedule"
        for t in cpu.spec.tolerations
    )
    assert not any(t.key == "is_cpu_compute" for t in gpu.spec.tolerations or [])

    async def node_of(name: str) -> str | None:
        pod = await client.CoreV1Api(api).read_namespaced_pod(name, namespace)
        return str(pod.spec.node_name) if pod.spec.node_name and pod.status.phase == "Running" else None

    cpu_node = await eventually(lambda: node_of("cpu"), timeout=30, what="CPU pod running")
    node = await client.CoreV1Api(api).read_node(cpu_node)
    assert "nvidia.com/gpu" not in node.status.allocatable, cpu_node
    assert any(t.key == "is_cpu_compute" for t in node.spec.taints or []), cpu_node


async def test_interruptable_must_be_true_or_false(customer_api: client.ApiClient, namespace: str) -> None:
    core = client.CoreV1Api(customer_api)
    with pytest.raises(ApiException) as denied:
        await core.create_namespaced_pod(
            namespace,
            {
                "metadata": {"name": "p", "labels": {INTERRUPTABLE: "maybe"}},
                "spec": {"containers": [container()]},
            },
        )
    assert denied.value.status == 403
    assert "'maybe'" in str(denied.value.body) and '\\"true\\"' in str(denied.value.body)


async def test_interruptable_true_on_a_gang_deployment_warns_the_client(
    cluster: Instance, namespace: str
) -> None:
    manifest = deployment("trainer", {INTERRUPTABLE: "true", "pod-group.scheduling.sigs.k8s.io": "pg1"})
    created = kubectl(cluster, "customer", "-n", namespace, "create", "-f", "-", stdin=json.dumps(manifest))
    assert created.returncode == 0, created.stderr
    assert "Warning:" in created.stderr
    assert "gang 'pg1'" in created.stderr and "checkpoint" in created.stderr
    inference = deployment("inference", {INTERRUPTABLE: "true"})
    quiet = kubectl(cluster, "customer", "-n", namespace, "create", "-f", "-", stdin=json.dumps(inference))
    assert quiet.returncode == 0 and "Warning:" not in quiet.stderr


async def test_a_daemonset_that_would_be_evicted_from_sunk_nodes_warns_the_client(
    cluster: Instance, namespace: str
) -> None:
    bare = yaml.safe_load((EXAMPLES / "seed-002-sunk" / "daemonset.yaml").read_text())
    bare["metadata"]["name"] = "no-tolerations"
    del bare["spec"]["template"]["spec"]["tolerations"]
    created = kubectl(cluster, "customer", "-n", namespace, "create", "-f", "-", stdin=json.dumps(bare))
    assert created.returncode == 0, created.stderr
    assert "Warning:" in created.stderr and "SUNK (Slurm) nodes" in created.stderr
    assert (
        "sunk.coreweave.com/lock=true:NoExecute, is_cpu_compute, is_gpu, node.coreweave.cloud/reserved"
        in (created.stderr)
    )
    # The same webhook, called for the example: it answers without a warning.
    example = kubectl(
        cluster,
        "customer",
        "-n",
        namespace,
        "create",
        "-f",
        str(EXAMPLES / "seed-002-sunk" / "daemonset.yaml"),
    )
    assert example.returncode == 0 and "Warning:" not in example.stderr, example.stderr
    # An update that does not touch its placement is not judged again; one that does is.
    same = kubectl(cluster, "customer", "-n", namespace, "label", "daemonset", "no-tolerations", "team=a")
    assert same.returncode == 0 and "Warning:" not in same.stderr, same.stderr
    patch = json.dumps(
        {"spec": {"template": {"spec": {"tolerations": [{"key": "is_gpu", "operator": "Exists"}]}}}}
    )
    changed = kubectl(
        cluster, "customer", "-n", namespace, "patch", "daemonset", "no-tolerations", "-p", patch
    )
    assert changed.returncode == 0 and "Warning:" in changed.stderr and "is_gpu," not in changed.stderr


async def _create_gated_pod(api: client.ApiClient, namespace: str, name: str) -> None:
    """A gang pod whose PodGroup does not exist: the webhook gates it and quorum leaves it gated."""
    await client.CoreV1Api(api).create_namespaced_pod(
        namespace,
        {
            "metadata": {"name": name, "labels": {"pod-group.scheduling.sigs.k8s.io": "not-created-yet"}},
            "spec": {"schedulingGates": [{"name": "example.com/other"}], "containers": [container()]},
        },
    )


async def _remove_gate(
    instance: Instance,
    api: client.ApiClient,
    who: str,
    namespace: str,
    pod: str,
    gate: str = GATE,
    *extra: str,
) -> subprocess.CompletedProcess[str]:
    found = await client.CoreV1Api(api).read_namespaced_pod(pod, namespace)
    index = [g.name for g in found.spec.scheduling_gates].index(gate)
    patch = json.dumps(
        [
            {"op": "test", "path": f"/spec/schedulingGates/{index}/name", "value": gate},
            {"op": "remove", "path": f"/spec/schedulingGates/{index}"},
        ]
    )
    return kubectl(instance, who, *extra, "-n", namespace, "patch", "pod", pod, "--type=json", "-p", patch)


async def check_gate_protection(instance: Instance, api: client.ApiClient, namespace: str) -> None:
    denied = await _remove_gate(instance, api, "customer", namespace, "gated")
    assert denied.returncode != 0
    assert "ValidatingAdmissionPolicy 'quorum-gate-protection'" in denied.stderr
    assert "removed only by quorum" in denied.stderr and "customer@example.com may not" in denied.stderr
    # Other gates are not quorum's business.
    other = await _remove_gate(instance, api, "customer", namespace, "gated", "example.com/other")
    assert other.returncode == 0, other.stderr
    # quorum's operator identity may remove it (with a client of its own: it may not `get` pods,
    # which `kubectl patch` does first).
    operator = await api_client(instance.kubeconfig("quorum-operator"))
    async with operator:
        patch = [  # the other gate is gone
            {"op": "test", "path": "/spec/schedulingGates/0/name", "value": GATE},
            {"op": "remove", "path": "/spec/schedulingGates/0"},
        ]
        await client.CoreV1Api(operator).patch_namespaced_pod("gated", namespace, patch)
    # So may the break-glass group (given rights on pods by RBAC).
    await client.RbacAuthorizationV1Api(api).create_namespaced_role_binding(
        namespace,
        {
            "metadata": {"name": "break-glass"},
            "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "ClusterRole", "name": "edit"},
            "subjects": [
                {"apiGroup": "rbac.authorization.k8s.io", "kind": "Group", "name": "quorum:break-glass"}
            ],
        },
    )
    glass = await _remove_gate(
        instance,
        api,
        "admin",
        namespace,
        "gated2",
        GATE,
        "--as=oncall@example.com",
        "--as-group=quorum:break-glass",
    )
    assert glass.returncode == 0, glass.stderr


async def test_only_quorum_removes_the_quorum_gate(
    cluster: Instance, api: client.ApiClient, namespace: str
) -> None:
    await _create_gated_pod(api, namespace, "gated")
    await _create_gated_pod(api, namespace, "gated2")
    await check_gate_protection(cluster, api, namespace)


async def check_backstop_rules(api: client.ApiClient, namespace: str) -> None:
    """Each rule of the backstop policy, and the pods it lets through, by server-side dry runs
    while the mutating webhook is down (its matchConditions repeat the rules, negated)."""
    gate = [{"name": GATE}]
    group = {"pod-group.scheduling.sigs.k8s.io": "pg"}
    cases: list[tuple[dict[str, Any], dict[str, Any], str | None]] = [
        # (labels, spec beyond the container, what the denial says, or None: allowed)
        ({}, {}, None),
        (group, {}, "quorum-webhooks did not process it"),
        ({"scheduling.x-k8s.io/pod-group": "pg"}, {"schedulerName": "default-scheduler"}, "did not process"),
        (group, {"schedulerName": "my-scheduler"}, None),
        (group | {GATE: "pg-pg"}, {"schedulingGates": gate}, None),
        ({}, {"schedulingGates": gate}, "a pod carries it only as a member of a gang"),
        ({}, {"schedulerName": "cw-coscheduler"}, "is not a scheduler in this cluster"),
        (
            {GATE: "pg-pg"} | group,
            {"schedulingGates": gate, "schedulerName": "coscheduler"},
            "is not a scheduler",
        ),
    ]
    core = client.CoreV1Api(api)
    for i, (labels, spec, denial) in enumerate(cases):
        body = {
            "metadata": {"name": f"probe-{i}", "labels": labels},
            "spec": {**spec, "containers": [container()]},
        }
        if denial is None:
            await core.create_namespaced_pod(namespace, body, dry_run="All")
            continue
        with pytest.raises(ApiException) as denied:
            await core.create_namespaced_pod(namespace, body, dry_run="All")
        assert "quorum-gang-backstop" in str(denied.value.body) and denial in str(denied.value.body), (
            labels,
            spec,
        )


async def test_with_the_webhook_server_down_gates_stay_protected_and_gang_pods_wait(
    start_instance: Callable[..., Instance],
) -> None:
    """A named instance of its own, installed with `--pod-admission webhooks`, whose
    quorum-webhooks is stopped: the gate protection and the backstop policy live in the apiserver
    and hold; the controller's retries succeed once the server is back."""
    instance = start_instance("t-nowebhooks", pod_admission="webhooks")
    api = await api_client(instance.kubeconfig("admin"))
    async with api:
        core = client.CoreV1Api(api)
        await create_namespace(api, "work")
        await _create_gated_pod(api, "work", "gated")
        await _create_gated_pod(api, "work", "gated2")
        instance.stop_component("quorum-webhooks")
        state = instance.state()
        assert state is not None
        assert not any(p.name == "quorum-webhooks" and is_alive(p) for p in state.processes)

        await check_gate_protection(instance, api, "work")
        # The mutating webhook fails open: a plain pod is created, without the toleration.
        plain = await core.create_namespaced_pod(
            "work", {"metadata": {"name": "plain"}, "spec": {"containers": [container()]}}
        )
        assert not any(t.key == "is_cpu_compute" for t in plain.spec.tolerations or [])
        # Validating webhooks fail closed, but only for objects with the labels they judge.
        with pytest.raises(ApiException) as closed:
            await core.create_namespaced_pod(
                "work",
                {
                    "metadata": {"name": "labelled", "labels": {"x.coreweave.cloud/y": "1"}},
                    "spec": {"containers": [container()]},
                },
            )
        assert "failed calling webhook" in str(closed.value.body)

        await check_backstop_rules(api, "work")
        # Backstop: gang pods the webhook did not see are refused, so none bypasses quorum...
        await create_podgroup(api, "work", "pg1", 2)
        manifest = yaml.safe_load_all((EXAMPLES / "seed-001-coscheduler/podgroup-pause.yaml").read_text())
        seed = next(d for d in manifest if d["kind"] == "Deployment")
        await client.AppsV1Api(api).create_namespaced_deployment("work", seed)

        async def refused() -> list[str] | None:
            events = (await core.list_namespaced_event("work")).items
            found = [
                e.message
                for e in events
                if e.reason == "FailedCreate" and "quorum-gang-backstop" in e.message
            ]
            return found or None

        messages = await eventually(refused, timeout=30, what="FailedCreate by the backstop policy")
        assert "quorum-webhooks did not process it" in messages[0] or "is not a scheduler" in messages[0]
        assert [p for p in (await core.list_namespaced_pod("work", label_selector="app=pause")).items] == []

        # ...and once the server is back, the ReplicaSet controller's retries create them gated,
        # and quorum releases the gang.
        instance.start_component("quorum-webhooks")

        async def running() -> bool:
            found = (await core.list_namespaced_pod("work", label_selector="app=pause")).items
            return len(found) == 2 and all(p.status.phase == "Running" for p in found)

        await eventually(running, timeout=120, what="the seed's pods created and Running")
        gang = await client.CustomObjectsApi(api).get_namespaced_custom_object(
            "quorum.dev", "v1alpha1", "work", "gangs", "pg-pg1"
        )
        assert len(gang["status"]["admission"]["placement"]) == 2


async def test_with_pods_admitted_in_the_apiserver_a_dead_server_stops_only_gangs_whose_names_it_shortens(
    start_instance: Callable[..., Instance],
) -> None:
    """The default way (`policies`), quorum-webhooks stopped: a CPU pod still gets its toleration
    and a gang's pods are created gated, by quorum-pod-defaults in the apiserver; only a gang
    whose name quorum must hash (a PodGroup name with a dot) is refused by the backstop, and
    its controller's retries succeed once the server is back."""
    instance = start_instance("t-nowebhooks-policies", operator=False)
    api = await api_client(instance.kubeconfig("admin"))
    async with api:
        core = client.CoreV1Api(api)
        await create_namespace(api, "work")
        instance.stop_component("quorum-webhooks")
        plain = await core.create_namespaced_pod(
            "work", {"metadata": {"name": "plain"}, "spec": {"containers": [container()]}}
        )
        assert any(t.key == "is_cpu_compute" for t in plain.spec.tolerations or [])
        gang = await core.create_namespaced_pod(
            "work",
            {
                "metadata": {"name": "member", "labels": {"pod-group.scheduling.sigs.k8s.io": "pg1"}},
                "spec": {"schedulerName": "cw-coscheduler", "containers": [container(1)]},
            },
        )
        assert [g.name for g in gang.spec.scheduling_gates or []] == ["quorum.dev/gang"]
        assert gang.metadata.labels["quorum.dev/gang"] == "pg-pg1"
        assert gang.spec.scheduler_name == "default-scheduler"
        shortened = {
            "metadata": {"name": "dotted", "labels": {"pod-group.scheduling.sigs.k8s.io": "pg.1"}},
            "spec": {"containers": [container(1)]},
        }
        with pytest.raises(ApiException) as refused:
            await core.create_namespaced_pod("work", shortened)
        assert "quorum-gang-backstop" in str(refused.value.body)
        instance.start_component("quorum-webhooks")

        async def created() -> bool:
            try:
                pod = await core.create_namespaced_pod("work", shortened)
            except ApiException:
                return False
            return pod.metadata.labels["quorum.dev/gang"].startswith("pg-pg-1-")

        await eventually(created, timeout=30, what="the dotted gang's pod created, gated by quorum-webhooks")
