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

Then the cost attack (docs/threat-model.md): the tenant identity (`edit` in its namespace only)
creates 64 one-pod gangs that never fit, each pod of its own shape with the most the apiserver
accepts of a gang pod (`quorum-gang-pod-size`: 64 tolerations, a required node affinity of 8
terms x 8 expressions x 64 values; one more toleration is refused, which is checked), and 5 small
gangs arrive behind them. Measured: the operator's worst pass and the small gangs' latency on the
instance, and the planner's passes over the same pods, read back from the apiserver and converted
as the operator converts them, in front of 5,000 nodes (the instance has 200).

Bounded: 1,400 pods, 600 s per phase. Writes bench/results/<date>-poison.json.

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

from devcluster.cluster import Instance
from devcluster.config import ClusterSpec
from quorum.core.model import Gang
from quorum.k8s.convert import pod_from_api
from tests.bench.end_to_end import PodTimes, percentile
from tests.bench.planner import GANG_POD_LIMITS, held_passes, nodes_of
from tests.kube import (
    api_client,
    assert_no_overcommit,
    create_namespace,
    create_podgroup,
    eventually,
    raw_json,
)

RESULTS = Path(__file__).resolve().parents[2] / "bench" / "results"
NAMESPACE = "poison"
WORKERS, SMALL_GANGS, PACE_SECONDS, DEADLINE = 1270, 30, 1.0, 600.0
ATTACK_NAMESPACE, ATTACK_GANGS, BYSTANDERS, ATTACK_NODES = "poison-attack", 64, 5, 5_000


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


def attack_pod(g: int, tolerations: int) -> dict[str, Any]:
    """Gang `g`'s one pod: 9 GPUs (never fits an 8-GPU node), its own keys (its own shape)."""
    _, terms, expressions, values = GANG_POD_LIMITS
    body = pod(f"attack-{g:02d}", f"attack-{g:02d}", 9)
    spec = body["spec"]
    spec["tolerations"] = [
        {"key": f"attack{g}.example.com/t{i}", "operator": "Exists"} for i in range(tolerations)
    ]
    spec["affinity"] = {
        "nodeAffinity": {
            "requiredDuringSchedulingIgnoredDuringExecution": {
                "nodeSelectorTerms": [
                    {
                        "matchExpressions": [
                            {
                                "key": f"attack{g}.example.com/k{t}-{e}",
                                "operator": "NotIn",
                                "values": [f"v{i}" for i in range(values)],
                            }
                            for e in range(expressions)
                        ]
                    }
                    for t in range(terms)
                ]
            }
        }
    }
    return body


async def cost_attack(instance: Instance, port: int) -> tuple[dict[str, Any], list[dict[str, Any]]]:
    """The attack on the instance: what it measured, and the attack pods as the apiserver has them."""
    api = await api_client(instance.kubeconfig("admin"))
    tenant = await api_client(instance.kubeconfig("tenant"))
    async with api, tenant:
        await create_namespace(api, ATTACK_NAMESPACE)
        binding = {
            "metadata": {"name": "tenant-edit"},
            "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "ClusterRole", "name": "edit"},
            "subjects": [
                {"apiGroup": "rbac.authorization.k8s.io", "kind": "User", "name": "tenant@example.com"}
            ],
        }
        await client.RbacAuthorizationV1Api(api).create_namespaced_role_binding(ATTACK_NAMESPACE, binding)
        core, custom = client.CoreV1Api(tenant), client.CustomObjectsApi(api)
        tolerations = GANG_POD_LIMITS[0]
        try:
            await core.create_namespaced_pod(ATTACK_NAMESPACE, attack_pod(99, tolerations + 1), dry_run="All")
            refused = ""
        except client.ApiException as err:
            refused = str(json.loads(err.body)["message"])[:200]
        if "quorum-gang-pod-size" not in refused:
            raise AssertionError(f"{tolerations + 1} tolerations were not refused: {refused!r}")
        for g in range(ATTACK_GANGS):
            await create_podgroup(tenant, ATTACK_NAMESPACE, f"attack-{g:02d}", 1)
        without_attack = await bystanders(api, tenant, "without")
        before = scrape(port)
        started = time.monotonic()
        for g in range(ATTACK_GANGS):
            await core.create_namespaced_pod(
                ATTACK_NAMESPACE, attack_pod(g, tolerations), _preload_content=False
            )
        created = time.monotonic() - started

        async def all_held() -> bool:
            listed = await custom.list_namespaced_custom_object(
                "quorum.dev", "v1alpha1", ATTACK_NAMESPACE, "gangs"
            )
            held = sum(
                1
                for gang in listed["items"]
                for c in (gang.get("status") or {}).get("conditions") or []
                if c["type"] == "Unschedulable" and c["status"] == "True"
            )
            return held == ATTACK_GANGS

        await eventually(all_held, timeout=DEADLINE, what=f"the {ATTACK_GANGS} attack gangs held")
        held_after = time.monotonic() - started
        with_attack = await bystanders(api, tenant, "with")
        after = scrape(port)
        listed = await raw_json(
            client.CoreV1Api(api).list_namespaced_pod(
                ATTACK_NAMESPACE, label_selector="quorum.dev/gang", _preload_content=False
            )
        )
        pods = [p for p in listed["items"] if p["metadata"]["name"].startswith("attack-")]
    return {
        "gangs": ATTACK_GANGS,
        "per_pod": f"{tolerations} tolerations, affinity {GANG_POD_LIMITS[1]} terms x "
        f"{GANG_POD_LIMITS[2]} expressions x {GANG_POD_LIMITS[3]} values",
        "one_more_toleration_refused": refused,
        "created_in_s": round(created, 1),
        "all_held_after_s": round(held_after, 1),
        "operator_worst_pass_s": round(after.get("quorum_operator_pass_duration_max_seconds", -1), 3),
        "operator_passes": int(
            after.get("quorum_operator_pass_duration_seconds_count", 0)
            - before.get("quorum_operator_pass_duration_seconds_count", 0)
        ),
        "bystanders_bound_ms": {"without_attack": without_attack, "with_attack": with_attack},
    }, pods


async def bystanders(api: client.ApiClient, tenant: client.ApiClient, run: str) -> dict[str, int]:
    """BYSTANDERS gangs of 2 one-GPU pods, one a second: last pod created -> both bound (ms)."""
    core = client.CoreV1Api(tenant)
    names = [f"{run}-{g}" for g in range(BYSTANDERS)]
    for name in names:
        await create_podgroup(tenant, ATTACK_NAMESPACE, name, 2)
    # Done when every bystander pod in the namespace is bound (the first run's too, in the second).
    times = PodTimes(ATTACK_NAMESPACE, BYSTANDERS * 2 * (2 if run == "with" else 1))
    follower = asyncio.create_task(times.follow(api))
    await asyncio.sleep(1)
    for name in names:
        for i in range(2):
            await core.create_namespaced_pod(ATTACK_NAMESPACE, pod(f"{name}-{i}", name, 1))
            times.created[f"{name}-{i}"] = time.monotonic()
        await asyncio.sleep(PACE_SECONDS)
    try:
        await asyncio.wait_for(times.done.wait(), DEADLINE)
    finally:
        follower.cancel()
    bound = [
        max(times.bound[f"{name}-{i}"] for i in range(2))
        - max(times.created[f"{name}-{i}"] for i in range(2))
        for name in names
    ]
    return {"p50": round(percentile(bound, 50) * 1000), "max": round(max(bound) * 1000)}


def planner_over(pods: list[dict[str, Any]], size: int, passes: int = 6) -> dict[str, Any]:
    """The planner's passes over these pods (one-pod held gangs) in front of `size` nodes: the
    first indexes every shape, later ones find them held."""
    queue = [
        Gang(ATTACK_NAMESPACE, p["metadata"]["name"], 1, (pod_from_api(p),), members=1, created=float(i),
             held_since=0.0)
        for i, p in enumerate(pods)
    ]  # fmt: skip
    by_name = {n.name: n for n in nodes_of(size)}
    return {"nodes": size, "gangs": len(queue), **held_passes(by_name, queue, passes)}


def main() -> int:
    instance = Instance("bench-poison")
    instance.down(quiet=True)
    state = instance.up(ClusterSpec(name="bench-poison", pool_size=200, client_qps=500, client_burst=1000))
    try:
        result = asyncio.run(workload(instance, state.ports.operator))
        result["cost_attack"], attack_pods = asyncio.run(cost_attack(instance, state.ports.operator))
        log = instance.layout.log("quorum-operator").read_text(errors="replace")
        result["lease_lost"] = log.count("lost the Lease")
        result["recursion_errors"] = log.count("RecursionError")
    finally:
        instance.down(quiet=True)
    # With the control plane stopped: the planner alone, as a leader's first pass would run it.
    result["cost_attack"]["planner"] = planner_over(attack_pods, ATTACK_NODES)
    RESULTS.mkdir(parents=True, exist_ok=True)
    stamp = datetime.now(UTC).strftime("%Y-%m-%d")
    out = RESULTS / f"{stamp}-poison.json"
    out.write_text(json.dumps({"date": stamp, **result}, indent=2) + "\n")
    print(json.dumps(result, indent=2))
    print(f"\nwritten to {out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
