"""The scale benchmark's pure parts: the workload at each size, what it reads from the operator's
metrics and log, and the report."""

from __future__ import annotations

from hypothesis import given
from hypothesis import strategies as st

from tests.bench.scale import (
    ARRIVAL_SECONDS,
    FILL,
    GANG_SIZES,
    GPUS_PER_NODE,
    apiserver_latency,
    big_gang_size,
    gang_count,
    markdown,
    merge,
    operator_figures,
    operator_log,
    workload,
)


def test_the_reference_size_is_the_issues() -> None:
    gangs = workload(5000)
    assert len(gangs) == 2000
    assert max(g.size for g in gangs) == 4096
    assert sum(g.size for g in gangs) <= 40_000


def test_sizes_scale_with_the_nodes() -> None:
    assert (gang_count(200), big_gang_size(200)) == (80, 164)
    assert (gang_count(1000), big_gang_size(1000)) == (400, 819)
    # the same size distribution at every size: pods per gang (without the large one) within 20%
    means = []
    for nodes in (200, 1000, 5000):
        small = [g.size for g in workload(nodes) if g.size != big_gang_size(nodes)]
        means.append(sum(small) / len(small))
    assert max(means) / min(means) < 1.2


@given(st.integers(10, 6000), st.integers(0, 3))
def test_a_workload_fits_and_arrives_in_the_window(nodes: int, seed: int) -> None:
    gangs = workload(nodes, seed=seed)
    assert len(gangs) == gang_count(nodes)
    assert sum(g.size for g in gangs) <= FILL * GPUS_PER_NODE * nodes
    middle = gangs[len(gangs) // 2]
    assert middle.size == big_gang_size(nodes)
    assert all(g.size in GANG_SIZES for g in gangs if g is not middle)
    arrivals = [g.arrival for g in gangs]
    assert arrivals == sorted(arrivals)
    assert arrivals[0] == 0.0
    assert abs(arrivals[-1] - ARRIVAL_SECONDS) < 0.01
    assert len({g.name for g in gangs}) == len(gangs)


def test_the_workload_is_deterministic() -> None:
    assert workload(1000) == workload(1000)
    assert workload(1000, seed=1) != workload(1000)


METRICS = """# HELP quorum_operator_pass_duration_seconds x
quorum_operator_pass_duration_seconds_bucket{{le="0.1"}} {a}
quorum_operator_pass_duration_seconds_bucket{{le="1.0"}} {b}
quorum_operator_pass_duration_seconds_bucket{{le="+Inf"}} {b}
quorum_operator_pass_duration_seconds_count {b}
quorum_operator_pass_duration_seconds_sum 1.0
quorum_operator_pass_duration_max_seconds {worst}
quorum_operator_event_loop_lag_max_seconds 0.2
quorum_operator_partial_placements_total {a}
"""


def test_operator_figures_count_the_window_only() -> None:
    before = METRICS.format(a=10, b=10, worst=0.05)
    after = METRICS.format(a=10, b=20, worst=0.9)
    figures = operator_figures(before, after)
    assert figures["worst_pass_seconds"] == 0.9
    assert figures["worst_event_loop_lag_seconds"] == 0.2
    assert figures["pass_count"] == 10
    assert 0.1 < figures["pass_p50_seconds"] <= 1.0  # the window's passes were all over 0.1 s
    assert "plan_count" not in figures
    assert figures["partial_placements"] == 0


PATCHES = 'resource="pods",subresource="",verb="PATCH"'
WAITED = 'execute="true",flow_schema="service-accounts",priority_level="workload-low"'
WAIT = "apiserver_flowcontrol_request_wait_duration_seconds"
APISERVER = "\n".join(
    (
        f'apiserver_request_duration_seconds_bucket{{{{{PATCHES},le="0.1"}}}} {{fast}}',
        f'apiserver_request_duration_seconds_bucket{{{{{PATCHES},le="1"}}}} {{slow}}',
        f'apiserver_request_duration_seconds_bucket{{{{{PATCHES},le="+Inf"}}}} {{slow}}',
        f"apiserver_request_duration_seconds_sum{{{{{PATCHES}}}}} {{total}}",
        f'{WAIT}_bucket{{{{{WAITED},le="0.5"}}}} 0',
        f'{WAIT}_bucket{{{{{WAITED},le="+Inf"}}}} {{slow}}',
        f"{WAIT}_sum{{{{{WAITED}}}}} {{waited}}",
        f'{WAIT}_bucket{{{{{WAITED.replace("true", "false")},le="+Inf"}}}} 7',
    )
)


def test_the_apiserver_latency_of_the_window_only() -> None:
    before = APISERVER.format(fast=5, slow=5, total=0.25, waited=0)
    after = APISERVER.format(fast=5, slow=15, total=5.25, waited=6)
    figures = apiserver_latency(before, after)
    assert figures["pods"] == {
        "patch": {
            "count": 10,
            "p50_ms": 550.0,
            "p99_ms": 991.0,
            "mean_ms": 500.0,
            "first_bucket_ms": 100.0,
        }
    }, "the window's ten patches, all between 0.1 and 1 s; none of the other requests made"
    (wait,) = figures["flowcontrol_wait"].items()
    assert wait[0] == "service-accounts/workload-low" and wait[1]["mean_ms"] == 600.0, (
        "executed requests only"
    )


def test_what_the_operator_log_tells() -> None:
    lines = [
        "2026-11-26 08:00:00,000 INFO quorum.operator: slow pass: 1.50s ({'plan': 1.2})",
        "2026-11-26 08:00:01,000 INFO quorum.operator: scale/xpg-g0001: released 1 of 1 planned pods",
        "2026-11-26 08:00:02,000 INFO quorum.operator: slow pass: 3.25s ({'plan': 3.0})",
        "2026-11-26 08:00:03,000 ERROR quorum.operator.leader: leader election failed; campaigning again",
        "2026-11-26 08:00:04,000 INFO quorum.k8s.writes: pod scale/g0200-1 not released: Invalid",
        "2026-11-26 08:00:05,000 INFO quorum.k8s.watch: pods listed again: 23631 objects",
    ]
    assert operator_log(lines) == {
        "slow_passes": 2,
        "slowest_logged_pass_seconds": 3.25,
        "slowest_logged_pass": "{'plan': 3.0}",
        "leader_losses": 1,
        "releases_refused": 1,
        "relistings": 1,
    }


def run(mode: str, nodes: int) -> dict[str, object]:
    return {
        "mode": mode,
        "nodes": nodes,
        "gpus": nodes * 8,
        "gangs": 80,
        "pods": 1000,
        "big_gang_pods": 164,
        "all_bound": True,
        "seconds_to_all_bound": 301.5,
        "release_p50_seconds": 0.25,
        "release_p99_seconds": 1.5,
        "peak_rss_mib": {"quorum-operator": 150.0},
        "requests_by_client": {"quorum-operator": 2500},
        "processes_dead_at_end": [],
        "oom_kills_during_run": 0,
    }


def test_the_report_has_a_column_per_run_in_order() -> None:
    runs = merge([run("quorum", 1000), run("coscheduling", 200)], [run("quorum", 200)])
    table = markdown({"date": "2026-11-26", "runs": runs})
    header = next(line for line in table.splitlines() if line.startswith("| |"))
    assert (
        header
        == "| | 200 nodes, quorum (1.36) | 1,000 nodes, quorum (1.36) | 200 nodes, coscheduling (1.36) |"
    )
    assert "| release: last created -> gates removed, p50 / p99 (s) | 0.250 / 1.5 |" in table
    assert "| quorum-operator requests per pod | 2.50 |" in table
    assert "| processes dead at the end / OOM kills | none / 0 |" in table
    assert "| worst pass (s) | - |" in table
    assert "| pods released and never bound / nodes overcommitted | - / 0 |" in table


def test_a_new_run_replaces_the_same_size_and_way() -> None:
    old = [run("quorum", 200), run("quorum", 1000)]
    new = run("quorum", 200) | {"seconds_to_all_bound": 1.0}
    merged = merge(old, [new])
    assert len(merged) == 2
    assert [r for r in merged if r["nodes"] == 200] == [new]


def test_runs_on_another_kubernetes_are_kept_beside_and_tabled_after() -> None:
    old = [run("quorum", 200), run("delegated", 200) | {"kubernetes": "v1.37.2"}]
    new = run("quorum", 200) | {"kubernetes": "v1.37.2"}
    merged = merge(old, [new])
    assert len(merged) == 3
    header = next(
        line for line in markdown({"date": "d", "runs": merged}).splitlines() if line.startswith("| |")
    )
    assert header == "| | 200 nodes, quorum (1.36) | 200 nodes, quorum (1.37) | 200 nodes, delegated (1.37) |"
