"""Fairness between tenants, on the planner alone in simulated time (pure, no cluster).

40 nodes of 8 GPUs. Tenant `attacker` keeps one pod running for ever, and queues gangs that can
never fit: each asks all 40 nodes whole, so each starves, and each gets the starvation guard's
turns. It also queues mixed gangs whose searches always run out of budget. Tenant `bystander`
sends a gang of 2 whole nodes every 30 s, each running 60 s once released. A pass every 5 s
plans the queue with the operator's default settings, on a planner kept across passes as the
operator keeps it. Every gang released binds at once.

Reported for the bystander's gangs: how long each waited from arrival to release (p50, p90,
max; a gang still waiting at the end counts with its wait so far), how many were released, and
the share of passes in which the guard held nodes for the attacker.
Three ways:

- **one namespace**: the attacker's gangs all in its namespace (one tenant);
- **spread**: the same gangs over as many namespaces as gangs, each namespace a tenant;
- **spread, labelled**: the same, the namespaces labelled as one tenant (the tenant label);
- **no attacker**: the bystander's own numbers with the attacker gone, as a baseline.

    python -m tests.bench.fairness [--gangs 8] [--minutes 180]
"""

from __future__ import annotations

import argparse
import json
import statistics
import time
from dataclasses import dataclass, replace
from datetime import UTC, datetime
from pathlib import Path

from quorum.core.conditions import NO_ROOM
from quorum.core.model import Gang, Node, Pod, add, resources
from quorum.core.planner import Planner, PlannerSettings

GPU = "nvidia.com/gpu"
NODES = 40
STEP = 5.0  # seconds between passes
ARRIVAL = 30.0  # a bystander gang every this long
RUN = 60.0  # how long a bystander gang runs


def node(i: int) -> Node:
    return Node(f"n{i:02d}", {}, resources({GPU: 8, "cpu": 130, "memory": "1Ti", "pods": 110}))


def pod(uid: str, gpus: int, cpu: int = 1) -> Pod:
    return Pod(uid, uid, resources({GPU: gpus, "cpu": cpu, "pods": 1}))


def whole_nodes(namespace: str, name: str, count: int, created: float) -> Gang:
    pods = tuple(pod(f"{namespace}-{name}-{i}", 8) for i in range(count))
    return Gang(namespace, name, count, pods, members=count, created=created)


def exhausting(namespace: str, name: str, created: float) -> Gang:
    """A launcher of 100 CPUs and one 1-GPU worker of 16 CPUs too many for the nodes: it fits in
    every sum but not together, so its search always runs out of budget."""
    workers = tuple(pod(f"{namespace}-{name}-w{i}", 1, 16) for i in range(8 * (NODES - 1) + 2))
    pods = (pod(f"{namespace}-{name}-launcher", 0, 100), *workers)
    return Gang(namespace, name, len(pods), pods, members=len(pods), created=created)


@dataclass
class Outcome:
    waits: list[float]
    released: int
    arrived: int
    guard_for_attacker: float  # share of passes in which the guard held nodes for the attacker
    worst_pass_ms: float


def simulate(attacker_gangs: int, spread: bool, minutes: float, labelled: bool = False) -> Outcome:
    nodes = {n.name: n for n in (node(i) for i in range(NODES))}
    # The attacker's pod that never ends, on n00.
    forever: dict[str, dict[str, int]] = {"n00": resources({GPU: 8, "cpu": 1, "pods": 1})}
    queue: dict[tuple[str, str], Gang] = {}
    for i in range(attacker_gangs):
        namespace = f"attacker-{i}" if spread else "attacker"
        tenant = "team=attacker" if labelled else ""
        queue[(namespace, f"all-{i}")] = replace(
            whole_nodes(namespace, f"all-{i}", NODES, created=i), tenant=tenant
        )
        if i < 3:
            search = exhausting(namespace, f"search-{i}", created=100 + i)
            queue[(namespace, f"search-{i}")] = replace(search, tenant=tenant)
    planner = Planner(PlannerSettings(gang_budget=20_000, pass_budget=60_000))
    arrived: dict[tuple[str, str], float] = {}
    held_since: dict[tuple[str, str], float] = {}
    running: list[tuple[float, str, dict[str, int]]] = []  # (ends, node, requests)
    waits: list[float] = []
    guard_passes = passes = 0
    worst = 0.0
    now, end, next_arrival, count = 1000.0, 1000.0 + minutes * 60, 1000.0, 0
    while now < end:
        while next_arrival <= now:
            key = ("bystander", f"small-{count}")
            queue[key] = whole_nodes(*key, 2, created=next_arrival)
            arrived[key] = next_arrival
            count += 1
            next_arrival += ARRIVAL
        running = [r for r in running if r[0] > now]
        used: dict[str, dict[str, int]] = dict(forever)
        for _, name, requests in running:
            used[name] = add(used.get(name, {}), requests)
        gangs = [replace(g, held_since=held_since.get(k)) for k, g in queue.items()]
        started = time.perf_counter()
        plan = planner.plan(nodes, used, gangs, now)
        planner.admitted(plan.releases)  # as the operator tells it, once the pass's releases are final
        worst = max(worst, (time.perf_counter() - started) * 1000)
        passes += 1
        for release in plan.releases:
            key = release.gang.key
            queue.pop(key, None)
            held_since.pop(key, None)
            if key in arrived:
                waits.append(now - arrived.pop(key))
            for p, n in release.placement:
                running.append((now + RUN, n.name, p.requests))
        for hold in plan.holds:
            if hold.reason in NO_ROOM:
                held_since.setdefault(hold.gang.key, now)
            if hold.held_nodes and hold.gang.namespace.startswith("attacker"):
                guard_passes += 1
        now += STEP
    released = len(waits)
    waits += [now - t for t in arrived.values()]  # still waiting at the end: their wait so far
    return Outcome(waits, released, count, guard_passes / max(1, passes), worst)


def summary(outcome: Outcome) -> dict[str, object]:
    waits = sorted(outcome.waits)
    return {
        "bystander gangs arrived / released": f"{outcome.arrived} / {outcome.released}",
        "wait p50 (s)": round(statistics.median(waits), 1) if waits else None,
        "wait p90 (s)": round(waits[int(0.9 * (len(waits) - 1))], 1) if waits else None,
        "wait max (s)": round(waits[-1], 1) if waits else None,
        "passes the guard held nodes for the attacker": f"{100 * outcome.guard_for_attacker:.0f} %",
        "worst pass (ms)": round(outcome.worst_pass_ms, 1),
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--gangs", type=int, default=8, help="the attacker's gangs that never fit")
    parser.add_argument("--minutes", type=float, default=180.0, help="simulated time")
    args = parser.parse_args()
    ways = {
        "one namespace": simulate(args.gangs, spread=False, minutes=args.minutes),
        "spread": simulate(args.gangs, spread=True, minutes=args.minutes),
        "spread, labelled": simulate(args.gangs, spread=True, minutes=args.minutes, labelled=True),
        "no attacker": simulate(0, spread=False, minutes=args.minutes),
    }
    rows = {name: summary(outcome) for name, outcome in ways.items()}
    fields = list(next(iter(rows.values())))
    print(f"| {args.gangs} gangs that never fit, {args.minutes:g} min | " + " | ".join(rows) + " |")
    print("|---|" + "---:|" * len(rows))
    for field in fields:
        print(f"| {field} | " + " | ".join(str(rows[w][field]) for w in rows) + " |")
    out = Path("bench/results") / f"{datetime.now(UTC):%Y-%m-%d}-fairness.json"
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps({"gangs": args.gangs, "minutes": args.minutes, "ways": rows}, indent=2) + "\n")
    print(f"\nwritten to {out}")


if __name__ == "__main__":
    main()
