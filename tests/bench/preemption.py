"""Whole-gang preemption on the local control plane (docs/preemption.md).

An instance of its own (`b-preempt`, operator defaults). A pool of 8 nodes x 8 GPUs is kept
full by 6 low-priority gangs (priority 10; Deployments of 2, 1, 1, 2, 1, 1 pods x 8 GPUs, all
Running under kwok). Then 6 high-priority gangs (priority 1000, 2 pods x 8 GPUs) arrive one after
another: each is created once the previous one is bound; once bound it "finishes" (its
Deployment is deleted) and the evicted low gangs, made again by their ReplicaSets, must be running
whole again, and run for 3 s (DWELL), before the next one arrives: every high gang meets a full
pool and preempts.

Measured from the cluster, by a pod watch in this process (client-side times) and the Events:
- per high gang, last pod created -> all its pods bound (every value, p50 and max);
- per preemption, victim gangs (the `Preempted` Events naming that preemptor) and victim pods;
- GPU-seconds of work lost: for each evicted pod, its GPUs x (deletion seen - bound seen);
- per round, the victims' time back to running (high gang deleted -> all low pods bound);
- partially placed gangs (some but not all of a gang's live pods bound), checked after every
  round and at the end: must be 0.

Bounded: 20 pods at a time, each wait at most 120 s, 6 rounds; about 1 minute on 2 cores (plus
the instance's start).
Writes bench/results/<date>-preemption.{json,md}.

    make bench-preemption
    python -m tests.bench.preemption --reuse   # an instance `b-preempt` already up: kept up
"""

from __future__ import annotations

import argparse
import asyncio
import functools
import json
import statistics
import sys
import time
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass, field
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from kubernetes_asyncio import client

from devcluster.cluster import Instance
from devcluster.config import ClusterSpec
from devcluster.nodes import TestPool
from quorum.k8s.watch import watch_objects
from tests.kube import api_client, create_namespace, create_podgroup, create_pool_nodes, eventually

RESULTS = Path(__file__).resolve().parents[2] / "bench" / "results"
NODES, GPUS = 8, 8
LOW_SIZES = (2, 1, 1, 2, 1, 1)  # fills the 8 nodes exactly
HIGH_GANGS, HIGH_SIZE = 6, 2
HIGH, LOW = ("bench-high", 1000), ("bench-low", 10)
NAMESPACE = "bench-preempt"
WAIT = 120.0
DWELL = 3.0  # the victims run this long between rounds: each preemption costs some work
GANG_LABEL = "pod-group.scheduling.sigs.k8s.io"


# -- what the watch saw (plain data) and the figures from it (pure) -------------------------


@dataclass
class PodSeen:
    name: str
    gang: str
    gpus: int
    created: float
    bound: float | None = None
    deleted: float | None = None


@dataclass
class PodLog:
    """Every pod of the namespace the watch saw, by uid, with when it was first seen created,
    bound (nodeName) and deleting (deletionTimestamp, or gone)."""

    pods: dict[str, PodSeen] = field(default_factory=dict)
    changed: asyncio.Event = field(default_factory=asyncio.Event)

    def upsert(self, raw: dict[str, Any]) -> None:
        meta, spec, now = raw["metadata"], raw.get("spec") or {}, time.monotonic()
        seen = self.pods.get(meta["uid"])
        if seen is None:
            limits = (spec.get("containers") or [{}])[0].get("resources", {}).get("limits", {})
            gang = (meta.get("labels") or {}).get(GANG_LABEL, "")
            seen = self.pods[meta["uid"]] = PodSeen(
                meta["name"], gang, int(limits.get("nvidia.com/gpu", 0)), now
            )
        if spec.get("nodeName") and seen.bound is None:
            seen.bound = now
        if meta.get("deletionTimestamp") and seen.deleted is None:
            seen.deleted = now
        self.changed.set()

    def delete(self, raw: dict[str, Any]) -> None:
        seen = self.pods.get(raw["metadata"]["uid"])
        if seen is not None and seen.deleted is None:
            seen.deleted = time.monotonic()
        self.changed.set()

    def replace_all(self, pods: list[dict[str, Any]]) -> None:
        for pod in pods:
            self.upsert(pod)

    def live(self, gang_prefix: str = "") -> list[PodSeen]:
        return [p for p in self.pods.values() if p.deleted is None and p.gang.startswith(gang_prefix)]


def partial_gangs(pods: list[PodSeen], sizes: dict[str, int]) -> list[str]:
    """Gangs some but not all of whose live pods are bound."""
    bound = Counter(p.gang for p in pods if p.deleted is None and p.bound is not None)
    return sorted(g for g, n in bound.items() if 0 < n < sizes.get(g, n + 1))


def lost_gpu_seconds(pods: list[PodSeen], gangs: set[str]) -> float:
    """GPUs x (deletion - binding) of the pods of `gangs` that were bound and then deleted."""
    return sum(p.gpus * (p.deleted - p.bound) for p in pods if p.gang in gangs and p.bound and p.deleted)


def victims_by_preemptor(events: list[dict[str, Any]], namespace: str) -> dict[str, list[str]]:
    """Preempted Events -> {preemptor Gang: victim Gangs}; the message names the preemptor
    ("preempted by <ns>/<gang> (priority ...)")."""
    out: dict[str, set[str]] = {}
    for e in events:
        message = e.get("message") or ""
        marker = f"preempted by {namespace}/"
        if marker not in message:
            continue
        preemptor = message.split(marker, 1)[1].split(" ", 1)[0]
        out.setdefault(preemptor, set()).add(e["involved_object"]["name"])
    return {k: sorted(v) for k, v in sorted(out.items())}


def describe(values: list[float]) -> dict[str, Any]:
    ordered = sorted(values)
    return {
        "values": [round(v, 1) for v in values],
        "p50": round(statistics.median(ordered), 1) if ordered else None,
        "p99": round(ordered[min(len(ordered) - 1, round(0.99 * (len(ordered) - 1)))], 1)
        if ordered
        else None,
        "max": round(ordered[-1], 1) if ordered else None,
    }


# -- the workload (I/O) ---------------------------------------------------------------------


def gang_deployment(name: str, replicas: int, pool: TestPool, priority: str) -> dict[str, Any]:
    labels = {"app": name, GANG_LABEL: name}
    spec: dict[str, Any] = {
        "schedulerName": "cw-coscheduler",
        "priorityClassName": priority,
        "terminationGracePeriodSeconds": 0,
        "containers": [
            {
                "name": "c",
                "image": "registry.k8s.io/pause:3.10",
                "resources": {"limits": {"nvidia.com/gpu": str(GPUS)}},
            }
        ],
        **pool.pod_spec(),
    }
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


async def apply_gang(api: client.ApiClient, name: str, size: int, pool: TestPool, priority: str) -> None:
    await create_podgroup(api, NAMESPACE, name, size)
    await client.AppsV1Api(api).create_namespaced_deployment(
        NAMESPACE, gang_deployment(name, size, pool, priority)
    )


async def until(log: PodLog, test: Callable[[], bool], what: str) -> None:
    async def probe() -> bool:
        return test()

    await eventually(probe, timeout=WAIT, interval=0.05, what=what)


async def events(api: client.ApiClient, reason: str) -> list[dict[str, Any]]:
    listed = await client.CoreV1Api(api).list_namespaced_event(NAMESPACE, field_selector=f"reason={reason}")
    return [e.to_dict() for e in listed.items]


async def workload(instance: Instance) -> dict[str, Any]:
    api = await api_client(instance.kubeconfig("admin"))
    async with api:
        for name, value in (HIGH, LOW):
            body = {"apiVersion": "scheduling.k8s.io/v1", "kind": "PriorityClass", "metadata": {"name": name}}
            try:
                await client.SchedulingV1Api(api).create_priority_class({**body, "value": value})
            except client.ApiException as err:
                if err.status != 409:
                    raise
        try:
            await client.CoreV1Api(api).delete_namespace(NAMESPACE)
            await eventually(
                lambda: gone(api), timeout=WAIT, what=f"namespace {NAMESPACE} from an earlier run gone"
            )
        except client.ApiException as err:
            if err.status != 404:
                raise
        await create_namespace(api, NAMESPACE)
        pool = TestPool(f"bp-{int(time.time()) % 100000}", NODES)
        platform = await api_client(instance.kubeconfig("platform"))
        async with platform:
            await create_pool_nodes(platform, pool)

        log = PodLog()
        listing = functools.partial(client.CoreV1Api(api).list_namespaced_pod, NAMESPACE)
        watch = asyncio.create_task(watch_objects(listing, [log], asyncio.Event(), lambda: None))
        try:
            return await rounds(api, pool, log)
        finally:
            watch.cancel()
            await asyncio.gather(watch, return_exceptions=True)
            await client.CoreV1Api(api).delete_namespace(NAMESPACE)


async def gone(api: client.ApiClient) -> bool:
    try:
        await client.CoreV1Api(api).read_namespace(NAMESPACE)
    except client.ApiException as err:
        return err.status == 404
    return False


async def rounds(api: client.ApiClient, pool: TestPool, log: PodLog) -> dict[str, Any]:
    low = {f"low-{i}": size for i, size in enumerate(LOW_SIZES)}
    sizes = dict(low)
    all_low = sum(LOW_SIZES)

    def low_bound() -> int:
        return sum(1 for p in log.live("low-") if p.bound is not None)

    start = time.monotonic()
    for name, size in low.items():
        await apply_gang(api, name, size, pool, LOW[0])
    await until(log, lambda: low_bound() == all_low, "the pool filled by low-priority gangs")
    fill_seconds = time.monotonic() - start
    await asyncio.sleep(DWELL)

    to_bound: list[float] = []
    back_running: list[float] = []
    partial_seen: list[str] = []
    per_round: list[dict[str, Any]] = []
    for i in range(HIGH_GANGS):
        name = f"high-{i}"
        sizes[name] = HIGH_SIZE
        lost_before = lost_gpu_seconds(list(log.pods.values()), set(low))
        await apply_gang(api, name, HIGH_SIZE, pool, HIGH[0])

        def high_pods(gang: str = name) -> list[PodSeen]:
            return [p for p in log.pods.values() if p.gang == gang]

        await until(
            log,
            lambda: len(high_pods()) == HIGH_SIZE and all(p.bound for p in high_pods()),
            f"{name} bound",
        )
        pods = high_pods()
        seconds = max(p.bound or 0 for p in pods) - max(p.created for p in pods)
        to_bound.append(seconds * 1000)
        partial_seen += partial_gangs(list(log.pods.values()), sizes)

        gone_at = time.monotonic()
        await client.AppsV1Api(api).delete_namespaced_deployment(name, NAMESPACE, grace_period_seconds=0)
        await until(log, lambda: low_bound() == all_low, f"the low-priority gangs running again after {name}")
        back_running.append((time.monotonic() - gone_at) * 1000)
        await asyncio.sleep(DWELL)
        partial_seen += partial_gangs(list(log.pods.values()), sizes)
        lost = lost_gpu_seconds(list(log.pods.values()), set(low)) - lost_before
        per_round.append(
            {"gang": f"pg-{name}", "ms_to_bound": round(seconds * 1000), "gpu_seconds_lost": round(lost, 1)}
        )

    preempted = await events(api, "Preempted")
    preempting = await events(api, "Preempting")
    victims = victims_by_preemptor(preempted, NAMESPACE)
    victim_pods = {
        gang: sum(low.get(v.removeprefix("pg-"), 0) for v in names) for gang, names in victims.items()
    }
    for r in per_round:
        r["victim_gangs"] = victims.get(r["gang"], [])
        r["victim_pods"] = victim_pods.get(r["gang"], 0)
    evicted = [p for p in log.pods.values() if p.gang in low and p.bound and p.deleted]
    final_partial = partial_gangs(list(log.pods.values()), sizes)
    return {
        "nodes": NODES,
        "gpus_per_node": GPUS,
        "low_gangs": list(LOW_SIZES),
        "high_gangs": HIGH_GANGS,
        "high_gang_pods": HIGH_SIZE,
        "dwell_seconds": DWELL,
        "seconds_to_fill_pool": round(fill_seconds, 2),
        "high_last_pod_created_to_all_bound_ms": describe(to_bound),
        "victims_back_running_after_high_deleted_ms": describe(back_running),
        "victim_gangs_per_preemption": describe([float(len(v)) for v in victims.values()]),
        "victim_pods_per_preemption": describe([float(n) for n in victim_pods.values()]),
        "preemptions_with_victims": len(victims),
        "preempted_events": sum(int(e.get("count") or 1) for e in preempted),
        "preempting_events": sum(int(e.get("count") or 1) for e in preempting),
        "evicted_pods": len(evicted),
        "gpu_seconds_lost": round(lost_gpu_seconds(list(log.pods.values()), set(low)), 1),
        "partial_gangs_during": sorted(set(partial_seen)),
        "partial_gangs_at_end": final_partial,
        "rounds": per_round,
    }


def markdown(stamp: str, r: dict[str, Any]) -> str:
    t, v, p, back = (
        r["high_last_pod_created_to_all_bound_ms"],
        r["victim_gangs_per_preemption"],
        r["victim_pods_per_preemption"],
        r["victims_back_running_after_high_deleted_ms"],
    )
    lines = [
        f"# Preemption benchmark, {stamp}",
        "",
        f"`make bench-preemption`: {r['nodes']} nodes x {r['gpus_per_node']} GPUs kept full by low-priority "
        f"gangs of {r['low_gangs']} pods; {r['high_gangs']} high-priority gangs of {r['high_gang_pods']} "
        "pods x 8 GPUs arrive one after another (each once the previous one is bound and deleted and "
        f"the victims have run again for {r['dwell_seconds']} s).",
        "",
        "| figure | values | p50 | max |",
        "|---|---|---|---|",
        f"| high gang: last pod created -> all bound (ms) | {t['values']} | {t['p50']} | {t['max']} |",
        f"| victim gangs per preemption | {v['values']} | {v['p50']} | {v['max']} |",
        f"| victim pods per preemption | {p['values']} | {p['p50']} | {p['max']} |",
        f"| victims running again after the high gang left (ms) | {back['values']} | {back['p50']} "
        f"| {back['max']} |",
        "",
        f"- GPU-seconds of work lost to preemption: {r['gpu_seconds_lost']} "
        f"({r['evicted_pods']} evicted pods; per round {[x['gpu_seconds_lost'] for x in r['rounds']]})",
        f"- Preempted Events {r['preempted_events']}, Preempting Events {r['preempting_events']}",
        f"- partially placed gangs during the run: {len(r['partial_gangs_during'])}, at the end: "
        f"{len(r['partial_gangs_at_end'])}",
        "",
    ]
    return "\n".join(lines)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--instance", default="b-preempt")
    parser.add_argument("--reuse", action="store_true", help="use the instance already up; leave it up")
    args = parser.parse_args()
    instance = Instance(args.instance)
    if not args.reuse:
        instance.down(quiet=True)
        instance.up(ClusterSpec(name=args.instance), log=lambda _: None)
    try:
        result = asyncio.run(asyncio.wait_for(workload(instance), timeout=15 * WAIT))
    finally:
        if not args.reuse:
            instance.down(quiet=True)
    RESULTS.mkdir(parents=True, exist_ok=True)
    stamp = datetime.now(UTC).strftime("%Y-%m-%d")
    out = RESULTS / f"{stamp}-preemption.json"
    out.write_text(json.dumps({"date": stamp, **result}, indent=2) + "\n")
    text = markdown(stamp, result)
    out.with_suffix(".md").write_text(text)
    print(text)
    print(f"written to {out} and {out.with_suffix('.md')}")
    return 1 if result["partial_gangs_at_end"] or result["partial_gangs_during"] else 0


if __name__ == "__main__":
    sys.exit(main())
