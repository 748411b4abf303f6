"""Benchmark of a planning pass on DRA nodes (pure, no cluster): the GPU nodes of a CKS-shaped
pool of 5,000 nodes publish their GPUs as devices (8 each, with a model, an index, a uuid, a
driver version and memory; no nvidia.com/gpu in allocatable), and 1,000 8-pod gangs ask for them
through claims with selectors: most 1 H100 a pod, every tenth 8 H100s (whole nodes), every fifth
2 devices of at least 40Gi. What the operator's pass does with them is timed
(`quorum.operator.snapshot.plan_queue`: devices counted, the queue planned, each release's devices
chosen), with the world assembled from the watched objects before it:

- world: the DRA objects assembled into what a pass plans on (after a change of a claim);
- full pass, cold: a new planner and no selector evaluated yet (a new leader's first pass);
- full pass, warm: a new planner, the selectors' results cached (as after any pass);
- incremental: one claim deallocated (a node's devices free again), one gang arrived.

    python -m tests.bench.planner_dra        # `make bench-planner` runs it after the planner's own
"""

from __future__ import annotations

import gc
import json
import secrets
import sys
import time
from dataclasses import replace
from datetime import UTC, datetime
from typing import Any

from quorum.core.devices import DeviceWorld
from quorum.core.model import Gang, Node, Pod, PodClaim, resources
from quorum.core.planner import Planner
from quorum.k8s.devices import DeviceObjects
from quorum.operator.snapshot import DeviceNodes, Planned, Snapshot, plan_queue
from tests.bench.planner import RESULTS, nodes_of

DRIVER = "gpu.example.com"
H100 = f'device.attributes["{DRIVER}"].model == "H100"'
BIG = f'device.capacity["{DRIVER}"].memory.compareTo(quantity("40Gi")) >= 0'
GPU = "nvidia.com/gpu"


def dra_nodes(size: int) -> list[Node]:
    """The pool's nodes, their GPUs served by DRA instead (none in allocatable)."""
    return [
        replace(n, allocatable={k: v for k, v in n.allocatable.items() if k != GPU}) for n in nodes_of(size)
    ]


def slices(nodes: list[Node], gpus_of: dict[str, int]) -> list[dict[str, Any]]:
    out = []
    for i, node in enumerate(nodes):
        count = gpus_of.get(node.name, 0)
        if not count:
            continue
        model, memory = ("A100", "40Gi") if i % 5 == 0 else ("H100", "80Gi")
        devices = [
            {
                "name": f"gpu-{d}",
                "attributes": {
                    "model": {"string": model},
                    "index": {"int": d},
                    "uuid": {"string": f"GPU-{secrets.token_hex(8)}"},
                    "driverVersion": {"version": "580.65.6"},
                },
                "capacity": {"memory": {"value": memory}},
            }
            for d in range(count)
        ]
        out.append(
            {
                "metadata": {
                    "name": f"{node.name}-{DRIVER}",
                    "uid": f"slice-{node.name}",
                    "resourceVersion": "1",
                },
                "spec": {
                    "driver": DRIVER,
                    "nodeName": node.name,
                    "pool": {"name": node.name, "generation": 1, "resourceSliceCount": 1},
                    "devices": devices,
                },
            }
        )
    return out


def device_class() -> dict[str, Any]:
    return {
        "metadata": {"name": "gpu", "uid": "class-gpu", "resourceVersion": "1"},
        "spec": {"selectors": [{"cel": {"expression": f'device.driver == "{DRIVER}"'}}]},
    }


def claim(
    name: str, count: int, selector: str, allocated: tuple[str, list[str]] | None = None
) -> dict[str, Any]:
    request = {
        "name": "gpus",
        "exactly": {
            "deviceClassName": "gpu",
            "count": count,
            "selectors": [{"cel": {"expression": selector}}],
        },
    }
    obj: dict[str, Any] = {
        "metadata": {"name": name, "namespace": "bench", "uid": f"uid-{name}", "resourceVersion": "1"},
        "spec": {"devices": {"requests": [request]}},
        "status": {},
    }
    if allocated is not None:
        node, devices = allocated
        results = [{"request": "gpus", "driver": DRIVER, "pool": node, "device": d} for d in devices]
        obj["status"] = {"allocation": {"devices": {"results": results}}}
    return obj


def gangs_and_claims(count: int) -> tuple[list[Gang], list[dict[str, Any]]]:
    gangs, claims = [], []
    for i in range(count):
        size, selector = (8, H100) if i % 10 == 0 else (2, BIG) if i % 5 == 0 else (1, H100)
        pods = []
        for j in range(8):
            name = f"g{i}p{j}-gpus"
            claims.append(claim(name, size, selector))
            requests = resources({"cpu": "8", "memory": "64Gi", "pods": "1"})
            pods.append(
                Pod(f"g{i}p{j}", f"g{i}p{j}", requests, claims=(PodClaim("gpus", template="t", made=name),))
            )
        gangs.append(Gang("bench", f"g{i}", 8, tuple(pods), members=8, created=float(i)))
    return gangs, claims


def best_ms(run: Any, repeat: int = 3) -> float:
    times = []
    for _ in range(repeat):
        started = time.perf_counter()
        run()
        times.append(time.perf_counter() - started)
    return round(min(times) * 1000, 1)


def snapshot(nodes: list[Node], world: DeviceWorld, changed: set[str] | None) -> Snapshot:
    return Snapshot({n.name: n for n in nodes}, {}, {}, {}, {}, changed, 0.0, devices=world)


def run(size: int = 5_000, gangs_count: int = 1_000, busy: float = 0.75) -> dict[str, Any]:
    nodes = dra_nodes(size)
    gpus_of = {n.name: 8 for n in nodes}  # every node: 5,000 x 8 devices
    gangs, claims = gangs_and_claims(gangs_count)
    # `busy` of the GPU nodes' devices held by claims of running pods (all 8 of a node, or none).
    gpu_nodes = sorted(gpus_of)
    running = [
        claim(f"running-{n}", 8, H100, (n, [f"gpu-{d}" for d in range(8)]))
        for n in gpu_nodes[: int(len(gpu_nodes) * busy)]
    ]
    objects = DeviceObjects()
    objects.slices.replace_all(slices(nodes, gpus_of))
    objects.classes.replace_all([device_class()])
    objects.claims.replace_all(claims + running)
    devices = sum(gpus_of.values())
    # What the watches hold is frozen after a full collection, as the operator's collector does
    # (quorum/operator/collector.py): collections then walk only what a pass makes.
    gc.collect()
    gc.freeze()

    def claims_changed() -> DeviceWorld:
        objects.claims.version += 1  # as after any claim's change: assembled again
        return objects.world(nodes)

    world_ms = best_ms(claims_changed)
    world = objects.world(nodes)

    def full(cold: bool) -> Planned:
        device_nodes = DeviceNodes()
        if not cold:
            device_nodes.matcher = warm_cache
        return plan_queue(snapshot(nodes, world, None), gangs, Planner(), device_nodes)

    # Cold: a new leader's passes until every kind of request is matched (a pass matches new
    # kinds within its budget, MATCHING_SECONDS; the gangs of the others wait for the next).
    warm_nodes, cold_planner = DeviceNodes(), Planner()
    cold_passes: list[float] = []
    for _ in range(20):  # bounded: a kind of 40,000 devices takes a few passes at most
        started = time.perf_counter()
        first = plan_queue(snapshot(nodes, world, None), gangs, cold_planner, warm_nodes)
        cold_passes.append(round((time.perf_counter() - started) * 1000, 1))
        if not any(h.reason == "WaitingForClaims" for h in first.plan.holds):
            break
    cold_ms = cold_passes[0]
    warm_cache = warm_nodes.matcher
    warm_ms = best_ms(lambda: full(cold=False))

    # Incremental, on the planner of a full pass, with the released gangs' devices taken.
    planner, device_nodes = Planner(), DeviceNodes()
    device_nodes.matcher = warm_cache
    planned = plan_queue(snapshot(nodes, world, None), gangs, planner, device_nodes)
    assumed = {k for a in planned.devices.values() for per in a.values() for ks in per.values() for k in ks}
    pending = [h.gang for h in planned.plan.holds]
    world = objects.world(nodes, assumed)
    plan_queue(snapshot(nodes, world, set()), pending, planner, device_nodes)  # settle
    # A claim of a running pod (or, on an idle cluster, one the full pass allocated) goes away.
    freed = running[0] if running else claim("freed", 8, H100, (gpu_nodes[0], [f"gpu-{d}" for d in range(8)]))

    def claim_freed() -> None:
        objects.claims.delete(freed)
        plan_queue(snapshot(nodes, objects.world(nodes, assumed), set()), pending, planner, device_nodes)
        objects.claims.upsert(freed)
        plan_queue(snapshot(nodes, objects.world(nodes, assumed), set()), pending, planner, device_nodes)

    newcomer = replace(gangs[1], name="newcomer", created=1e9)

    def gang_arrived() -> None:
        plan_queue(
            snapshot(nodes, objects.world(nodes, assumed), set()), [*pending, newcomer], planner, device_nodes
        )

    gc.unfreeze()
    return {
        "nodes": size,
        "devices": devices,
        "gangs": gangs_count,
        "devices_busy": busy,
        "world_ms": world_ms,
        "full_pass_cold_ms": cold_ms,
        "cold_passes_ms": cold_passes,  # until every kind was matched
        "full_pass_warm_ms": warm_ms,
        "released": len(first.plan.releases),
        "held": len(first.plan.holds),
        "after_claim_freed_ms": round(best_ms(claim_freed) / 2, 1),  # two passes each: there and back
        "after_gang_arrived_ms": best_ms(gang_arrived),
    }


def main() -> int:
    stamp = datetime.now(UTC).strftime("%Y-%m-%d")
    runs = [run(busy=0.0), run(busy=0.75)]
    RESULTS.mkdir(parents=True, exist_ok=True)
    out = RESULTS / f"{stamp}-planner-dra.json"
    out.write_text(json.dumps({"date": stamp, "runs": runs}, indent=2) + "\n")
    print(
        "| nodes | devices | gangs x 8 pods | devices busy | world (ms) | full pass cold / warm (ms) "
        "| released / held | incremental: claim freed / gang arrived (ms) "
        "| cold: passes until all matched (ms) |"
    )
    print("|---|---|---|---|---|---|---|---|---|")
    for r in runs:
        print(
            f"| {r['nodes']} | {r['devices']} | {r['gangs']} | {r['devices_busy']:.0%} | {r['world_ms']} "
            f"| {r['full_pass_cold_ms']} / {r['full_pass_warm_ms']} | {r['released']} / {r['held']} "
            f"| {r['after_claim_freed_ms']} / {r['after_gang_arrived_ms']} "
            f"| {' + '.join(str(t) for t in r['cold_passes_ms'])} |"
        )
    print(f"\nwritten to {out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
