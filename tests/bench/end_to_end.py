"""End-to-end benchmark on the local control plane: quorum-webhooks gate, quorum-operator plans
and releases, kube-scheduler binds, kwok runs. 200 production GPU nodes (8 GPUs each, the
CKS-like pool scaled to 252 nodes), 200 PodGroups of 8 pods x 1 GPU created as fast as the
apiserver takes them (64 creates in flight), which fill the GPUs exactly.

Two runs on one instance: 40 gangs arriving one every 0.5 s (a pace the control plane keeps
up with: latency without a queue), then 200 gangs all at once (throughput). Measured from the
benchmark's own pod watch (client-side times):
- gangs admitted per second (gangs / first pod created -> last gang's gates removed);
- per gang, from its last pod created to all its gates removed (quorum's decision and patches)
  and to all its pods bound (p50 / p99);
- API requests quorum-operator made, per gang, from the apiserver's audit log (its
  ServiceAccount only, the workload window only), by verb and resource;
- quorum-operator's memory (RSS now and peak) from /proc.

Bounded: 1,600 pods, 300 s. Writes bench/results/<date>-end-to-end.json.

    make bench-e2e
"""

from __future__ import annotations

import asyncio
import functools
import json
import statistics
import sys
import tempfile
import time
from collections import Counter
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from kubernetes_asyncio import client

from devcluster.cluster import Instance
from devcluster.config import ClusterSpec
from quorum.install import DEFAULT_NAMESPACE, operator_username
from quorum.k8s.watch import watch_objects
from tests.kube import api_client, assert_no_overcommit, create_namespace, create_podgroup, eventually

RESULTS = Path(__file__).resolve().parents[2] / "bench" / "results"
GANGS, PODS, IN_FLIGHT, DEADLINE = 200, 8, 64, 300.0
PACED_GANGS, PACE_SECONDS = 40, 0.5
NAMESPACE = "bench"
OPERATOR = operator_username(DEFAULT_NAMESPACE)
AUDIT_POLICY = f"""apiVersion: audit.k8s.io/v1
kind: Policy
omitStages: [RequestReceived]
rules:
  - level: Metadata
    users: ["{OPERATOR}"]
  - level: None
"""


def pod(gang: int, index: int) -> dict[str, Any]:
    return {
        "metadata": {
            "name": f"g{gang:03d}-{index}",
            "labels": {"pod-group.scheduling.sigs.k8s.io": f"g{gang:03d}"},
        },
        "spec": {
            "schedulerName": "cw-coscheduler",
            "containers": [
                {
                    "name": "train",
                    "image": "registry.k8s.io/pause:3.10",
                    "resources": {
                        "limits": {"nvidia.com/gpu": "1"},
                        "requests": {"cpu": "1", "memory": "8Gi"},
                    },
                }
            ],
        },
    }


class PodTimes:
    """When each pod was seen created, ungated and bound, from a watch in this process."""

    def __init__(self, namespace: str, pods: int) -> None:
        self.namespace, self.pods = namespace, pods
        self.created: dict[str, float] = {}
        self.ungated: dict[str, float] = {}
        self.bound: dict[str, float] = {}
        self.done = asyncio.Event()

    def upsert(self, raw: dict[str, Any]) -> None:
        """One version of a pod, from the watch (`watch_objects` index)."""
        name, now = raw["metadata"]["name"], time.monotonic()
        spec = raw.get("spec") or {}
        gated = any(g["name"] == "quorum.dev/gang" for g in spec.get("schedulingGates") or [])
        if not gated and name not in self.ungated:
            self.ungated[name] = now
        if spec.get("nodeName") and name not in self.bound:
            self.bound[name] = now
        if len(self.bound) == self.pods:
            self.done.set()

    def delete(self, raw: dict[str, Any]) -> None:
        pass

    def replace_all(self, pods: list[dict[str, Any]]) -> None:
        for pod in pods:
            self.upsert(pod)

    async def follow(self, api: client.ApiClient) -> None:
        """Watch the namespace's pods until cancelled; a closed watch goes on from the last
        resourceVersion (quorum's own list+watch, `quorum/k8s/watch.py`)."""
        listing = functools.partial(client.CoreV1Api(api).list_namespaced_pod, self.namespace)
        await watch_objects(listing, [self], asyncio.Event(), lambda: None)


def percentile(values: list[float], p: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, round(p / 100 * (len(ordered) - 1)))]


def rss(pid: int) -> dict[str, float]:
    fields = dict(
        line.split(":", 1) for line in Path(f"/proc/{pid}/status").read_text().splitlines() if ":" in line
    )
    return {k: round(int(fields[k].split()[0]) / 1024, 1) for k in ("VmRSS", "VmHWM")}


def operator_requests(audit_log: Path, since: str) -> Counter[str]:
    counts: Counter[str] = Counter()
    for line in audit_log.read_text().splitlines():
        event = json.loads(line)
        if event.get("user", {}).get("username") != OPERATOR or event["requestReceivedTimestamp"] < since:
            continue
        ref = event.get("objectRef") or {}
        resource = ref.get("resource", "?") + (f"/{ref['subresource']}" if ref.get("subresource") else "")
        counts[f"{event['verb']} {resource}"] += 1
    return counts


async def run_gangs(api: client.ApiClient, namespace: str, gangs: int, pace: float | None) -> dict[str, Any]:
    """Create `gangs` PodGroups of 8 pods: all at once (64 creates in flight), or one gang every
    `pace` seconds; wait until every pod is bound; times per gang."""
    await create_namespace(api, namespace)
    for g in range(gangs):
        await create_podgroup(api, namespace, f"g{g:03d}", PODS)
    times = PodTimes(namespace, gangs * PODS)
    follower = asyncio.create_task(times.follow(api))
    await asyncio.sleep(1)  # the watch is open
    core, gate = client.CoreV1Api(api), asyncio.Semaphore(IN_FLIGHT)
    start = time.monotonic()

    async def create(g: int, i: int) -> None:
        async with gate:
            await core.create_namespaced_pod(namespace, pod(g, i))
            times.created[f"g{g:03d}-{i}"] = time.monotonic()

    if pace is None:
        await asyncio.gather(*(create(g, i) for g in range(gangs) for i in range(PODS)))
    else:
        for g in range(gangs):
            await asyncio.gather(*(create(g, i) for i in range(PODS)))
            await asyncio.sleep(max(0.0, start + (g + 1) * pace - time.monotonic()))
    created_all = time.monotonic() - start
    try:
        await asyncio.wait_for(times.done.wait(), DEADLINE)
    finally:
        follower.cancel()
    await assert_no_overcommit(api)
    per_gang = []
    for g in range(gangs):
        names = [f"g{g:03d}-{i}" for i in range(PODS)]
        last = max(times.created[n] for n in names)
        per_gang.append(
            (max(times.ungated[n] for n in names) - last, max(times.bound[n] for n in names) - last)
        )
    last_ungated = max(times.ungated.values()) - start
    gate_ms = [a * 1000 for a, _ in per_gang]
    bound_ms = [b * 1000 for _, b in per_gang]
    return {
        "gangs": gangs,
        "pods": gangs * PODS,
        "arrival": "all at once" if pace is None else f"one gang every {pace:g} s",
        "seconds_to_create_all_pods": round(created_all, 2),
        "seconds_to_release_all": round(last_ungated, 2),
        "seconds_to_bind_all": round(max(times.bound.values()) - start, 2),
        "gangs_admitted_per_second": round(gangs / last_ungated, 1),
        "gate_removal_ms_p50": round(statistics.median(gate_ms)),
        "gate_removal_ms_p99": round(percentile(gate_ms, 99)),
        "all_bound_ms_p50": round(statistics.median(bound_ms)),
        "all_bound_ms_p99": round(percentile(bound_ms, 99)),
    }


async def workload(instance: Instance, audit_log: Path) -> dict[str, Any]:
    """First gangs arriving at a pace the control plane keeps up with (latency without a
    queue), then all 200 at once (throughput; 1,600 GPUs, the whole pool)."""
    api = await api_client(instance.kubeconfig("admin"))
    async with api:
        paced = await run_gangs(api, "paced", PACED_GANGS, PACE_SECONDS)
        await client.CoreV1Api(api).delete_namespace("paced")

        async def paced_gone() -> bool:
            listing = await client.CoreV1Api(api).list_namespaced_pod("paced")
            return not listing.items

        await eventually(paced_gone, timeout=120, what="the paced run's pods gone")
        since = datetime.now(UTC).strftime("%Y-%m-%dT%H:%M:%S.%fZ")
        burst = await run_gangs(api, NAMESPACE, GANGS, None)
        await asyncio.sleep(2)  # the audit log is written asynchronously
    requests = operator_requests(audit_log, since)
    mutating = sum(v for k, v in requests.items() if not k.startswith(("get ", "list ", "watch ")))
    burst.update(
        {
            "operator_requests_per_gang": round(sum(requests.values()) / GANGS, 2),
            "operator_writes_per_gang": round(mutating / GANGS, 2),
            "operator_requests": dict(requests.most_common()),
        }
    )
    return {"paced": paced, "burst": burst}


def main() -> int:
    with tempfile.TemporaryDirectory(prefix="quorum-bench-") as tmp:
        policy, audit_log = Path(tmp) / "audit-policy.yaml", Path(tmp) / "audit.log"
        policy.write_text(AUDIT_POLICY)
        spec = ClusterSpec(
            name="bench-e2e",
            pool_size=252,
            client_qps=500,
            client_burst=1000,
            extra_args={
                "kube-apiserver": (
                    f"--audit-policy-file={policy}",
                    f"--audit-log-path={audit_log}",
                    "--audit-log-mode=batch",
                    "--audit-log-batch-max-wait=1s",
                )
            },
        )
        instance = Instance("bench-e2e")
        instance.down(quiet=True)
        state = instance.up(spec, log=lambda _: None)
        try:
            result = asyncio.run(workload(instance, audit_log))
            operator = next(p for p in state.processes if p.name == "quorum-operator")
            result["operator_memory_mib"] = rss(operator.pid)
        finally:
            instance.down(quiet=True)
    RESULTS.mkdir(parents=True, exist_ok=True)
    stamp = datetime.now(UTC).strftime("%Y-%m-%d")
    out = RESULTS / f"{stamp}-end-to-end.json"
    out.write_text(json.dumps({"date": stamp, **result}, indent=2) + "\n")
    for label, r in result.items():
        if label in ("paced", "burst"):
            created, released = r["seconds_to_create_all_pods"], r["seconds_to_release_all"]
            print(f"{label}: {r['gangs']} gangs x {PODS} pods, {r['arrival']}:")
            print(f"  all pods created in {created} s; all released in {released} s")
            print(f"  gangs admitted per second: {r['gangs_admitted_per_second']}")
            for what, key in (("gates removed", "gate_removal"), ("all bound", "all_bound")):
                print(
                    f"  last pod created -> {what}: p50 {r[key + '_ms_p50']} ms, p99 {r[key + '_ms_p99']} ms"
                )
    burst = result["burst"]
    print(
        f"operator API requests per gang (burst): {burst['operator_requests_per_gang']} "
        f"({burst['operator_writes_per_gang']} writes): {burst['operator_requests']}"
    )
    print(f"operator memory: {result['operator_memory_mib']} MiB")
    print(f"\nwritten to {out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
