"""GPUs through Dynamic Resource Allocation on the real control plane: a test driver publishes
ResourceSlices for a test pool's kwok nodes, quorum plans gangs on those devices and allocates
their claims, kube-scheduler binds (and allocates what quorum did not: the extended-resource
mapping's claims). docs/dra.md."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import pytest
import yaml
from kubernetes_asyncio import client

from devcluster import dra
from devcluster.cluster import Instance
from devcluster.dra import device
from devcluster.nodes import HOSTNAME_LABEL, TEST_POOL_KEY, TestPool
from tests.integration.test_explain import quorum
from tests.integration.test_gangs import all_running, assert_as_planned, gang_condition, pods
from tests.integration.test_workloads import member
from tests.kube import WorkloadApi, create_podgroup, eventually, raw_json

pytestmark = [pytest.mark.cluster, pytest.mark.kubernetes_1_36]

RESOURCE = ("resource.k8s.io", "v1")
NO_GPUS = {"cpu": "32", "memory": "256Gi", "pods": "110"}


class Driver:
    """A DRA driver's ResourceSlices for a test pool, and its DeviceClass (names unique per test)."""

    def __init__(self, pool: TestPool) -> None:
        self.pool = pool
        self.name = f"{pool.name}.gpu.example.com"
        self.extended = f"example.com/{pool.name}"

    def slices(self, devices: dict[str, list[dict[str, Any]]]) -> list[dict[str, Any]]:
        return [dra.resource_slice(self.name, node, found) for node, found in devices.items()]

    def device_class(self) -> dict[str, Any]:
        return dra.device_class(self.name, self.name, self.extended)

    def publish(self, cluster: Instance, devices: dict[str, list[dict[str, Any]]]) -> None:
        objects = [self.device_class(), *self.slices(devices)]
        applied = cluster.kubectl("apply", "-f", "-", input_text=yaml.safe_dump_all(objects))
        assert applied.returncode == 0, applied.stderr

    def remove(self, cluster: Instance) -> None:
        for kind, names in (
            ("resourceslice", [f"{n}-{self.name}" for n in self.pool.names]),
            ("deviceclass", [self.name]),
        ):
            cluster.kubectl("delete", kind, "--ignore-not-found", *names, check=False)

    def template(self, name: str, count: int, *selectors: str) -> dict[str, Any]:
        return dra.claim_template(name, self.name, count, *selectors)


def gang_pod(
    pool: TestPool, name: str, group: str, template: str | None = None, extended: dict[str, str] | None = None
) -> dict[str, Any]:
    container: dict[str, Any] = {"name": "c", "image": "registry.k8s.io/pause:3.10"}
    spec: dict[str, Any] = {"schedulerName": "cw-coscheduler", "containers": [container], **pool.pod_spec()}
    if template is not None:
        container["resources"] = {"claims": [{"name": "gpus"}]}
        spec["resourceClaims"] = [{"name": "gpus", "resourceClaimTemplateName": template}]
    if extended:
        container["resources"] = {"limits": extended}
    return {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": name, "labels": {"pod-group.scheduling.sigs.k8s.io": group}},
        "spec": spec,
    }


@pytest.fixture
async def driver(cluster: Instance, test_pool: Callable[..., Any]) -> Any:
    made: list[Driver] = []

    async def make(count: int) -> Driver:
        pool = await test_pool(count=count, capacity=NO_GPUS)
        found = Driver(pool)
        made.append(found)
        return found

    yield make
    for found in made:
        found.remove(cluster)


def apply(cluster: Instance, namespace: str, *objects: dict[str, Any]) -> None:
    applied = cluster.kubectl(
        "-n", namespace, "apply", "-f", "-", who="customer", input_text=yaml.safe_dump_all(objects)
    )
    assert applied.returncode == 0, applied.stderr


def allocated_by(claim: dict[str, Any]) -> set[str]:
    """Who wrote the claim's allocation (its status's field managers)."""
    return {
        m["manager"]
        for m in claim["metadata"].get("managedFields") or []
        if m.get("subresource") == "status"
        and "f:allocation" in (m.get("fieldsV1") or {}).get("f:status", {})
    }


async def claims(api: client.ApiClient, namespace: str) -> dict[str, dict[str, Any]]:
    found = await raw_json(
        client.ResourceV1Api(api).list_namespaced_resource_claim(namespace, _preload_content=False)
    )
    return {c["metadata"]["name"]: c for c in found["items"]}


async def test_a_gang_is_planned_on_its_devices_and_quorum_allocates_its_claims(
    cluster: Instance, api: client.ApiClient, namespace: str, driver: Any
) -> None:
    """Claims from a template, a selector that rules a node out, devices on only some nodes: the
    gang that fits is released whole with its claims allocated to the planned node's devices
    (kube-scheduler keeps them); one more that does not fit is held, saying so in devices."""
    gpus = await driver(3)
    names = gpus.pool.names
    gpus.publish(
        cluster, {names[0]: [device(i) for i in range(8)], names[1]: [device(i, "A100") for i in range(8)]}
    )
    h100 = f'device.attributes["{gpus.name}"].model == "H100"'
    apply(cluster, namespace, gpus.template("h100x4", 4, h100))
    await create_podgroup(api, namespace, "pair", 2)
    apply(cluster, namespace, *(gang_pod(gpus.pool, f"pair-{i}", "pair", "h100x4") for i in range(2)))
    running = await all_running(api, namespace, 2, "pod-group.scheduling.sigs.k8s.io=pair")
    assert {p["spec"]["nodeName"] for p in running} == {names[0]}, "only node 0 has H100s"
    await assert_as_planned(api, namespace, "pg-pair")
    held = await claims(api, namespace)
    chosen: list[str] = []
    for pod in running:
        (status,) = pod["status"]["resourceClaimStatuses"]
        claim = held[status["resourceClaimName"]]
        allocation = claim["status"]["allocation"]
        results = allocation["devices"]["results"]
        assert len(results) == 4 and {r["pool"] for r in results} == {names[0]}
        assert allocation["nodeSelector"]["nodeSelectorTerms"][0]["matchFields"][0]["values"] == [names[0]]
        assert [r["uid"] for r in claim["status"]["reservedFor"]] == [pod["metadata"]["uid"]]
        assert "resource.kubernetes.io/delete-protection" in claim["metadata"]["finalizers"]
        assert allocated_by(claim) == {"quorum-operator"}, "quorum allocated it, kube-scheduler kept it"
        chosen += [r["device"] for r in results]
    assert len(set(chosen)) == 8, "no device in two claims"

    # One more pod of 4 H100s does not fit anywhere: held, in devices, never released.
    await create_podgroup(api, namespace, "more", 1)
    apply(cluster, namespace, gang_pod(gpus.pool, "more-0", "more", "h100x4"))
    gang = await gang_condition(api, namespace, "pg-more", "Unschedulable", containing="devices of class")
    assert (
        "H100" in gang["status"]["conditions"][0]["message"]
        or "model" in gang["status"]["conditions"][0]["message"]
    )
    (pod,) = await pods(api, namespace, "pod-group.scheduling.sigs.k8s.io=more")
    assert pod["spec"].get("schedulingGates") and not pod["spec"].get("nodeName")
    shown = quorum("explain", f"{namespace}/pg-more", kubeconfig=cluster.kubeconfig("customer"))
    assert shown.returncode == 0, shown.stderr
    assert shown.stdout.startswith(f"gang {namespace}/pg-more: Pending"), shown.stdout
    assert "1 pods × 4 devices of class" in shown.stdout, shown.stdout
    assert "3 nodes: Insufficient devices of class" in shown.stdout, shown.stdout
    assert "DevicesNotModelled" not in shown.stdout, "its claim was being made: it waited, quietly"

    # A selector that fails on every device (no such attribute): held, saying where it failed.
    apply(cluster, namespace, gpus.template("broken", 1, f'device.attributes["{gpus.name}"].memoryGiB > 40'))
    await create_podgroup(api, namespace, "broken", 1)
    apply(cluster, namespace, gang_pod(gpus.pool, "broken-0", "broken", "broken"))
    await gang_condition(
        api, namespace, "pg-broken", "Unschedulable", containing="a device selector failed on"
    )
    shown = quorum("explain", f"{namespace}/pg-broken", kubeconfig=cluster.kubeconfig("customer"))
    assert shown.returncode == 0 and "a device selector failed on" in shown.stdout, shown.stdout


async def test_a_gang_that_fits_only_if_its_devices_are_chosen_together(
    cluster: Instance, api: client.ApiClient, namespace: str, driver: Any
) -> None:
    """One node, two devices: gpu-0 is NVLinked, gpu-1 not. One pod asks a linked device, the
    other any device. Chosen pod by pod, the second can take gpu-0 first and the first then
    finds nothing; quorum chooses both at once and allocates them so."""
    gpus = await driver(1)
    (node,) = gpus.pool.names
    gpus.publish(cluster, {node: [device(0, nvlink=True), device(1, nvlink=False)]})
    linked = f'device.attributes["{gpus.name}"].nvlink'
    apply(cluster, namespace, gpus.template("any", 1), gpus.template("linked", 1, linked))
    await create_podgroup(api, namespace, "g", 2)
    apply(
        cluster,
        namespace,
        gang_pod(gpus.pool, "g-any", "g", "any"),
        gang_pod(gpus.pool, "g-linked", "g", "linked"),
    )
    running = await all_running(api, namespace, 2, "pod-group.scheduling.sigs.k8s.io=g")
    held = await claims(api, namespace)
    got = {}
    for pod in running:
        (status,) = pod["status"]["resourceClaimStatuses"]
        claim = held[status["resourceClaimName"]]
        assert allocated_by(claim) == {"quorum-operator"}
        (result,) = claim["status"]["allocation"]["devices"]["results"]
        got[pod["metadata"]["name"]] = result["device"]
    assert got == {"g-linked": "gpu-0", "g-any": "gpu-1"}


async def test_the_extended_resource_mapping(
    cluster: Instance, api: client.ApiClient, namespace: str, driver: Any
) -> None:
    """Pods asking the class's extended resource, on nodes that do not have it in allocatable:
    planned on the DRA devices; kube-scheduler makes and allocates their claims. A gang bigger
    than the devices is held, not released to sit Pending."""
    gpus = await driver(3)
    names = gpus.pool.names
    gpus.publish(cluster, {names[0]: [device(i) for i in range(8)], names[1]: [device(i) for i in range(8)]})
    await create_podgroup(api, namespace, "two", 2)
    apply(
        cluster,
        namespace,
        *(gang_pod(gpus.pool, f"two-{i}", "two", extended={gpus.extended: "8"}) for i in range(2)),
    )
    running = await all_running(api, namespace, 2, "pod-group.scheduling.sigs.k8s.io=two")
    assert {p["spec"]["nodeName"] for p in running} == {names[0], names[1]}
    for pod in running:
        assert pod["status"].get("extendedResourceClaimStatus"), "kube-scheduler made its claim"
    await create_podgroup(api, namespace, "one", 1)
    apply(cluster, namespace, gang_pod(gpus.pool, "one-0", "one", extended={gpus.extended: "1"}))
    await gang_condition(api, namespace, "pg-one", "Unschedulable", containing="devices of class")


async def test_gangs_contending_for_devices_run_whole_one_after_the_other(
    cluster: Instance, api: client.ApiClient, namespace: str, driver: Any
) -> None:
    """Two gangs that each need every device of the pool, made at once: one runs whole, the
    other waits whole (no pod of it bound, no device of it allocated); once the first is
    deleted, its claims are deallocated and the second runs whole."""
    gpus = await driver(2)
    names = gpus.pool.names
    gpus.publish(cluster, {n: [device(i) for i in range(8)] for n in names})
    apply(cluster, namespace, gpus.template("eight", 8))
    for group in ("first", "second"):
        await create_podgroup(api, namespace, group, 2)
    apply(
        cluster,
        namespace,
        *(gang_pod(gpus.pool, f"{g}-{i}", g, "eight") for i in range(2) for g in ("first", "second")),
    )

    async def one_running() -> str | None:
        found = await pods(api, namespace)
        running = {
            p["metadata"]["labels"]["pod-group.scheduling.sigs.k8s.io"]
            for p in found
            if p["spec"].get("nodeName")
        }
        return (
            running.pop()
            if len(running) == 1 and len([p for p in found if p["spec"].get("nodeName")]) == 2
            else None
        )

    winner = await eventually(one_running, timeout=60, what="one gang bound whole")
    loser = "second" if winner == "first" else "first"
    await all_running(api, namespace, 2, f"pod-group.scheduling.sigs.k8s.io={winner}")
    await gang_condition(api, namespace, f"pg-{loser}", "Unschedulable", containing="devices of class")
    waiting = await pods(api, namespace, f"pod-group.scheduling.sigs.k8s.io={loser}")
    assert all(p["spec"].get("schedulingGates") and not p["spec"].get("nodeName") for p in waiting)
    held = await claims(api, namespace)
    for pod in waiting:
        (status,) = pod["status"]["resourceClaimStatuses"]
        assert not held[status["resourceClaimName"]]["status"].get("allocation"), "no device promised"

    deleted = cluster.kubectl(
        "-n", namespace, "delete", "pod", "-l", f"pod-group.scheduling.sigs.k8s.io={winner}", "--wait=false"
    )
    assert deleted.returncode == 0, deleted.stderr
    await all_running(api, namespace, 2, f"pod-group.scheduling.sigs.k8s.io={loser}")
    held = await claims(api, namespace)
    chosen = [
        (r["pool"], r["device"])
        for c in held.values()
        if (c.get("status") or {}).get("allocation")
        for r in c["status"]["allocation"]["devices"]["results"]
    ]
    assert len(chosen) == len(set(chosen)) == 16, "every device once"


def rooted(model: str, per_root: int) -> list[dict[str, Any]]:
    """8 devices of a model whose `pcieRoot` groups them `per_root` at a time."""
    found = [device(i, model) for i in range(8)]
    for i, d in enumerate(found):
        d["attributes"]["pcieRoot"] = {"string": f"root-{i // per_root}"}
    return found


async def test_first_available_and_a_shared_pcie_root(
    cluster: Instance, api: client.ApiClient, namespace: str, driver: Any
) -> None:
    """Claims of 4 H100s on one PCIe root, or else 4 A100s on one root. Node 0 has A100s in two
    roots of 4; node 1 H100s in four roots of 2 (8 H100s, but no root of 4). The gang of 2 is
    held on the H100s, then placed on the A100s, one pod per root; kube-scheduler keeps the
    allocation of the alternative quorum chose."""
    gpus = await driver(2)
    names = gpus.pool.names
    gpus.publish(cluster, {names[0]: rooted("A100", 4), names[1]: rooted("H100", 2)})
    model, root = f'device.attributes["{gpus.name}"].model', f"{gpus.name}/pcieRoot"
    template = {
        "apiVersion": "resource.k8s.io/v1",
        "kind": "ResourceClaimTemplate",
        "metadata": {"name": "four-on-a-root"},
        "spec": {
            "spec": {
                "devices": {
                    "requests": [
                        {
                            "name": "gpus",
                            "firstAvailable": [
                                {
                                    "name": m.lower(),
                                    "deviceClassName": gpus.name,
                                    "count": 4,
                                    "selectors": [{"cel": {"expression": f'{model} == "{m}"'}}],
                                }
                                for m in ("H100", "A100")
                            ],
                        }
                    ],
                    "constraints": [{"requests": ["gpus"], "matchAttribute": root}],
                }
            }
        },
    }
    apply(cluster, namespace, template)
    await create_podgroup(api, namespace, "g", 2)
    apply(cluster, namespace, *(gang_pod(gpus.pool, f"g-{i}", "g", "four-on-a-root") for i in range(2)))
    running = await all_running(api, namespace, 2, "pod-group.scheduling.sigs.k8s.io=g")
    assert {p["spec"]["nodeName"] for p in running} == {names[0]}
    held = await claims(api, namespace)
    roots = set()
    for pod in running:
        (status,) = pod["status"]["resourceClaimStatuses"]
        claim = held[status["resourceClaimName"]]
        assert allocated_by(claim) == {"quorum-operator"}
        results = claim["status"]["allocation"]["devices"]["results"]
        assert {r["request"] for r in results} == {"gpus/a100"} and len(results) == 4
        indexes = {int(r["device"].removeprefix("gpu-")) for r in results}
        assert len({i // 4 for i in indexes}) == 1, f"one root: {indexes}"
        roots.add(min(indexes) // 4)
    assert roots == {0, 1}, "one pod per root"
    events = await raw_json(client.CoreV1Api(api).list_namespaced_event(namespace, _preload_content=False))
    told = [e["message"] for e in events["items"] if e["reason"] == "Unschedulable"]
    assert any("tried alternative 1 of 2" in m for m in told), told


async def test_a_gpu_and_a_nic_on_one_pcie_root(
    cluster: Instance, api: client.ApiClient, namespace: str, driver: Any
) -> None:
    """Claims of 2 GPUs and 1 NIC on one PCIe root (matchAttribute over both requests). Both
    nodes have GPUs in two roots of 4; only node 0 has NICs, one on each root. A gang of 2 goes
    to node 0, each pod's GPUs on its NIC's root, one pod per root."""
    gpus = await driver(2)
    names = gpus.pool.names
    nics = []
    for i in range(2):
        nic = device(8 + i, "NIC")
        nic["name"], nic["attributes"]["pcieRoot"] = f"nic-{i}", {"string": f"root-{i}"}
        nics.append(nic)
    gpus.publish(cluster, {names[0]: rooted("H100", 4) + nics, names[1]: rooted("H100", 4)})
    model, root = f'device.attributes["{gpus.name}"].model', f"{gpus.name}/pcieRoot"

    def request(name: str, wanted: str, count: int) -> dict[str, Any]:
        selector = {"cel": {"expression": f'{model} == "{wanted}"'}}
        return {
            "name": name,
            "exactly": {"deviceClassName": gpus.name, "count": count, "selectors": [selector]},
        }

    template = {
        "apiVersion": "resource.k8s.io/v1",
        "kind": "ResourceClaimTemplate",
        "metadata": {"name": "gpus-and-nic"},
        "spec": {
            "spec": {
                "devices": {
                    "requests": [request("gpus", "H100", 2), request("nic", "NIC", 1)],
                    "constraints": [{"requests": ["gpus", "nic"], "matchAttribute": root}],
                }
            }
        },
    }
    apply(cluster, namespace, template)
    await create_podgroup(api, namespace, "g", 2)
    apply(cluster, namespace, *(gang_pod(gpus.pool, f"g-{i}", "g", "gpus-and-nic") for i in range(2)))
    running = await all_running(api, namespace, 2, "pod-group.scheduling.sigs.k8s.io=g")
    assert {p["spec"]["nodeName"] for p in running} == {names[0]}, "only node 0 has NICs"
    held = await claims(api, namespace)
    roots = set()
    for pod in running:
        (status,) = pod["status"]["resourceClaimStatuses"]
        claim = held[status["resourceClaimName"]]
        assert allocated_by(claim) == {"quorum-operator"}
        results = claim["status"]["allocation"]["devices"]["results"]
        by_request = {r: [x["device"] for x in results if x["request"] == r] for r in ("gpus", "nic")}
        (nic,) = by_request["nic"]
        on = {int(d.removeprefix("gpu-")) // 4 for d in by_request["gpus"]}
        assert len(by_request["gpus"]) == 2 and on == {int(nic.removeprefix("nic-"))}, by_request
        roots |= on
    assert roots == {0, 1}, "one pod per root"


async def test_a_podgroups_claim_is_allocated_once_for_the_group(
    cluster: Instance, api: client.ApiClient, namespace: str, driver: Any
) -> None:
    """A Workload PodGroup with a claim of 8 devices (`spec.resourceClaims`, from a template) and
    two pods that name it: kube-controller-manager makes one claim for the group; quorum puts
    both pods on the node with 8 devices, allocates the claim there for the PodGroup, and
    kube-scheduler binds both."""
    was = await WorkloadApi.of(api)
    if was.legacy:
        pytest.skip("PodGroup claims are Kubernetes 1.37's (DRAWorkloadResourceClaims, beta)")
    gpus = await driver(2)
    names = gpus.pool.names
    gpus.publish(cluster, {names[0]: [device(i) for i in range(4)], names[1]: [device(i) for i in range(8)]})
    apply(cluster, namespace, gpus.template("eight", 8))
    entry = {"name": "gpus", "resourceClaimTemplateName": "eight"}
    gang = {"gang": {"minCount": 2}}
    await was.create(
        api, namespace, "workloads", was.workload("train", [{"name": "w", "schedulingPolicy": gang}])
    )
    group = was.podgroup("train-w", gang, ("train", "w"), resourceClaims=[entry])
    await was.create(api, namespace, "podgroups", group)
    pods_of_group = []
    for i in range(2):
        pod = member(f"w{i}", "train-w", gpus.pool, 0)
        pod["spec"]["containers"][0]["resources"] = {"claims": [{"name": "gpus"}]}
        pod["spec"]["resourceClaims"] = [entry]
        pods_of_group.append(pod)
    apply(cluster, namespace, *({"apiVersion": "v1", "kind": "Pod", **p} for p in pods_of_group))
    running = await all_running(api, namespace, 2, "app=train-w")
    assert {p["spec"]["nodeName"] for p in running} == {names[1]}, "the one node with 8 devices"
    (made,) = {p["status"]["resourceClaimStatuses"][0]["resourceClaimName"] for p in running}
    claim = (await claims(api, namespace))[made]
    assert allocated_by(claim) == {"quorum-operator"}
    assert len(claim["status"]["allocation"]["devices"]["results"]) == 8
    (reserved,) = claim["status"]["reservedFor"]
    assert (reserved["resource"], reserved["name"]) == ("podgroups", "train-w"), reserved


async def test_a_gang_pod_goes_where_its_shared_claim_was_allocated(
    cluster: Instance, api: client.ApiClient, namespace: str, driver: Any
) -> None:
    """A shared ResourceClaim, allocated by kube-scheduler for a pod of no gang on node 0 of two
    with devices: the gang pod that names it too is planned onto node 0 and runs there, though
    best fit alone would choose node 1, which a pod of 16 CPUs fills more."""
    gpus = await driver(2)
    names = gpus.pool.names
    gpus.publish(cluster, {n: [device(i) for i in range(8)] for n in names})
    shared = dra.resource_claim("shared", gpus.name, 1)
    first = gang_pod(gpus.pool, "first", "none")
    first["metadata"]["labels"] = {}
    first["spec"]["schedulerName"] = "default-scheduler"
    first["spec"]["containers"][0]["resources"] = {"claims": [{"name": "gpus"}]}
    first["spec"]["resourceClaims"] = [{"name": "gpus", "resourceClaimName": "shared"}]
    first["spec"]["nodeSelector"] = {**first["spec"]["nodeSelector"], HOSTNAME_LABEL: names[0]}
    filler = gang_pod(gpus.pool, "filler", "none")
    filler["metadata"]["labels"] = {}
    filler["spec"]["schedulerName"] = "default-scheduler"
    filler["spec"]["nodeName"] = names[1]
    filler["spec"]["containers"][0]["resources"] = {"requests": {"cpu": "16"}}
    apply(cluster, namespace, shared, first, filler)
    await all_running(api, namespace, 2)
    where = names[0]
    await create_podgroup(api, namespace, "g", 1)
    second = gang_pod(gpus.pool, "second", "g")
    second["spec"]["containers"][0]["resources"] = {"claims": [{"name": "gpus"}]}
    second["spec"]["resourceClaims"] = [{"name": "gpus", "resourceClaimName": "shared"}]
    apply(cluster, namespace, second)
    (placed,) = await all_running(api, namespace, 1, "pod-group.scheduling.sigs.k8s.io=g")
    assert placed["spec"]["nodeName"] == where
    await assert_as_planned(api, namespace, "pg-g")


async def test_a_claim_a_gangs_pods_share_puts_them_on_one_node_with_its_devices(
    cluster: Instance, api: client.ApiClient, namespace: str, driver: Any
) -> None:
    """One ResourceClaim of 8 devices named by both pods of a gang (as a PodGroup's claim is):
    its devices counted once, both pods on the node quorum allocated it on."""
    gpus = await driver(2)
    names = gpus.pool.names
    gpus.publish(cluster, {n: [device(i) for i in range(8)] for n in names})
    shared = dra.resource_claim("pair-gpus", gpus.name, 8)
    pair = [gang_pod(gpus.pool, f"pair-{i}", "pair") for i in range(2)]
    for p in pair:
        p["spec"]["containers"][0]["resources"] = {"claims": [{"name": "gpus"}]}
        p["spec"]["resourceClaims"] = [{"name": "gpus", "resourceClaimName": "pair-gpus"}]
    await create_podgroup(api, namespace, "pair", 2)
    apply(cluster, namespace, shared, *pair)
    running = await all_running(api, namespace, 2, "pod-group.scheduling.sigs.k8s.io=pair")
    (node,) = {p["spec"]["nodeName"] for p in running}
    claim = (await claims(api, namespace))["pair-gpus"]
    assert allocated_by(claim) == {"quorum-operator"}
    results = claim["status"]["allocation"]["devices"]["results"]
    assert {r["pool"] for r in results} == {node} and len(results) == 8
    assert {r["name"] for r in claim["status"]["reservedFor"]} == {"pair-0", "pair-1"}


async def test_a_pool_serving_several_nodes_is_counted_once(
    cluster: Instance, api: client.ApiClient, namespace: str, driver: Any
) -> None:
    """Two network devices in one slice that serves every node of the pool (a nodeSelector):
    a gang of three pods that each ask one is held, saying why, though each node counts two; a
    later gang of two gets them, one each, allocated by quorum and kept by kube-scheduler."""
    nics = await driver(3)
    fabric = {
        "apiVersion": dra.API_VERSION,
        "kind": "ResourceSlice",
        "metadata": {"name": f"fabric-{nics.name}"},
        "spec": {
            "driver": nics.name,
            "pool": {"name": "fabric", "generation": 1, "resourceSliceCount": 1},
            "nodeSelector": {
                "nodeSelectorTerms": [
                    {
                        "matchExpressions": [
                            {"key": TEST_POOL_KEY, "operator": "In", "values": [nics.pool.name]}
                        ]
                    }
                ]
            },
            "devices": [{"name": f"nic-{i}", "attributes": {"model": {"string": "NIC"}}} for i in range(2)],
        },
    }
    applied = cluster.kubectl(
        "apply", "-f", "-", input_text=yaml.safe_dump_all([nics.device_class(), fabric])
    )
    assert applied.returncode == 0, applied.stderr
    try:
        apply(cluster, namespace, nics.template("nic", 1))
        await create_podgroup(api, namespace, "three", 3)
        apply(cluster, namespace, *(gang_pod(nics.pool, f"three-{i}", "three", "nic") for i in range(3)))
        await gang_condition(api, namespace, "pg-three", "Unschedulable", containing="serve several nodes")
        await create_podgroup(api, namespace, "two", 2)
        apply(cluster, namespace, *(gang_pod(nics.pool, f"two-{i}", "two", "nic") for i in range(2)))
        running = await all_running(api, namespace, 2, "pod-group.scheduling.sigs.k8s.io=two")
        held = await claims(api, namespace)
        chosen = []
        for pod in running:
            (status,) = pod["status"]["resourceClaimStatuses"]
            claim = held[status["resourceClaimName"]]
            assert allocated_by(claim) == {"quorum-operator"}
            chosen += [r["device"] for r in claim["status"]["allocation"]["devices"]["results"]]
        assert sorted(chosen) == ["nic-0", "nic-1"], "each device once"
        for pod in await pods(api, namespace, "pod-group.scheduling.sigs.k8s.io=three"):
            assert pod["spec"].get("schedulingGates") and not pod["spec"].get("nodeName")
    finally:
        cluster.kubectl("delete", "resourceslice", "--ignore-not-found", f"fabric-{nics.name}", check=False)
