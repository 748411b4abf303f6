"""Benchmark of the planner alone (pure function, no cluster): one full planning pass over
node pools shaped like CKS (GPU nodes in zones/blocks/racks, CPU nodes, a triage and a cordoned
node) and a queue of 8-pod gangs. Time and peak memory (tracemalloc) per pass; bounded sizes.

    make bench-planner
"""

from __future__ import annotations

import json
import sys
import time
import tracemalloc
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from quorum.core.model import Gang, Pod, Toleration, resources
from quorum.core.planner import plan_gangs
from quorum.devcluster.nodes import load_pool, render_nodes, scale_pool
from quorum.k8s.convert import node_from_api

RESULTS = Path(__file__).resolve().parents[2] / "bench" / "results"
CASES = ((1_000, 100), (1_000, 1_000), (5_000, 1_000), (10_000, 5_000))


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


def main() -> int:
    runs = []
    for size, count in CASES:
        nodes, gangs = nodes_of(size), gangs_of(count)
        plan_gangs(nodes, {}, gangs[:10])  # warm-up
        tracemalloc.start()
        started = time.perf_counter()
        plan = plan_gangs(nodes, {}, gangs)
        seconds = time.perf_counter() - started
        _, peak = tracemalloc.get_traced_memory()
        tracemalloc.stop()
        started = time.perf_counter()
        plan_gangs(nodes, {}, gangs)
        untraced = time.perf_counter() - started
        runs.append(
            {
                "nodes": len(nodes),
                "gangs": count,
                "pass_ms": round(untraced * 1000, 1),
                "pass_ms_traced": round(seconds * 1000, 1),
                "peak_mib": round(peak / 2**20, 1),
                "released": len(plan.releases),
                "held": len(plan.holds),
            }
        )
    RESULTS.mkdir(parents=True, exist_ok=True)
    stamp = datetime.now(UTC).strftime("%Y-%m-%d")
    out = RESULTS / f"{stamp}-planner.json"
    out.write_text(json.dumps({"date": stamp, "runs": runs}, indent=2) + "\n")
    print("| nodes | gangs × 8 pods | full pass (ms) | peak memory (MiB) | released | held |")
    print("|---|---|---|---|---|---|")
    for r in runs:
        row = (r["nodes"], r["gangs"], r["pass_ms"], r["peak_mib"], r["released"], r["held"])
        print("| " + " | ".join(str(v) for v in row) + " |")
    print(f"\nwritten to {out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
