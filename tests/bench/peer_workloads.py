"""The workloads of the peer benchmark (`make bench-peers`), as plain data: node pools, gangs,
pods and the order they are created in. The same objects go to every scheduler under test; only
`schedulerName` differs (kube-scheduler alone has no gangs and schedules every pod itself), and
for Kueue, which has no PodGroup, the pods carry its queue and pod-group metadata as well.

Pods are bare (no controller), 1 GPU each, labelled with scheduler-plugins' current group label
`scheduling.x-k8s.io/pod-group` (a form quorum also reads), and run for a fixed simulated time:
kwok completes them after the delay their annotation gives (data/stages/pod-complete-bare.yaml).

On DRA nodes (`contention-dra`) the GPU nodes have no `nvidia.com/gpu` in allocatable; a test
driver publishes 8 devices per node (devcluster/dra.py) and each pod asks its GPUs through a
claim made from a ResourceClaimTemplate, one template per GPU count. For Kubernetes' own gang
scheduling, each gang is a `scheduling.k8s.io` PodGroup and its pods name it in
`spec.schedulingGroup`.

In `together-dra` a gang fits only if its devices are chosen together: each node's first 2
devices have `nvlink: true`, the other 6 `nvlink: false`; a gang of 8 asks 6 devices of any kind
(template `any-1`) and, in its last 2 pods, 2 with NVLink (`linked-1`), one node's worth. An
allocator that takes the first free device in slice order gives the `any` pods the linked ones.
"""

from __future__ import annotations

import random
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import yaml

from devcluster import dra
from devcluster.kueue import POD_GROUP_COUNT, POD_GROUP_LABEL, PREFERRED_TOPOLOGY, QUEUE_LABEL
from devcluster.nodes import load_pool

GROUP = "scheduling.x-k8s.io"
GROUP_LABEL = f"{GROUP}/pod-group"
RUN_FOR = "pod-complete.stage.kwok.x-k8s.io/delay"
GANG_SIZES = (2, 4, 8, 16, 32, 64)
CPU_TOLERATION = {"key": "is_cpu_compute", "operator": "Exists", "effect": "NoSchedule"}
GPUS_PER_NODE = 8  # in allocatable, or as DRA devices
DEVICE_CLASS = dra.DRIVER  # the class of every device of the test driver
CLAIM = "gpus"  # the pod's claim, and its container's
NVLINK = "nvlink"  # together-dra: the boolean attribute of the devices that are linked
LINKED_PER_NODE = 2  # together-dra: devices gpu-0 and gpu-1 of each node, first in the slice


@dataclass(frozen=True)
class GangSpec:
    name: str
    size: int  # pods, minMember = size
    gpus: int = 1  # per pod
    linked: int = 0  # DRA: its last pods, whose devices must have NVLink (the others: any device)

    def asks_linked(self, index: int) -> bool:
        return index >= self.size - self.linked


def write_pool(path: Path, gpu_nodes: int, cpu_nodes: int, gpus_in_allocatable: bool = True) -> Path:
    """The default CKS-like pool with exactly this many production GPU and CPU nodes (no triage
    or cordoned nodes: every scheduler gets the same usable capacity). Without
    `gpus_in_allocatable`, the GPU nodes have no nvidia.com/gpu: their GPUs come through DRA."""
    pool = load_pool()
    counts = {"gpu": gpu_nodes, "cpu": cpu_nodes}
    groups = [g.model_copy(update={"count": counts[g.name]}) for g in pool.groups if g.name in counts]
    if not gpus_in_allocatable:
        groups = [
            g.model_copy(update={"capacity": {k: v for k, v in g.capacity.items() if k != "nvidia.com/gpu"}})
            for g in groups
        ]
    pool = pool.model_copy(update={"groups": groups})
    path.write_text(yaml.safe_dump(pool.model_dump(by_alias=True, exclude_defaults=True)))
    return path


def uniform_gangs(count: int, size: int) -> list[GangSpec]:
    return [GangSpec(f"g{i:03d}", size) for i in range(count)]


def mixed_gangs(total_pods: int, seed: int = 7) -> list[GangSpec]:
    """Gangs of 2 to 64 pods (sizes drawn with a fixed seed) whose pods add up to `total_pods`
    exactly (the last gang takes what is left, at least 2)."""
    rng = random.Random(seed)
    gangs: list[GangSpec] = []
    left = total_pods
    while left > 0:
        size = rng.choice([s for s in GANG_SIZES if s <= left] or [left])
        if 0 < left - size < 2:
            size = left
        gangs.append(GangSpec(f"g{len(gangs):03d}", size))
        left -= size
    return gangs


def together_gangs(count: int, size: int = GPUS_PER_NODE, linked: int = LINKED_PER_NODE) -> list[GangSpec]:
    """together-dra: `count` gangs of `size` pods of 1 device, the last `linked` of them asking a
    linked one: with the defaults, exactly one node's devices each."""
    return [GangSpec(f"g{i:03d}", size, linked=linked) for i in range(count)]


def interleaved(gangs: list[GangSpec]) -> list[tuple[GangSpec, int]]:
    """Creation order in which all gangs grow at once: pod 0 of every gang, then pod 1 of every
    gang that has one, ... (the arrival that makes per-pod schedulers deadlock)."""
    order = []
    for index in range(max((g.size for g in gangs), default=0)):
        order += [(g, index) for g in gangs if index < g.size]
    return order


def in_sequence(gangs: list[GangSpec]) -> list[tuple[GangSpec, int]]:
    return [(g, i) for g in gangs for i in range(g.size)]


def podgroup(gang: GangSpec, timeout_seconds: int) -> dict[str, Any]:
    return {
        "apiVersion": f"{GROUP}/v1alpha1",
        "kind": "PodGroup",
        "metadata": {"name": gang.name},
        "spec": {"minMember": gang.size, "scheduleTimeoutSeconds": timeout_seconds},
    }


def gang_pod(gang: GangSpec, index: int, scheduler: str, run_seconds: int) -> dict[str, Any]:
    return {
        "metadata": {
            "name": f"{gang.name}-{index}",
            "labels": {GROUP_LABEL: gang.name},
            "annotations": {RUN_FOR: f"{run_seconds}s"},
        },
        "spec": {
            "schedulerName": scheduler,
            "containers": [
                {
                    "name": "train",
                    "image": "registry.k8s.io/pause:3.10",
                    "resources": {
                        "limits": {"nvidia.com/gpu": str(gang.gpus)},
                        "requests": {"cpu": "1", "memory": "8Gi"},
                    },
                }
            ],
        },
    }


def kueue_gang_pod(
    gang: GangSpec, index: int, run_seconds: int, queue: str, preferred_topology: str | None = None
) -> dict[str, Any]:
    """The same pod for Kueue: kube-scheduler places it, and Kueue's pod-group metadata (its
    LocalQueue, the group and the group's size) makes its webhook gate it until the group's
    Workload is admitted. With a preferred topology level, Kueue keeps the group in one domain
    of that level when one has room (topology-aware scheduling)."""
    pod = gang_pod(gang, index, "default-scheduler", run_seconds)
    pod["metadata"]["labels"] |= {QUEUE_LABEL: queue, POD_GROUP_LABEL: gang.name}
    pod["metadata"]["annotations"][POD_GROUP_COUNT] = str(gang.size)
    if preferred_topology:
        pod["metadata"]["annotations"][PREFERRED_TOPOLOGY] = preferred_topology
    return pod


def cpu_pod(index: int, run_seconds: int) -> dict[str, Any]:
    """A small CPU-only pod (the churn beside a large gang); it tolerates the CPU nodes itself,
    as quorum's webhook would make it, so that every scheduler sees the same pod."""
    return {
        "metadata": {"name": f"cpu-{index:04d}", "annotations": {RUN_FOR: f"{run_seconds}s"}},
        "spec": {
            "tolerations": [CPU_TOLERATION],
            "containers": [
                {
                    "name": "work",
                    "image": "registry.k8s.io/pause:3.10",
                    "resources": {"requests": {"cpu": "1", "memory": "1Gi"}},
                }
            ],
        },
    }


# -- DRA: the test driver's devices, claim templates, and pods that ask through them -------------


def gpu_devices(linked: int = 0) -> list[dict[str, Any]]:
    """One node's 8 devices, in slice order. With `linked`, each has the `nvlink` attribute,
    true for the first `linked` (gpu-0, ...) and false for the rest."""
    if not linked:
        return [dra.device(i) for i in range(GPUS_PER_NODE)]
    return [dra.device(i, **{NVLINK: i < linked}) for i in range(GPUS_PER_NODE)]


def linked_device_names(linked: int) -> frozenset[str]:
    return frozenset(f"gpu-{i}" for i in range(linked))


def device_objects(gpu_nodes: list[str], linked: int = 0) -> list[dict[str, Any]]:
    """The DeviceClass of the test driver's GPUs, and a ResourceSlice of 8 per GPU node (the
    first `linked` of them with NVLink)."""
    slices = [dra.resource_slice(dra.DRIVER, node, gpu_devices(linked)) for node in gpu_nodes]
    return [dra.device_class(DEVICE_CLASS, dra.DRIVER), *slices]


LINKED_SELECTOR = dra.attribute_selector(dra.DRIVER, NVLINK)


def claim_template_name(gpus: int, kind: str = "gpus") -> str:
    """`gpus-<n>` (contention-dra); together-dra: `any-<n>` and `linked-<n>`."""
    return f"{kind}-{gpus}"


def pod_claim_template(gang: GangSpec, index: int) -> str:
    """The template the gang's pod `index` makes its claim from."""
    if not gang.linked:
        return claim_template_name(gang.gpus)
    return claim_template_name(gang.gpus, "linked" if gang.asks_linked(index) else "any")


def claim_templates(gangs: list[GangSpec]) -> list[dict[str, Any]]:
    """One ResourceClaimTemplate per template the gangs' pods name: for exactly their GPU count,
    of any device or (`linked-<n>`) of devices with NVLink."""
    names = sorted({(pod_claim_template(g, i), g.gpus) for g in gangs for i in range(g.size)})
    return [
        dra.claim_template(name, DEVICE_CLASS, n, *([LINKED_SELECTOR] if name.startswith("linked-") else []))
        for name, n in names
    ]


def dra_gang_pod(gang: GangSpec, index: int, scheduler: str, run_seconds: int) -> dict[str, Any]:
    """`gang_pod`, its GPUs asked through a claim from its template (`pod_claim_template`) instead
    of nvidia.com/gpu."""
    pod = gang_pod(gang, index, scheduler, run_seconds)
    (container,) = pod["spec"]["containers"]
    del container["resources"]["limits"]
    container["resources"]["claims"] = [{"name": CLAIM}]
    pod["spec"]["resourceClaims"] = [
        {"name": CLAIM, "resourceClaimTemplateName": pod_claim_template(gang, index)}
    ]
    return pod


# -- Kubernetes' own gang scheduling (Workload Aware Scheduling) ---------------------------------


def workload_podgroup(gang: GangSpec, version: str) -> dict[str, Any]:
    """The gang as a standalone `scheduling.k8s.io` PodGroup, of the version the cluster serves
    (1.37: v1beta1, 1.36: v1alpha2), minCount its size: all of its pods or none. No Workload:
    the reference to one is optional in both."""
    return {
        "apiVersion": f"scheduling.k8s.io/{version}",
        "kind": "PodGroup",
        "metadata": {"name": gang.name},
        "spec": {"schedulingPolicy": {"gang": {"minCount": gang.size}}},
    }


def in_workload_podgroup(pod: dict[str, Any], gang: GangSpec) -> dict[str, Any]:
    """The pod, for kube-scheduler's gang scheduling: it names its gang's PodGroup."""
    pod["spec"]["schedulingGroup"] = {"podGroupName": gang.name}
    return pod
