"""The peer benchmark's results as Markdown tables: one per scenario, a column per scheduler and
the ratios quorum / scheduler-plugins and quorum / Kueue (when it ran) within the same run."""

from __future__ import annotations

import statistics
from typing import Any

ROWS: dict[str, list[tuple[str, str]]] = {
    "throughput": [
        ("pods_bound_per_second", "pods bound per second"),
        ("seconds_to_all_bound", "first pod created -> all bound (s)"),
        ("apiserver_requests", "apiserver requests"),
        ("apiserver_requests_per_pod", "apiserver requests per pod"),
        ("cpu_seconds", "CPU seconds, all processes"),
    ],
    "contention": [
        ("gangs_partially_placed", "gangs ever partially placed"),
        ("gpu_seconds_held_partially", "GPU-seconds held partially"),
        ("gangs_unfinished", "gangs not finished within the deadline"),
        ("deadlocks", "deadlocks (60 s partial, no bind)"),
        ("longest_stall_while_partial", "longest stall while partial (s)"),
        ("longest_gap_between_binds", "longest gap between binds (s)"),
        ("seconds_to_finish_all_gangs", "time to finish all gangs (s)"),
        ("gpu_utilisation", "GPU utilisation"),
        ("pods_that_waited_at_permit", "pods that waited at Permit"),
        ("apiserver_requests", "apiserver requests"),
        ("cpu_seconds", "CPU seconds, all processes"),
    ],
    "contention-dra": [
        ("gangs_partially_placed", "gangs ever partially placed"),
        ("gpu_seconds_held_partially", "GPU-seconds held partially"),
        ("gangs_unfinished", "gangs not finished within the deadline"),
        ("gangs_partial_at_end", "of which partially placed at the end"),
        ("deadlocks", "deadlocks (60 s partial, no bind)"),
        ("longest_stall_while_partial", "longest stall while partial (s)"),
        ("longest_gap_between_binds", "longest gap between binds (s)"),
        ("seconds_to_finish_all_gangs", "time to finish all gangs (s)"),
        ("gpu_utilisation", "GPU utilisation"),
        ("claims_allocated", "claims allocated"),
        ("devices_allocated_twice", "devices allocated to two claims at once"),
        ("apiserver_requests", "apiserver requests"),
        ("cpu_seconds", "CPU seconds, all processes"),
    ],
    "together-dra": [
        ("gangs_ran_whole", "gangs that ran whole (all pods at once, over 10 s)"),
        ("gangs_ran_in_part", "gangs that ran only in part (or in pieces)"),
        ("gangs_never_started", "gangs never started"),
        ("gangs_not_fully_bound", "gangs not fully bound by the deadline"),
        ("gangs_partially_placed", "gangs ever partially placed"),
        ("gpu_seconds_held_partially", "GPU-seconds held partially"),
        ("pods_pending_at_end", "pods pending at the deadline"),
        ("pending_reason", "why they wait (latest event; the CPU nodes' taint left out)"),
        ("pods_refused", "pods kube-scheduler refused at least once"),
        ("refusal_reasons", "its reasons over the run (pods given each)"),
        ("any_claims_on_linked_devices", "any-1 claims given an NVLink device"),
        ("gangs_unfinished", "gangs not finished within the deadline"),
        ("seconds_to_finish_all_gangs", "time to finish all gangs (s)"),
        ("gpu_utilisation", "GPU utilisation"),
        ("claims_allocated", "claims allocated"),
        ("devices_allocated_twice", "devices allocated to two claims at once"),
        ("apiserver_requests", "apiserver requests"),
        ("cpu_seconds", "CPU seconds, all processes"),
    ],
    "large-gang": [
        ("last_created_to_all_bound_seconds", "last gang pod created -> all bound (s)"),
        ("seconds_to_all_bound", "first pod created -> all bound (s)"),
        ("apiserver_requests", "apiserver requests"),
        ("cpu_seconds", "CPU seconds, all processes"),
    ],
}
TITLES = {
    "throughput": "Throughput",
    "contention": "Contention (demand 1.5x the GPUs, interleaved arrival)",
    "large-gang": "Large gang beside CPU churn",
    "contention-dra": "Contention on DRA devices (demand 1.5x the devices, interleaved arrival)",
    "together-dra": "Gangs whose DRA devices must be chosen together (6 any + 2 NVLink per gang, two waves)",
}
HEADERS = {
    "quorum": "quorum",
    "coscheduling": "scheduler-plugins",
    "kueue": "Kueue",
    "kueue-tas": "Kueue, topology-aware",
    "default": "kube-scheduler alone",
    "was": "kube-scheduler, Workload PodGroups",
    "delegated": "quorum, placed by kube-scheduler",
}
RATIOS = ("coscheduling", "kueue", "kueue-tas", "was")  # quorum / each of these, when both ran
OURS = ("quorum", "delegated")  # quorum's ways, each compared with the peers


def cell(value: Any) -> str:
    if value is None:
        return "-"
    if isinstance(value, bool):
        return "yes" if value else "no"
    if isinstance(value, float):
        return f"{value:,.3f}" if abs(value) < 1 else f"{value:,.1f}"
    return f"{value:,}" if isinstance(value, int) else str(value)


def ratio(ours: Any, theirs: Any) -> str:
    numbers = all(isinstance(v, int | float) and not isinstance(v, bool) for v in (ours, theirs))
    if not numbers or not theirs:
        return "-"
    return f"{ours / theirs:.2f}"


def markdown(data: dict[str, Any]) -> str:
    lines = [f"# quorum beside its peers, {data['date']}{' (quick sizes)' if data.get('quick') else ''}", ""]
    for name, scenario in data["scenarios"].items():
        runs = {r["mode"]: r for r in scenario["runs"]}
        modes = [m for m in HEADERS if m in runs]
        peers = [p for p in RATIOS if p in runs] or ["coscheduling"]
        ours = [o for o in OURS if o in runs] or ["quorum"]
        lines += [
            f"## {TITLES.get(name, name)}",
            "",
            f"{scenario['gpu_nodes']} GPU nodes x 8 GPUs, {scenario['gangs']} gangs, "
            f"{scenario['pods']} pods"
            + (f", Kubernetes {scenario['kubernetes']}." if scenario.get("kubernetes") else "."),
            "",
            "| | " + " | ".join(HEADERS[m] for m in modes) + " | " + ratio_headers(ours, peers) + " |",
            "|---|" + "---:|" * (len(modes) + len(ours) * len(peers)),
        ]
        rows = [*ROWS.get(name, []), ("finished", "all pods done within the deadline")]
        for key, label in rows:
            values = [runs[m].get(key) for m in modes]
            ratios = [ratio(runs.get(o, {}).get(key), runs.get(p, {}).get(key)) for o in ours for p in peers]
            lines.append(
                f"| {label} | " + " | ".join(cell(v) for v in values) + " | " + " | ".join(ratios) + " |"
            )
        lines.append("")
        lines += rounds_table(scenario.get("rounds") or [])
    return "\n".join(lines)


def ratio_headers(ours: list[str], peers: list[str]) -> str:
    return " | ".join(f"{HEADERS[o]} / {HEADERS[p]}" for o in ours for p in peers)


def rounds_table(rounds: list[list[dict[str, Any]]]) -> list[str]:
    """Pods bound per second in every round (the table above is the first), and the median of
    the ratios, each taken within its round."""
    if len(rounds) < 2:
        return []
    modes = [m for m in HEADERS if any(r["mode"] == m for r in rounds[0])]
    peers = [p for p in RATIOS if p in modes] or ["coscheduling"]
    ours = [o for o in OURS if o in modes] or ["quorum"]
    pairs = [(o, p) for o in ours for p in peers]
    lines = [
        f"{len(rounds)} rounds, the ways one after another in each: pods bound per second.",
        "",
        "| round | " + " | ".join(HEADERS[m] for m in modes) + " | " + ratio_headers(ours, peers) + " |",
        "|---|" + "---:|" * (len(modes) + len(pairs)),
    ]
    ratios: dict[tuple[str, str], list[float]] = {pair: [] for pair in pairs}
    for number, runs in enumerate(rounds, 1):
        speed = {r["mode"]: r.get("pods_bound_per_second") for r in runs}
        within = {(o, p): ratio(speed.get(o), speed.get(p)) for o, p in pairs}
        for pair, value in within.items():
            if value != "-":
                ratios[pair].append(float(value))
        cells = " | ".join(cell(speed.get(m)) for m in modes)
        lines.append(f"| {number} | {cells} | " + " | ".join(within.values()) + " |")
    if any(ratios.values()):
        medians = [f"{statistics.median(r):.2f}" if r else "-" for r in ratios.values()]
        lines.append("| median | " + " | ".join("" for _ in modes) + " | " + " | ".join(medians) + " |")
    return [*lines, ""]
