"""A hostile tenant on the real control plane (docs/threat-model.md, "How quorum is attacked").
Each attack is made by the identity that would make it, with that identity's own kubeconfig:
a namespace-scoped tenant (`edit` in its namespace) or a CKS customer (cluster-admin by RBAC,
not system:masters). Each asserts the apiserver's refusal, and beside it a bystander's gang is
admitted and runs whole."""

from __future__ import annotations

import asyncio
import json
import secrets
import time
from collections.abc import AsyncIterator, Callable
from typing import Any

import pytest
from kubernetes_asyncio import client
from kubernetes_asyncio.client.exceptions import ApiException

from devcluster.cluster import Instance
from devcluster.nodes import TestPool
from quorum.core.gangs import LABEL_GANG_MIN_AVAILABLE, LABEL_GANG_NAME
from tests.integration.test_explain import quorum
from tests.integration.test_gangs import all_running, deployment
from tests.integration.test_preemption import HIGH, LOW, gang_deployment
from tests.kube import api_client, create_namespace, create_podgroup, eventually, raw_json

pytestmark = pytest.mark.cluster
JSON = dict[str, Any]
MERGE = "application/merge-patch+json"


@pytest.fixture
async def tenant_api(
    cluster: Instance, api: client.ApiClient, namespace: str
) -> AsyncIterator[client.ApiClient]:
    """The tenant, with `edit` in the test's namespace and nothing elsewhere."""
    binding = {
        "metadata": {"name": "tenant-edit"},
        "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "ClusterRole", "name": "edit"},
        "subjects": [{"apiGroup": "rbac.authorization.k8s.io", "kind": "User", "name": "tenant@example.com"}],
    }
    await client.RbacAuthorizationV1Api(api).create_namespaced_role_binding(namespace, binding)
    tenant = await api_client(cluster.kubeconfig("tenant"))
    async with tenant:
        yield tenant


def refusal(err: pytest.ExceptionInfo[ApiException]) -> str:
    assert err.value.status in (403, 422), (err.value.status, err.value.body)
    return str(json.loads(err.value.body)["message"])


def bare_pod(name: str, pool: TestPool, tolerations: list[JSON] | None = None) -> JSON:
    spec: JSON = {
        "containers": [{"name": "c", "image": "registry.k8s.io/pause:3.10"}],
        **pool.pod_spec(),
    }
    spec["tolerations"] = spec["tolerations"] + (tolerations or [])
    return {"apiVersion": "v1", "kind": "Pod", "metadata": {"name": name}, "spec": spec}


BLANKET = {"operator": "Exists"}
RESERVED = {"key": "quorum.dev/reserved", "operator": "Exists"}
LOCK = {"key": "sunk.coreweave.com/lock", "operator": "Equal", "value": "true", "effect": "NoExecute"}


async def test_a_tenant_may_not_tolerate_the_room_a_preemption_reserved(
    tenant_api: client.ApiClient,
    customer_api: client.ApiClient,
    api: client.ApiClient,
    namespace: str,
    test_pool: Callable[..., Any],
) -> None:
    pool: TestPool = await test_pool(count=2)
    core = client.CoreV1Api(tenant_api)
    for name, toleration, words in [
        ("blanket", BLANKET, "covers the taint\nquorum.dev/reserved"),
        ("reserved", RESERVED, "quorum.dev/reserved is quorum's to add"),
        ("lock", LOCK, "sunk.coreweave.com/lock is for the pods Slurm places"),
    ]:
        with pytest.raises(ApiException) as refused:
            await core.create_namespaced_pod(namespace, bare_pod(name, pool, [toleration]))
        message = refusal(refused)
        assert "quorum-reserved-tolerations" in message and " ".join(words.split()) in " ".join(
            message.split()
        )
    # Taints named by key, and a blanket toleration of an effect neither reservation has, pass.
    keyed = [{"key": "dedicated", "operator": "Exists"}, {**BLANKET, "effect": "PreferNoSchedule"}]
    await core.create_namespaced_pod(namespace, bare_pod("keyed", pool, keyed))
    # Added later, on an UPDATE (tolerations may be added to a pod): refused the same.
    await core.create_namespaced_pod(namespace, bare_pod("plain", pool))
    patch = [{"op": "add", "path": "/spec/tolerations/-", "value": BLANKET}]
    with pytest.raises(ApiException) as refused:
        await core.patch_namespaced_pod("plain", namespace, patch)
    assert "quorum-reserved-tolerations" in refusal(refused)
    # Not by namespace: the customer, who may create pods in kube-system, is refused there too.
    with pytest.raises(ApiException) as refused:
        await client.CoreV1Api(customer_api).create_namespaced_pod(
            "kube-system", bare_pod("blanket", pool, [BLANKET]), dry_run="All"
        )
    assert "quorum-reserved-tolerations" in refusal(refused)

    # DaemonSet pods tolerate everything, by who creates them (the DaemonSet controller).
    selector = {"app": "agent"}
    template_spec = bare_pod("agent", pool, [BLANKET])["spec"]
    template_spec["nodeSelector"] = {**template_spec["nodeSelector"], "kubernetes.io/hostname": pool.names[0]}
    daemonset = {
        "metadata": {"name": "agent"},
        "spec": {
            "selector": {"matchLabels": selector},
            "template": {"metadata": {"labels": selector}, "spec": template_spec},
        },
    }
    await client.AppsV1Api(tenant_api).create_namespaced_daemon_set(namespace, daemonset)

    async def agent_pod() -> list[Any]:
        return (await client.CoreV1Api(api).list_namespaced_pod(namespace, label_selector="app=agent")).items

    (agent,) = await eventually(agent_pod, timeout=60, what="the DaemonSet's pod, created by its controller")
    assert BLANKET in [
        {k: v for k, v in t.to_dict().items() if v is not None} for t in agent.spec.tolerations
    ]

    # The bystander beside it: a gang of the tenant's, admitted and running whole.
    await create_podgroup(tenant_api, namespace, "train", 2)
    await client.AppsV1Api(tenant_api).create_namespaced_deployment(
        namespace, deployment("train", 2, 8, pool, "train")
    )
    await all_running(api, namespace, 2, "app=train")


async def test_reserved_labels_and_quorum_keys_do_not_go_on_through_status(
    cluster: Instance,
    customer_api: client.ApiClient,
    api: client.ApiClient,
    namespace: str,
    test_pool: Callable[..., Any],
) -> None:
    pool: TestPool = await test_pool(count=1)
    node = pool.names[0]
    core = client.CoreV1Api(customer_api)
    triage = {"metadata": {"labels": {"node.coreweave.cloud/state": "triage"}}}
    with pytest.raises(ApiException) as refused:
        await core.patch_node_status(node, triage)
    message = refusal(refused)
    assert "quorum-reserved-status" in message and "node.coreweave.cloud/state" in message, message
    # A status update that leaves metadata alone (what kubelets send) passes.
    stamp = "2026-11-25T00:00:00Z"
    condition = {"type": "TenantProbe", "status": "True", "reason": "Probe", "message": "",
                 "lastHeartbeatTime": stamp, "lastTransitionTime": stamp}  # fmt: skip
    await core.patch_node_status(node, {"status": {"conditions": [condition]}})
    # The platform may, through status as anywhere.
    platform = await api_client(cluster.kubeconfig("platform"))
    async with platform:
        await client.CoreV1Api(platform).patch_node_status(
            node, {"metadata": {"labels": {"node.coreweave.cloud/x": "y"}}}
        )

    await core.create_namespaced_pod(namespace, bare_pod("p", pool))
    immune = {"metadata": {"annotations": {"quorum.dev/preemptible": "false"}}}
    with pytest.raises(ApiException) as refused:
        await core.patch_namespaced_pod_status("p", namespace, immune)
    assert "quorum-reserved-status" in refusal(refused)
    found = await client.CoreV1Api(api).read_namespaced_pod("p", namespace)
    assert "quorum.dev/preemptible" not in (found.metadata.annotations or {})


async def test_quorums_records_are_written_by_quorum_alone(
    customer_api: client.ApiClient, api: client.ApiClient, namespace: str, test_pool: Callable[..., Any]
) -> None:
    pool: TestPool = await test_pool(count=2)
    await create_podgroup(customer_api, namespace, "train", 2)
    await client.AppsV1Api(customer_api).create_namespaced_deployment(
        namespace, deployment("train", 2, 8, pool, "train")
    )
    await all_running(api, namespace, 2, "app=train")  # the operator wrote its Gang: quorum may
    custom = client.CustomObjectsApi(customer_api)
    forged = {
        "status": {
            "preemption": {"token": "t0k3n", "deadline": "2099-01-01T00:00:00Z", "nodes": [], "victims": []}
        }
    }
    attempts: list[tuple[str, Any]] = [
        (
            "status",
            lambda: custom.patch_namespaced_custom_object_status(
                "quorum.dev",
                "v1alpha1",
                namespace,
                "gangs",
                "pg-train",
                forged,
                _content_type=MERGE,  # type: ignore[call-arg]  # a dict body would go as JSON patch
            ),
        ),
        (
            "spec",
            lambda: custom.patch_namespaced_custom_object(
                "quorum.dev",
                "v1alpha1",
                namespace,
                "gangs",
                "pg-train",
                {"spec": {"minMember": 1}},
                _content_type=MERGE,  # type: ignore[call-arg]
            ),
        ),
        (
            "create",
            lambda: custom.create_namespaced_custom_object(
                "quorum.dev",
                "v1alpha1",
                namespace,
                "gangs",
                {
                    "apiVersion": "quorum.dev/v1alpha1",
                    "kind": "Gang",
                    "metadata": {"name": "pg-forged"},
                    "spec": {"source": {"kind": "Labels", "name": "forged"}, "minMember": 1},
                },
            ),
        ),
        (
            "delete",
            lambda: custom.delete_namespaced_custom_object(
                "quorum.dev", "v1alpha1", namespace, "gangs", "pg-train"
            ),
        ),
    ]
    for what, attempt in attempts:
        with pytest.raises(ApiException) as refused:
            await attempt()
        assert "quorum-records" in refusal(refused), what
    gang = await client.CustomObjectsApi(api).get_namespaced_custom_object(
        "quorum.dev", "v1alpha1", namespace, "gangs", "pg-train"
    )
    assert not gang["status"].get("preemption") and gang["spec"]["minMember"] == 2


async def test_immunity_from_preemption_is_not_self_declared(
    tenant_api: client.ApiClient, customer_api: client.ApiClient, namespace: str
) -> None:
    for who in (tenant_api, customer_api):
        with pytest.raises(ApiException) as refused:
            await create_podgroup(
                who, namespace, "immune", 2, annotations={"quorum.dev/preemptible": "false"}
            )
        assert "quorum-preemption-immunity" in refusal(refused)
    await create_podgroup(tenant_api, namespace, "plain", 2)
    custom = client.CustomObjectsApi(tenant_api)
    with pytest.raises(ApiException) as refused:  # added later, the same
        await custom.patch_namespaced_custom_object(
            "scheduling.sigs.k8s.io", "v1alpha1", namespace, "podgroups", "plain",
            {"metadata": {"annotations": {"quorum.dev/preemptible": "false"}}},
            _content_type=MERGE,  # type: ignore[call-arg]
        )  # fmt: skip
    assert "quorum-preemption-immunity" in refusal(refused)


async def priority_classes(api: client.ApiClient) -> None:
    for name, value in ((HIGH, 1000), (LOW, 10)):
        body = {"apiVersion": "scheduling.k8s.io/v1", "kind": "PriorityClass", "metadata": {"name": name}}
        try:
            await client.SchedulingV1Api(api).create_priority_class({**body, "value": value})
        except ApiException as err:
            if err.status != 409:
                raise


async def test_a_disruption_budget_does_not_make_a_tenants_gang_immune(
    tenant_api: client.ApiClient,
    api: client.ApiClient,
    namespace: str,
    test_pool: Callable[..., Any],
) -> None:
    """A tenant guards its low-priority gang with a PodDisruptionBudget that allows nothing. The
    platform's high-priority gang still takes its room (priority decides, as with
    kube-scheduler's preemption): the victim is marked, deleted, and the preemptor's Event names
    the budget it passed."""
    await priority_classes(api)
    pool: TestPool = await test_pool(count=1)
    await create_podgroup(tenant_api, namespace, "hoard", 1)
    await client.AppsV1Api(tenant_api).create_namespaced_deployment(
        namespace, gang_deployment("hoard", 1, pool, LOW)
    )
    (hoard,) = await all_running(api, namespace, 1, "app=hoard")
    pdb = {
        "apiVersion": "policy/v1",
        "kind": "PodDisruptionBudget",
        "metadata": {"name": "hoard"},
        "spec": {"minAvailable": 1, "selector": {"matchLabels": {"app": "hoard"}}},
    }
    policy = client.PolicyV1Api(tenant_api)
    await policy.create_namespaced_pod_disruption_budget(namespace, pdb)

    async def guarding() -> bool:
        status = (await policy.read_namespaced_pod_disruption_budget("hoard", namespace)).status
        return bool(status and status.current_healthy == 1 and status.disruptions_allowed == 0)

    await eventually(guarding, timeout=60, what="the budget allowing no disruption")

    await create_podgroup(api, namespace, "urgent", 1)
    await client.AppsV1Api(api).create_namespaced_deployment(
        namespace, gang_deployment("urgent", 1, pool, HIGH)
    )
    (urgent,) = await all_running(api, namespace, 1, "app=urgent")
    assert urgent["spec"]["nodeName"] == hoard["spec"]["nodeName"]

    async def told() -> list[str]:
        listed = await client.CoreV1Api(api).list_namespaced_event(
            namespace, field_selector="reason=Preempting"
        )
        return [e.message for e in listed.items]

    (message,) = await eventually(told, timeout=30, what="the preemptor's Preempting Event")
    assert f"past PodDisruptionBudget {namespace}/hoard (allows 0, takes 1)" in message, message
    uid = hoard["metadata"]["uid"]
    left = (await client.CoreV1Api(api).list_namespaced_pod(namespace, label_selector="app=hoard")).items
    assert all(p.metadata.uid != uid or p.metadata.deletion_timestamp for p in left), "the victim went"


async def test_what_quorum_tells_a_tenant_of_a_preemption_names_nothing_of_other_namespaces(
    cluster: Instance,
    tenant_api: client.ApiClient,
    api: client.ApiClient,
    namespace: str,
    test_pool: Callable[..., Any],
) -> None:
    """The tenant's high-priority gang takes the node of another namespace's gang, past that
    namespace's PodDisruptionBudget. What the tenant reads of it (its Gang, its namespace's
    Events, `quorum explain`) names neither that namespace nor its gang, pod or budget, nor the
    node reserved; the victim's namespace is not told who took its room; the Event in quorum's
    own namespace, which the tenant may not read, names them all (docs/threat-model.md, "What a
    tenant can read")."""
    await priority_classes(api)
    pool: TestPool = await test_pool(count=1)
    other = f"victims-{secrets.token_hex(3)}"
    await create_namespace(api, other, {"quorum.dev/test": "1"})
    try:
        await create_podgroup(api, other, "hoard", 1)
        await client.AppsV1Api(api).create_namespaced_deployment(
            other, gang_deployment("hoard", 1, pool, LOW)
        )
        (hoard,) = await all_running(api, other, 1, "app=hoard")
        pdb = {
            "apiVersion": "policy/v1",
            "kind": "PodDisruptionBudget",
            "metadata": {"name": "keep"},
            "spec": {"minAvailable": 1, "selector": {"matchLabels": {"app": "hoard"}}},
        }
        policy = client.PolicyV1Api(api)
        await policy.create_namespaced_pod_disruption_budget(other, pdb)

        async def guarding() -> bool:
            status = (await policy.read_namespaced_pod_disruption_budget("keep", other)).status
            return bool(status and status.current_healthy == 1 and status.disruptions_allowed == 0)

        await eventually(guarding, timeout=60, what="the budget allowing no disruption")
        await create_podgroup(tenant_api, namespace, "urgent", 1)
        await client.AppsV1Api(tenant_api).create_namespaced_deployment(
            namespace, gang_deployment("urgent", 1, pool, HIGH)
        )
        await all_running(api, namespace, 1, "app=urgent")

        async def events_of(reader: client.ApiClient, ns: str, selector: str = "") -> list[Any]:
            return (await client.CoreV1Api(reader).list_namespaced_event(ns, field_selector=selector)).items

        async def preempting() -> list[str]:
            return [e.message for e in await events_of(tenant_api, namespace, "reason=Preempting")]

        (told,) = await eventually(preempting, timeout=30, what="the preemptor's Preempting Event")
        assert told == (
            "needed 8 nvidia.com/gpu: preempting 1 gang: 1 pod of other namespaces (1 gang whole; "
            "priority ≤ 10); past 1 PodDisruptionBudget of other namespaces; reserved 1 node"
        )
        gang = await client.CustomObjectsApi(tenant_api).get_namespaced_custom_object(
            "quorum.dev", "v1alpha1", namespace, "gangs", "pg-urgent"
        )
        shown = quorum("explain", "pg-urgent", "-n", namespace, kubeconfig=cluster.kubeconfig("tenant"))
        assert shown.returncode == 0 and "view: as recorded by quorum-operator" in shown.stdout, shown
        read = [json.dumps(gang), shown.stdout, *(e.message for e in await events_of(tenant_api, namespace))]
        for text in read:
            for secret in (other, "hoard", "keep"):
                assert secret not in text, (secret, text)
        # The node is named only where the tenant's own pod went (its release's record and Event,
        # as its pod's spec.nodeName shows it), never as the room reserved.
        rest = {k: v for k, v in gang["status"].items() if k != "admission"}
        assert pool.names[0] not in told and pool.names[0] not in json.dumps(rest), rest

        async def victim_told() -> JSON | None:
            found = await client.CustomObjectsApi(api).get_namespaced_custom_object(
                "quorum.dev", "v1alpha1", other, "gangs", "pg-hoard"
            )
            return (found.get("status") or {}).get("preempted")

        preempted = await eventually(victim_told, timeout=30, what="the victim's record")
        assert (
            preempted["message"]
            == (
                "preempted by a gang of another namespace (priority 1000): needed 8 nvidia.com/gpu; "
                f"past PodDisruptionBudget {other}/keep (allows 0, takes 1)"
            )
            and "by" not in preempted
        ), preempted
        for event in await events_of(api, other):
            assert namespace not in event.message and "urgent" not in event.message, event.message
        assert hoard["metadata"]["name"] not in str(await events_of(tenant_api, namespace))

        with pytest.raises(ApiException) as refused:
            await events_of(tenant_api, "quorum-system")
        assert refused.value.status == 403, "the platform's record is out of the tenant's reach"
        platform = [
            e
            for e in await events_of(api, "quorum-system", "reason=Preempting,involvedObject.kind=Lease")
            if f"gang {namespace}/pg-urgent " in e.message
        ]
        (record,) = platform
        for named in (
            f"{other}/pg-hoard",
            f"PodDisruptionBudget {other}/keep",
            f"reserved nodes {pool.names[0]}",
        ):
            assert named in record.message, record.message
    finally:
        await client.CoreV1Api(api).delete_namespace(other, propagation_policy="Background")


async def test_an_old_podgroup_reused_does_not_jump_the_queue(
    tenant_api: client.ApiClient, api: client.ApiClient, namespace: str, test_pool: Callable[..., Any]
) -> None:
    """The tenant makes its PodGroup early and its pods only after a bystander's gang queued for
    the same node. When the node frees, the bystander, queued first, is admitted; the tenant's
    gang (named to win a tie) waits."""
    pool: TestPool = await test_pool(count=1)
    await create_podgroup(tenant_api, namespace, "aaa-early", 1)
    filler = bare_pod("filler", pool)
    filler["spec"]["containers"][0]["resources"] = {"limits": {"nvidia.com/gpu": "8"}}
    await client.CoreV1Api(api).create_namespaced_pod(namespace, filler)
    await all_running(api, namespace, 1)
    await create_podgroup(api, namespace, "fair", 1)
    apps = client.AppsV1Api(api)
    await apps.create_namespaced_deployment(namespace, deployment("fair", 1, 8, pool, "fair"))
    await held_for_room(api, namespace, "pg-fair")
    core = client.CoreV1Api(api)
    (fair,) = (await core.list_namespaced_pod(namespace, label_selector="app=fair")).items
    # Creation times have whole seconds: the tenant's pods come in a later one.
    next_second = fair.metadata.creation_timestamp.timestamp() + 1
    await asyncio.sleep(max(0.0, next_second - time.time()) + 0.05)
    await client.AppsV1Api(tenant_api).create_namespaced_deployment(
        namespace, deployment("aaa-early", 1, 8, pool, "aaa-early")
    )
    await held_for_room(api, namespace, "pg-aaa-early")
    (early,) = (await core.list_namespaced_pod(namespace, label_selector="app=aaa-early")).items
    assert early.metadata.creation_timestamp > fair.metadata.creation_timestamp, "the set-up"

    await core.delete_namespaced_pod("filler", namespace, grace_period_seconds=0)
    (admitted,) = await all_running(api, namespace, 1, "app=fair")
    assert admitted["spec"]["nodeName"] == pool.names[0]
    await held_for_room(api, namespace, "pg-aaa-early")
    (early,) = (await core.list_namespaced_pod(namespace, label_selector="app=aaa-early")).items
    assert early.spec.scheduling_gates and not early.spec.node_name, "the tenant's gang still waits"


async def held_for_room(api: client.ApiClient, namespace: str, gang: str) -> JSON:
    async def probe() -> JSON | None:
        try:
            obj = await client.CustomObjectsApi(api).get_namespaced_custom_object(
                "quorum.dev", "v1alpha1", namespace, "gangs", gang
            )
        except ApiException:
            return None
        conditions = {c["type"]: c for c in (obj.get("status") or {}).get("conditions") or []}
        held = conditions.get("Unschedulable", {}).get("status") == "True"
        return obj if held else None

    found: JSON = await eventually(probe, timeout=60, what=f"{gang} held for lack of room")
    return found


async def test_a_tenant_may_not_take_a_system_priority(
    tenant_api: client.ApiClient, namespace: str, test_pool: Callable[..., Any]
) -> None:
    """Pods of a system PriorityClass are never preemption's victims and come first in the
    queue; a namespace may use those classes only if the platform gave it a ResourceQuota for
    them (the apiserver's ResourceQuota admission, docs/preemption.md)."""
    pool: TestPool = await test_pool(count=1)
    core = client.CoreV1Api(tenant_api)
    for priority_class in ("system-cluster-critical", "system-node-critical"):
        pod = bare_pod("immune", pool)
        pod["spec"]["priorityClassName"] = priority_class
        with pytest.raises(ApiException) as refused:
            await core.create_namespaced_pod(namespace, pod, dry_run="All")
        # ResourceQuota admission answers this refusal with a 500 (not a typed API error).
        message = json.loads(refused.value.body)["message"]
        assert refused.value.status in (403, 500) and "insufficient quota to match these scopes" in message
    await core.create_namespaced_pod(namespace, bare_pod("ordinary", pool), dry_run="All")


async def test_a_gang_pod_may_ask_the_planner_only_so_much(
    tenant_api: client.ApiClient, namespace: str, test_pool: Callable[..., Any]
) -> None:
    """Tolerations and required node affinity cost the planner per node and pod shape: a gang pod
    carries at most 64 tolerations and 8 affinity terms of 8 expressions (make bench-planner
    measures a pass at these limits); a pod of no gang is not quorum's to limit."""
    pool: TestPool = await test_pool(count=1)
    core = client.CoreV1Api(tenant_api)
    labels = {LABEL_GANG_NAME: "big", LABEL_GANG_MIN_AVAILABLE: "1"}
    own = len(pool.pod_spec()["tolerations"])

    def member(name: str, extra: int, terms: int = 0) -> JSON:
        pod = bare_pod(
            name, pool, [{"key": f"t{i}.example.com/k", "operator": "Exists"} for i in range(extra)]
        )
        pod["metadata"]["labels"] = labels
        if terms:
            term = {"matchExpressions": [{"key": "kubernetes.io/hostname", "operator": "Exists"}]}
            pod["spec"]["affinity"] = {
                "nodeAffinity": {
                    "requiredDuringSchedulingIgnoredDuringExecution": {"nodeSelectorTerms": [term] * terms}
                }
            }
        return pod

    for name, pod in [("tolerations", member("a", 65 - own)), ("affinity", member("b", 0, terms=9))]:
        with pytest.raises(ApiException) as refused:
            await core.create_namespaced_pod(namespace, pod)
        assert "quorum-gang-pod-size" in refusal(refused), name
    await core.create_namespaced_pod(namespace, member("c", 64 - own, terms=8))  # at the limits
    lone = bare_pod("lone", pool, [{"key": f"t{i}.example.com/k", "operator": "Exists"} for i in range(100)])
    await core.create_namespaced_pod(namespace, lone)


async def test_a_podgroup_deleted_with_its_gang_orphaned_is_gone(
    customer_api: client.ApiClient, api: client.ApiClient, namespace: str, test_pool: Callable[..., Any]
) -> None:
    """The garbage collector takes the PodGroup's ownerReference off its Gang (an UPDATE of a
    record quorum-records keeps for quorum): the cluster's own clean-up is not fenced out."""
    pool: TestPool = await test_pool(count=1)
    await create_podgroup(customer_api, namespace, "kept", 1)
    await client.AppsV1Api(customer_api).create_namespaced_deployment(
        namespace, deployment("kept", 1, 8, pool, "kept")
    )
    await all_running(api, namespace, 1, "app=kept")
    custom = client.CustomObjectsApi(customer_api)
    await custom.delete_namespaced_custom_object(
        "scheduling.sigs.k8s.io", "v1alpha1", namespace, "podgroups", "kept", propagation_policy="Orphan"
    )

    async def orphaned() -> bool:
        gone = await raw_json(
            client.CustomObjectsApi(api).get_namespaced_custom_object(
                "scheduling.sigs.k8s.io", "v1alpha1", namespace, "podgroups", "kept", _preload_content=False
            )
        )
        gang = await client.CustomObjectsApi(api).get_namespaced_custom_object(
            "quorum.dev", "v1alpha1", namespace, "gangs", "pg-kept"
        )
        return gone.get("kind") == "Status" and not gang["metadata"].get("ownerReferences")

    await eventually(orphaned, timeout=60, what="the PodGroup gone and its Gang orphaned")
