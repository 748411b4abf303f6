"""The poison run: one pathological gang in front of a stream of small ones, end to end.

An instance of 200 nodes (158 usable 8-GPU nodes, 1,264 GPUs), as a new user would try it: a
PodGroup of minMember 1,271 made of one CPU launcher and 1,270 one-GPU workers (the MPI
launcher + workers shape), 6 GPUs short — the gang that once stopped quorum-operator for
everybody. Once it is held, 30 small gangs (2 pods x 1 GPU) arrive one a second. Measured:

- for each small gang, from its last pod created to both pods released and bound (the
  benchmark's own pod watch);
- the operator's worst scheduling pass and worst event-loop lag, and its pass-time histogram
  (its /metrics), and whether it ever lost the Lease (its log);
- how the big gang is held (its Gang's Unschedulable condition).

Bounded: 1,331 pods, 600 s. Writes bench/results/<date>-poison.json.

    make bench-poison
"""

from __future__ import annotations

import asyncio
import json
import sys
import time
import urllib.request
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from kubernetes_asyncio import client

from quorum.devcluster.cluster import Instance
from quorum.devcluster.config import ClusterSpec
from tests.bench.end_to_end import PodTimes, percentile
from tests.kube import api_client, assert_no_overcommit, create_namespace, create_podgroup, eventually

RESULTS = Path(__file__).resolve().parents[2] / "bench" / "results"
NAMESPACE = "poison"
WORKERS, SMALL_GANGS, PACE_SECONDS, DEADLINE = 1270, 30, 1.0, 600.0


def pod(name: str, group: str, gpus: int, cpu: str = "1") -> dict[str, Any]:
    resources: dict[str, Any] = {"requests": {"cpu": cpu, "memory": "1Gi"}}
    if gpus:
        resources["limits"] = {"nvidia.com/gpu": str(gpus)}
    return {
        "metadata": {"name": name, "labels": {"pod-group.scheduling.sigs.k8s.io": group}},
        "spec": {
            "schedulerName": "cw-coscheduler",
            "containers": [{"name": "c", "image": "registry.k8s.io/pause:3.10", "resources": resources}],
        },
    }


def scrape(port: int) -> dict[str, float]:
    """The operator's metrics, as name{labels} -> value."""
    with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=10) as response:
        text = response.read().decode()
    out = {}
    for line in text.splitlines():
        if line and not line.startswith("#"):
            name, _, value = line.rpartition(" ")
            out[name] = float(value)
    return out


async def workload(instance: Instance, port: int) -> dict[str, Any]:
    api = await api_client(instance.kubeconfig("admin"))
    async with api:
        core, custom = client.CoreV1Api(api), client.CustomObjectsApi(api)
        await create_namespace(api, NAMESPACE)
        await create_podgroup(api, NAMESPACE, "big", WORKERS + 1)
        gate = asyncio.Semaphore(32)

        async def create(body: dict[str, Any]) -> None:
            async with gate:
                await core.create_namespaced_pod(NAMESPACE, body, _preload_content=False)

        before = scrape(port)  # the lag from here on: the stress, not the process's start
        started = time.monotonic()
        bodies = [pod("big-launcher", "big", 0, cpu="4")] + [
            pod(f"big-{i}", "big", 1) for i in range(WORKERS)
        ]
        await asyncio.gather(*(create(b) for b in bodies))
        created_big = time.monotonic() - started

        async def big_held() -> dict[str, Any] | None:
            gang: dict[str, Any] = await custom.get_namespaced_custom_object(
                "quorum.dev", "v1alpha1", NAMESPACE, "gangs", "pg-big"
            )
            held = [
                c
                for c in (gang.get("status") or {}).get("conditions") or []
                if c["type"] == "Unschedulable" and c["status"] == "True"
            ]
            return held[0] if held else None

        held = await eventually(big_held, timeout=DEADLINE, what="the big gang held")
        held_after = time.monotonic() - started
        for g in range(SMALL_GANGS):
            await create_podgroup(api, NAMESPACE, f"s{g:02d}", 2)
        times = PodTimes(NAMESPACE, SMALL_GANGS * 2)
        follower = asyncio.create_task(times.follow(api))
        await asyncio.sleep(1)
        stream = time.monotonic()
        for g in range(SMALL_GANGS):
            for i in range(2):
                await create(pod(f"s{g:02d}-{i}", f"s{g:02d}", 1))
                times.created[f"s{g:02d}-{i}"] = time.monotonic()
            await asyncio.sleep(max(0.0, stream + (g + 1) * PACE_SECONDS - time.monotonic()))
        try:
            await asyncio.wait_for(times.done.wait(), DEADLINE)
        finally:
            follower.cancel()
        await assert_no_overcommit(api)
    released, bound = [], []
    for g in range(SMALL_GANGS):
        names = [f"s{g:02d}-{i}" for i in range(2)]
        last = max(times.created[n] for n in names)
        released.append(max(times.ungated[n] for n in names) - last)
        bound.append(max(times.bound[n] for n in names) - last)
    metrics = scrape(port)
    lag = {
        k.split('le="')[1].rstrip('"}'): int(v - before.get(k, 0))
        for k, v in metrics.items()
        if k.startswith("quorum_operator_event_loop_lag_seconds_bucket")
    }
    passes = {
        k: v for k, v in metrics.items() if k.startswith("quorum_operator_pass_duration_seconds_bucket")
    }
    return {
        "big_gang": {
            "pods": WORKERS + 1,
            "created_in_s": round(created_big, 1),
            "held_after_s": round(held_after, 1),
        },
        "big_gang_held": {"reason": held["reason"], "message": held["message"]},
        "small_gangs": SMALL_GANGS,
        "small_released_ms": {
            "p50": round(percentile(released, 50) * 1000),
            "p99": round(percentile(released, 99) * 1000),
            "max": round(max(released) * 1000),
        },
        "small_bound_ms": {
            "p50": round(percentile(bound, 50) * 1000),
            "p99": round(percentile(bound, 99) * 1000),
            "max": round(max(bound) * 1000),
        },
        "worst_pass_s": round(metrics.get("quorum_operator_pass_duration_max_seconds", -1), 3),
        "worst_event_loop_lag_ms": round(
            metrics.get("quorum_operator_event_loop_lag_max_seconds", -1) * 1000, 1
        ),
        # Cumulative, from the big gang's first pod on: lag samples (one per 50 ms sleep) <= le.
        "event_loop_lag_samples_during_stress": lag,
        "passes": int(metrics.get("quorum_operator_pass_duration_seconds_count", 0)),
        "pass_duration_buckets": passes,
        "gang_failures": sum(
            v for k, v in metrics.items() if k.startswith("quorum_operator_gang_failures_total")
        ),
    }


def main() -> int:
    instance = Instance("bench-poison")
    instance.down(quiet=True)
    state = instance.up(ClusterSpec(name="bench-poison", pool_size=200, client_qps=500, client_burst=1000))
    try:
        result = asyncio.run(workload(instance, state.ports.operator))
        log = instance.layout.log("quorum-operator").read_text(errors="replace")
        result["lease_lost"] = log.count("lost the Lease")
        result["recursion_errors"] = log.count("RecursionError")
    finally:
        instance.down(quiet=True)
    RESULTS.mkdir(parents=True, exist_ok=True)
    stamp = datetime.now(UTC).strftime("%Y-%m-%d")
    out = RESULTS / f"{stamp}-poison.json"
    out.write_text(json.dumps({"date": stamp, **result}, indent=2) + "\n")
    print(json.dumps(result, indent=2))
    print(f"\nwritten to {out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
