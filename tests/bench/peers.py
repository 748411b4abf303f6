"""quorum beside scheduler-plugins coscheduling, Kueue and kube-scheduler alone, on the same
control plane and the same workloads (issues 7 and 29). `make bench-peers`.

Each scenario runs several ways, each on a freshly started instance with the same node pool and
the same client QPS/burst for the schedulers and the controller-manager:

- `quorum`: quorum-webhooks and quorum-operator + kube-scheduler (pods ask for cw-coscheduler;
  the webhook gates them and hands them to the default scheduler);
- `coscheduling`: no quorum; scheduler-plugins' Coscheduling runs as a second scheduler named
  cw-coscheduler (devcluster.coscheduler) with its own PodGroup CRD;
- `kueue`: no quorum; Kueue's manager (devcluster.kueue) with its pod integration: the pods name
  a LocalQueue and a Kueue pod group (no PodGroup objects), its webhook gates them, and it
  ungates a group once the group's Workload fits the ClusterQueue's quota (the pool's capacity);
  kube-scheduler places them;
- `kueue-tas`: the same with Kueue's topology-aware scheduling: the flavor is the GPU nodes with
  a Topology of the pool's levels (zone, block, rack, node), the pods prefer one block, and
  Kueue admits a group only once it has found every pod a node (kube-scheduler binds them there);
- `default`: no quorum, no gangs: kube-scheduler schedules every pod as it comes (the speed
  baseline; gang figures are shown for it only to say what no gang semantics costs);
- `was` (the DRA scenarios only): no quorum; Kubernetes' own gang scheduling (Workload Aware
  Scheduling, the GenericWorkload gate): each gang a standalone `scheduling.k8s.io` PodGroup of
  minCount its size, its pods naming it in `spec.schedulingGroup`; kube-scheduler places them.

Scenarios (tests/bench/peer_workloads.py builds the objects):
1. throughput: 500 GPU nodes x 8; 400 gangs x 8 pods x 1 GPU, created as fast as the apiserver
   takes them (64 in flight). Pods bound per second, time to all bound, apiserver requests.
2. contention: 100 GPU nodes (800 GPUs); gangs of 2 to 64 pods whose pods add up to 1.5x the
   GPUs, created interleaved, each pod running 20 s. Gangs ever partially placed, GPU-seconds held
   partially, deadlocks, time to finish all gangs, GPU utilisation (tests/bench/gang_metrics.py).
3. large gang: 100 GPU nodes + 8 CPU nodes; 200 CPU-only pods churn (10 a second, 4 s each) while
   one 512-pod gang (64 whole nodes) is created: last pod created -> all 512 bound.
4. contention-dra: contention's gangs, arrival and 20 s runs on GPUs that come through DRA
   (docs/dra.md): the GPU nodes have no nvidia.com/gpu; a test driver publishes 8 devices per node
   in ResourceSlices (devcluster/dra.py), and each pod asks its GPUs through a claim made from a
   ResourceClaimTemplate. Ways: quorum (it plans the devices and allocates the claims),
   kube-scheduler alone (it allocates claims pod by pod) and `was`; on Kubernetes 1.37, where
   Workload Aware Scheduling is beta, unless `--kubernetes` says otherwise. The same figures as
   contention, a pod's GPUs being its claim's devices; a watch on the claims checks that no device
   is ever allocated to two at once.
5. together-dra: gangs that fit only if their devices are chosen together. 16 GPU nodes, each
   publishing 8 devices, the first 2 in its slice (gpu-0, gpu-1) with `nvlink: true` and 6 with
   `nvlink: false`; gangs of 8 pods of 1 device, 6 asking any device (template `any-1`) and then
   2 a linked one (`linked-1`, a selector on nvlink): one node's worth each. Two waves of 16
   gangs, the second created once the first has finished (at the latest 150 s in); each wave's
   pods one at a time, gang by gang, a gang's `any` pods before its `linked` pods; pods run 20 s;
   300 s deadline. Same three ways as contention-dra. Per way: gangs that ran whole (all 8 at
   once), ran only in part, never started, not fully bound by the deadline; gangs partially
   placed and the GPU-seconds they held; pods pending at the deadline and why (the latest event
   about each); claims of `any-1` given a linked device.
Scenario 6, the planner alone at 100 to 10,000 nodes, is `make bench-planner`.

Every run is bounded (deadlines below); each figure comes from one run on this machine, and
comparisons are ratios within that run. Writes bench/results/<date>.json and <date>.md.

    make bench-peers                      # everything (about 45 minutes on 2 cores)
    python -m tests.bench.peers --scenario contention --mode quorum --quick
    python -m tests.bench.peers --scenario throughput --mode kueue --rounds 1
    python -m tests.bench.peers --scenario contention-dra --mode quorum --mode was --quick
    python -m tests.bench.peers --scenario together-dra --quick --name-prefix td --output /tmp/td.json
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import functools
import json
import os
import re
import sys
import tempfile
import time
from collections import Counter
from dataclasses import asdict, dataclass, field
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from kubernetes_asyncio import client

from devcluster.build import BinaryCache
from devcluster.cluster import Instance
from devcluster.config import ClusterSpec
from devcluster.coscheduler import (
    PERMIT_WAITING_SECONDS,
    SCHEDULER_NAME,
    ensure_coscheduler,
    start_coscheduler,
    start_podgroup_controller,
)
from devcluster.kueue import QUEUE, ensure_kueue, local_queue, pool_quota, start_kueue
from devcluster.nodes import BLOCK_LABEL, NodePool, load_pool, node_groups, render_nodes
from devcluster.versions import RELEASES
from quorum.install import DEFAULT_NAMESPACE, operator_username
from quorum.k8s.watch import watch_objects
from tests.bench import peer_report
from tests.bench.gang_metrics import PodRecord, gang_outcomes, gang_report, permit_waits
from tests.bench.peer_workloads import (
    GPUS_PER_NODE,
    GROUP,
    GangSpec,
    claim_templates,
    cpu_pod,
    device_objects,
    dra_gang_pod,
    gang_pod,
    in_sequence,
    in_workload_podgroup,
    interleaved,
    kueue_gang_pod,
    linked_device_names,
    mixed_gangs,
    podgroup,
    together_gangs,
    uniform_gangs,
    workload_podgroup,
    write_pool,
)
from tests.kube import WorkloadApi, api_client, assert_no_overcommit, create_namespace, raw_json

RESULTS = Path(__file__).resolve().parents[2] / "bench" / "results"
MODES = ("quorum", "coscheduling", "kueue", "kueue-tas", "default", "was", "delegated")
# quorum installed with `placement: kube-scheduler` (docs/placement.md): the same objects as
# `quorum`'s, placed by kube-scheduler's gang cycle; Kubernetes 1.37 and later.
DELEGATED_KUBERNETES = "1.37"
PEER_MODES = MODES[:5]  # the ways of the scenarios on GPUs in allocatable
DRA_MODES = ("quorum", "default", "was")
KUEUE_PREFERRED_LEVEL = BLOCK_LABEL  # kueue-tas: a block is 8 nodes, 64 GPUs (the largest mixed gang)
SCENARIOS = ("throughput", "contention", "large-gang", "contention-dra", "together-dra")
QPS, BURST, IN_FLIGHT = 500.0, 1000, 64
# The minor all ways run on unless `--kubernetes` says otherwise: 1.36, where every figure of
# docs/benchmarks.md before 2026-11-26 was taken; contention-dra's own is 1.37 (Workload Aware
# Scheduling beta, its PodGroup at v1beta1), and together-dra's.
KUBERNETES = "1.36"
DRA_KUBERNETES = "1.37"
NAMESPACE = "bench"
OPERATOR = operator_username(DEFAULT_NAMESPACE)
# The gang controllers whose requests are counted by verb and resource too, and under what key.
DETAILED = {"quorum-operator": "operator_requests", "kueue": "kueue_requests"}
AUDIT_POLICY = (
    "apiVersion: audit.k8s.io/v1\nkind: Policy\nomitStages: [RequestReceived]\nrules:\n  - level: Metadata\n"
)


@dataclass(frozen=True)
class Scenario:
    name: str
    gpu_nodes: int
    cpu_nodes: int
    gangs: list[GangSpec]
    interleave: bool
    run_seconds: int
    deadline: float
    wait_for: str  # "bound" or "finished"
    churn: int = 0  # CPU-only pods created beside the gangs (large gang)
    dra: bool = False  # GPUs as DRA devices, asked through claims (contention-dra)
    modes: tuple[str, ...] = PEER_MODES  # the ways it runs
    kubernetes: str = KUBERNETES  # the minor it runs on unless --kubernetes says otherwise
    linked: int = 0  # DRA: each node's first devices with nvlink (together-dra)
    waves: int = 1  # the gangs in this many waves, each created once the one before finished
    wave_by: float = 0.0  # ... or this many seconds after the start, whichever comes first
    ordered: bool = False  # pods created one at a time, in order (not IN_FLIGHT at once)


def scenarios(quick: bool) -> dict[str, Scenario]:
    """Full sizes as issue 7 gives them; --quick: a few minutes in all, for a smoke run."""
    k = 4 if quick else 1
    return {
        "throughput": Scenario(
            "throughput",
            500 // k,
            8,
            uniform_gangs(400 // k, 8),
            False,
            3600,
            600,
            "bound",
            modes=(*PEER_MODES, "was", "delegated"),
        ),
        "contention": Scenario(
            "contention",
            100 // k,
            8,
            mixed_gangs(1200 // k),
            True,
            20,
            900,
            "finished",
            modes=(*PEER_MODES, "delegated"),
        ),
        "contention-dra": Scenario(
            "contention-dra",
            100 // k,
            8,
            mixed_gangs(1200 // k),
            True,
            20,
            900,
            "finished",
            dra=True,
            modes=DRA_MODES,
            kubernetes=DRA_KUBERNETES,
        ),
        "large-gang": Scenario(
            "large-gang",
            100 // k,
            8,
            uniform_gangs(1, 512 // k),
            False,
            3600,
            300,
            "bound",
            200 // k,
            modes=(*PEER_MODES, "delegated"),
        ),
        "together-dra": Scenario(
            "together-dra",
            16 // k,
            2,
            together_gangs(2 * 16 // k),
            False,
            20,
            300,
            "finished",
            dra=True,
            modes=DRA_MODES,
            kubernetes=DRA_KUBERNETES,
            linked=2,
            waves=2,
            wave_by=150,
            ordered=True,
        ),
    }


@dataclass
class Observed:
    """What one run saw, in wall-clock seconds (time.time(), the clock of klog's lines too)."""

    created: dict[str, float] = field(default_factory=dict)
    bound: dict[str, float] = field(default_factory=dict)
    finished: dict[str, float] = field(default_factory=dict)
    done: asyncio.Event = field(default_factory=asyncio.Event)
    watch_restarts: int = 0
    waves_created: list[float] = field(default_factory=list)  # when each wave's first pod was sent
    waits: Waits | None = None  # at the end: why pods waited (together-dra)
    wave: set[str] = field(default_factory=set)  # the pods of the wave waited for, and
    wave_done: asyncio.Event = field(default_factory=asyncio.Event)  # set once they all finished

    def wait_for_wave(self, names: set[str]) -> None:
        self.wave = names
        self.wave_done.clear()
        if names <= self.finished.keys():
            self.wave_done.set()

    def see(self, pod: dict[str, Any], watched: set[str], wait_for: str) -> None:
        name, now = pod["metadata"]["name"], time.time()
        if (pod.get("spec") or {}).get("nodeName"):
            self.bound.setdefault(name, now)
        if (pod.get("status") or {}).get("phase") == "Succeeded":
            self.finished.setdefault(name, now)
        seen = self.bound if wait_for == "bound" else self.finished
        if watched <= seen.keys():
            self.done.set()
        if self.wave and name in self.wave and self.wave <= self.finished.keys():
            self.wave_done.set()


@dataclass
class SeenPods:
    """The benchmark's pods as an index of `watch_objects`: every version seen goes to `seen`."""

    seen: Observed
    watched: set[str]
    wait_for: str
    listings: int = 0

    def upsert(self, pod: dict[str, Any]) -> None:
        self.seen.see(pod, self.watched, self.wait_for)

    def delete(self, pod: dict[str, Any]) -> None:
        pass

    def replace_all(self, pods: list[dict[str, Any]]) -> None:
        self.listings += 1
        self.seen.watch_restarts = self.listings - 1
        for pod in pods:
            self.upsert(pod)


Device = tuple[str, str, str]  # driver, pool, device


@dataclass
class SeenClaims:
    """The benchmark's ResourceClaims as an index of `watch_objects`: which claim holds each
    device. The watch gives the claims' versions in the order etcd wrote them, so a device
    allocated to a claim while another claim's last version still has it was allocated twice."""

    holders: dict[Device, str] = field(default_factory=dict)  # device -> claim uid
    held: dict[str, set[Device]] = field(default_factory=dict)  # claim uid -> devices
    twice: set[Device] = field(default_factory=set)
    allocated: set[str] = field(default_factory=set)  # every claim seen allocated
    linked: frozenset[str] = frozenset()  # together-dra: the names of the devices with NVLink
    any_on_linked: set[str] = field(default_factory=set)  # claims without a selector given one

    def upsert(self, claim: dict[str, Any]) -> None:
        uid = claim["metadata"]["uid"]
        allocation = (claim.get("status") or {}).get("allocation") or {}
        results = (allocation.get("devices") or {}).get("results") or []
        devices = {(r["driver"], r["pool"], r["device"]) for r in results}
        if any(d in self.linked for _, _, d in devices) and not selective(claim):
            self.any_on_linked.add(uid)
        self.release(uid)
        for found in devices:
            if self.holders.get(found, uid) != uid:
                self.twice.add(found)
            self.holders[found] = uid
        if devices:
            self.held[uid] = devices
            self.allocated.add(uid)

    def release(self, uid: str) -> None:
        for found in self.held.pop(uid, set()):
            if self.holders.get(found) == uid:
                del self.holders[found]

    def delete(self, claim: dict[str, Any]) -> None:
        self.release(claim["metadata"]["uid"])

    def replace_all(self, claims: list[dict[str, Any]]) -> None:
        self.holders.clear()
        self.held.clear()
        for claim in claims:
            self.upsert(claim)


def selective(claim: dict[str, Any]) -> bool:
    """Whether some request of the claim has selectors of its own (beyond its class's)."""
    requests = ((claim.get("spec") or {}).get("devices") or {}).get("requests") or []
    return any((r.get("exactly") or {}).get("selectors") for r in requests)


async def follow_claims(api: client.ApiClient, claims: SeenClaims) -> None:
    """Watch the benchmark's ResourceClaims until cancelled (contention-dra)."""
    listing = functools.partial(client.ResourceV1Api(api).list_namespaced_resource_claim, NAMESPACE)
    await watch_objects(listing, [claims], asyncio.Event(), lambda: None)


async def publish_devices(
    api: client.ApiClient, gpu_nodes: list[str], gangs: list[GangSpec], linked: int = 0
) -> None:
    """The test driver's DeviceClass and ResourceSlices (8 devices per GPU node, the first
    `linked` with NVLink), and the claim templates the gangs' pods name."""
    resource = client.ResourceV1Api(api)
    gate = asyncio.Semaphore(IN_FLIGHT)

    async def create(body: dict[str, Any]) -> None:
        async with gate:
            if body["kind"] == "DeviceClass":
                await resource.create_device_class(body)
            else:
                await resource.create_resource_slice(body)

    await asyncio.gather(*(create(body) for body in device_objects(gpu_nodes, linked)))
    for template in claim_templates(gangs):
        await resource.create_namespaced_resource_claim_template(NAMESPACE, template)


def scenario_pods(mode: str, scenario: Scenario) -> list[dict[str, Any]]:
    """The scenario's gang pods for this way, in the order they are created."""
    order = interleaved(scenario.gangs) if scenario.interleave else in_sequence(scenario.gangs)
    if mode.startswith("kueue"):
        level = KUEUE_PREFERRED_LEVEL if mode == "kueue-tas" else None
        return [kueue_gang_pod(g, i, scenario.run_seconds, QUEUE, level) for g, i in order]
    scheduler = "default-scheduler" if mode in ("default", "was") else SCHEDULER_NAME
    build = dra_gang_pod if scenario.dra else gang_pod
    pods = [build(g, i, scheduler, scenario.run_seconds) for g, i in order]
    if mode == "was":
        pods = [in_workload_podgroup(pod, g) for pod, (g, _) in zip(pods, order, strict=True)]
    return pods


def waves(scenario: Scenario, pods: list[dict[str, Any]]) -> list[list[dict[str, Any]]]:
    """The pods in the scenario's waves: its gangs split in `waves` runs, in order."""
    gangs = [g.name for g in scenario.gangs]
    per_wave = -(-len(gangs) // scenario.waves)
    wave_of = {name: i // per_wave for i, name in enumerate(gangs)}
    out: list[list[dict[str, Any]]] = [[] for _ in range(scenario.waves)]
    for pod in pods:
        out[wave_of[gang_of(pod)]].append(pod)
    return out


def gang_of(pod: dict[str, Any]) -> str:
    return str(pod["metadata"]["name"]).rsplit("-", 1)[0]


_COUNTS = re.compile(r"\b\d+\b")
_COUNT = r"(?:\d+|N)"
_LEADING_COUNT = re.compile(rf"^{_COUNT} ")
_AVAILABLE = re.compile(rf"^{_COUNT}/{_COUNT} \w+ are available(: )?")
_PREEMPTION = re.compile(r"[.,] (pod group )?preemption:.*$")
_FRAGMENTS = re.compile(rf", (?!{_COUNT} remaining)")
_CPU_TAINT = "untolerated taint"


def reason_parts(message: str) -> list[str]:
    """kube-scheduler's reasons in a FailedScheduling message, without the node counts and what
    it says of preemption: "0/6 nodes are available: 2 node(s) had untolerated taint(s), 4 cannot
    allocate all claims. preemption: ..." -> ["node(s) had untolerated taint(s)", "cannot allocate
    all claims"]; a pod group's "pod group is unschedulable, 0/1 placements are available, first
    placement status: minCount (8) cannot be satisfied: 6 scheduled, 1 remaining, pod group
    preemption: ..." -> ["pod group is unschedulable", "minCount (N) cannot be satisfied: N
    scheduled, N remaining"]."""
    parts: list[str] = []
    for fragment in _FRAGMENTS.split(_PREEMPTION.sub("", message.strip()).rstrip(".")):
        part = _AVAILABLE.sub("", fragment.strip()).removeprefix("first placement status: ")
        part = _COUNTS.sub("N", _LEADING_COUNT.sub("", part))
        if part and part not in parts:
            parts.append(part)
    return parts


def pending_summary(reasons: dict[str, int]) -> str:
    """The reasons seen for pending pods, for a table cell: kube-scheduler's (`reason_parts` of
    its FailedScheduling events) other than the CPU nodes' taint, and any other kind of wait as
    it is, the reasons that held the most pods first."""
    parts: Counter[str] = Counter()
    for key, pods in reasons.items():
        _, reason, message = [*key.split(": ", 2), "", ""][:3]
        found = reason_parts(message) if reason == "FailedScheduling" else [key]
        parts.update({part: pods for part in found if _CPU_TAINT not in part})
    return "; ".join(part for part, _ in parts.most_common()) or "-"


@dataclass
class Waits:
    """Why the benchmark's pods waited to be bound, from the events about them at the end."""

    pending: dict[str, int] = field(default_factory=dict)  # pods not bound at the end, by why
    refused: dict[str, int] = field(default_factory=dict)  # kube-scheduler's reasons: pods given each
    pods_refused: int = 0  # pods kube-scheduler refused at least once (FailedScheduling)


def pod_waits(pods: list[dict[str, Any]], events: list[dict[str, Any]]) -> Waits:
    """For pods not bound: its scheduling gates if it has any, and the latest event about it
    ("<component>: <reason>: <message, counts as N>"), how many pods each. Over the whole run:
    the reasons (`reason_parts`) of kube-scheduler's FailedScheduling events, and how many pods
    were given each."""
    pending = {p["metadata"]["name"]: p for p in pods if not (p.get("spec") or {}).get("nodeName")}
    latest: dict[str, tuple[str, str]] = {}
    refused: dict[str, set[str]] = {}
    for event in events:
        involved = event.get("involvedObject") or {}
        name = str(involved.get("name") or "")
        if involved.get("kind") != "Pod":
            continue
        if event.get("reason") == "FailedScheduling":
            for part in reason_parts(event.get("message") or ""):
                refused.setdefault(part, set()).add(name)
        if name not in pending:
            continue
        when = (
            (event.get("series") or {}).get("lastObservedTime")
            or event.get("lastTimestamp")
            or event.get("eventTime")
            or event["metadata"].get("creationTimestamp")
            or ""
        )
        source = event.get("reportingComponent") or (event.get("source") or {}).get("component") or "?"
        text = f"{source}: {event.get('reason')}: {_COUNTS.sub('N', event.get('message') or '')}"
        if name not in latest or when >= latest[name][0]:
            latest[name] = (when, text)
    reasons: Counter[str] = Counter()
    for name, pod in pending.items():
        gates = [g["name"] for g in (pod.get("spec") or {}).get("schedulingGates") or []]
        said = latest.get(name, ("", "no event"))[1]
        reasons[f"gated ({', '.join(gates)}); {said}" if gates else said] += 1
    return Waits(
        dict(reasons.most_common()),
        {part: len(names) for part, names in sorted(refused.items(), key=lambda kv: -len(kv[1]))},
        len(set().union(*refused.values())),
    )


def refusal_summary(refused: dict[str, int]) -> str:
    """kube-scheduler's reasons for refusing pods, for a table cell: how many pods got each, the
    CPU nodes' taint left out."""
    return "; ".join(f"{part} ({pods})" for part, pods in refused.items() if _CPU_TAINT not in part) or "-"


async def why_pods_waited(api: client.ApiClient) -> Waits:
    core = client.CoreV1Api(api)
    pods = await raw_json(core.list_namespaced_pod(NAMESPACE, _preload_content=False))
    events = await raw_json(core.list_namespaced_event(NAMESPACE, _preload_content=False))
    return pod_waits(pods["items"], events["items"])


async def follow(api: client.ApiClient, seen: Observed, watched: set[str], wait_for: str) -> None:
    """Watch the benchmark's pods until cancelled, with quorum's own list+watch: a watch the
    apiserver closes (it closes watchers that fall behind under load) goes on from the last
    resourceVersion, and only an expired one lists again. (A watch begun afresh each time sent
    every pod again: up to a dozen times per run, more in the runs with more pod events, and a
    fifth more apiserver CPU in those runs.)"""
    listing = functools.partial(client.CoreV1Api(api).list_namespaced_pod, NAMESPACE)
    await watch_objects(listing, [SeenPods(seen, watched, wait_for)], asyncio.Event(), lambda: None)


def gpu_node_labels(pool: NodePool) -> dict[str, str]:
    """The labels the pool's GPU group gives its nodes (kueue-tas: its flavor's node labels)."""
    (gpu,) = [g for g in pool.groups if g.name == "gpu"]
    return dict(gpu.labels)


def coscheduler_binaries(instance: Instance) -> BinaryCache:
    """The Kubernetes release scheduler-plugins is built against: the instance's, or 1.36 on a
    newer one. Kubernetes 1.37 changed the framework's queue-sort interface (QueuedEntityInfo,
    pod groups) and scheduler-plugins has no release for it; built against 1.36 it runs one
    minor behind the apiserver, within Kubernetes' supported skew for a scheduler."""
    binaries = instance.binaries
    if binaries.pins.kubernetes.startswith("v1.36."):
        return binaries
    return BinaryCache(pins=RELEASES["1.36"].pins, root=binaries.root)


def start_instance(
    mode: str, scenario: Scenario, tmp: Path, kubernetes: str = KUBERNETES, name_prefix: str = "bench"
) -> tuple[Instance, Path]:
    """A fresh instance for one run; its audit log path."""
    pool = write_pool(tmp / "pool.yaml", scenario.gpu_nodes, scenario.cpu_nodes, not scenario.dra)
    (tmp / "audit-policy.yaml").write_text(AUDIT_POLICY)
    audit = tmp / "audit.log"
    with_quorum = mode in ("quorum", "delegated")
    spec = ClusterSpec(
        placement="kube-scheduler" if mode == "delegated" else "quorum",
        name=f"{name_prefix}-{mode}",
        kubernetes=kubernetes,
        pool_file=pool,
        client_qps=QPS,
        client_burst=BURST,
        install_manifests=with_quorum,
        webhooks=with_quorum,
        operator=with_quorum,
        extra_args={
            "kube-apiserver": (
                f"--audit-policy-file={tmp / 'audit-policy.yaml'}",
                f"--audit-log-path={audit}",
                "--audit-log-mode=batch",
                "--audit-log-batch-max-wait=1s",
                # QUORUM_BENCH_PROFILING=1: /debug/pprof on the apiserver, to see where its CPU goes.
                *(("--profiling=true",) if os.environ.get("QUORUM_BENCH_PROFILING") == "1" else ()),
            )
        },
    )
    instance = Instance(spec.name)
    instance.down(quiet=True)
    instance.up(spec, log=lambda _: None)
    if mode.startswith("kueue"):  # its own pod groups: no PodGroup objects
        nodes = render_nodes(load_pool(pool))
        topology = gpu_node_labels(load_pool(pool)) if mode == "kueue-tas" else None
        start_kueue(instance, ensure_kueue(instance.binaries), pool_quota(nodes, topology), topology)
    elif not with_quorum and mode != "was":  # the same PodGroup objects everywhere: scheduler-plugins' CRD
        binaries = coscheduler_binaries(instance)
        built_for_instance = binaries.pins == instance.binaries.pins
        built = ensure_coscheduler(binaries)
        if mode == "coscheduling":
            # v=3: its Permit rejections are logged at 3 (needed for the time pods wait there).
            start_coscheduler(
                instance,
                built,
                verbosity=3 if scenario.name == "contention" else 0,
                own_gates=built_for_instance,
            )
            start_podgroup_controller(instance, built)  # as scheduler-plugins' chart runs it
        else:
            instance.kubectl("apply", "--server-side", "-f", str(built.crd))
            instance.wait_established("-f", str(built.crd))
    return instance, audit


async def run_workload(
    instance: Instance, mode: str, scenario: Scenario, gpu_nodes: list[str], claims: SeenClaims
) -> tuple[Observed, float, float]:
    """Create the scenario's objects and wait until its pods are bound (or finished); what was
    seen, and the window (first create, end). On DRA devices: its devices and claim templates
    first, and `claims` follows the claims meanwhile. In waves (together-dra), each wave once the
    one before has finished; at the end, why the pods not bound wait."""
    gang_pods = scenario_pods(mode, scenario)
    watched = {p["metadata"]["name"] for p in gang_pods}
    seen = Observed()
    api = await api_client(instance.kubeconfig("admin"))
    async with api:
        await create_namespace(api, NAMESPACE)
        custom, core = client.CustomObjectsApi(api), client.CoreV1Api(api)
        if mode.startswith("kueue"):
            queue = local_queue(NAMESPACE)
            await custom.create_namespaced_custom_object(
                "kueue.x-k8s.io", "v1beta2", NAMESPACE, "localqueues", queue
            )
        if mode == "was":  # Kubernetes' own PodGroups, of the version the cluster serves
            workloads = await WorkloadApi.of(api)
            for gang in scenario.gangs:
                body = workload_podgroup(gang, workloads.version)
                await workloads.create(api, NAMESPACE, "podgroups", body)
        elif not mode.startswith("kueue"):
            for gang in scenario.gangs:
                body = podgroup(gang, PERMIT_WAITING_SECONDS)
                await custom.create_namespaced_custom_object(GROUP, "v1alpha1", NAMESPACE, "podgroups", body)
        if scenario.dra:
            await publish_devices(api, gpu_nodes, scenario.gangs, scenario.linked)
        follower = asyncio.create_task(follow(api, seen, watched, scenario.wait_for))
        claim_watch = asyncio.create_task(follow_claims(api, claims)) if scenario.dra else None
        await asyncio.sleep(1)  # the watch is open
        gate = asyncio.Semaphore(1 if scenario.ordered else IN_FLIGHT)

        async def create(pod: dict[str, Any]) -> None:
            async with gate:
                await core.create_namespaced_pod(NAMESPACE, pod)
                seen.created[pod["metadata"]["name"]] = time.time()

        async def churn() -> None:  # 10 CPU-only pods a second, each running 4 s
            for i in range(scenario.churn):
                await create(cpu_pod(i, 4))
                await asyncio.sleep(0.1)

        start = time.time()
        churning = asyncio.create_task(churn())
        if scenario.churn:
            await asyncio.sleep(5)  # the gang arrives into a cluster that is already churning
        before: set[str] = set()
        for number, wave in enumerate(waves(scenario, gang_pods)):
            # once the wave before has finished, or at the latest wave_by s after the one before
            if number:
                seen.wait_for_wave(before)
                finished = asyncio.create_task(seen.wave_done.wait())
                by = start + scenario.wave_by * number
                await asyncio.wait(
                    [finished, follower], timeout=max(0.0, by - time.time()), return_when="FIRST_COMPLETED"
                )
                finished.cancel()
            seen.waves_created.append(time.time())
            await asyncio.gather(*(create(p) for p in wave))
            before = {p["metadata"]["name"] for p in wave}
        waiting = asyncio.create_task(seen.done.wait())
        # In waves the deadline counts from the start, else from the last pod created.
        left = scenario.deadline if scenario.waves == 1 else max(0.0, start + scenario.deadline - time.time())
        await asyncio.wait([waiting, follower], timeout=left, return_when="FIRST_COMPLETED")
        if follower.done() and not seen.done.is_set():
            follower.result()  # the watch failed for good: say why
        if not seen.done.is_set():
            print(f"  {mode}/{scenario.name}: not done within {scenario.deadline:.0f} s", file=sys.stderr)
        end = time.time()
        if scenario.linked:
            seen.waits = await why_pods_waited(api)
        for task in (waiting, follower, claim_watch):
            if task is not None:
                task.cancel()
        await churning
        await assert_no_overcommit(api)
    return seen, start, end


def cpu_seconds(instance: Instance) -> dict[str, float]:
    """CPU time (user + system) each of the instance's processes has used so far."""
    state = instance.state()
    assert state is not None
    tick = os.sysconf("SC_CLK_TCK")
    used: dict[str, float] = {}
    for record in state.processes:
        with contextlib.suppress(OSError):
            text = Path(f"/proc/{record.pid}/stat").read_text()
            fields = text[text.rindex(")") + 2 :].split()
            used[record.name] = (int(fields[11]) + int(fields[12])) / tick
    used["benchmark client"] = sum(os.times()[:2])
    return used


def count_requests(audit_log: Path, start: float, end: float) -> tuple[Counter[str], dict[str, Counter[str]]]:
    """Requests the apiserver served in [start, end], by who made them; and the gang
    controllers' (quorum-operator's, Kueue's) by verb and resource."""
    counts: Counter[str] = Counter()
    detail: dict[str, Counter[str]] = {name: Counter() for name in DETAILED}
    for line in audit_log.read_text().splitlines():
        event = json.loads(line)
        when = datetime.fromisoformat(event["requestReceivedTimestamp"].replace("Z", "+00:00")).timestamp()
        if not start <= when <= end:
            continue
        user, agent = event.get("user", {}).get("username", ""), event.get("userAgent", "")
        if user == OPERATOR:
            who = "quorum-operator"
        elif agent.startswith("OpenAPI-Generator"):
            who = "benchmark client"
        elif user.startswith("system:serviceaccount:kube-system:"):
            who = "kube-controller-manager"
        else:
            who = agent.split("/", 1)[0] or user  # Kueue's: "kueue/v0.17.0 (linux/amd64) ..."
        counts[who] += 1
        if who in detail:
            ref = event.get("objectRef") or {}
            sub = f"/{ref['subresource']}" if ref.get("subresource") else ""
            detail[who][f"{event['verb']} {ref.get('resource', '?')}{sub}"] += 1
    return counts, detail


def gpu_node_names(pool_file: Path) -> list[str]:
    return [name for name, group in node_groups(load_pool(pool_file)).items() if group == "gpu"]


def measure(
    mode: str, scenario: Scenario, quick: bool, kubernetes: str = KUBERNETES, name_prefix: str = "bench"
) -> dict[str, Any]:
    print(
        f"{scenario.name} / {mode}: starting a fresh instance (Kubernetes {kubernetes}) ...",
        file=sys.stderr,
        flush=True,
    )
    with tempfile.TemporaryDirectory(prefix="quorum-peers-") as tmp:
        instance, audit = start_instance(mode, scenario, Path(tmp), kubernetes, name_prefix)
        claims = SeenClaims(linked=linked_device_names(scenario.linked))
        try:
            before = cpu_seconds(instance)
            gpu_nodes = gpu_node_names(Path(tmp) / "pool.yaml")
            seen, start, end = asyncio.run(run_workload(instance, mode, scenario, gpu_nodes, claims))
            after = cpu_seconds(instance)
            cpu = {k: round(after[k] - before.get(k, 0.0), 1) for k in after}
            time.sleep(2)  # the audit log is written in batches
            requests, detail = count_requests(audit, start, end)
            log = instance.layout.log(SCHEDULER_NAME)
            waits = (
                permit_waits(
                    log.read_text().splitlines(),
                    {f"{NAMESPACE}/{k}": v for k, v in seen.bound.items()},
                    PERMIT_WAITING_SECONDS,
                    datetime.now(UTC).year,
                )
                if log.exists()
                else {}
            )
        finally:
            instance.down(quiet=True)
    result = summarise(mode, scenario, seen, start, end, requests, waits)
    for who, key in DETAILED.items():
        if detail[who]:
            result[key] = dict(detail[who].most_common())
    if scenario.dra:
        result["claims_allocated"] = len(claims.allocated)
        result["devices_allocated_twice"] = len(claims.twice)
        if claims.twice:
            print(
                f"  {mode}/{scenario.name}: devices allocated twice: {sorted(claims.twice)}", file=sys.stderr
            )
    if scenario.linked:
        result["any_claims_on_linked_devices"] = len(claims.any_on_linked)
        why = seen.waits or Waits()
        result["pending_reasons"] = why.pending
        result["pending_reason"] = pending_summary(why.pending)
        result["pods_refused"] = why.pods_refused
        result["refusals"] = why.refused
        result["refusal_reasons"] = refusal_summary(why.refused)
        result["waves_created_at"] = [round(t - seen.waves_created[0], 1) for t in seen.waves_created]
    result["cpu_seconds"] = round(sum(cpu.values()), 1)
    result["cpu_seconds_by_process"] = dict(sorted(cpu.items(), key=lambda kv: -kv[1]))
    return result


def summarise(
    mode: str,
    scenario: Scenario,
    seen: Observed,
    start: float,
    end: float,
    requests: Counter[str],
    waits: dict[str, list[tuple[float, float]]],
) -> dict[str, Any]:
    order = in_sequence(scenario.gangs)
    names = [f"{g.name}-{i}" for g, i in order]
    bound = [seen.bound[n] for n in names if n in seen.bound]
    total = sum(requests.values())
    result: dict[str, Any] = {
        "mode": mode,
        "pods": len(names),
        "pods_bound": len(bound),
        "finished": len(bound) == len(names)
        and (scenario.wait_for == "bound" or all(n in seen.finished for n in names)),
        "apiserver_requests": total,
        "apiserver_requests_per_pod": round(total / len(names), 2),
        "requests_by_client": dict(requests.most_common()),
        "pod_watch_restarts": seen.watch_restarts,
    }
    if bound:
        last_created = max(seen.created[n] for n in names if n in seen.created)
        result["seconds_to_all_bound"] = round(max(bound) - start, 2)
        result["pods_bound_per_second"] = round(len(bound) / (max(bound) - start), 1)
        result["last_created_to_all_bound_seconds"] = round(max(bound) - last_created, 2)
    if scenario.wait_for == "finished":
        done = [seen.finished[n] for n in names if n in seen.finished]
        finish = max(done) if len(done) == len(names) else end
        pods = [  # a pod's GPUs: its nvidia.com/gpu, or its claim's devices (the template's count)
            PodRecord(
                gang.name,
                gang.gpus,
                seen.bound.get(name),
                seen.finished.get(name),
                tuple(waits.get(f"{NAMESPACE}/{name}", ())),
            )
            for name, (gang, _) in zip(names, order, strict=True)
        ]
        report = gang_report(
            pods, {g.name: g.size for g in scenario.gangs}, scenario.gpu_nodes * GPUS_PER_NODE, start, finish
        )
        result |= {k: v for k, v in asdict(report).items() if k != "episodes"}
        result |= asdict(gang_outcomes(pods, {g.name: g.size for g in scenario.gangs}, end))
        result["seconds_to_finish_all_gangs"] = round(finish - start, 1)
        result["pods_that_waited_at_permit"] = sum(1 for w in waits.values() if w)
    return result


def main() -> int:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--scenario", action="append", choices=SCENARIOS)
    parser.add_argument("--mode", action="append", choices=MODES)
    parser.add_argument("--quick", action="store_true", help="a quarter of the sizes (a smoke run)")
    parser.add_argument(
        "--rounds",
        type=int,
        default=3,
        help="throughput: run every way this many times, the ways in turn (the machine's speed drifts)",
    )
    parser.add_argument("--name-prefix", default="bench", help="instance names: <prefix>-<way>")
    parser.add_argument(
        "--output",
        type=Path,
        help="the results' JSON file (the Markdown beside it); default bench/results/<date>[-...].json",
    )
    parser.add_argument(
        "--kubernetes",
        choices=sorted(RELEASES),
        help=f"the minor every way runs on (default {KUBERNETES}, the figures' baseline; "
        f"contention-dra: {DRA_KUBERNETES})",
    )
    args = parser.parse_args()
    chosen = scenarios(args.quick)
    results: dict[str, Any] = {}
    for name in args.scenario or SCENARIOS:
        scenario = chosen[name]
        modes = [m for m in args.mode or scenario.modes if m in scenario.modes]
        if not modes:
            print(f"{name}: none of the ways asked runs it ({', '.join(scenario.modes)} do)", file=sys.stderr)
            continue
        kubernetes = args.kubernetes or scenario.kubernetes
        if "delegated" in modes and kubernetes < DELEGATED_KUBERNETES:
            if args.mode and "delegated" in args.mode:
                parser.error(f"--mode delegated needs --kubernetes {DELEGATED_KUBERNETES} or later")
            modes.remove("delegated")
        rounds = [
            [measure(mode, scenario, args.quick, kubernetes, args.name_prefix) for mode in modes]
            for _ in range(max(1, args.rounds) if name == "throughput" else 1)
        ]
        results[name] = {
            "kubernetes": kubernetes,
            "gpu_nodes": scenario.gpu_nodes,
            "gangs": len(scenario.gangs),
            "pods": sum(g.size for g in scenario.gangs),
            "runs": rounds[0],
        }
        if len(rounds) > 1:
            results[name]["rounds"] = rounds
        print(json.dumps(results[name], indent=2), flush=True)
    stamp = datetime.now(UTC).strftime("%Y-%m-%d")
    (args.output.parent if args.output else RESULTS).mkdir(parents=True, exist_ok=True)
    # A run of some scenarios or ways does not overwrite the day's full comparison.
    suffix = (
        ("-quick" if args.quick else "")
        + ("-partial" if args.scenario or args.mode else "")
        + (f"-k8s-{args.kubernetes}" if args.kubernetes not in (None, KUBERNETES) else "")
    )
    data = {
        "date": stamp,
        "quick": args.quick,
        "kubernetes": args.kubernetes or KUBERNETES,
        "qps": QPS,
        "burst": BURST,
        "scenarios": results,
    }
    out = args.output or RESULTS / f"{stamp}{suffix}.json"
    out.write_text(json.dumps(data, indent=2) + "\n")
    table = peer_report.markdown(data)
    out.with_suffix(".md").write_text(table)
    print(table)
    print(f"written to {out} and {out.with_suffix('.md')}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
