"""What quorum's operator identity may do, tried with its own token on the apiserver: RBAC
(manifests/10-rbac.yaml) refuses what it was not granted, and the fence
(manifests/47-operator-fence.yaml) refuses every pod and Job write that is not a release, a
gang pod's deletion or a Job's suspension — while those go through. The lifecycle tests
(test_gang_lifecycle.py, test_gangs.py, test_operator_*.py) show that real releases and
recoveries still work.

A running `default` instance started before the fence existed gets both manifests applied by
`fenced` below (idempotent); `make down && make up` gives every test them.
"""

from __future__ import annotations

import copy
import itertools
import secrets
from collections.abc import AsyncIterator, Awaitable
from typing import Any

import pytest
from kubernetes_asyncio import client
from kubernetes_asyncio.client.exceptions import ApiException

from devcluster.cluster import Instance
from quorum.install import OPERATOR_SERVICE_ACCOUNT, WEBHOOKS_SERVICE_ACCOUNT, render_files
from quorum.k8s import writes
from quorum.k8s.api import LiveApi
from quorum.k8s.writes import REQUIRED
from tests.integration.test_gangs import gated, pods
from tests.kube import WorkloadApi, api_client, eventually, raw_json

pytestmark = pytest.mark.cluster

FENCE = "ValidatingAdmissionPolicy 'quorum-operator-fence'"
PAUSE = {"name": "c", "image": "registry.k8s.io/pause:3.10"}
JSON = dict[str, Any]


def namespace_of(instance: Instance) -> str:
    state = instance.state()
    assert state is not None
    return state.spec.namespace


@pytest.fixture(scope="module")
def fenced(cluster: Instance) -> Instance:
    """The instance, with this checkout's RBAC and fence applied (a no-op on a fresh one)."""
    manifests = render_files(["10-rbac.yaml", "47-operator-fence.yaml"], namespace_of(cluster))
    cluster.kubectl("apply", "-f", "-", input_text=manifests)
    return cluster


@pytest.fixture
async def op(fenced: Instance, api: client.ApiClient, namespace: str) -> AsyncIterator[client.ApiClient]:
    """The operator's own identity (its ServiceAccount token), once the fence is in force."""
    operator = await api_client(fenced.kubeconfig("quorum-operator"))
    core = client.CoreV1Api(api)
    await core.create_namespaced_pod(
        namespace, {"metadata": {"name": "probe"}, "spec": {"containers": [PAUSE]}}
    )
    fresh = itertools.count()

    async def fence_in_force() -> bool:  # the apiserver's policy informer may be a moment behind
        body = {"metadata": {"labels": {"probe": str(next(fresh))}}}
        try:
            await client.CoreV1Api(operator).patch_namespaced_pod("probe", namespace, body)
        except ApiException as err:
            return err.status == 403 and FENCE in str(err.body)
        return False

    async with operator:
        await eventually(fence_in_force, timeout=30, what="the fence to refuse the operator a label")
        yield operator


async def refused(call: Awaitable[Any]) -> ApiException:
    with pytest.raises(ApiException) as caught:
        await call
    return caught.value


def by_fence(err: ApiException, says: str) -> None:
    assert err.status == 403, (err.status, err.body)
    assert FENCE in str(err.body) and says in str(err.body), err.body


def by_rbac(err: ApiException, verb: str, resource: str, namespace: str) -> None:
    assert err.status == 403, (err.status, err.body)
    user = f"system:serviceaccount:{namespace}:{OPERATOR_SERVICE_ACCOUNT}"
    assert f'User \\"{user}\\" cannot {verb} resource \\"{resource}\\"' in str(err.body), err.body


async def gang_pod(api: client.ApiClient, namespace: str, name: str, spec: JSON | None = None) -> JSON:
    """A gang pod whose PodGroup does not exist: the webhook gates and labels it, and quorum
    leaves it gated."""
    body = {
        "metadata": {"name": name, "labels": {"pod-group.scheduling.sigs.k8s.io": "never-created"}},
        "spec": {"containers": [PAUSE], **(spec or {})},
    }
    await client.CoreV1Api(api).create_namespaced_pod(namespace, body)
    (pod,) = [p for p in await pods(api, namespace) if p["metadata"]["name"] == name]
    assert gated(pod) and pod["metadata"]["labels"]["quorum.dev/gang"], pod
    return pod


async def test_the_operator_changes_a_pod_only_by_releasing_it(
    op: client.ApiClient, api: client.ApiClient, namespace: str
) -> None:
    pod = await gang_pod(api, namespace, "g-0", {"schedulingGates": [{"name": "example.com/other"}]})
    core = client.CoreV1Api(op)
    image = {"spec": {"containers": [{**PAUSE, "image": "registry.k8s.io/pause:3.9"}]}}
    by_fence(
        await refused(core.patch_namespaced_pod("g-0", namespace, image)), "may not change spec.containers"
    )
    label = {"metadata": {"labels": {"team": "other"}}}
    by_fence(await refused(core.patch_namespaced_pod("g-0", namespace, label)), "may not change the labels")
    annotate = {"metadata": {"annotations": {"note": "x"}}}
    by_fence(await refused(core.patch_namespaced_pod("g-0", namespace, annotate)), "the annotations")
    # The gate, removed with the other gate, or with a "pin" that keeps the pod off one node.
    gates = [g["name"] for g in pod["spec"]["schedulingGates"]]
    both = [
        {"op": "remove", "path": "/spec/schedulingGates/1"},
        {"op": "remove", "path": "/spec/schedulingGates/0"},
    ]
    by_fence(
        await refused(core.patch_namespaced_pod("g-0", namespace, both)),
        "may remove only the quorum.dev/gang",
    )
    ops = writes.release_patch(pod, "node-a")
    assert ops is not None and gates
    wide = copy.deepcopy(ops)
    wide[-1]["value"]["nodeAffinity"][REQUIRED]["nodeSelectorTerms"][0]["matchFields"][0]["operator"] = (
        "NotIn"
    )
    by_fence(await refused(core.patch_namespaced_pod("g-0", namespace, wide)), "only by the release pin")
    # The release itself goes through: the plain one, settled by the match condition.
    assert await writes.release_pod(op, pod, "lp-nowhere")
    (after,) = await pods(api, namespace, "quorum.dev/gang")
    assert not gated(after) and [g["name"] for g in after["spec"]["schedulingGates"]] == ["example.com/other"]


async def test_a_release_onto_a_pod_with_node_affinity_of_its_own_passes_the_rules(
    op: client.ApiClient, api: client.ApiClient, namespace: str
) -> None:
    """Not the match condition's fast path: the validations decide, in the apiserver's CEL."""
    own = {"key": "topology.kubernetes.io/zone", "operator": "In", "values": ["z1", "z2"]}
    name_pin = {"key": "metadata.name", "operator": "NotIn", "values": ["node-x"]}
    terms = [{"matchExpressions": [own]}, {"matchFields": [name_pin]}]
    affinity = {
        "nodeAffinity": {
            REQUIRED: {"nodeSelectorTerms": terms},
            "preferredDuringSchedulingIgnoredDuringExecution": [
                {"weight": 1, "preference": {"matchExpressions": [own]}}
            ],
        }
    }
    pod = await gang_pod(api, namespace, "aff-0", {"affinity": affinity})
    ops = writes.release_patch(pod, "lp-nowhere")
    assert ops is not None
    # One term left without the pin: refused; the whole release: through.
    by_fence(
        await refused(client.CoreV1Api(op).patch_namespaced_pod("aff-0", namespace, ops[:-1])),
        "only by the release pin",
    )
    assert await writes.release_pod(op, pod, "lp-nowhere")
    (after,) = await pods(api, namespace, "quorum.dev/gang")
    pinned = after["spec"]["affinity"]["nodeAffinity"][REQUIRED]["nodeSelectorTerms"]
    assert all(t["matchFields"][-1]["values"] == ["lp-nowhere"] for t in pinned)


async def test_the_operator_deletes_only_gang_pods(
    op: client.ApiClient, api: client.ApiClient, namespace: str
) -> None:
    core, admin = client.CoreV1Api(op), client.CoreV1Api(api)
    system = f"lp-fence-{secrets.token_hex(3)}"
    await admin.create_namespaced_pod(
        "kube-system", {"metadata": {"name": system}, "spec": {"containers": [PAUSE]}}
    )
    try:
        err = await refused(core.delete_namespaced_pod(system, "kube-system"))
        by_fence(err, "may delete only gang pods (labelled quorum.dev/gang)")
        by_fence(err, f"pod kube-system/{system} is neither")
    finally:
        await admin.delete_namespaced_pod(system, "kube-system", grace_period_seconds=0)
    await admin.create_namespaced_pod(
        namespace, {"metadata": {"name": "plain"}, "spec": {"containers": [PAUSE]}}
    )
    by_fence(await refused(core.delete_namespaced_pod("plain", namespace)), "may delete only gang pods")
    pod = await gang_pod(api, namespace, "g-1")
    assert await writes.delete_pod(op, pod)


async def test_the_operator_changes_a_job_only_to_suspend_or_resume_it(
    op: client.ApiClient, api: client.ApiClient, namespace: str
) -> None:
    body = {
        "metadata": {"name": "train"},
        "spec": {
            "suspend": True,
            "parallelism": 2,
            "template": {"spec": {"restartPolicy": "Never", "containers": [PAUSE]}},
        },
    }
    job = await raw_json(
        client.BatchV1Api(api).create_namespaced_job(namespace, body, _preload_content=False)
    )
    batch = client.BatchV1Api(op)
    parallel = {"spec": {"parallelism": 8}}
    by_fence(await refused(batch.patch_namespaced_job("train", namespace, parallel)), "spec.parallelism")
    label = {"metadata": {"labels": {"x": "y"}}}
    by_fence(
        await refused(batch.patch_namespaced_job("train", namespace, label)), "may not change the labels"
    )
    uid = job["metadata"]["uid"]
    assert await writes.set_job_suspend(op, namespace, "train", uid, False)
    assert await writes.set_job_suspend(op, namespace, "train", uid, True)


async def test_rbac_refuses_what_the_operator_does_not_use(
    fenced: Instance, op: client.ApiClient, api: client.ApiClient, namespace: str
) -> None:
    where = namespace_of(fenced)
    core = client.CoreV1Api(op)
    await client.CoreV1Api(api).create_namespaced_pod(
        namespace, {"metadata": {"name": "other"}, "spec": {"containers": [PAUSE]}}
    )
    by_rbac(await refused(core.read_namespaced_pod("other", namespace)), "get", "pods", where)
    whole = await client.CoreV1Api(api).read_namespaced_pod("other", namespace)
    by_rbac(await refused(core.replace_namespaced_pod("other", namespace, whole)), "update", "pods", where)
    by_rbac(await refused(core.list_config_map_for_all_namespaces()), "list", "configmaps", where)
    by_rbac(await refused(core.list_namespaced_secret(namespace)), "list", "secrets", where)
    apps = client.AppsV1Api(op)
    by_rbac(await refused(apps.list_deployment_for_all_namespaces()), "list", "deployments", where)
    scheduling = client.SchedulingV1Api(op)
    by_rbac(await refused(scheduling.list_priority_class()), "list", "priorityclasses", where)
    custom = client.CustomObjectsApi(op)
    group = custom.patch_namespaced_custom_object(
        "scheduling.sigs.k8s.io", "v1alpha1", namespace, "podgroups", "pg", {"spec": {"minMember": 1}}
    )
    by_rbac(await refused(group), "patch", "podgroups", where)


CLAIM_FENCE = "ValidatingAdmissionPolicy 'quorum-operator-claim-fence'"


async def test_the_operator_only_allocates_claims_not_allocated_yet(
    fenced: Instance, op: client.ApiClient, api: client.ApiClient, namespace: str
) -> None:
    """A ResourceClaim: the operator allocates it (finalizer, then status) as it does for a
    release; it may not then change or remove that allocation, nor touch the claim otherwise."""
    resource, as_operator = client.ResourceV1Api(api), client.ResourceV1Api(op)
    request = {"name": "gpus", "exactly": {"deviceClassName": "gpu.example.com", "count": 1}}
    await resource.create_namespaced_resource_claim(
        namespace, {"metadata": {"name": "c"}, "spec": {"devices": {"requests": [request]}}}
    )

    async def read() -> JSON:
        found: JSON = await raw_json(
            resource.read_namespaced_resource_claim("c", namespace, _preload_content=False)
        )
        return found

    def allocation(device: str) -> JSON:
        result = {"request": "gpus", "driver": "gpu.example.com", "pool": "n1", "device": device}
        return {"devices": {"results": [result]}, "allocationTimestamp": "2026-11-29T00:00:00Z"}

    async def fence_in_force() -> bool:  # the apiserver's policy informer may be a moment behind
        try:
            await as_operator.patch_namespaced_resource_claim(
                "c", namespace, {"metadata": {"labels": {"x": "y"}}}
            )
        except ApiException as err:
            return err.status == 403 and CLAIM_FENCE in str(err.body)
        return False

    await eventually(fence_in_force, timeout=30, what="the claim fence to refuse the operator a label")
    # A pod of the claim, held by a gate of its own: the resourceclaim controller keeps the claim
    # reserved for it (it would free a claim reserved for a pod that does not exist).
    user = await client.CoreV1Api(api).create_namespaced_pod(
        namespace,
        {
            "metadata": {"name": "p"},
            "spec": {
                "schedulingGates": [{"name": "example.com/hold"}],
                "containers": [{**PAUSE, "resources": {"claims": [{"name": "gpus"}]}}],
                "resourceClaims": [{"name": "gpus", "resourceClaimName": "c"}],
            },
        },
    )
    pod = {"resource": "pods", "name": "p", "uid": user.metadata.uid}
    assert await writes.allocate_claim(
        op, await read(), {"allocation": allocation("gpu-0"), "reservedFor": [pod]}
    )
    claim = await read()
    assert claim["status"]["allocation"]["devices"]["results"][0]["device"] == "gpu-0"
    assert claim["metadata"]["finalizers"] == ["resource.kubernetes.io/delete-protection"]

    # (The apiserver itself refuses a change of an allocation; a removal it allows, not here.)
    removal = {"status": {"allocation": None, "reservedFor": None}}
    err = await refused(
        as_operator.patch_namespaced_resource_claim_status(
            "c",
            namespace,
            removal,
            _content_type="application/merge-patch+json",  # type: ignore[call-arg]
        )
    )
    assert err.status == 403 and CLAIM_FENCE in str(err.body), err.body
    assert "never changes nor removes an allocation" in str(err.body), err.body
    unprotect = {"metadata": {"finalizers": None}}
    err = await refused(
        as_operator.patch_namespaced_resource_claim(
            "c",
            namespace,
            unprotect,
            _content_type="application/merge-patch+json",  # type: ignore[call-arg]
        )
    )
    assert err.status == 403 and "may only add the finalizer" in str(err.body), err.body
    assert (await read())["status"]["allocation"]["devices"]["results"][0]["device"] == "gpu-0"


FOREIGN = {"key": "dedicated", "value": "x", "effect": "NoSchedule"}


async def test_preemptions_writes_are_fenced_to_the_taint_the_condition_and_its_victims(
    fenced: Instance, op: client.ApiClient, api: client.ApiClient, namespace: str
) -> None:
    """What preemption may do as the operator (docs/preemption.md), and only that: mark a pod a
    preemption may take, delete it once marked; never a pod of a system-critical priority,
    wherever it runs."""
    core = client.CoreV1Api(op)
    await client.CoreV1Api(api).create_namespaced_pod(
        namespace, {"metadata": {"name": "victim"}, "spec": {"containers": [PAUSE]}}
    )
    by_fence(await refused(core.delete_namespaced_pod("victim", namespace)), "is neither")

    async def running() -> bool:  # kwok's kubelet writes the conditions once as it starts the pod
        pod = await client.CoreV1Api(api).read_namespaced_pod("victim", namespace)
        return pod.status.phase == "Running"

    await eventually(running, timeout=30, what="the victim running")
    # With a transition time, as quorum writes it: the disruption controller resets a condition
    # whose pod was not deleted within 2 minutes of it (one without a time at once).
    target = {
        "type": "DisruptionTarget",
        "status": "True",
        "reason": "PreemptionByQuorum",
        "message": "m",
        "lastTransitionTime": writes.now(),
    }
    await core.patch_namespaced_pod_status("victim", namespace, {"status": {"conditions": [target]}})
    ready = {"type": "PodScheduled", "status": "False", "reason": "Forged"}
    by_fence(
        await refused(
            core.patch_namespaced_pod_status("victim", namespace, {"status": {"conditions": [ready]}})
        ),
        "only the DisruptionTarget condition",
    )
    node = f"fence-{secrets.token_hex(3)}"
    await client.CoreV1Api(api).create_node({"metadata": {"name": node}, "spec": {"taints": [FOREIGN]}})
    try:
        reserved = {"key": "quorum.dev/reserved", "value": "t0k3n", "effect": "NoSchedule"}
        await core.patch_node(node, [{"op": "add", "path": "/spec/taints/-", "value": reserved}])

        async def swept() -> bool:  # a reservation of no preemption in flight: the operator removes it
            taints = (await client.CoreV1Api(api).read_node(node)).spec.taints or []
            return [t.key for t in taints] == [FOREIGN["key"]]

        await eventually(swept, timeout=30, what="the stray reservation taint removed by the operator")
        remove_foreign = [{"op": "remove", "path": "/spec/taints/0"}]
        by_fence(await refused(core.patch_node(node, remove_foreign)), "only the quorum.dev/reserved taints")
    finally:
        await client.CoreV1Api(api).delete_node(node)
    await core.delete_namespaced_pod("victim", namespace)  # marked, of a user priority: may go

    async def deleted() -> bool:
        return not [p for p in await pods(api, namespace) if p["metadata"]["name"] == "victim"]

    await eventually(deleted, timeout=30, what="the victim deleted")
    budgets = await client.PolicyV1Api(op).list_pod_disruption_budget_for_all_namespaces()
    assert isinstance(budgets.items, list), "RBAC lets preemption read the budgets"

    # A pod of a system-critical priority is never a victim, in any namespace: not marked, not
    # deleted, even with the mark put on by someone else.
    critical = f"fence-{secrets.token_hex(3)}"
    quota = {  # the platform lets this namespace use the class (docs/preemption.md)
        "metadata": {"name": "critical"},
        "spec": {
            "hard": {"pods": "1"},
            "scopeSelector": {
                "matchExpressions": [
                    {"scopeName": "PriorityClass", "operator": "In", "values": ["system-cluster-critical"]}
                ]
            },
        },
    }
    await client.CoreV1Api(api).create_namespaced_resource_quota(namespace, quota)
    body = {
        "metadata": {"name": critical},
        "spec": {"containers": [PAUSE], "priorityClassName": "system-cluster-critical"},
    }
    await eventually(
        lambda: created(client.CoreV1Api(api).create_namespaced_pod(namespace, body)),
        timeout=30,
        what="the quota's first status, after which the class may be used here",
    )
    try:
        err = await refused(
            core.patch_namespaced_pod_status(critical, namespace, {"status": {"conditions": [target]}})
        )
        by_fence(err, f"pod {namespace}/{critical} is never a preemption's victim")
        await client.CoreV1Api(api).patch_namespaced_pod_status(
            critical, namespace, {"status": {"conditions": [target]}}
        )
        by_fence(await refused(core.delete_namespaced_pod(critical, namespace)), "is neither")
        assert await client.CoreV1Api(api).read_namespaced_pod(critical, namespace)
    finally:
        await client.CoreV1Api(api).delete_namespaced_pod(critical, namespace, grace_period_seconds=0)


async def created(call: Awaitable[object]) -> bool:
    try:
        await call
    except ApiException as err:
        if err.status in (403, 500) and "insufficient quota" in str(err.body):
            return False
        raise
    return True


async def test_the_webhook_servers_identity_may_do_nothing(fenced: Instance, api: client.ApiClient) -> None:
    where = namespace_of(fenced)
    user = f"system:serviceaccount:{where}:{WEBHOOKS_SERVICE_ACCOUNT}"
    groups = ["system:serviceaccounts", f"system:serviceaccounts:{where}", "system:authenticated"]
    for verb, group, resource in (
        ("get", "", "pods"),
        ("list", "", "pods"),
        ("patch", "", "pods"),
        ("list", "", "secrets"),
        ("get", "coordination.k8s.io", "leases"),
        ("list", "quorum.dev", "gangs"),
    ):
        review = await client.AuthorizationV1Api(api).create_subject_access_review(
            {
                "spec": {
                    "user": user,
                    "groups": groups,
                    "resourceAttributes": {
                        "verb": verb,
                        "group": group,
                        "resource": resource,
                        "namespace": where,
                    },
                }
            }
        )
        assert not review.status.allowed, (verb, group, resource)


PODGROUP_FENCE = "ValidatingAdmissionPolicy 'quorum-operator-podgroup-fence'"


async def test_the_operator_makes_and_resizes_only_its_own_kubernetes_podgroups(
    fenced: Instance, op: client.ApiClient, api: client.ApiClient, namespace: str
) -> None:
    """Under placement kube-scheduler the operator may create and patch scheduling.k8s.io
    PodGroups (RBAC); the fence leaves it only PodGroups labelled as quorum's and owned by their gang,
    and their spec: a user's PodGroup, and the labels and owners of its own, are not its to change."""
    was = await WorkloadApi.of(api)
    if was.legacy:
        pytest.skip("Kubernetes 1.37's PodGroup (this plane runs 1.36)")
    spec = {"minMember": 2, "source": {"kind": "Labels", "name": "mine"}}
    gang = await writes.create_gang(op, namespace, "lbl-mine", spec, None)
    owner = {
        "apiVersion": "quorum.dev/v1alpha1",
        "kind": "Gang",
        "name": "lbl-mine",
        "uid": gang["metadata"]["uid"],
    }
    live = LiveApi(op)
    made = await live.ensure_pod_group(namespace, "lbl-mine", was.version, 2, owner)
    assert made["metadata"]["labels"]["app.kubernetes.io/managed-by"] == "quorum"
    resized = await live.ensure_pod_group(namespace, "lbl-mine", was.version, 3, owner)
    assert resized["spec"]["schedulingPolicy"] == {"gang": {"minCount": 3}}

    custom = client.CustomObjectsApi(op)
    mine = {"spec": {"schedulingPolicy": {"gang": {"minCount": 4}}}}
    await was.create(api, namespace, "podgroups", was.podgroup("theirs", {"gang": {"minCount": 2}}))
    for call, says in [
        (
            custom.patch_namespaced_custom_object(
                "scheduling.k8s.io",
                was.version,
                namespace,
                "podgroups",
                "theirs",
                mine,
                _content_type="application/merge-patch+json",  # type: ignore[call-arg]
            ),
            "not its own",
        ),
        (
            custom.patch_namespaced_custom_object(
                "scheduling.k8s.io",
                was.version,
                namespace,
                "podgroups",
                "lbl-mine",
                {"metadata": {"labels": {"app.kubernetes.io/managed-by": "me"}}},
                _content_type="application/merge-patch+json",  # type: ignore[call-arg]
            ),
            "not its own",
        ),
        (
            custom.create_namespaced_custom_object(
                "scheduling.k8s.io",
                was.version,
                namespace,
                "podgroups",
                {"metadata": {"name": "unowned"}, "spec": {"schedulingPolicy": {"gang": {"minCount": 1}}}},
            ),
            "owned by its gang",
        ),
    ]:
        err = await refused(call)
        assert err.status == 403 and PODGROUP_FENCE in str(err.body) and says in str(err.body), err.body
    # Their PodGroup as it was.
    theirs = await was.get(api, namespace, "podgroups", "theirs")
    assert theirs["spec"]["schedulingPolicy"] == {"gang": {"minCount": 2}}
