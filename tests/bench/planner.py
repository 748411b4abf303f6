"""Benchmark of the planner alone (pure, no cluster), on node pools shaped like CKS (GPU nodes
in zones/blocks/racks, CPU nodes, a triage and a cordoned node) and a queue of 8-pod gangs:

- full pass: a fresh planner, every node indexed, the whole queue planned;
- incremental passes, on the planner the full pass left: after one pod finishes (one node's
  usage shrinks), after one node changes (cordoned), and after one new gang arrives — with the
  gangs the full pass could not place still pending, as the operator's loop would have it.

Cases with the cluster empty, and with 75 % of every GPU node's GPUs busy (so that most of the
1,000 gangs are held and every incremental pass re-examines them). Time (best of a few runs) and
peak memory (tracemalloc); bounded sizes.

    make bench-planner
"""

from __future__ import annotations

import json
import sys
import time
import tracemalloc
from dataclasses import replace
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from quorum.core.model import Gang, Node, Pod, Toleration, add, resources, subtract
from quorum.core.planner import Planner, plan_gangs
from quorum.devcluster.nodes import load_pool, render_nodes, scale_pool
from quorum.k8s.convert import node_from_api

RESULTS = Path(__file__).resolve().parents[2] / "bench" / "results"
CASES = ((100, 100), (1_000, 100), (1_000, 1_000), (5_000, 1_000), (10_000, 1_000), (10_000, 5_000))


def nodes_of(size: int) -> list[Any]:
    ready = [{"type": "Ready", "status": "True"}]
    return [
        node_from_api({**n, "status": {**n["status"], "conditions": ready}})
        for n in render_nodes(scale_pool(load_pool(), size))
    ]


def gangs_of(count: int) -> list[Gang]:
    """Mostly 8-pod 1-GPU training gangs; every tenth asks for whole nodes (8 GPUs a pod); every
    seventh is a CPU-only gang that tolerates the CPU nodes."""
    gangs = []
    tolerations: tuple[Toleration, ...]
    cpu_toleration = (Toleration("is_cpu_compute", "Exists", effect="NoSchedule"),)
    for i in range(count):
        if i % 7 == 0:
            requests, tolerations = resources({"cpu": "8", "memory": "32Gi", "pods": "1"}), cpu_toleration
        else:
            gpus = "8" if i % 10 == 0 else "1"
            requests, tolerations = (
                resources({"nvidia.com/gpu": gpus, "cpu": "8", "memory": "64Gi", "pods": "1"}),
                (),
            )
        pods = tuple(Pod(f"g{i}p{j}", f"g{i}p{j}", requests, tolerations) for j in range(8))
        gangs.append(Gang("bench", f"g{i}", 8, pods, members=8, created=float(i)))
    return gangs


def busy_usage(nodes: list[Node], fraction: float) -> dict[str, dict[str, int]]:
    """`fraction` of every GPU node's GPUs (and as much CPU) in use."""
    used = {}
    for node in nodes:
        gpus = node.allocatable.get("nvidia.com/gpu", 0)
        if gpus:
            used[node.name] = {
                "nvidia.com/gpu": int(gpus * fraction) // 1000 * 1000,
                "cpu": int(node.allocatable.get("cpu", 0) * fraction),
                "pods": 1000,
            }
    return used


def best_ms(run: Any, repeat: int = 5) -> float:
    times = []
    for _ in range(repeat):
        started = time.perf_counter()
        run()
        times.append(time.perf_counter() - started)
    return round(min(times) * 1000, 3)


def incremental(nodes: list[Node], used: dict[str, dict[str, int]], gangs: list[Gang]) -> dict[str, float]:
    """Times of incremental passes on a planner after its full pass (see the module's doc)."""
    by_name = {n.name: n for n in nodes}
    planner = Planner()
    plan = planner.plan(by_name, used, gangs)
    used = {k: dict(v) for k, v in used.items()}
    for release in plan.releases:  # what the loop holds as reservations
        for pod, node in release.placement:
            used[node.name] = add(used.get(node.name, {}), pod.requests)
    pending = [h.gang for h in plan.holds]
    planner.plan(by_name, used, pending, changed=())  # settle: the released gangs are reservations
    gpu_pod = next(p for g in gangs for p in g.pods if p.requests.get("nvidia.com/gpu"))
    busy = next(n for n in used if used[n].get("nvidia.com/gpu", 0) >= gpu_pod.requests["nvidia.com/gpu"])

    def pod_finished() -> None:
        used[busy] = subtract(used[busy], gpu_pod.requests)
        planner.plan(by_name, used, pending, changed=(busy,))
        used[busy] = add(used[busy], gpu_pod.requests)  # and back, for the next repetition
        planner.plan(by_name, used, pending, changed=(busy,))

    target = nodes[len(nodes) // 2]

    def node_changed() -> None:
        by_name[target.name] = replace(target, unschedulable=True)
        planner.plan(by_name, used, pending, changed=(target.name,))
        by_name[target.name] = target
        planner.plan(by_name, used, pending, changed=(target.name,))

    newcomer = replace(gangs[1], name="newcomer", created=1e9)

    def gang_arrived() -> None:
        planner.plan(by_name, used, [*pending, newcomer], changed=())

    return {
        # each of the first two runs two passes (there and back): halve
        "after_pod_finished_ms": round(best_ms(pod_finished) / 2, 3),
        "after_node_changed_ms": round(best_ms(node_changed) / 2, 3),
        "after_gang_arrived_ms": best_ms(gang_arrived),
        "pending": len(pending),
    }


def main() -> int:
    runs = []
    for size, count in CASES:
        nodes, gangs = nodes_of(size), gangs_of(count)
        for fraction in (0.0, 0.75) if count == 1_000 else (0.0,):
            used = busy_usage(nodes, fraction)
            plan_gangs(nodes, used, gangs[:10])  # warm-up
            tracemalloc.start()
            plan = plan_gangs(nodes, used, gangs)
            _, peak = tracemalloc.get_traced_memory()
            tracemalloc.stop()
            run: dict[str, Any] = {
                "nodes": len(nodes),
                "gangs": count,
                "gpus_busy": fraction,
                "pass_ms": best_ms(lambda n=nodes, u=used, g=gangs: plan_gangs(n, u, g), repeat=3),
                "peak_mib": round(peak / 2**20, 1),
                "released": len(plan.releases),
                "held": len(plan.holds),
            }
            if count == 1_000:
                run.update(incremental(nodes, used, gangs))
            runs.append(run)
    RESULTS.mkdir(parents=True, exist_ok=True)
    stamp = datetime.now(UTC).strftime("%Y-%m-%d")
    out = RESULTS / f"{stamp}-planner.json"
    out.write_text(json.dumps({"date": stamp, "runs": runs}, indent=2) + "\n")
    print(
        "| nodes | gangs x 8 pods | GPUs busy | full pass (ms) | peak memory (MiB) | released / held "
        "| incremental: pod finished / node changed / gang arrived (ms) |"
    )
    print("|---|---|---|---|---|---|---|")
    for r in runs:
        inc = "–"
        if "after_pod_finished_ms" in r:
            inc = (
                f"{r['after_pod_finished_ms']} / {r['after_node_changed_ms']} / {r['after_gang_arrived_ms']}"
            )
        print(
            f"| {r['nodes']} | {r['gangs']} | {r['gpus_busy']:.0%} | {r['pass_ms']} | {r['peak_mib']} "
            f"| {r['released']} / {r['held']} | {inc} |"
        )
    print(f"\nwritten to {out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
