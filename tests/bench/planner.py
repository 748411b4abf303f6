"""Benchmark of the planner alone (pure, no cluster), on node pools shaped like CKS (GPU nodes
in zones/blocks/racks, CPU nodes, a triage and a cordoned node) and a queue of 8-pod gangs:

- full pass: a fresh planner, every node indexed, the whole queue planned;
- incremental passes, on the planner the full pass left: after one pod finishes (one node's
  usage shrinks), after one node changes (cordoned), and after one new gang arrives — with the
  gangs the full pass could not place still pending, as the operator's loop would have it.

Cases with the cluster empty, and with 75 % of every GPU node's GPUs busy (so that most of the
1,000 gangs are held and every incremental pass re-examines them). Time (best of a few runs) and
peak memory (tracemalloc); bounded sizes.

Stress (adversarial gangs in front of a stream of small ones, 5,000 nodes, `stress()`): held mixed
gangs that once stopped the planner (a launcher + 301 whole-node workers with 300 whole nodes free;
a launcher + 1,270 one-GPU workers 6 GPUs short) and mixed gangs that fit in every sum but not
together (their searches run out of budget, then the pass's budget), then 500 small gangs, then
passes as pods finish (in turn in the small gangs' zone and in the big gangs', where every change
has the big gangs searched again) and gangs arrive. The worst pass time, node visits of search per
pass, peak memory, and how each big gang is held.

    make bench-planner                           # everything
    python -m tests.bench.planner --stress-only  # the stress scenario alone
"""

from __future__ import annotations

import argparse
import json
import sys
import time
import tracemalloc
from dataclasses import replace
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from devcluster.nodes import load_pool, render_nodes, scale_pool
from quorum.core.model import Gang, Node, Pod, Requirement, Toleration, add, resources, subtract
from quorum.core.planner import Plan, Planner, PlannerSettings, plan_gangs
from quorum.k8s.convert import node_from_api

RESULTS = Path(__file__).resolve().parents[2] / "bench" / "results"
# What one gang pod may carry (manifests/48-tenant-fence.yaml, quorum-gang-pod-size): tolerations,
# affinity terms, expressions per term, values per expression.
GANG_POD_LIMITS = (64, 8, 8, 64)
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


ZONE = "topology.kubernetes.io/zone"
GPU = "nvidia.com/gpu"


def stress_usage(nodes: list[Node]) -> dict[str, dict[str, int]]:
    """Zone a: 300 GPU nodes free, 700 half free (4 GPUs, 64 CPUs used); zone b: 58 free and 200
    half free (1,264 GPUs); every other GPU node full (8 CPUs left)."""
    used: dict[str, dict[str, int]] = {}
    counts = {"a": [300, 700], "b": [58, 200]}
    for node in nodes:
        if not node.allocatable.get(GPU) or node.unschedulable:
            continue
        zone = counts.get(node.labels.get(ZONE, "")[-1:], [0, 0])  # us-east-04a: "a"
        if zone[0] > 0:
            zone[0] -= 1
            continue
        if zone[1] > 0:
            zone[1] -= 1
            used[node.name] = {GPU: 4000, "cpu": 64000, "pods": 1000}
            continue
        used[node.name] = {GPU: 8000, "cpu": 120000, "pods": 8000}
    return used


def launcher_and_workers(
    name: str, workers: int, gpus: int, cpu: int, launcher_cpu: int, created: float, zone: str
) -> Gang:
    launcher = Pod(
        f"{name}-l", f"{name}-l", resources({"cpu": str(launcher_cpu), "memory": "8Gi", "pods": "1"})
    )
    asks = resources({GPU: str(gpus), "cpu": str(cpu), "memory": "16Gi", "pods": "1"})
    pods = (
        replace(launcher, node_selector={ZONE: zone}),
        *(Pod(f"{name}-w{i}", f"{name}-w{i}", asks, node_selector={ZONE: zone}) for i in range(workers)),
    )
    return Gang("stress", name, len(pods), pods, members=len(pods), created=created)


def in_zone(gang: Gang, zone: str, name: str, created: float) -> Gang:
    pods = tuple(replace(p, node_selector={ZONE: zone}) for p in gang.pods)
    return replace(gang, namespace="stress", name=name, pods=pods, created=created)


def stress_gangs() -> tuple[list[Gang], list[Gang]]:
    """The big mixed gangs (held), and the stream of small gangs behind them (in zone a)."""
    big = [
        # 300 whole nodes free in zone a (and enough GPUs in all, on the half-free nodes).
        launcher_and_workers("whole-nodes-301", 301, 8, 8, 4, created=0, zone="us-east-04a"),
        # Zone b has 1,264 GPUs free.
        launcher_and_workers("gpus-6-short", 1270, 1, 4, 4, created=1, zone="us-east-04b"),
    ]
    # Fit in every sum, not together: a launcher takes 100 of a node's 128 CPUs, leaving room for
    # 2 of the 8 workers (12 CPUs each) there: zone b takes 1,258 workers with it; these ask 1,259.
    big += [
        launcher_and_workers(f"joint-{i}", 1259, 1, 12, 100, created=2 + i, zone="us-east-04b")
        for i in range(5)
    ]
    small = [in_zone(g, "us-east-04a", g.name, 100.0 + i) for i, g in enumerate(gangs_of(500))]
    return big, small


def stress(settings: PlannerSettings | None = None, passes: int = 20) -> dict[str, Any]:
    """The stress scenario (see the module's doc), run twice: timed, then under tracemalloc for its
    peak memory (tracemalloc slows allocation-heavy code many times over: never timed with it)."""
    timed = stress_run(settings, passes, trace=False)
    traced = stress_run(settings, passes, trace=True)
    return {**timed, "peak_mib": traced["peak_mib"]}


def stress_run(settings: PlannerSettings | None, passes: int, trace: bool) -> dict[str, Any]:
    """A full pass, then `passes` incremental passes (a pod finishes on a node, a small gang
    arrives), each timed."""
    nodes = nodes_of(5_000)
    by_name = {n.name: n for n in nodes}
    used = stress_usage(nodes)
    big, small = stress_gangs()
    planner = Planner(settings)
    times: list[float] = []
    visits: list[int] = []

    def timed(queue: list[Gang], changed: tuple[str, ...] | None) -> Plan:
        started = time.perf_counter()
        plan = planner.plan(by_name, used, queue, changed=changed)
        times.append(time.perf_counter() - started)
        visits.append(plan.visits)
        return plan

    if trace:
        tracemalloc.start()
    first = timed([*big, *small], None)
    for release in first.releases:  # what the loop holds as reservations
        for pod, node in release.placement:
            used[node.name] = add(used.get(node.name, {}), pod.requests)
    pending = [h.gang for h in first.holds]
    busy = {
        zone: sorted(
            n for n, u in used.items() if u.get(GPU, 0) >= 8000 and by_name[n].labels.get(ZONE) == zone
        )
        for zone in ("us-east-04a", "us-east-04b")
    }
    arrivals = [in_zone(g, "us-east-04a", f"late-{i}", 1e6 + i) for i, g in enumerate(gangs_of(passes))]
    for i in range(passes):
        nodes_there = busy["us-east-04b" if i % 2 else "us-east-04a"]  # where a pod finishes
        name = nodes_there[(i * 7919) % len(nodes_there)]
        used[name] = subtract(used[name], {GPU: 1000, "cpu": 2000, "pods": 1000})  # a small pod
        pending.append(arrivals[i])
        plan = timed(pending, (name,))
        done = {r.gang.key for r in plan.releases}
        for release in plan.releases:
            for pod, node in release.placement:
                used[node.name] = add(used.get(node.name, {}), pod.requests)
        pending = [g for g in pending if g.key not in done]
    peak = 0
    if trace:
        _, peak = tracemalloc.get_traced_memory()
        tracemalloc.stop()
    effective = planner.settings
    return {
        "nodes": len(nodes),
        "gangs": len(big) + len(small),
        "big_gangs": {h.gang.name: f"{h.reason}: {h.message[:200]}" for h in first.holds if h.gang in big},
        "released_first_pass": len(first.releases),
        "held_first_pass": len(first.holds),
        "first_pass_ms": round(times[0] * 1000, 1),
        "worst_pass_ms": round(max(times) * 1000, 1),
        "worst_incremental_pass_ms": round(max(times[1:], default=0) * 1000, 1),
        "pass_ms": [round(t * 1000, 1) for t in times],
        "visits_first_pass": visits[0],
        "visits_max": max(visits),
        "visits": visits,
        "visits_bound": effective.pass_budget + effective.gang_budget,
        "gang_budget": effective.gang_budget,
        "pass_budget": effective.pass_budget,
        "passes": len(times),
        "peak_mib": round(peak / 2**20, 1),
    }


def cost_attack(
    tolerations: int,
    terms: int,
    expressions: int,
    values: int,
    gangs: int = 64,
    size: int = 5_000,
    passes: int = 6,
) -> dict[str, Any]:
    """`gangs` one-pod gangs that never fit (9 GPUs on 8-GPU nodes), each pod of its own shape with
    `tolerations` tolerations and a required node affinity of `terms` terms of `expressions`
    expressions of `values` values (`GANG_POD_LIMITS`: the most `quorum-gang-pod-size` admits),
    held in front of `size` nodes: the first pass indexes every shape, later ones find them held."""
    nodes = nodes_of(size)
    by_name = {n.name: n for n in nodes}
    queue = []
    for g in range(gangs):
        tolerated = tuple(Toleration(f"attack{g}.example.com/t{i}", "Exists") for i in range(tolerations))
        affinity = tuple(
            tuple(
                Requirement(f"attack{g}.example.com/k{t}-{e}", "NotIn", tuple(f"v{i}" for i in range(values)))
                for e in range(expressions)
            )
            for t in range(terms)
        )
        pod = Pod(f"a{g}", f"a{g}", resources({"nvidia.com/gpu": "9", "cpu": "1", "pods": "1"}), tolerated,
                  affinity=affinity)  # fmt: skip
        queue.append(Gang("attack", f"a{g}", 1, (pod,), members=1, created=float(g), held_since=0.0))
    return {
        "nodes": size,
        "gangs": gangs,
        "tolerations": tolerations,
        "affinity": f"{terms} terms x {expressions} expressions x {values} values",
        **held_passes(by_name, queue, passes),
    }


def held_passes(nodes: dict[str, Node], queue: list[Gang], passes: int) -> dict[str, float]:
    """`passes` passes of one planner over gangs that stay held: the first indexes every shape,
    the later ones find them held (nothing changed)."""
    planner = Planner(PlannerSettings(starvation_seconds=1e9))
    times = []
    for i in range(passes):
        started = time.perf_counter()
        planner.plan(nodes, {}, queue, now=1.0, changed=None if i == 0 else ())
        times.append(time.perf_counter() - started)
    return {
        "first_pass_ms": round(times[0] * 1000, 1),
        "worst_later_pass_ms": round(max(times[1:]) * 1000, 1),
    }


def print_stress(result: dict[str, Any]) -> None:
    print(
        f"\nstress: {result['nodes']} nodes, {result['gangs']} gangs; {result['passes']} passes: worst "
        f"{result['worst_pass_ms']} ms (first pass {result['first_pass_ms']} ms, worst incremental "
        f"{result['worst_incremental_pass_ms']} ms); node visits of search per pass: at most "
        f"{result['visits_max']} (bound {result['visits_bound']}); peak memory {result['peak_mib']} MiB; "
        f"first pass: {result['released_first_pass']} released, {result['held_first_pass']} held"
    )
    for name, how in result["big_gangs"].items():
        print(f"  {name}: {how}")


def write(name: str, payload: dict[str, Any]) -> Path:
    RESULTS.mkdir(parents=True, exist_ok=True)
    out = RESULTS / f"{payload['date']}-{name}.json"
    out.write_text(json.dumps(payload, indent=2) + "\n")
    return out


def main() -> int:
    parser = argparse.ArgumentParser(prog="python -m tests.bench.planner", description="The planner alone.")
    parser.add_argument("--stress-only", action="store_true", help="only the stress scenario")
    args = parser.parse_args()
    stamp = datetime.now(UTC).strftime("%Y-%m-%d")
    if args.stress_only:
        result = stress()
        print_stress(result)
        print(f"\nwritten to {write('planner-stress', {'date': stamp, 'stress': result})}")
        return 0
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
    result = stress()
    attack = cost_attack(*GANG_POD_LIMITS)
    out = write("planner", {"date": stamp, "runs": runs, "stress": result, "cost_attack": attack})
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
    print_stress(result)
    print(
        f"\ncost attack: {attack['gangs']} held one-pod gangs of {attack['tolerations']} tolerations and "
        f"{attack['affinity']} of affinity over {attack['nodes']} nodes: first pass "
        f"{attack['first_pass_ms']} ms, later passes at most {attack['worst_later_pass_ms']} ms"
    )
    print(f"\nwritten to {out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
