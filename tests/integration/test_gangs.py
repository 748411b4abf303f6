"""Gang admission end to end: the webhook gates gang pods, quorum-operator (running with its
ServiceAccount's token) plans and releases whole gangs, kube-scheduler binds, kwok runs.
Scenarios whose outcome depends on capacity use their own node pool."""

from __future__ import annotations

import json
import ssl
import urllib.request
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
import yaml
from kubernetes_asyncio import client
from kubernetes_asyncio.client.exceptions import ApiException

from devcluster.cluster import Instance
from devcluster.nodes import STATE_LABEL, TEST_POOL_KEY, TestPool
from tests.kube import assert_no_overcommit, create_podgroup, eventually, raw_json

pytestmark = [pytest.mark.cluster, pytest.mark.kubernetes_1_36]

EXAMPLES = Path(__file__).resolve().parents[2] / "examples"
SIGS = ("scheduling.sigs.k8s.io", "v1alpha1", "podgroups")
GANGS = ("quorum.dev", "v1alpha1", "gangs")
GATE = "quorum.dev/gang"


async def get(
    api: client.ApiClient, kind: tuple[str, str, str], namespace: str, name: str
) -> dict[str, Any] | None:
    try:
        obj: dict[str, Any] = await client.CustomObjectsApi(api).get_namespaced_custom_object(
            kind[0], kind[1], namespace, kind[2], name
        )
    except ApiException as err:
        if err.status == 404:
            return None
        raise
    return obj


async def pods(api: client.ApiClient, namespace: str, selector: str = "") -> list[dict[str, Any]]:
    data = await raw_json(
        client.CoreV1Api(api).list_namespaced_pod(namespace, label_selector=selector, _preload_content=False)
    )
    items: list[dict[str, Any]] = data["items"]
    return items


def gated(pod: dict[str, Any]) -> bool:
    return any(g["name"] == GATE for g in pod["spec"].get("schedulingGates") or [])


def admitted(gang: dict[str, Any] | None) -> dict[str, Any]:
    conditions = (gang or {}).get("status", {}).get("conditions") or []
    return next((c for c in conditions if c["type"] == "Admitted"), {})


async def gang_condition(
    api: client.ApiClient,
    namespace: str,
    name: str,
    reason: str,
    message: str | None = None,
    containing: str = "",
) -> dict[str, Any]:
    """The Gang once its Admitted condition has `reason` (and `message`, or a message
    `containing` a text, if given: counters move as pods arrive and nodes get Ready, so a test
    that checks numbers waits for them)."""

    async def probe() -> dict[str, Any] | None:
        gang = await get(api, GANGS, namespace, name)
        condition = admitted(gang)
        text = condition.get("message") or ""
        ok = condition.get("reason") == reason and message in (None, text) and containing in text
        return gang if ok else None

    return await eventually(probe, timeout=45, what=f"gang {name} {reason} {message or ''}")


async def all_running(
    api: client.ApiClient, namespace: str, count: int, selector: str = ""
) -> list[dict[str, Any]]:
    async def probe() -> list[dict[str, Any]] | None:
        found = await pods(api, namespace, selector)
        running = [p for p in found if p["status"].get("phase") == "Running"]
        return running if len(running) == count else None

    return await eventually(probe, timeout=60, what=f"{count} pods Running")


async def assert_as_planned(api: client.ApiClient, namespace: str, gang_name: str) -> None:
    """Every released pod is bound to the node its gang's recorded plan chose."""
    gang = await get(api, GANGS, namespace, gang_name)
    assert gang is not None
    planned = {p["uid"]: p["node"] for p in gang["status"]["admission"]["placement"]}
    nodes = {
        n["metadata"]["name"]: n
        for n in (await raw_json(client.CoreV1Api(api).list_node(_preload_content=False)))["items"]
    }
    for pod in await pods(api, namespace, f"quorum.dev/gang={gang_name}"):
        # kopf writes nothing: no annotations or finalizers of its own on anything it watches
        assert not any(k.startswith("kopf.zalando.org") for k in pod["metadata"].get("annotations") or {})
        assert not [f for f in pod["metadata"].get("finalizers") or [] if "kopf" in f]
        if not gated(pod) and pod["metadata"]["uid"] in planned:
            assert pod["spec"]["nodeName"] == planned[pod["metadata"]["uid"]], pod["metadata"]["name"]
            node = nodes[pod["spec"]["nodeName"]]  # never a triage or cordoned node
            assert node["metadata"]["labels"][STATE_LABEL] == "production" and not node["spec"].get(
                "unschedulable"
            )
    await assert_no_overcommit(api)


def deployment(
    name: str, replicas: int, gpus: int, pool: TestPool | None, group: str | None
) -> dict[str, Any]:
    labels = {"app": name}
    if group:
        labels["pod-group.scheduling.sigs.k8s.io"] = group
    spec: dict[str, Any] = {
        "schedulerName": "cw-coscheduler",
        "containers": [
            {
                "name": "c",
                "image": "registry.k8s.io/pause:3.10",
                "resources": {"limits": {"nvidia.com/gpu": str(gpus)}} if gpus else {},
            }
        ],
    }
    if pool is not None:
        spec.update(pool.pod_spec())
    return {
        "apiVersion": "apps/v1",
        "kind": "Deployment",
        "metadata": {"name": name},
        "spec": {
            "replicas": replicas,
            "selector": {"matchLabels": {"app": name}},
            "template": {"metadata": {"labels": labels}, "spec": spec},
        },
    }


async def test_seed_001_held_at_two_of_four_then_released_whole(
    cluster: Instance, customer_api: client.ApiClient, api: client.ApiClient, namespace: str
) -> None:
    """Seed 001's manifest exactly: PodGroup pg1 (minMember 4) + Deployment of 2 replicas."""
    manifest = (EXAMPLES / "seed-001-coscheduler/podgroup-pause.yaml").read_text()
    applied = cluster.kubectl("-n", namespace, "apply", "-f", "-", who="customer", input_text=manifest)
    assert applied.returncode == 0, applied.stderr

    async def two_gated() -> list[dict[str, Any]] | None:
        found = await pods(api, namespace, "app=pause")
        return found if len(found) == 2 and all(gated(p) for p in found) else None

    for pod in await eventually(two_gated, timeout=30, what="2 gated pods"):
        assert pod["metadata"]["labels"]["quorum.dev/gang"] == "pg-pg1"
        assert pod["spec"]["schedulerName"] == "default-scheduler"
        assert pod["metadata"]["annotations"]["quorum.dev/requested-scheduler"] == "cw-coscheduler"
        assert not pod["spec"].get("nodeName")
    gang = await gang_condition(
        api, namespace, "pg-pg1", "WaitingForMembers", "2 of 4 members exist (minMember 4)"
    )
    assert gang["status"]["phase"] == "Pending" and gang["status"]["members"] == 2
    assert gang["metadata"]["ownerReferences"][0]["kind"] == "PodGroup"

    async def podgroup_waiting() -> dict[str, Any] | None:
        # The PodGroup's status is written after the Gang's, so wait for it too.
        group = await get(api, SIGS, namespace, "pg1")
        conditions = (group or {}).get("status", {}).get("conditions", [])
        ours = [c for c in conditions if c["type"] == "QuorumAdmitted"]
        return group if ours and ours[0]["message"] == "2 of 4 members exist (minMember 4)" else None

    group = await eventually(podgroup_waiting, timeout=30, what="PodGroup QuorumAdmitted waiting")
    assert group["status"]["phase"] == "Pending"

    scaled = cluster.kubectl("-n", namespace, "scale", "deployment", "pause", "--replicas=4", who="customer")
    assert scaled.returncode == 0
    running = await all_running(api, namespace, 4, "app=pause")
    gang = await gang_condition(api, namespace, "pg-pg1", "Released")
    admission = gang["status"]["admission"]
    assert admission["attempt"] == 1 and len(admission["placement"]) == 4, "one decision for the whole gang"
    assert {p["uid"] for p in admission["placement"]} == {p["metadata"]["uid"] for p in running}
    await assert_as_planned(api, namespace, "pg-pg1")

    async def podgroup_running() -> dict[str, Any] | None:
        group = await get(api, SIGS, namespace, "pg1")
        return group if (group or {}).get("status", {}).get("phase") == "Running" else None

    group = await eventually(podgroup_running, timeout=30, what="PodGroup Running")
    assert group["status"]["running"] == 4 and group["status"]["scheduled"] == 4
    events = await raw_json(client.CoreV1Api(api).list_namespaced_event(namespace, _preload_content=False))
    released = [e for e in events["items"] if e["reason"] == "Released"]  # one, on the PodGroup
    assert len(released) == 1 and "released 4 of 4 planned pods" in released[0]["message"]
    assert released[0]["involvedObject"]["kind"] == "PodGroup"


async def test_two_gangs_that_cannot_both_fit(
    customer_api: client.ApiClient, api: client.ApiClient, namespace: str, test_pool: Callable[..., Any]
) -> None:
    pool: TestPool = await test_pool(count=2)
    apps = client.AppsV1Api(customer_api)
    await create_podgroup(customer_api, namespace, "first", 2)
    await apps.create_namespaced_deployment(namespace, deployment("first", 2, 8, pool, "first"))
    await all_running(api, namespace, 2, "app=first")
    await create_podgroup(customer_api, namespace, "second", 2)
    await apps.create_namespaced_deployment(namespace, deployment("second", 2, 8, pool, "second"))
    held = await gang_condition(api, namespace, "pg-second", "Unschedulable", containing="short by 2")
    assert "2 pods × 8 nvidia.com/gpu" in admitted(held)["message"]
    assert "short by 2" in admitted(held)["message"]
    assert all(not p["spec"].get("nodeName") for p in await pods(api, namespace, "app=second")), (
        "no partial gang"
    )
    await assert_as_planned(api, namespace, "pg-first")

    await apps.delete_namespaced_deployment("first", namespace)
    await all_running(api, namespace, 2, "app=second")
    await assert_as_planned(api, namespace, "pg-second")


async def test_pods_with_their_own_node_affinity_are_pinned_within_it(
    customer_api: client.ApiClient, api: client.ApiClient, namespace: str, test_pool: Callable[..., Any]
) -> None:
    """The release pins a pod by node name in each of its own required node affinity terms: the
    apiserver accepts these additions on a gated pod (KEP-3838), kube-scheduler binds as planned."""
    pool: TestPool = await test_pool(count=3)
    terms = [
        {"matchExpressions": [{"key": TEST_POOL_KEY, "operator": "In", "values": [pool.name]}]},
        {"matchFields": [{"key": "metadata.name", "operator": "NotIn", "values": pool.names[2:]}]},
    ]
    required = "requiredDuringSchedulingIgnoredDuringExecution"
    manifest = deployment("own", 2, 8, pool, "own")
    manifest["spec"]["template"]["spec"]["affinity"] = {
        "nodeAffinity": {required: {"nodeSelectorTerms": terms}}
    }
    await create_podgroup(customer_api, namespace, "own", 2)
    await client.AppsV1Api(customer_api).create_namespaced_deployment(namespace, manifest)
    running = await all_running(api, namespace, 2, "app=own")
    await assert_as_planned(api, namespace, "pg-own")
    for pod in running:
        node = pod["spec"]["nodeName"]
        pin = {"key": "metadata.name", "operator": "In", "values": [node]}
        got = pod["spec"]["affinity"]["nodeAffinity"][required]["nodeSelectorTerms"]
        assert got == [{**terms[0], "matchFields": [pin]}, {"matchFields": [*terms[1]["matchFields"], pin]}]


async def test_fragmented_capacity_holds_until_a_node_frees_up(
    customer_api: client.ApiClient, api: client.ApiClient, namespace: str, test_pool: Callable[..., Any]
) -> None:
    pool: TestPool = await test_pool(count=2)
    core = client.CoreV1Api(customer_api)
    for i, node in enumerate(pool.names):  # 4 of 8 GPUs taken on each node: 8 free in all
        spec = {
            **pool.pod_spec(),
            "containers": [
                {
                    "name": "c",
                    "image": "registry.k8s.io/pause:3.10",
                    "resources": {"limits": {"nvidia.com/gpu": "4"}},
                }
            ],
        }
        spec["nodeSelector"] = {**spec["nodeSelector"], "kubernetes.io/hostname": node}
        await core.create_namespaced_pod(namespace, {"metadata": {"name": f"filler-{i}"}, "spec": spec})
    await all_running(api, namespace, 2)
    await create_podgroup(customer_api, namespace, "big", 1)
    await client.AppsV1Api(customer_api).create_namespaced_deployment(
        namespace, deployment("big", 1, 8, pool, "big")
    )
    held = await gang_condition(api, namespace, "pg-big", "Unschedulable", containing="0 have room for one")
    assert "0 have room for one" in admitted(held)["message"], admitted(held)
    await core.delete_namespaced_pod("filler-0", namespace, grace_period_seconds=0)
    await all_running(api, namespace, 1, "app=big")
    await assert_as_planned(api, namespace, "pg-big")


async def test_gang_larger_than_the_cluster_is_held_with_a_reason(
    customer_api: client.ApiClient, api: client.ApiClient, namespace: str, test_pool: Callable[..., Any]
) -> None:
    pool: TestPool = await test_pool(count=2)
    await create_podgroup(customer_api, namespace, "huge", 3)
    await client.AppsV1Api(customer_api).create_namespaced_deployment(
        namespace, deployment("huge", 3, 8, pool, "huge")
    )
    held = await gang_condition(api, namespace, "pg-huge", "Unschedulable", containing="short by 1")
    message = admitted(held)["message"]
    assert "3 pods × 8 nvidia.com/gpu" in message and "short by 1" in message, message
    assert all(gated(p) for p in await pods(api, namespace, "app=huge"))


async def test_label_only_gang_of_seed_000(cluster: Instance, api: client.ApiClient, namespace: str) -> None:
    manifest = (EXAMPLES / "seed-001-coscheduler/labels-pause.yaml").read_text()
    applied = cluster.kubectl("-n", namespace, "apply", "-f", "-", who="customer", input_text=manifest)
    assert applied.returncode == 0, applied.stderr
    await all_running(api, namespace, 2, "app=pause-labels")
    gang = await gang_condition(api, namespace, "lbl-pause-labels", "Released")
    assert gang["spec"]["source"] == {"kind": "Labels", "name": "pause-labels"}
    assert "ownerReferences" not in gang["metadata"]
    await assert_as_planned(api, namespace, "lbl-pause-labels")


async def test_cpu_gang_lands_on_cpu_nodes_and_never_on_triage_or_cordoned(
    customer_api: client.ApiClient, api: client.ApiClient, namespace: str
) -> None:
    body = deployment("cpu", 3, 0, None, "cpu")
    body["spec"]["template"]["spec"]["containers"][0]["resources"] = {
        "requests": {"cpu": "2", "memory": "1Gi"}
    }
    await create_podgroup(customer_api, namespace, "cpu", 3)
    await client.AppsV1Api(customer_api).create_namespaced_deployment(namespace, body)
    running = await all_running(api, namespace, 3, "app=cpu")
    nodes = {
        n["metadata"]["name"]: n
        for n in (await raw_json(client.CoreV1Api(api).list_node(_preload_content=False)))["items"]
    }
    for pod in running:
        node = nodes[pod["spec"]["nodeName"]]
        assert "nvidia.com/gpu" not in node["status"]["allocatable"], node["metadata"]["name"]
        assert node["metadata"]["labels"][STATE_LABEL] == "production" and not node["spec"].get(
            "unschedulable"
        )
    await assert_as_planned(api, namespace, "pg-cpu")


async def test_bad_podgroups_are_refused_with_readable_messages(cluster: Instance, namespace: str) -> None:
    bad = {
        "apiVersion": "scheduling.sigs.k8s.io/v1alpha1",
        "kind": "PodGroup",
        "metadata": {"name": "bad"},
        "spec": {"minMember": 0, "minResources": {"nvidia.com/gpu": "lots"}},
    }
    refused = cluster.kubectl(
        "-n", namespace, "create", "-f", "-", who="customer", input_text=json.dumps(bad), check=False
    )
    assert refused.returncode != 0
    assert "spec.minMember in body should be greater than or equal to 1" in refused.stderr
    assert 'spec.minResources.nvidia.com/gpu: Invalid value: "lots"' in refused.stderr
    missing = yaml.safe_dump({**bad, "spec": {}})
    refused = cluster.kubectl(
        "-n", namespace, "create", "-f", "-", who="customer", input_text=missing, check=False
    )
    assert "spec.minMember: Required value" in refused.stderr


async def test_gang_pods_are_refused_what_would_bypass_quorum(cluster: Instance, namespace: str) -> None:
    def create(obj: dict[str, Any]) -> str:
        done = cluster.kubectl(
            "-n", namespace, "create", "-f", "-", who="customer", input_text=json.dumps(obj), check=False
        )
        assert done.returncode != 0, f"{obj['metadata']['name']} was created"
        return done.stderr

    template_label = deployment("forged-template", 1, 0, None, "g")
    template_label["spec"]["template"]["metadata"]["labels"]["quorum.dev/gang"] = "pg-g"
    assert "the pod template carries quorum.dev/gang" in create(template_label)
    forged = {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {
            "name": "forged",
            "labels": {"pod-group.scheduling.sigs.k8s.io": "g", "quorum.dev/gang": "pg-other"},
        },
        "spec": {"containers": [{"name": "c", "image": "registry.k8s.io/pause:3.10"}]},
    }
    assert "quorum.dev/gang='pg-other'" in create(forged)
    pinned = {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": "pinned", "labels": {"pod-group.scheduling.sigs.k8s.io": "g"}},
        "spec": {
            "nodeName": "gpu-h100-001",
            "containers": [{"name": "c", "image": "registry.k8s.io/pause:3.10"}],
        },
    }
    assert "sets spec.nodeName='gpu-h100-001'" in create(pinned)


async def test_ordered_ready_statefulset_gang_is_warned_about_twice(
    cluster: Instance, customer_api: client.ApiClient, api: client.ApiClient, namespace: str
) -> None:
    await create_podgroup(customer_api, namespace, "db", 2)
    sts = {
        "apiVersion": "apps/v1",
        "kind": "StatefulSet",
        "metadata": {"name": "db"},
        "spec": {
            "replicas": 2,
            "serviceName": "db",
            "selector": {"matchLabels": {"app": "db"}},
            "template": {
                "metadata": {"labels": {"app": "db", "pod-group.scheduling.sigs.k8s.io": "db"}},
                "spec": {"containers": [{"name": "c", "image": "registry.k8s.io/pause:3.10"}]},
            },
        },
    }
    created = cluster.kubectl(
        "-n", namespace, "create", "-f", "-", who="customer", input_text=json.dumps(sts)
    )
    assert "Warning:" in created.stderr and "podManagementPolicy: Parallel" in created.stderr
    held = await gang_condition(api, namespace, "pg-db", "WaitingForMembers", containing="OrderedReady")
    message = admitted(held)["message"]
    assert message.startswith(
        "1 of 2 members exist (minMember 2); StatefulSet db uses podManagementPolicy OrderedReady"
    )


async def test_unmodeled_constraints_get_a_warning_event(
    customer_api: client.ApiClient, api: client.ApiClient, namespace: str
) -> None:
    body = deployment("spread", 2, 0, None, "spread")
    body["spec"]["template"]["spec"]["affinity"] = {
        "podAntiAffinity": {
            "requiredDuringSchedulingIgnoredDuringExecution": [
                {"topologyKey": "kubernetes.io/hostname", "labelSelector": {"matchLabels": {"app": "spread"}}}
            ]
        }
    }
    await create_podgroup(customer_api, namespace, "spread", 3)  # never complete: stays gated
    await client.AppsV1Api(customer_api).create_namespaced_deployment(namespace, body)

    async def warned() -> list[dict[str, Any]] | None:
        events = await raw_json(
            client.CoreV1Api(api).list_namespaced_event(namespace, _preload_content=False)
        )
        found = [e for e in events["items"] if e["reason"] == "UnmodeledConstraints"]
        return found or None

    events = await eventually(warned, timeout=30, what="UnmodeledConstraints event")
    assert "required pod anti-affinity" in events[0]["message"] and events[0]["type"] == "Warning"


async def test_pods_with_another_gate_wait_until_it_is_removed(
    customer_api: client.ApiClient, api: client.ApiClient, namespace: str, test_pool: Callable[..., Any]
) -> None:
    """Other gates mean "not quorum's to release yet" (docs/architecture.md) — a pod released
    while another gate holds it could not bind, and its gang would time out."""
    pool: TestPool = await test_pool(count=1)
    core = client.CoreV1Api(customer_api)
    await create_podgroup(customer_api, namespace, "held", 2)
    for name in ("a", "b"):
        spec: dict[str, Any] = {
            "containers": [{"name": "c", "image": "registry.k8s.io/pause:3.10"}],
            **pool.pod_spec(),
        }
        if name == "b":
            spec["schedulingGates"] = [{"name": "example.com/hold"}]
        body = {
            "metadata": {"name": name, "labels": {"pod-group.scheduling.sigs.k8s.io": "held"}},
            "spec": spec,
        }
        await core.create_namespaced_pod(namespace, body)
    gang = await gang_condition(api, namespace, "pg-held", "WaitingForOtherGates")
    assert "1 pods also carry other scheduling gates (example.com/hold)" in admitted(gang)["message"]
    assert all(gated(p) for p in await pods(api, namespace)), "neither pod released while b is held"

    b = await core.read_namespaced_pod("b", namespace)
    index = [g.name for g in b.spec.scheduling_gates].index("example.com/hold")
    await core.patch_namespaced_pod(
        "b", namespace, [{"op": "remove", "path": f"/spec/schedulingGates/{index}"}]
    )
    await all_running(api, namespace, 2)
    await assert_as_planned(api, namespace, "pg-held")


def webhook_calls(cluster: Instance, webhook: str) -> int:
    """AdmissionReviews quorum-webhooks has answered on `webhook`, from its /metrics."""
    state = cluster.state()
    assert state is not None
    context = ssl.create_default_context(cafile=str(cluster.layout.root / "webhooks-pki" / "ca.crt"))
    url = f"https://127.0.0.1:{state.ports.webhooks}/metrics"
    with urllib.request.urlopen(url, context=context, timeout=5) as response:
        text = response.read().decode()
    prefix = f'quorum_webhook_requests_total{{webhook="{webhook}",'
    return sum(int(line.rsplit(" ", 1)[1]) for line in text.splitlines() if line.startswith(prefix))


async def test_a_gang_pod_is_validated_at_creation_only_when_it_carries_more_than_quorum_sets(
    cluster: Instance, namespace: str
) -> None:
    """The gangs webhook's CEL condition lets a gang pod whose quorum.dev/* keys are exactly what
    the mutating webhook set be created without a second call; anything else still goes there."""

    def pod(name: str, labels: dict[str, str]) -> str:
        obj = {
            "apiVersion": "v1",
            "kind": "Pod",
            "metadata": {"name": name, "labels": {"pod-group.scheduling.sigs.k8s.io": "calls", **labels}},
            "spec": {"containers": [{"name": "c", "image": "registry.k8s.io/pause:3.10"}]},
        }
        done = cluster.kubectl(
            "-n", namespace, "create", "-f", "-", who="customer", input_text=json.dumps(obj), check=False
        )
        return done.stderr

    before = webhook_calls(cluster, "validate-pods")
    assert pod("plain", {}) == ""
    assert webhook_calls(cluster, "validate-pods") == before, "an ordinary gang pod: one webhook call"
    assert "quorum.dev/extra" in pod("extra", {"quorum.dev/extra": "x"})
    assert webhook_calls(cluster, "validate-pods") == before + 1, "an unknown quorum.dev key is checked"
